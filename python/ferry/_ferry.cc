// _ferry: the thin pybind11 layer between Python and the C++ API.
//
// Everything here maps one Python call onto one ferry::Engine call: arguments
// are converted, the GIL is released around the call, and a non-OK Status is
// raised as the matching ferry.FerryError subclass (the classes and the
// code -> class table live in ferry/_errors.py). Object handling (buffers,
// tensors, keep-alive), defaults and the Mooncake shim are in Python.
//
// Thread safety: a NativeEngine may be used from any number of Python threads.
// Calls hold a shared lock on the engine; close() takes it exclusively, so it
// waits for calls in progress (each ends at the latest at its timeout, a
// Python-level wait loops in short steps) and later calls fail with
// FailedPrecondition instead of touching a freed engine.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/ferry.h"

namespace py = pybind11;

namespace {

using ferry::Status;
using ferry::StatusOr;

// Decodes text that may come from a peer; never fails on bad UTF-8.
py::str LossyStr(const std::string& s) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace");
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(o);
}

// The ferry.FerryError subclass instance for a non-OK status.
py::object MakeError(const Status& status) {
  py::object from_status = py::module_::import("ferry._errors").attr("from_status");
  return from_status(static_cast<int>(status.code()),
                     std::string(ferry::StatusCodeName(status.code())), LossyStr(status.message()));
}

[[noreturn]] void Raise(const Status& status) {
  py::object exc = MakeError(status);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T Unwrap(StatusOr<T>&& s) {
  if (!s.ok()) Raise(s.status());
  return std::move(s).value();
}

py::object ErrorOrNone(const Status& status) {
  return status.ok() ? py::none() : MakeError(status);
}

std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds > 0)) return std::chrono::milliseconds(0);  // also NaN
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(std::min(seconds, 1e9) * 1e3)));
}

double Seconds(std::chrono::microseconds d) { return static_cast<double>(d.count()) / 1e6; }

py::dict CapabilitiesDict(const ferry::Capabilities& c) {
  py::dict d;
  d["version"] = c.version;
  d["wire_version_min"] = c.wire_version_min;
  d["wire_version_max"] = c.wire_version_max;
  d["transports"] = c.transports;
  d["features"] = c.features;
  return d;
}

// Builds requests from parallel lists; `opcodes` and `segments` may hold one
// element that applies to every request.
StatusOr<std::vector<ferry::TransferRequest>> BuildRequests(
    const std::vector<int>& opcodes, const std::vector<uint64_t>& segments,
    const std::vector<uint64_t>& locals, const std::vector<uint64_t>& remotes,
    const std::vector<uint64_t>& lengths) {
  const size_t n = locals.size();
  if (remotes.size() != n || lengths.size() != n) {
    return ferry::InvalidArgumentError(
        "request lists differ in length: " + std::to_string(n) + " local addresses, " +
        std::to_string(remotes.size()) + " remote addresses, " + std::to_string(lengths.size()) +
        " lengths");
  }
  auto broadcast_ok = [n](size_t size) { return size == 1 || size == n; };
  if (!broadcast_ok(opcodes.size()) || !broadcast_ok(segments.size())) {
    return ferry::InvalidArgumentError("expected 1 or " + std::to_string(n) +
                                       " opcodes and segments, got " +
                                       std::to_string(opcodes.size()) + " and " +
                                       std::to_string(segments.size()));
  }
  std::vector<ferry::TransferRequest> requests(n);
  for (size_t i = 0; i < n; ++i) {
    const int op = opcodes[opcodes.size() == 1 ? 0 : i];
    if (op != static_cast<int>(ferry::Opcode::kRead) &&
        op != static_cast<int>(ferry::Opcode::kWrite)) {
      return ferry::InvalidArgumentError("request " + std::to_string(i) + ": unknown opcode " +
                                         std::to_string(op));
    }
    ferry::TransferRequest& r = requests[i];
    r.opcode = static_cast<ferry::Opcode>(op);
    r.local = reinterpret_cast<void*>(static_cast<uintptr_t>(locals[i]));
    r.segment = ferry::SegmentHandle{segments[segments.size() == 1 ? 0 : i]};
    r.remote_addr = remotes[i];
    r.length = lengths[i];
  }
  return requests;
}

