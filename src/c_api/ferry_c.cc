// The C API (include/ferry/ferry_c.h) over ferry::Engine.
//
// Each function checks its pointers, converts its arguments, makes one C++
// call and turns the ferry::Status into a code plus this thread's last-error
// message. No exception crosses into C: every body runs inside Guarded(),
// which reports one as FERRY_RESOURCE_EXHAUSTED (out of memory) or
// FERRY_INTERNAL.

#include "ferry/ferry_c.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/ferry.h"
#include "transport/registry.h"

// The codes are ferry::StatusCode's, number for number.
#define FERRY_C_SAME_CODE(c, k)                                     \
  static_assert((c) == static_cast<int>(::ferry::StatusCode::k), #c \
                " differs from "                                    \
                "StatusCode::" #k)
FERRY_C_SAME_CODE(FERRY_OK, kOk);
FERRY_C_SAME_CODE(FERRY_CANCELLED, kCancelled);
FERRY_C_SAME_CODE(FERRY_UNKNOWN, kUnknown);
FERRY_C_SAME_CODE(FERRY_INVALID_ARGUMENT, kInvalidArgument);
FERRY_C_SAME_CODE(FERRY_DEADLINE_EXCEEDED, kDeadlineExceeded);
FERRY_C_SAME_CODE(FERRY_NOT_FOUND, kNotFound);
FERRY_C_SAME_CODE(FERRY_ALREADY_EXISTS, kAlreadyExists);
FERRY_C_SAME_CODE(FERRY_RESOURCE_EXHAUSTED, kResourceExhausted);
FERRY_C_SAME_CODE(FERRY_FAILED_PRECONDITION, kFailedPrecondition);
FERRY_C_SAME_CODE(FERRY_UNIMPLEMENTED, kUnimplemented);
FERRY_C_SAME_CODE(FERRY_INTERNAL, kInternal);
FERRY_C_SAME_CODE(FERRY_UNAVAILABLE, kUnavailable);
FERRY_C_SAME_CODE(FERRY_DATA_LOSS, kDataLoss);
FERRY_C_SAME_CODE(FERRY_UNAUTHENTICATED, kUnauthenticated);
#undef FERRY_C_SAME_CODE
static_assert(FERRY_OP_READ == static_cast<int>(ferry::Opcode::kRead));
static_assert(FERRY_OP_WRITE == static_cast<int>(ferry::Opcode::kWrite));
static_assert(FERRY_STATE_PENDING == static_cast<int>(ferry::TransferState::kPending));
static_assert(FERRY_STATE_COMPLETED == static_cast<int>(ferry::TransferState::kCompleted));
static_assert(FERRY_STATE_FAILED == static_cast<int>(ferry::TransferState::kFailed));

// The objects behind the opaque handles.
struct ferry_options {
  ferry::EngineOptions options;
};
struct ferry_engine {
  std::unique_ptr<ferry::Engine> engine;
};
struct ferry_segment_info {
  ferry::SegmentInfo info;
};
struct ferry_notifications {
  std::vector<ferry::Notification> items;
};

namespace {

using ferry::Status;
using ferry::StatusOr;

thread_local std::string t_last_error;

ferry_status_t Ok() {
  t_last_error.clear();
  return FERRY_OK;
}

ferry_status_t Report(const Status& s) {
  if (s.ok()) return Ok();
  t_last_error = s.message();
  return static_cast<ferry_status_t>(s.code());
}

// FERRY_INVALID_ARGUMENT for a null where `fn` needs `what`.
ferry_status_t Null(const char* fn, const char* what) {
  return Report(ferry::InvalidArgumentError(std::string(fn) + ": " + what + " is NULL"));
}

#define FERRY_C_REQUIRE(p) \
  if ((p) == nullptr) return Null(fn, #p)

// Runs `body` (returning a ferry_status_t); an exception becomes a code.
template <typename F>
ferry_status_t Guarded(const char* fn, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Report(ferry::ResourceExhaustedError(std::string(fn) + ": out of memory"));
  } catch (const std::exception& e) {
    return Report(ferry::InternalError(std::string(fn) + ": " + e.what()));
  } catch (...) {
    return Report(ferry::InternalError(std::string(fn) + ": unknown exception"));
  }
}

// The buffer convention of ferry_c.h: copies `value` and a NUL into buf.
ferry_status_t CopyOut(const char* fn, std::string_view value, char* buf, size_t buf_len,
                       size_t* out_len) {
  if (out_len != nullptr) *out_len = value.size();
  if (buf == nullptr) {
    if (buf_len == 0) return Ok();
    return Null(fn, "buf (with buf_len > 0)");
  }
  if (buf_len == 0) {
    return Report(ferry::ResourceExhaustedError(std::string(fn) + ": buf_len is 0, the value is " +
                                                std::to_string(value.size()) + " bytes"));
  }
  const size_t n = std::min(value.size(), buf_len - 1);
  std::memcpy(buf, value.data(), n);
  buf[n] = '\0';
  if (n < value.size()) {
    return Report(ferry::ResourceExhaustedError(
        std::string(fn) + ": a buffer of " + std::to_string(buf_len) + " bytes is too small for " +
        std::to_string(value.size()) + " bytes and a NUL (truncated)"));
  }
  return Ok();
}

std::chrono::milliseconds Timeout(int64_t timeout_ms) {
  // Below the steady clock's overflow however long the machine has been up.
  constexpr int64_t kYear = int64_t{365} * 24 * 3600 * 1000;
  return std::chrono::milliseconds(timeout_ms < 0 ? kYear : std::min(timeout_ms, kYear));
}

StatusOr<ferry::Opcode> ToOpcode(const char* fn, int32_t opcode) {
  if (opcode == FERRY_OP_READ) return ferry::Opcode::kRead;
  if (opcode == FERRY_OP_WRITE) return ferry::Opcode::kWrite;
  return ferry::InvalidArgumentError(std::string(fn) + ": opcode must be FERRY_OP_READ (0) or " +
                                     "FERRY_OP_WRITE (1), got " + std::to_string(opcode));
}

StatusOr<std::vector<ferry::TransferRequest>> ToRequests(const char* fn,
                                                         const ferry_request_t* requests,
                                                         size_t count) {
  if (requests == nullptr && count > 0) {
    return ferry::InvalidArgumentError(std::string(fn) + ": requests is NULL");
  }
  std::vector<ferry::TransferRequest> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    const ferry_request_t& r = requests[i];
    StatusOr<ferry::Opcode> op = ToOpcode(fn, r.opcode);
    if (!op.ok()) return op.status().WithPrefix("request " + std::to_string(i));
    out.push_back({*op, r.local, ferry::SegmentHandle{r.segment}, r.remote_addr, r.length});
  }
  return out;
}

// The notification (name, message) of a prepared transfer, or none.
StatusOr<std::optional<ferry::Notification>> ToNotification(const char* fn, const char* name,
                                                            const void* message,
                                                            size_t message_len) {
  if (name == nullptr) return std::optional<ferry::Notification>();
  if (message == nullptr && message_len > 0) {
    return ferry::InvalidArgumentError(std::string(fn) +
                                       ": notify_message is NULL with a non-zero length");
  }
  ferry::Notification n;
  n.name = name;
  if (message_len > 0) n.message.assign(static_cast<const char*>(message), message_len);
  return std::optional<ferry::Notification>(std::move(n));
}

// ferry_batch_spin's and ferry_xfer_spin's spin_us: < 0 is the engine's await_spin.
std::chrono::microseconds SpinOf(const ferry_engine_t& engine, int64_t spin_us) {
  return spin_us < 0 ? engine.engine->options().await_spin : std::chrono::microseconds(spin_us);
}

// ferry_batch_status's and ferry_batch_spin's answer.
ferry_status_t ReportBatch(const StatusOr<ferry::BatchStatus>& s, ferry_batch_status_t* out) {
  if (!s.ok()) return Report(s.status());
  out->state = static_cast<int32_t>(s->state);
  out->first_error = static_cast<ferry_status_t>(s->first_error.code());
  out->submitted = s->submitted;
  out->completed = s->completed;
  out->failed = s->failed;
  const ferry_status_t ok = Ok();
  if (!s->first_error.ok()) t_last_error = s->first_error.message();
  return ok;
}

// Reports a request's or transfer's state: the query's error, or *state,
// *code and, for a failure, its message in the last error (the query itself
// succeeded).
ferry_status_t ReportState(const StatusOr<ferry::TransferStatus>& s, int32_t* state,
                           ferry_status_t* code) {
  if (!s.ok()) return Report(s.status());
  *state = static_cast<int32_t>(s->state);
  if (code != nullptr) *code = static_cast<ferry_status_t>(s->status.code());
  const ferry_status_t ok = Ok();
  if (!s->status.ok()) t_last_error = s->status.message();
  return ok;
}

// The rows as the C++ API takes them.
std::vector<ferry::DescRow> Rows(const ferry_desc_row_t* rows, size_t count) {
  std::vector<ferry::DescRow> out(count);
  for (size_t i = 0; i < count; ++i) {
    out[i] = {rows[i].addr, rows[i].length, rows[i].stride, rows[i].count};
  }
  return out;
}

ferry_status_t ListOut(const StatusOr<ferry::DescListHandle>& h, ferry_desc_list_t* out) {
  if (!h.ok()) return Report(h.status());
  *out = h->value;
  return Ok();
}

// FERRY_INVALID_ARGUMENT for an option name no row has, suggesting the
// closest ones (SetOption's message).
ferry_status_t UnknownOption(const char* name) {
  ferry::EngineOptions scratch;
  return Report(ferry::SetOption(scratch, name, ""));
}

}  // namespace

