#include "transport/fabric/fabric_progress.h"

#include <rdma/fi_errno.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/log.h"
#include "transport/fabric/fabric_info.h"
#include "transport/fabric/fabric_notify.h"
#include "transport/fabric/fabric_posting.h"

namespace ferry::internal::fabric {
namespace {

constexpr int kPollBatch = 64;
// How often the progress thread looks for operations past their deadline.
constexpr auto kDeadlineScan = std::chrono::milliseconds(10);

}  // namespace

void Progress::Stop() {
  if (fids_.cq != nullptr) (void)fi_cq_signal(fids_.cq);
  if (thread_.joinable()) thread_.join();
}

void Progress::Run() {
  fi_cq_data_entry e[kPollBatch];
  Clock::time_point active = Clock::now();
  while (wakeup_.running()) {
    const uint64_t gen = wakeup_.generation();
    ssize_t handled = Drain(e, fi_cq_read(fids_.cq, e, kPollBatch));
    notify_.PostSends();
    posting_.Pump();
    const Clock::time_point now = Clock::now();
    if (now - last_scan_ > kDeadlineScan) {
      ScanDeadlines(now);
      last_scan_ = now;
    }
    if (handled > 0) {
      active = now;
      continue;
    }
    if (now - active < cfg_.spin) continue;
    // A pipeline of operations in flight that keep completing: keep
    // polling, as sleeping between two completions costs a wake-up each. A
    // single operation does not: its caller is likely spinning in its
    // wait, and on a machine with few cores a third spinning thread starves
    // the peer's (docs/benchmarks-history.md, fabric).
    if (now - active < cfg_.spin_in_flight && posting_.InFlight() >= 2) continue;
    Sleep(gen, e, &active);
  }
}

void Progress::Sleep(uint64_t gen, fi_cq_data_entry* e, Clock::time_point* active) {
  // A peer's incoming data wakes the wait in any case.
  const int timeout_ms = posting_.Busy() ? 1 : posting_.Idle() ? 100 : 10;
  if (!fids_.cq_waits) {
    // No wait object: a short nap instead.
    if (wakeup_.BeginSleep(gen)) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      wakeup_.EndSleep();
    }
    return;
  }
  if (!wakeup_.BeginSleep(gen)) return;
  const ssize_t n = fi_cq_sread(fids_.cq, e, kPollBatch, nullptr, timeout_ms);
  wakeup_.EndSleep();
  if (Drain(e, n) > 0) *active = Clock::now();
}

ssize_t Progress::Drain(fi_cq_data_entry* e, ssize_t n) {
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i) Handle(e[i]);
    return n;
  }
  if (n == -FI_EAVAIL) {
    HandleError();
    return 1;
  }
  return 0;
}

void Progress::Handle(const fi_cq_data_entry& e) {
  auto* c = static_cast<Context*>(e.op_context);
  if (c == nullptr) return;
  switch (c->kind) {
    case Kind::kRma:
      posting_.Finish(static_cast<Op*>(c), 0, "");
      break;
    case Kind::kRecv:
      notify_.OnRecv(*static_cast<MsgBuf*>(c), e.len);
      break;
    case Kind::kSend:
      notify_.OnSendDone(static_cast<MsgBuf*>(c), 0, "");
      break;
  }
}

void Progress::HandleError() {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(fids_.cq, &err, 0) < 0) return;
  char buf[256] = {0};
  const char* text = fi_cq_strerror(fids_.cq, err.prov_errno, err.err_data, buf, sizeof(buf));
  std::string provider_text = text != nullptr ? text : "";
  if (err.prov_errno != 0) {
    provider_text += " [prov_errno " + std::to_string(err.prov_errno) + "]";
  }
  auto* c = static_cast<Context*>(err.op_context);
  if (c == nullptr) {
    FERRY_LOG(kWarning, "fabric " << cfg_.provider
                                  << ": completion error without context: " << ErrorText(err.err));
    return;
  }
  // tcp;ofi_rxm cancels what was in flight to a peer whose connection
  // broke (prov_errno ENOTCONN, ENOENT): the peer is gone, not this engine.
  int code = err.err;
  if (code == FI_ECANCELED && !wakeup_.stopping()) {
    code = FI_ECONNABORTED;
    provider_text = "the provider cancelled it: " + provider_text;
  }
  switch (c->kind) {
    case Kind::kRma:
      posting_.Finish(static_cast<Op*>(c), code, provider_text);
      break;
    case Kind::kRecv:
      notify_.OnRecvError(*static_cast<MsgBuf*>(c), err.err, provider_text);
      break;
    case Kind::kSend:
      notify_.OnSendDone(static_cast<MsgBuf*>(c), code, provider_text);
      break;
  }
}

void Progress::ScanDeadlines(Clock::time_point now) {
  // The operations stay in flight (their buffers are the provider's until
  // they complete or the endpoint closes); their slices fail now.
  for (Op* op : posting_.TakeLate(now)) {
    // A read past its deadline no longer holds its batch's landing fence,
    // so a cancel is bounded by the deadline; the provider may still
    // store its bytes until the operation ends (docs/reliability.md).
    if (op->landing) {
      op->landing = false;
      op->batch->EndLanding();
    }
    BatchState::Completer done(*op->batch);
    for (uint32_t i = 0; i < op->n; ++i) {
      done.Complete(op->slices[i].request, 1,
                    DeadlineExceededError(SliceName(cfg_.provider, op->slices[i], *op->peer) +
                                          ": no completion before the deadline"));
    }
  }
}

}  // namespace ferry::internal::fabric