class NativeEngine {
 public:
  explicit NativeEngine(ferry::EngineOptions options) {
    StatusOr<std::unique_ptr<ferry::Engine>> created = [&] {
      py::gil_scoped_release nogil;
      return ferry::Engine::Create(std::move(options));
    }();
    engine_ = Unwrap(std::move(created));
    peer_id_ = engine_->PeerId();
    local_name_ = engine_->LocalName();
    rpc_port_ = engine_->RpcPort();
  }

  ~NativeEngine() {
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      engine_.reset();
    } else {
      engine_.reset();
    }
  }

  NativeEngine(const NativeEngine&) = delete;
  NativeEngine& operator=(const NativeEngine&) = delete;

  void Close() {
    // New calls fail from here on, so a steady stream of them cannot keep
    // the exclusive lock away (pairs with the load in Run).
    closing_.store(true, std::memory_order_release);
    py::gil_scoped_release nogil;
    std::unique_lock lock(mu_);
    engine_.reset();
  }

  bool closed() const { return closing_.load(std::memory_order_acquire); }

  const std::string& peer_id() const { return peer_id_; }
  const std::string& local_name() const { return local_name_; }
  uint16_t rpc_port() const { return rpc_port_; }

  // Runs f(engine) without the GIL, with the engine pinned; returns what f
  // returns (a Status or StatusOr), or FailedPrecondition once closed.
  template <typename F>
  auto Run(F&& f) -> decltype(f(std::declval<ferry::Engine&>())) {
    using R = decltype(f(std::declval<ferry::Engine&>()));
    py::gil_scoped_release nogil;
    if (closing_.load(std::memory_order_acquire)) return R(ClosedError());
    std::shared_lock lock(mu_);
    if (engine_ == nullptr) return R(ClosedError());
    return f(*engine_);
  }

  py::dict Capabilities() {
    return CapabilitiesDict(Unwrap(Run([](ferry::Engine& e) -> StatusOr<ferry::Capabilities> {
      return e.GetCapabilities();
    })));
  }

  ferry::EngineOptions Options() {
    return Unwrap(Run([](ferry::Engine& e) -> StatusOr<ferry::EngineOptions> {
      return e.options();
    }));
  }

  void RegisterMemory(uint64_t addr, uint64_t length, const std::string& location, bool exported) {
    ferry::MemoryRegion r{reinterpret_cast<void*>(static_cast<uintptr_t>(addr)), length, location, exported};
    Check(Run([&](ferry::Engine& e) { return e.RegisterMemory(std::span<const ferry::MemoryRegion>(&r, 1)); }));
  }

  void RegisterMemoryList(const std::vector<uint64_t>& addrs, const std::vector<uint64_t>& lengths,
                          const std::vector<std::string>& locations, bool exported) {
    if (lengths.size() != addrs.size() ||
        (locations.size() != 1 && locations.size() != addrs.size())) {
      Raise(ferry::InvalidArgumentError(
          "register lists differ in length: " + std::to_string(addrs.size()) + " addresses, " +
          std::to_string(lengths.size()) + " lengths, " + std::to_string(locations.size()) +
          " locations"));
    }
    std::vector<ferry::MemoryRegion> regions(addrs.size());
    for (size_t i = 0; i < addrs.size(); ++i) {
      regions[i].addr = reinterpret_cast<void*>(static_cast<uintptr_t>(addrs[i]));
      regions[i].length = lengths[i];
      regions[i].location = locations[locations.size() == 1 ? 0 : i];
      regions[i].exported = exported;
    }
    Check(Run([&](ferry::Engine& e) {
      return e.RegisterMemory(std::span<const ferry::MemoryRegion>(regions));
    }));
  }

  void UnregisterMemory(uint64_t addr) {
    Check(Run([&](ferry::Engine& e) {
      return e.UnregisterMemory(reinterpret_cast<void*>(static_cast<uintptr_t>(addr)));
    }));
  }

  uint64_t OpenSegment(const std::string& peer_id) {
    return Unwrap(Run([&](ferry::Engine& e) { return e.OpenSegment(peer_id); })).value;
  }

  void CloseSegment(uint64_t segment) {
    Check(Run([&](ferry::Engine& e) { return e.CloseSegment(ferry::SegmentHandle{segment}); }));
  }

  py::dict QuerySegment(uint64_t segment) {
    ferry::SegmentInfo info = Unwrap(
        Run([&](ferry::Engine& e) { return e.QuerySegment(ferry::SegmentHandle{segment}); }));
    py::dict d;
    d["peer_id"] = info.peer_id;
    d["engine_name"] = LossyStr(info.engine_name);
    d["instance_id"] = info.instance_id;
    d["wire_version"] = info.wire_version;
    d["transport"] = info.transport;
    d["capabilities"] = CapabilitiesDict(info.capabilities);
    py::list regions;
    for (const ferry::RemoteRegion& r : info.regions) {
      regions.append(py::make_tuple(r.addr, r.length, r.location));
    }
    d["regions"] = regions;
    return d;
  }

  uint64_t AllocateBatch(uint64_t capacity) {
    return Unwrap(Run([&](ferry::Engine& e) { return e.AllocateBatch(capacity); })).value;
  }

  void Submit(uint64_t batch, const std::vector<int>& opcodes,
              const std::vector<uint64_t>& segments, const std::vector<uint64_t>& locals,
              const std::vector<uint64_t>& remotes, const std::vector<uint64_t>& lengths) {
    Check(Run([&](ferry::Engine& e) -> Status {
      FERRY_ASSIGN_OR_RETURN(std::vector<ferry::TransferRequest> requests,
                             BuildRequests(opcodes, segments, locals, remotes, lengths));
      return e.Submit(ferry::BatchId{batch}, requests);
    }));
  }

  // (state, submitted, completed, failed, first error or None)
  py::tuple BatchStatus(uint64_t batch) {
    ferry::BatchStatus s =
        Unwrap(Run([&](ferry::Engine& e) { return e.GetBatchStatus(ferry::BatchId{batch}); }));
    return py::make_tuple(static_cast<int>(s.state), s.submitted, s.completed, s.failed,
                          ErrorOrNone(s.first_error));
  }

  // [(state, error or None)] for every request submitted to the batch.
  py::list TransferStatuses(uint64_t batch) {
    std::vector<ferry::TransferStatus> statuses;
    Check(Run([&](ferry::Engine& e) -> Status {
      FERRY_ASSIGN_OR_RETURN(ferry::BatchStatus s, e.GetBatchStatus(ferry::BatchId{batch}));
      statuses.reserve(s.submitted);
      for (size_t i = 0; i < s.submitted; ++i) {
        FERRY_ASSIGN_OR_RETURN(ferry::TransferStatus t,
                               e.GetTransferStatus(ferry::BatchId{batch}, i));
        statuses.push_back(std::move(t));
      }
      return Status();
    }));
    py::list out;
    for (const ferry::TransferStatus& t : statuses) {
      out.append(py::make_tuple(static_cast<int>(t.state), ErrorOrNone(t.status)));
    }
    return out;
  }

  void WaitBatch(uint64_t batch, double timeout_s) {
    Check(Run([&](ferry::Engine& e) {
      return e.WaitBatch(ferry::BatchId{batch}, Millis(timeout_s));
    }));
  }

  void FreeBatch(uint64_t batch) {
    Check(Run([&](ferry::Engine& e) { return e.FreeBatch(ferry::BatchId{batch}); }));
  }

  void TransferSync(const std::vector<int>& opcodes, const std::vector<uint64_t>& segments,
                    const std::vector<uint64_t>& locals, const std::vector<uint64_t>& remotes,
                    const std::vector<uint64_t>& lengths) {
    Check(Run([&](ferry::Engine& e) -> Status {
      FERRY_ASSIGN_OR_RETURN(std::vector<ferry::TransferRequest> requests,
                             BuildRequests(opcodes, segments, locals, remotes, lengths));
      if (requests.size() == 1) return e.TransferSync(requests[0]);
      return e.TransferSync(std::span<const ferry::TransferRequest>(requests));
    }));
  }

  void SendNotification(uint64_t segment, const std::string& name, const std::string& message) {
    Check(Run([&](ferry::Engine& e) {
      return e.SendNotification(ferry::SegmentHandle{segment}, name, message);
    }));
  }

  // [(sender, name, message bytes)], oldest first.
  py::list GetNotifications() {
    std::vector<ferry::Notification> notes = Unwrap(
        Run([](ferry::Engine& e) -> StatusOr<std::vector<ferry::Notification>> {
          return e.GetNotifications();
        }));
    py::list out;
    for (const ferry::Notification& n : notes) {
      out.append(py::make_tuple(LossyStr(n.sender), LossyStr(n.name), py::bytes(n.message)));
    }
    return out;
  }

 private:
  static Status ClosedError() { return ferry::FailedPreconditionError("the engine is closed"); }

  std::atomic<bool> closing_{false};
  std::shared_mutex mu_;
  std::unique_ptr<ferry::Engine> engine_;  // null once closed; guarded by mu_
  std::string peer_id_;
  std::string local_name_;
  uint16_t rpc_port_ = 0;
};