extern "C" {

// ---- Status -------------------------------------------------------------

const char* ferry_last_error(void) { return t_last_error.c_str(); }

const char* ferry_status_name(ferry_status_t code) {
  // StatusCodeName returns literals: NUL-terminated.
  return ferry::StatusCodeName(static_cast<ferry::StatusCode>(code)).data();
}

const char* ferry_version(void) { return ferry::Version().data(); }

// ---- Options ------------------------------------------------------------

ferry_status_t ferry_options_new(ferry_options_t** out) {
  static constexpr const char* fn = "ferry_options_new";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(out);
    *out = new ferry_options{};
    return Ok();
  });
}

ferry_status_t ferry_options_free(ferry_options_t* opts) {
  delete opts;
  return Ok();
}

ferry_status_t ferry_options_set(ferry_options_t* opts, const char* name, const char* value) {
  static constexpr const char* fn = "ferry_options_set";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(opts);
    FERRY_C_REQUIRE(name);
    FERRY_C_REQUIRE(value);
    // The transport's name is otherwise checked only by Engine::Create;
    // here the error comes from the call that set it (same message).
    if (std::string_view(name) == "transport" && std::string_view(value) != "auto" &&
        ferry::internal::FindTransport(value) == nullptr) {
      return Report(ferry::InvalidArgumentError("transport must be auto or one of " +
                                                ferry::internal::TransportNames() + ", got '" +
                                                value + "'"));
    }
    return Report(ferry::SetOption(opts->options, name, value));
  });
}