// A contiguous view of any object with the buffer protocol.
struct BufferView {
  explicit BufferView(const py::object& obj, bool writable) {
    int flags = PyBUF_ANY_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view, flags) != 0) throw py::error_already_set();
  }
  ~BufferView() { PyBuffer_Release(&view); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  Py_buffer view{};
};

void* Address(uint64_t addr) { return reinterpret_cast<void*>(static_cast<uintptr_t>(addr)); }

// Copies below this size are not worth dropping the GIL for.
constexpr size_t kReleaseGilAbove = 64 * 1024;

}  // namespace

PYBIND11_MODULE(_ferry, m) {
  m.doc() = "Ferry's native layer; use the `ferry` package instead.";
  m.def("version", [] { return std::string(ferry::Version()); });
  m.attr("WIRE_VERSION_MIN") = ferry::kWireVersionMin;
  m.attr("WIRE_VERSION_MAX") = ferry::kWireVersionMax;

  // (address, nbytes) of a C- or F-contiguous buffer; raises BufferError.
  m.def(
      "buffer_address",
      [](const py::object& obj, bool writable) {
        BufferView b(obj, writable);
        return py::make_tuple(reinterpret_cast<uintptr_t>(b.view.buf),
                              static_cast<uint64_t>(b.view.len));
      },
      py::arg("obj"), py::arg("writable") = true);

  // memcpy(dest, src buffer, length) from Python memory into raw memory.
  m.def(
      "copy_from_buffer",
      [](uint64_t dest, const py::object& src, uint64_t length) {
        BufferView b(src, /*writable=*/false);
        if (length > static_cast<uint64_t>(b.view.len)) {
          Raise(ferry::InvalidArgumentError("length " + std::to_string(length) +
                                            " exceeds the source's " +
                                            std::to_string(b.view.len) + " bytes"));
        }
        if (dest == 0 && length > 0) Raise(ferry::InvalidArgumentError("null destination"));
        if (length > kReleaseGilAbove) {
          py::gil_scoped_release nogil;
          std::memcpy(Address(dest), b.view.buf, length);
        } else if (length > 0) {
          std::memcpy(Address(dest), b.view.buf, length);
        }
      },
      py::arg("dest"), py::arg("src"), py::arg("length"));

  // bytes(length) copied from raw memory.
  m.def(
      "read_bytes",
      [](uint64_t source, uint64_t length) {
        if (source == 0 && length > 0) Raise(ferry::InvalidArgumentError("null source"));
        PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(length));
        if (out == nullptr) throw py::error_already_set();
        py::bytes result = py::reinterpret_steal<py::bytes>(out);
        char* dst = PyBytes_AS_STRING(out);
        if (length > kReleaseGilAbove) {
          py::gil_scoped_release nogil;
          std::memcpy(dst, Address(source), length);
        } else if (length > 0) {
          std::memcpy(dst, Address(source), length);
        }
        return result;
      },
      py::arg("source"), py::arg("length"));

  py::class_<ferry::EngineOptions>(m, "EngineOptions")
      .def(py::init<>())
      .def("with_environment", &ferry::EngineOptions::WithEnvironment,
           "A copy with FERRY_* environment variables overlaid.")
      .def_readwrite("local_name", &ferry::EngineOptions::local_name)
      .def_readwrite("listen_host", &ferry::EngineOptions::listen_host)
      .def_readwrite("listen_port", &ferry::EngineOptions::listen_port)
      .def_readwrite("metadata", &ferry::EngineOptions::metadata)
      .def_property(
          "metadata_ttl",
          [](const ferry::EngineOptions& o) { return Seconds(o.metadata_ttl); },
          [](ferry::EngineOptions& o, double s) { o.metadata_ttl = Millis(s); })
      .def_readwrite("metadata_cluster", &ferry::EngineOptions::metadata_cluster)
      .def_readwrite("transport", &ferry::EngineOptions::transport)
      .def_readwrite("secret_file", &ferry::EngineOptions::secret_file,
                     "Path of the cluster secret file (FERRY_SECRET_FILE); empty = no secret.")
      .def_property(
          "connect_timeout",
          [](const ferry::EngineOptions& o) { return Seconds(o.connect_timeout); },
          [](ferry::EngineOptions& o, double s) { o.connect_timeout = Millis(s); })
      .def_property(
          "transfer_timeout",
          [](const ferry::EngineOptions& o) { return Seconds(o.transfer_timeout); },
          [](ferry::EngineOptions& o, double s) { o.transfer_timeout = Millis(s); })
      .def_property(
          "handshake_timeout",
          [](const ferry::EngineOptions& o) { return Seconds(o.handshake_timeout); },
          [](ferry::EngineOptions& o, double s) { o.handshake_timeout = Millis(s); })
      .def_readwrite("tcp_streams", &ferry::EngineOptions::tcp_streams)
      .def_readwrite("io_threads", &ferry::EngineOptions::io_threads)
      .def_readwrite("slice_size", &ferry::EngineOptions::slice_size)
      .def_readwrite("max_frame_bytes", &ferry::EngineOptions::max_frame_bytes)
      .def_readwrite("max_frame_entries", &ferry::EngineOptions::max_frame_entries)
      .def_readwrite("tcp_send_buffer", &ferry::EngineOptions::tcp_send_buffer)
      .def_property(
          "spin", [](const ferry::EngineOptions& o) { return Seconds(o.spin); },
          [](ferry::EngineOptions& o, double s) {
            o.spin = std::chrono::microseconds(
                s > 0 ? static_cast<int64_t>(std::llround(std::min(s, 1e6) * 1e6)) : 0);
          })
      .def_property(
          "wait_spin", [](const ferry::EngineOptions& o) { return Seconds(o.wait_spin); },
          [](ferry::EngineOptions& o, double s) {
            o.wait_spin = std::chrono::microseconds(
                s > 0 ? static_cast<int64_t>(std::llround(std::min(s, 1e6) * 1e6)) : 0);
          })
      .def_property(
          "testing_wire_version_min",
          [](const ferry::EngineOptions& o) { return o.testing.wire_version_min; },
          [](ferry::EngineOptions& o, uint16_t v) { o.testing.wire_version_min = v; })
      .def_property(
          "testing_wire_version_max",
          [](const ferry::EngineOptions& o) { return o.testing.wire_version_max; },
          [](ferry::EngineOptions& o, uint16_t v) { o.testing.wire_version_max = v; });

  py::class_<NativeEngine>(m, "NativeEngine")
      .def(py::init<ferry::EngineOptions>(), py::arg("options"))
      .def("close", &NativeEngine::Close)
      .def_property_readonly("closed", &NativeEngine::closed)
      .def_property_readonly("peer_id", &NativeEngine::peer_id)
      .def_property_readonly("local_name", &NativeEngine::local_name)
      .def_property_readonly("rpc_port", &NativeEngine::rpc_port)
      .def("capabilities", &NativeEngine::Capabilities)
      .def("options", &NativeEngine::Options)
      .def("register_memory", &NativeEngine::RegisterMemory, py::arg("addr"), py::arg("length"),
           py::arg("location") = "*", py::arg("exported") = true)
      .def("register_memory_list", &NativeEngine::RegisterMemoryList, py::arg("addrs"), py::arg("lengths"),
           py::arg("locations"), py::arg("exported") = true)
      .def("unregister_memory", &NativeEngine::UnregisterMemory)
      .def("open_segment", &NativeEngine::OpenSegment)
      .def("close_segment", &NativeEngine::CloseSegment)
      .def("query_segment", &NativeEngine::QuerySegment)
      .def("allocate_batch", &NativeEngine::AllocateBatch)
      .def("submit", &NativeEngine::Submit)
      .def("batch_status", &NativeEngine::BatchStatus)
      .def("transfer_statuses", &NativeEngine::TransferStatuses)
      .def("wait_batch", &NativeEngine::WaitBatch)
      .def("free_batch", &NativeEngine::FreeBatch)
      .def("transfer_sync", &NativeEngine::TransferSync)
      .def("send_notification", &NativeEngine::SendNotification)
      .def("get_notifications", &NativeEngine::GetNotifications);
}