ferry_status_t ferry_options_get(const ferry_options_t* opts, const char* name, char* buf,
                                 size_t buf_len, size_t* out_len) {
  static constexpr const char* fn = "ferry_options_get";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(opts);
    FERRY_C_REQUIRE(name);
    const ferry::OptionSpec* spec = ferry::FindOption(name);
    if (spec == nullptr) return UnknownOption(name);
    return CopyOut(fn, spec->Value(opts->options), buf, buf_len, out_len);
  });
}

ferry_status_t ferry_options_apply_environment(ferry_options_t* opts) {
  static constexpr const char* fn = "ferry_options_apply_environment";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(opts);
    opts->options = opts->options.WithEnvironment();
    return Ok();
  });
}

ferry_status_t ferry_transport_check(const char* name) {
  static constexpr const char* fn = "ferry_transport_check";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(name);
    for (const ferry::TransportInfo& t : ferry::ListTransports()) {
      if (t.name != name) continue;
      if (t.unavailable.empty()) return Ok();
      return Report(ferry::FailedPreconditionError("transport " + t.name +
                                                   " cannot work here: " + t.unavailable));
    }
    return Report(ferry::NotFoundError(std::string("no transport named '") + name +
                                       "' (this build has " + ferry::internal::TransportNames() +
                                       ")"));
  });
}

// ---- Engine -------------------------------------------------------------

ferry_status_t ferry_engine_new(const ferry_options_t* opts, ferry_engine_t** out) {
  static constexpr const char* fn = "ferry_engine_new";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(out);
    *out = nullptr;
    StatusOr<std::unique_ptr<ferry::Engine>> e =
        ferry::Engine::Create(opts != nullptr ? opts->options : ferry::EngineOptions{});
    if (!e.ok()) return Report(e.status());
    *out = new ferry_engine{std::move(e).value()};
    return Ok();
  });
}

ferry_status_t ferry_engine_destroy(ferry_engine_t* engine) {
  return Guarded("ferry_engine_destroy", [&] {
    delete engine;
    return Ok();
  });
}

ferry_status_t ferry_engine_peer_id(const ferry_engine_t* engine, const char** out) {
  static constexpr const char* fn = "ferry_engine_peer_id";
  FERRY_C_REQUIRE(engine);
  FERRY_C_REQUIRE(out);
  *out = engine->engine->PeerId().c_str();
  return Ok();
}

ferry_status_t ferry_engine_local_name(const ferry_engine_t* engine, const char** out) {
  static constexpr const char* fn = "ferry_engine_local_name";
  FERRY_C_REQUIRE(engine);
  FERRY_C_REQUIRE(out);
  *out = engine->engine->LocalName().c_str();
  return Ok();
}

ferry_status_t ferry_engine_completion_fd(ferry_engine_t* engine, int* out_fd) {
  static constexpr const char* fn = "ferry_engine_completion_fd";
  FERRY_C_REQUIRE(engine);
  FERRY_C_REQUIRE(out_fd);
  const int fd = engine->engine->CompletionFd();
  if (fd < 0) {
    return Report(ferry::ResourceExhaustedError(
        std::string(fn) + ": cannot create the completion eventfd (the descriptor limit?)"));
  }
  *out_fd = fd;
  return Ok();
}

ferry_status_t ferry_engine_take_finished(ferry_engine_t* engine, ferry_batch_t* batches,
                                          size_t batches_cap, size_t* out_batches,
                                          ferry_xfer_t* xfers, size_t xfers_cap, size_t* out_xfers,
                                          int* out_overflowed) {
  static constexpr const char* fn = "ferry_engine_take_finished";
  FERRY_C_REQUIRE(engine);
  FERRY_C_REQUIRE(out_batches);
  FERRY_C_REQUIRE(out_xfers);
  FERRY_C_REQUIRE(out_overflowed);
  if ((batches == nullptr && batches_cap > 0) || (xfers == nullptr && xfers_cap > 0)) {
    return Report(ferry::InvalidArgumentError(
        std::string(fn) + ": " + (batches == nullptr && batches_cap > 0 ? "batches" : "xfers") +
        " is NULL with a capacity above 0"));
  }
  return Guarded(fn, [&] {
    ferry::FinishedWork done = engine->engine->TakeFinished();
    const size_t nb = std::min(done.batches.size(), batches_cap);
    const size_t nx = std::min(done.transfers.size(), xfers_cap);
    for (size_t i = 0; i < nb; ++i) batches[i] = done.batches[i].value;
    for (size_t i = 0; i < nx; ++i) xfers[i] = done.transfers[i].value;
    *out_batches = nb;
    *out_xfers = nx;
    *out_overflowed =
        done.overflowed || nb < done.batches.size() || nx < done.transfers.size() ? 1 : 0;
    return Ok();
  });
}

ferry_status_t ferry_engine_rpc_port(const ferry_engine_t* engine, uint16_t* out) {
  static constexpr const char* fn = "ferry_engine_rpc_port";
  FERRY_C_REQUIRE(engine);
  FERRY_C_REQUIRE(out);
  *out = engine->engine->RpcPort();
  return Ok();
}

ferry_status_t ferry_engine_option(const ferry_engine_t* engine, const char* name, char* buf,
                                   size_t buf_len, size_t* out_len) {
  static constexpr const char* fn = "ferry_engine_option";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(name);
    const ferry::OptionSpec* spec = ferry::FindOption(name);
    if (spec == nullptr) return UnknownOption(name);
    return CopyOut(fn, spec->Value(engine->engine->options()), buf, buf_len, out_len);
  });
}

// ---- Memory -------------------------------------------------------------

ferry_status_t ferry_memory_register(ferry_engine_t* engine, void* addr, size_t length,
                                     const char* location) {
  static constexpr const char* fn = "ferry_memory_register";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(addr);
    return Report(
        engine->engine->RegisterMemory(addr, length, location != nullptr ? location : "*"));
  });
}

ferry_status_t ferry_memory_unregister(ferry_engine_t* engine, void* addr) {
  static constexpr const char* fn = "ferry_memory_unregister";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(addr);
    return Report(engine->engine->UnregisterMemory(addr));
  });
}

ferry_status_t ferry_memory_allocate_shared(ferry_engine_t* engine, size_t length,
                                            const char* location, int exported, void** out) {
  static constexpr const char* fn = "ferry_memory_allocate_shared";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    *out = nullptr;
    StatusOr<void*> addr = engine->engine->AllocateShared(
        length, location != nullptr ? location : "cpu", exported != 0);
    if (!addr.ok()) return Report(addr.status());
    *out = *addr;
    return Ok();
  });
}

ferry_status_t ferry_memory_free_shared(ferry_engine_t* engine, void* addr) {
  static constexpr const char* fn = "ferry_memory_free_shared";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(addr);
    return Report(engine->engine->FreeShared(addr));
  });
}

ferry_status_t ferry_memory_register_shared(ferry_engine_t* engine, void* addr, size_t length,
                                            const char* location, int fd, uint64_t fd_offset) {
  static constexpr const char* fn = "ferry_memory_register_shared";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(addr);
    ferry::MemoryRegion region;
    region.addr = addr;
    region.length = length;
    region.location = location != nullptr ? location : "*";
    region.fd = fd;
    region.fd_offset = fd_offset;
    return Report(engine->engine->RegisterMemory(std::span<const ferry::MemoryRegion>(&region, 1)));
  });
}

// ---- Segments -----------------------------------------------------------

ferry_status_t ferry_segment_open(ferry_engine_t* engine, const char* peer, ferry_segment_t* out) {
  static constexpr const char* fn = "ferry_segment_open";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(peer);
    FERRY_C_REQUIRE(out);
    *out = 0;
    StatusOr<ferry::SegmentHandle> s = engine->engine->OpenSegment(peer);
    if (!s.ok()) return Report(s.status());
    *out = s->value;
    return Ok();
  });
}

ferry_status_t ferry_segment_close(ferry_engine_t* engine, ferry_segment_t segment) {
  static constexpr const char* fn = "ferry_segment_close";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->CloseSegment(ferry::SegmentHandle{segment}));
  });
}

ferry_status_t ferry_segment_query(ferry_engine_t* engine, ferry_segment_t segment,
                                   ferry_segment_info_t** out) {
  static constexpr const char* fn = "ferry_segment_query";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    *out = nullptr;
    StatusOr<ferry::SegmentInfo> info = engine->engine->QuerySegment(ferry::SegmentHandle{segment});
    if (!info.ok()) return Report(info.status());
    *out = new ferry_segment_info{std::move(info).value()};
    return Ok();
  });
}

ferry_status_t ferry_segment_info_free(ferry_segment_info_t* info) {
  delete info;
  return Ok();
}

ferry_status_t ferry_segment_info_peer_id(const ferry_segment_info_t* info, const char** out) {
  static constexpr const char* fn = "ferry_segment_info_peer_id";
  FERRY_C_REQUIRE(info);
  FERRY_C_REQUIRE(out);
  *out = info->info.peer_id.c_str();
  return Ok();
}

ferry_status_t ferry_segment_info_name(const ferry_segment_info_t* info, const char** out) {
  static constexpr const char* fn = "ferry_segment_info_name";
  FERRY_C_REQUIRE(info);
  FERRY_C_REQUIRE(out);
  *out = info->info.engine_name.c_str();
  return Ok();
}

ferry_status_t ferry_segment_info_transport(const ferry_segment_info_t* info, const char** out) {
  static constexpr const char* fn = "ferry_segment_info_transport";
  FERRY_C_REQUIRE(info);
  FERRY_C_REQUIRE(out);
  *out = info->info.transport.c_str();
  return Ok();
}

ferry_status_t ferry_segment_info_instance_id(const ferry_segment_info_t* info, uint64_t* out) {
  static constexpr const char* fn = "ferry_segment_info_instance_id";
  FERRY_C_REQUIRE(info);
  FERRY_C_REQUIRE(out);
  *out = info->info.instance_id;
  return Ok();
}

ferry_status_t ferry_segment_info_region_count(const ferry_segment_info_t* info, size_t* out) {
  static constexpr const char* fn = "ferry_segment_info_region_count";
  FERRY_C_REQUIRE(info);
  FERRY_C_REQUIRE(out);
  *out = info->info.regions.size();
  return Ok();
}

ferry_status_t ferry_segment_info_region(const ferry_segment_info_t* info, size_t index,
                                         uint64_t* addr, uint64_t* length, const char** kind) {
  static constexpr const char* fn = "ferry_segment_info_region";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(info);
    const std::vector<ferry::RemoteRegion>& regions = info->info.regions;
    if (index >= regions.size()) {
      return Report(ferry::InvalidArgumentError(std::string(fn) + ": region " +
                                                std::to_string(index) + " of a segment with " +
                                                std::to_string(regions.size()) + " regions"));
    }
    if (addr != nullptr) *addr = regions[index].addr;
    if (length != nullptr) *length = regions[index].length;
    if (kind != nullptr) *kind = regions[index].kind.c_str();
    return Ok();
  });
}

// ---- Batches ------------------------------------------------------------

ferry_status_t ferry_batch_allocate(ferry_engine_t* engine, size_t capacity, ferry_batch_t* out) {
  static constexpr const char* fn = "ferry_batch_allocate";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    *out = 0;
    StatusOr<ferry::BatchId> b = engine->engine->AllocateBatch(capacity);
    if (!b.ok()) return Report(b.status());
    *out = b->value;
    return Ok();
  });
}

ferry_status_t ferry_batch_submit(ferry_engine_t* engine, ferry_batch_t batch,
                                  const ferry_request_t* requests, size_t count) {
  static constexpr const char* fn = "ferry_batch_submit";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    StatusOr<std::vector<ferry::TransferRequest>> r = ToRequests(fn, requests, count);
    if (!r.ok()) return Report(r.status());
    return Report(engine->engine->Submit(ferry::BatchId{batch}, *r));
  });
}

ferry_status_t ferry_batch_wait(ferry_engine_t* engine, ferry_batch_t batch, int64_t timeout_ms) {
  static constexpr const char* fn = "ferry_batch_wait";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->WaitBatch(ferry::BatchId{batch}, Timeout(timeout_ms)));
  });
}

ferry_status_t ferry_batch_status(ferry_engine_t* engine, ferry_batch_t batch,
                                  ferry_batch_status_t* out) {
  static constexpr const char* fn = "ferry_batch_status";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    return ReportBatch(engine->engine->GetBatchStatus(ferry::BatchId{batch}), out);
  });
}

ferry_status_t ferry_batch_spin(ferry_engine_t* engine, ferry_batch_t batch, int64_t spin_us,
                                ferry_batch_status_t* out) {
  static constexpr const char* fn = "ferry_batch_spin";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    return ReportBatch(engine->engine->SpinBatch(ferry::BatchId{batch}, SpinOf(*engine, spin_us)),
                       out);
  });
}

ferry_status_t ferry_batch_request_status(ferry_engine_t* engine, ferry_batch_t batch, size_t index,
                                          int32_t* state, ferry_status_t* request_status) {
  static constexpr const char* fn = "ferry_batch_request_status";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(state);
    return ReportState(engine->engine->GetTransferStatus(ferry::BatchId{batch}, index), state,
                       request_status);
  });
}

ferry_status_t ferry_batch_cancel(ferry_engine_t* engine, ferry_batch_t batch) {
  static constexpr const char* fn = "ferry_batch_cancel";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->CancelBatch(ferry::BatchId{batch}));
  });
}

ferry_status_t ferry_batch_free(ferry_engine_t* engine, ferry_batch_t batch) {
  static constexpr const char* fn = "ferry_batch_free";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->FreeBatch(ferry::BatchId{batch}));
  });
}

ferry_status_t ferry_transfer_sync(ferry_engine_t* engine, const ferry_request_t* requests,
                                   size_t count) {
  static constexpr const char* fn = "ferry_transfer_sync";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    StatusOr<std::vector<ferry::TransferRequest>> r = ToRequests(fn, requests, count);
    if (!r.ok()) return Report(r.status());
    return Report(engine->engine->TransferSync(std::span<const ferry::TransferRequest>(*r)));
  });
}

ferry_status_t ferry_write_sync(ferry_engine_t* engine, ferry_segment_t segment, const void* local,
                                uint64_t remote_addr, uint64_t length) {
  static constexpr const char* fn = "ferry_write_sync";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(local);
    // A write only reads `local`; TransferRequest has one pointer type.
    const ferry::TransferRequest r{ferry::Opcode::kWrite, const_cast<void*>(local),
                                   ferry::SegmentHandle{segment}, remote_addr, length};
    return Report(engine->engine->TransferSync(r));
  });
}

ferry_status_t ferry_read_sync(ferry_engine_t* engine, ferry_segment_t segment, void* local,
                               uint64_t remote_addr, uint64_t length) {
  static constexpr const char* fn = "ferry_read_sync";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(local);
    const ferry::TransferRequest r{ferry::Opcode::kRead, local, ferry::SegmentHandle{segment},
                                   remote_addr, length};
    return Report(engine->engine->TransferSync(r));
  });
}

// ---- Notifications ------------------------------------------------------

ferry_status_t ferry_notify_send(ferry_engine_t* engine, ferry_segment_t segment, const char* name,
                                 const void* message, size_t message_len) {
  static constexpr const char* fn = "ferry_notify_send";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(name);
    if (message == nullptr && message_len > 0) {
      return Report(ferry::InvalidArgumentError(std::string(fn) +
                                                ": message is NULL with a non-zero length"));
    }
    const std::string_view body(static_cast<const char*>(message),
                                message == nullptr ? 0 : message_len);
    return Report(engine->engine->SendNotification(ferry::SegmentHandle{segment}, name, body));
  });
}

ferry_status_t ferry_notify_drain(ferry_engine_t* engine, ferry_notifications_t** out) {
  static constexpr const char* fn = "ferry_notify_drain";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    *out = nullptr;
    auto list = std::make_unique<ferry_notifications>();
    list->items = engine->engine->GetNotifications();
    *out = list.release();
    return Ok();
  });
}

ferry_status_t ferry_notifications_free(ferry_notifications_t* list) {
  delete list;
  return Ok();
}

ferry_status_t ferry_notifications_count(const ferry_notifications_t* list, size_t* out) {
  static constexpr const char* fn = "ferry_notifications_count";
  FERRY_C_REQUIRE(list);
  FERRY_C_REQUIRE(out);
  *out = list->items.size();
  return Ok();
}

ferry_status_t ferry_notifications_get(const ferry_notifications_t* list, size_t index,
                                       const char** sender, const char** name, const void** message,
                                       size_t* message_len) {
  static constexpr const char* fn = "ferry_notifications_get";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(list);
    if (index >= list->items.size()) {
      return Report(ferry::InvalidArgumentError(std::string(fn) + ": notification " +
                                                std::to_string(index) + " of a list of " +
                                                std::to_string(list->items.size())));
    }
    const ferry::Notification& n = list->items[index];
    if (sender != nullptr) *sender = n.sender.c_str();
    if (name != nullptr) *name = n.name.c_str();
    if (message != nullptr) *message = n.message.c_str();
    if (message_len != nullptr) *message_len = n.message.size();
    return Ok();
  });
}

// ---- Prepared lists and transfers ---------------------------------------

ferry_status_t ferry_list_prepare_local(ferry_engine_t* engine, const ferry_desc_row_t* rows,
                                        size_t count, ferry_desc_list_t* out) {
  static constexpr const char* fn = "ferry_list_prepare_local";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    *out = 0;
    if (count > 0) FERRY_C_REQUIRE(rows);
    return ListOut(engine->engine->PrepareLocalList(Rows(rows, count)), out);
  });
}

ferry_status_t ferry_list_prepare_remote(ferry_engine_t* engine, ferry_segment_t segment,
                                         const ferry_desc_row_t* rows, size_t count,
                                         ferry_desc_list_t* out) {
  static constexpr const char* fn = "ferry_list_prepare_remote";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    *out = 0;
    if (count > 0) FERRY_C_REQUIRE(rows);
    return ListOut(
        engine->engine->PrepareRemoteList(ferry::SegmentHandle{segment}, Rows(rows, count)), out);
  });
}

ferry_status_t ferry_list_entries(ferry_engine_t* engine, ferry_desc_list_t list, size_t* out) {
  static constexpr const char* fn = "ferry_list_entries";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    StatusOr<size_t> n = engine->engine->DescListEntries(ferry::DescListHandle{list});
    if (!n.ok()) return Report(n.status());
    *out = *n;
    return Ok();
  });
}

ferry_status_t ferry_list_release(ferry_engine_t* engine, ferry_desc_list_t list) {
  static constexpr const char* fn = "ferry_list_release";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->ReleaseDescList(ferry::DescListHandle{list}));
  });
}

ferry_status_t ferry_xfer_make(ferry_engine_t* engine, int32_t opcode, ferry_desc_list_t local,
                               const uint32_t* local_indices, size_t local_count,
                               ferry_desc_list_t remote, const uint32_t* remote_indices,
                               size_t remote_count, const char* notify_name,
                               const void* notify_message, size_t notify_message_len,
                               ferry_xfer_t* out) {
  static constexpr const char* fn = "ferry_xfer_make";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    *out = 0;
    if (local_count > 0) FERRY_C_REQUIRE(local_indices);
    if (remote_count > 0) FERRY_C_REQUIRE(remote_indices);
    StatusOr<ferry::Opcode> op = ToOpcode(fn, opcode);
    if (!op.ok()) return Report(op.status());
    StatusOr<std::optional<ferry::Notification>> note =
        ToNotification(fn, notify_name, notify_message, notify_message_len);
    if (!note.ok()) return Report(note.status());
    std::span<const uint32_t> li, ri;
    if (local_count > 0) li = {local_indices, local_count};
    if (remote_count > 0) ri = {remote_indices, remote_count};
    StatusOr<ferry::TransferHandle> h = engine->engine->MakeTransfer(
        *op, ferry::DescListHandle{local}, li, ferry::DescListHandle{remote}, ri, std::move(*note));
    if (!h.ok()) return Report(h.status());
    *out = h->value;
    return Ok();
  });
}

ferry_status_t ferry_xfer_post(ferry_engine_t* engine, ferry_xfer_t xfer, const char* notify_name,
                               const void* notify_message, size_t notify_message_len) {
  static constexpr const char* fn = "ferry_xfer_post";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    StatusOr<std::optional<ferry::Notification>> note =
        ToNotification(fn, notify_name, notify_message, notify_message_len);
    if (!note.ok()) return Report(note.status());
    return Report(engine->engine->PostTransfer(ferry::TransferHandle{xfer}, std::move(*note)));
  });
}

ferry_status_t ferry_xfer_status(ferry_engine_t* engine, ferry_xfer_t xfer, int32_t* state,
                                 ferry_status_t* xfer_status) {
  static constexpr const char* fn = "ferry_xfer_status";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(state);
    return ReportState(engine->engine->GetTransferStatus(ferry::TransferHandle{xfer}), state,
                       xfer_status);
  });
}

ferry_status_t ferry_xfer_spin(ferry_engine_t* engine, ferry_xfer_t xfer, int64_t spin_us,
                               int32_t* state, ferry_status_t* xfer_status) {
  static constexpr const char* fn = "ferry_xfer_spin";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(state);
    return ReportState(
        engine->engine->SpinTransfer(ferry::TransferHandle{xfer}, SpinOf(*engine, spin_us)), state,
        xfer_status);
  });
}

ferry_status_t ferry_xfer_wait(ferry_engine_t* engine, ferry_xfer_t xfer, int64_t timeout_ms) {
  static constexpr const char* fn = "ferry_xfer_wait";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->WaitTransfer(ferry::TransferHandle{xfer}, Timeout(timeout_ms)));
  });
}

ferry_status_t ferry_xfer_telemetry(ferry_engine_t* engine, ferry_xfer_t xfer,
                                    ferry_xfer_telemetry_t* out) {
  static constexpr const char* fn = "ferry_xfer_telemetry";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    FERRY_C_REQUIRE(out);
    StatusOr<ferry::TransferTelemetry> t =
        engine->engine->GetTransferTelemetry(ferry::TransferHandle{xfer});
    if (!t.ok()) return Report(t.status());
    out->start_us = t->start_us;
    out->post_us = t->post_us;
    out->transfer_us = t->transfer_us;
    out->bytes = t->bytes;
    out->entries = t->entries;
    return Ok();
  });
}

ferry_status_t ferry_xfer_cancel(ferry_engine_t* engine, ferry_xfer_t xfer) {
  static constexpr const char* fn = "ferry_xfer_cancel";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->CancelTransfer(ferry::TransferHandle{xfer}));
  });
}

ferry_status_t ferry_xfer_release(ferry_engine_t* engine, ferry_xfer_t xfer) {
  static constexpr const char* fn = "ferry_xfer_release";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return Report(engine->engine->ReleaseTransfer(ferry::TransferHandle{xfer}));
  });
}

// ---- Telemetry ----------------------------------------------------------

ferry_status_t ferry_metrics_text(ferry_engine_t* engine, char* buf, size_t buf_len,
                                  size_t* out_len) {
  static constexpr const char* fn = "ferry_metrics_text";
  return Guarded(fn, [&] {
    FERRY_C_REQUIRE(engine);
    return CopyOut(fn, engine->engine->MetricsText(), buf, buf_len, out_len);
  });
}

}  // extern "C"
