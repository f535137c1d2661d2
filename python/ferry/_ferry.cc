// _ferry: the thin pybind11 layer between Python and the C++ API.
//
// Everything here maps one Python call onto one ferry::Engine call: arguments
// are converted, the GIL is released around the call, and a non-OK Status is
// raised as the matching ferry.FerryError subclass (the classes and the
// code -> class table live in ferry/_errors.py). Object handling (buffers,
// tensors, keep-alive), defaults and the Mooncake and NIXL shims are in
// Python. The exception: prepared lists' rows and indices are read here
// straight from the array's buffer (numpy), without a Python object per row.
//
// Thread safety: a NativeEngine may be used from any number of Python threads.
// Calls hold a shared lock on the engine; close() takes it exclusively, so it
// waits for calls in progress (each ends at the latest at its timeout, a
// Python-level wait loops in short steps) and later calls fail with
// FailedPrecondition instead of touching a freed engine.

#include <fcntl.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
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

// What the status calls (batch_status, transfer_state) wait while work is
// in flight and the caller polls them in a tight loop (Engine::PollBatch; a
// call that is not part of a tight loop reports at once). Callers spin on
// those (NIXL's check_xfer_state, Mooncake's transfer_check_status), and a
// loop that never leaves the core starves the engine's own threads of it on
// a small machine. The wait ends as soon as any of the engine's work
// finished, so a caller polling several transfers in turn still gets round
// at once; 1 ms rather than 50 us took NIXL's tcp rows of
// tools/dropin_bench.py from 4.2-6.1 to 5.0-7.3 GB/s on 2 cores.
constexpr std::chrono::microseconds kPollWait{1000};

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
StatusOr<std::vector<ferry::TransferRequest>> BuildRequests(const std::vector<int>& opcodes,
                                                            const std::vector<uint64_t>& segments,
                                                            const std::vector<uint64_t>& locals,
                                                            const std::vector<uint64_t>& remotes,
                                                            const std::vector<uint64_t>& lengths) {
  const size_t n = locals.size();
  if (remotes.size() != n || lengths.size() != n) {
    return ferry::InvalidArgumentError("request lists differ in length: " + std::to_string(n) +
                                       " local addresses, " + std::to_string(remotes.size()) +
                                       " remote addresses, " + std::to_string(lengths.size()) +
                                       " lengths");
  }
  auto broadcast_ok = [n](size_t size) { return size == 1 || size == n; };
  if (!broadcast_ok(opcodes.size()) || !broadcast_ok(segments.size())) {
    return ferry::InvalidArgumentError(
        "expected 1 or " + std::to_string(n) + " opcodes and segments, got " +
        std::to_string(opcodes.size()) + " and " + std::to_string(segments.size()));
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

// ---- Row and index arrays ----------------------------------------------------
// Prepared lists take rows and indices as buffers (numpy arrays) read here in
// C++, without a Python object per row, or as sequences of ints / tuples.

// One integer element of a buffer: how to read it.
struct IntFormat {
  size_t size = 0;  // 1, 2, 4 or 8 bytes
  bool is_signed = false;
};

// The integer format of a buffer (struct-module format, native byte order),
// or nullopt for anything else (floats, big-endian, records).
std::optional<IntFormat> ParseIntFormat(const char* format, Py_ssize_t itemsize) {
  std::string_view f = format == nullptr ? "B" : format;
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.remove_prefix(1);
  if (f.size() != 1) return std::nullopt;
  IntFormat out;
  switch (f[0]) {
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      out.is_signed = true;
      break;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
      out.is_signed = false;
      break;
    default:
      return std::nullopt;
  }
  if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) return std::nullopt;
  out.size = static_cast<size_t>(itemsize);
  return out;
}

// Reads element `p` as a signed (negative values stay negative) or unsigned value.
struct IntValue {
  uint64_t value = 0;
  bool negative = false;
};

template <typename T>
IntValue ReadAs(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof x);
  IntValue v;
  if constexpr (std::is_signed_v<T>) {
    v.negative = x < 0;
    v.value = static_cast<uint64_t>(static_cast<int64_t>(x));
  } else {
    v.value = static_cast<uint64_t>(x);
  }
  return v;
}

inline IntValue ReadInt(const char* p, IntFormat f) {
  switch (f.size) {
    case 1:
      return f.is_signed ? ReadAs<int8_t>(p) : ReadAs<uint8_t>(p);
    case 2:
      return f.is_signed ? ReadAs<int16_t>(p) : ReadAs<uint16_t>(p);
    case 4:
      return f.is_signed ? ReadAs<int32_t>(p) : ReadAs<uint32_t>(p);
    default:
      return f.is_signed ? ReadAs<int64_t>(p) : ReadAs<uint64_t>(p);
  }
}

// A strided view of an integer buffer (1-D or 2-D), held while it is read.
class IntBuffer {
 public:
  // Returns false (and sets no Python error) if `obj` has no buffer.
  bool Open(const py::handle& obj) {
    if (!PyObject_CheckBuffer(obj.ptr())) return false;
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_RECORDS_RO) != 0) {
      PyErr_Clear();
      return false;
    }
    open_ = true;
    return true;
  }
  ~IntBuffer() {
    if (open_) PyBuffer_Release(&view_);
  }
  const Py_buffer& view() const { return view_; }

 private:
  Py_buffer view_{};
  bool open_ = false;
};

std::string Describe(const Py_buffer& v) {
  std::string shape = "(";
  for (int i = 0; i < v.ndim; ++i) shape += (i ? ", " : "") + std::to_string(v.shape[i]);
  if (v.ndim == 1) shape += ",";
  shape += ")";
  return "an array of shape " + shape + " and format '" + (v.format ? v.format : "B") + "'";
}

// Column layouts of a row array: 2 (addr, len), 3 (addr, len, dev),
// 4 (addr, len, stride, count), 5 (addr, len, dev, stride, count).
Status RowFromValues(const uint64_t* v, size_t columns, ferry::DescRow* row) {
  row->addr = v[0];
  row->length = v[1];
  row->stride = 0;
  row->count = 1;
  if (columns == 4) {
    row->stride = v[2];
    row->count = v[3];
  } else if (columns == 5) {
    row->stride = v[3];
    row->count = v[4];
  }
  return Status();
}

Status ColumnsError(size_t columns, const std::string& what) {
  return ferry::InvalidArgumentError(
      what + " has " + std::to_string(columns) +
      " columns; expected 2 (addr, len), 3 (addr, len, dev), 4 (addr, len, stride, count) or 5 "
      "(addr, len, dev, stride, count)");
}

// Rows of a 2-D integer buffer; runs without the GIL (the buffer export
// keeps the memory in place).
StatusOr<std::vector<ferry::DescRow>> RowsFromBuffer(const Py_buffer& v) {
  std::optional<IntFormat> f = ParseIntFormat(v.format, v.itemsize);
  if (!f || v.ndim != 2) {
    return ferry::InvalidArgumentError("rows must be an (N, 2..5) integer array, got " +
                                       Describe(v));
  }
  const size_t n = static_cast<size_t>(v.shape[0]);
  const size_t columns = static_cast<size_t>(v.shape[1]);
  if (columns < 2 || columns > 5) return ColumnsError(columns, "the row array");
  const Py_ssize_t rs = v.strides[0], cs = v.strides[1];
  const char* base = static_cast<const char*>(v.buf);
  std::vector<ferry::DescRow> rows;
  rows.reserve(n);  // one pass over the rows' memory: no value-initialization first
  if (f->size == 8 && !f->is_signed && cs == 8 && (columns == 2 || columns == 3)) {
    for (size_t i = 0; i < n; ++i) {  // the common case: (N, 2 or 3) uint64
      uint64_t v2[2];
      std::memcpy(v2, base + static_cast<Py_ssize_t>(i) * rs, sizeof v2);
      rows.push_back(ferry::DescRow{v2[0], v2[1], 0, 1});
    }
    return rows;
  }
  const bool fast = f->size == 8 && !f->is_signed && cs == 8;
  uint64_t values[5];
  for (size_t i = 0; i < n; ++i) {
    const char* p = base + static_cast<Py_ssize_t>(i) * rs;
    rows.emplace_back();
    if (fast) {
      std::memcpy(values, p, columns * 8);
    } else {
      for (size_t c = 0; c < columns; ++c) {
        IntValue x = ReadInt(p + static_cast<Py_ssize_t>(c) * cs, *f);
        if (x.negative) {
          return ferry::InvalidArgumentError("row " + std::to_string(i) + ", column " +
                                             std::to_string(c) + ": negative value " +
                                             std::to_string(static_cast<int64_t>(x.value)));
        }
        values[c] = x.value;
      }
    }
    FERRY_RETURN_IF_ERROR(RowFromValues(values, columns, &rows.back()));
  }
  return rows;
}

// An int of a Python sequence element; InvalidArgument names `what`.
StatusOr<uint64_t> NonNegativeInt(PyObject* o, const std::string& what) {
  PyObject* index = PyNumber_Index(o);
  if (index == nullptr) {
    PyErr_Clear();
    return ferry::InvalidArgumentError(what + " is not an integer (" + Py_TYPE(o)->tp_name + ")");
  }
  int overflow = 0;
  long long s = PyLong_AsLongLongAndOverflow(index, &overflow);
  uint64_t value = 0;
  if (overflow > 0) {
    value = PyLong_AsUnsignedLongLong(index);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      Py_DECREF(index);
      return ferry::InvalidArgumentError(what + " does not fit in 64 bits");
    }
  } else if (overflow < 0 || s < 0) {
    Py_DECREF(index);
    return ferry::InvalidArgumentError(what + " is negative");
  } else {
    value = static_cast<uint64_t>(s);
  }
  Py_DECREF(index);
  return value;
}

// Rows of a sequence of tuples (2..5 ints each, as for arrays). Needs the GIL.
StatusOr<std::vector<ferry::DescRow>> RowsFromSequence(const py::handle& obj) {
  PyObject* seq =
      PySequence_Fast(obj.ptr(), "rows must be an integer array or a sequence of tuples");
  if (seq == nullptr) {
    PyErr_Clear();
    return ferry::InvalidArgumentError(std::string("rows must be an (N, 2..5) integer array or a "
                                                   "sequence of tuples, got ") +
                                       Py_TYPE(obj.ptr())->tp_name);
  }
  py::object keep = py::reinterpret_steal<py::object>(seq);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  std::vector<ferry::DescRow> rows(static_cast<size_t>(n));
  uint64_t values[5];
  for (Py_ssize_t i = 0; i < n; ++i) {
    const std::string row_name = "row " + std::to_string(i);
    PyObject* row = PySequence_Fast(items[i], "");
    if (row == nullptr) {
      PyErr_Clear();
      return ferry::InvalidArgumentError(row_name + " is not a tuple (" +
                                         Py_TYPE(items[i])->tp_name + ")");
    }
    py::object keep_row = py::reinterpret_steal<py::object>(row);
    const size_t columns = static_cast<size_t>(PySequence_Fast_GET_SIZE(row));
    if (columns < 2 || columns > 5) return ColumnsError(columns, row_name);
    PyObject** cells = PySequence_Fast_ITEMS(row);
    for (size_t c = 0; c < columns; ++c) {
      FERRY_ASSIGN_OR_RETURN(values[c],
                             NonNegativeInt(cells[c], row_name + ", column " + std::to_string(c)));
    }
    FERRY_RETURN_IF_ERROR(RowFromValues(values, columns, &rows[static_cast<size_t>(i)]));
  }
  return rows;
}

// Indices into a prepared list: a 1-D integer buffer or a sequence of ints,
// each in [0, 2^32 - 1]. `side` ("local", "remote") names them in errors.
StatusOr<std::vector<uint32_t>> IndicesFromBuffer(const Py_buffer& v, const char* side) {
  std::optional<IntFormat> f = ParseIntFormat(v.format, v.itemsize);
  if (!f || v.ndim != 1) {
    return ferry::InvalidArgumentError(
        std::string(side) + " indices must be a 1-D integer array or a list, got " + Describe(v));
  }
  const size_t n = static_cast<size_t>(v.shape[0]);
  const Py_ssize_t stride = v.strides[0];
  const char* base = static_cast<const char*>(v.buf);
  std::vector<uint32_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    IntValue x = ReadInt(base + static_cast<Py_ssize_t>(i) * stride, *f);
    if (x.negative || x.value > UINT32_MAX) {
      return ferry::InvalidArgumentError(
          std::string(side) + " index at position " + std::to_string(i) + " is " +
          (x.negative ? std::to_string(static_cast<int64_t>(x.value)) : std::to_string(x.value)) +
          ": indices must be in [0, 4294967295]");
    }
    out[i] = static_cast<uint32_t>(x.value);
  }
  return out;
}

StatusOr<std::vector<uint32_t>> IndicesFromSequence(const py::handle& obj, const char* side) {
  PyObject* seq = PySequence_Fast(obj.ptr(), "");
  if (seq == nullptr) {
    PyErr_Clear();
    return ferry::InvalidArgumentError(std::string(side) +
                                       " indices must be a 1-D integer array or a list, got " +
                                       Py_TYPE(obj.ptr())->tp_name);
  }
  py::object keep = py::reinterpret_steal<py::object>(seq);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  std::vector<uint32_t> out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const std::string what = std::string(side) + " index at position " + std::to_string(i);
    PyObject* index = PyNumber_Index(items[i]);
    if (index == nullptr) {
      PyErr_Clear();
      return ferry::InvalidArgumentError(what + " is not an integer (" +
                                         Py_TYPE(items[i])->tp_name + ")");
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(index, &overflow);
    Py_DECREF(index);
    if (overflow != 0 || value < 0 || value > static_cast<long long>(UINT32_MAX)) {
      return ferry::InvalidArgumentError(
          what + " is " +
          (overflow != 0 ? std::string(overflow > 0 ? "too large" : "too small")
                         : std::to_string(value)) +
          ": indices must be in [0, 4294967295]");
    }
    out[static_cast<size_t>(i)] = static_cast<uint32_t>(value);
  }
  return out;
}

StatusOr<std::vector<uint32_t>> Indices(const py::handle& obj, const char* side) {
  IntBuffer buffer;
  if (buffer.Open(obj)) return IndicesFromBuffer(buffer.view(), side);
  return IndicesFromSequence(obj, side);
}

// None, or (name, message bytes/str): a prepared transfer's notification.
std::optional<ferry::Notification> NotificationArg(const py::object& obj) {
  if (obj.is_none()) return std::nullopt;
  py::tuple t;
  try {
    t = obj.cast<py::tuple>();
  } catch (const py::cast_error&) {
    Raise(ferry::InvalidArgumentError("a notification is None or (name, message)"));
  }
  if (t.size() != 2)
    Raise(ferry::InvalidArgumentError("a notification is None or (name, message)"));
  ferry::Notification n;
  n.name = t[0].cast<std::string>();
  py::object message = t[1];
  if (PyUnicode_Check(message.ptr())) {
    n.message = message.cast<std::string>();
  } else {
    BufferView b(message, /*writable=*/false);
    n.message.assign(static_cast<const char*>(b.view.buf), static_cast<size_t>(b.view.len));
  }
  return n;
}

py::dict HistogramDict(const ferry::LatencyHistogram& h) {
  py::dict d;
  d["bounds_us"] = h.bounds_us;
  d["counts"] = h.counts;
  d["count"] = h.count;
  d["sum_us"] = h.sum_us;
  return d;
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
    return CapabilitiesDict(Unwrap(Run(
        [](ferry::Engine& e) -> StatusOr<ferry::Capabilities> { return e.GetCapabilities(); })));
  }

  ferry::EngineOptions Options() {
    return Unwrap(
        Run([](ferry::Engine& e) -> StatusOr<ferry::EngineOptions> { return e.options(); }));
  }

  // `fd` >= 0: the memfd the range is a MAP_SHARED mapping of, at file
  // offset `fd_offset` (MemoryRegion::fd; the engine keeps a duplicate).
  void RegisterMemory(uint64_t addr, uint64_t length, const std::string& location, bool exported,
                      int fd, uint64_t fd_offset) {
    ferry::MemoryRegion r{reinterpret_cast<void*>(static_cast<uintptr_t>(addr)), length, location,
                          exported};
    r.fd = fd;
    r.fd_offset = fd_offset;
    Check(Run([&](ferry::Engine& e) {
      return e.RegisterMemory(std::span<const ferry::MemoryRegion>(&r, 1));
    }));
  }

  // Engine::AllocateShared: the address of `length` bytes of registered
  // host memory same-host peers can map.
  uint64_t AllocateShared(uint64_t length, const std::string& location, bool exported) {
    void* addr =
        Unwrap(Run([&](ferry::Engine& e) { return e.AllocateShared(length, location, exported); }));
    return reinterpret_cast<uintptr_t>(addr);
  }

  void FreeShared(uint64_t addr) {
    Check(Run([&](ferry::Engine& e) {
      return e.FreeShared(reinterpret_cast<void*>(static_cast<uintptr_t>(addr)));
    }));
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

  // A range of a file (Engine::RegisterFile): `path`, or `fd` >= 0; its
  // base address.
  uint64_t RegisterFile(const std::string& path, int fd, uint64_t offset, uint64_t length,
                        bool writable, bool durable, bool direct, bool exported) {
    ferry::FileRegion r;
    r.path = path;
    r.fd = fd;
    r.offset = offset;
    r.length = length;
    r.writable = writable;
    r.durable = durable;
    r.direct = direct;
    r.exported = exported;
    void* base = Unwrap(Run([&](ferry::Engine& e) { return e.RegisterFile(r); }));
    return reinterpret_cast<uintptr_t>(base);
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
      regions.append(py::make_tuple(r.addr, r.length, r.location, r.kind));
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

  // A batch check_batches reports: it ended (or its id is not allocated).
  struct Ended {
    size_t index;
    ferry::BatchStatus status;
    bool freed;
  };
  // The batch's end after Engine::SpinBatch(`spin`), freed if `owned`; none
  // while it is pending. Under Run (the GIL released).
  static std::optional<Ended> CheckOne(ferry::Engine& e, uint64_t id, bool owned,
                                       std::chrono::microseconds spin) {
    StatusOr<ferry::BatchStatus> s = e.SpinBatch(ferry::BatchId{id}, spin);
    if (!s.ok()) {
      ferry::BatchStatus gone;
      gone.state = ferry::TransferState::kFailed;
      gone.first_error = s.status();
      return Ended{0, std::move(gone), false};
    }
    if (s->state == ferry::TransferState::kPending) return std::nullopt;
    const bool freed = owned && e.FreeBatch(ferry::BatchId{id}).ok();
    return Ended{0, *std::move(s), freed};
  }
  static py::tuple EndedTuple(const Ended& x) {
    return py::make_tuple(x.index, static_cast<int>(x.status.state),
                          ErrorOrNone(x.status.first_error), x.freed);
  }

  // A new batch holding one request, submitted. The batch is freed again if
  // the submit fails (nothing was submitted). With `spin`, then waits for it
  // as Engine::SpinBatch does for the options' await_spin (never blocking).
  // Returns (id, entry): entry as check_batches gives it, (0, state, error,
  // freed), once the batch ended -- then also freed -- else None. One call
  // and one GIL release for what AllocateBatch, Submit and the first check
  // do in three: the awaited single transfers of ferry.aio pay per call.
  py::tuple SubmitOne(int opcode, uint64_t segment, uint64_t local, uint64_t remote,
                      uint64_t length, bool spin) {
    std::optional<Ended> ended;
    const uint64_t id = Unwrap(Run([&](ferry::Engine& e) -> StatusOr<uint64_t> {
      FERRY_ASSIGN_OR_RETURN(std::vector<ferry::TransferRequest> requests,
                             BuildRequests({opcode}, {segment}, {local}, {remote}, {length}));
      FERRY_ASSIGN_OR_RETURN(ferry::BatchId batch, e.AllocateBatch(1));
      Status submitted = e.Submit(batch, requests);
      if (!submitted.ok()) {
        (void)e.FreeBatch(batch);  // nothing was submitted: it is idle
        return submitted;
      }
      ended = CheckOne(e, batch.value, /*owned=*/true,
                       spin ? e.options().await_spin : std::chrono::microseconds(0));
      return batch.value;
    }));
    return py::make_tuple(id, ended ? EndedTuple(*ended) : py::object(py::none()));
  }

  // Engine::SpinBatch for the options' await_spin, then check_batches for
  // this one batch: its entry once it ended (freed if `owned`), else None.
  py::object SpinBatch(uint64_t id, bool owned) {
    std::optional<Ended> ended;
    Check(Run([&](ferry::Engine& e) -> Status {
      ended = CheckOne(e, id, owned, e.options().await_spin);
      return Status();
    }));
    return ended ? EndedTuple(*ended) : py::object(py::none());
  }

  // The batches of `ids` that are no longer pending, reported at once:
  // [(index into ids, state, first error or None, freed)]. Those with
  // `owned[i]` set are also freed once they ended (freed: the id is spent),
  // for a caller that owns the batch and only waits for its end (ferry.aio's
  // single transfers: one call where BatchStatus and FreeBatch are two).
  // Only the state decides: a batch whose counts are complete is still
  // kPending while its last completer finishes its step, and stays
  // allocated until a later call (the engine's completion descriptor is
  // written after that). An id not allocated (freed, stale) is reported
  // kFailed with that error. One call for all of an event loop's waiters:
  // a wake-up that finds one of many finished costs one call, not one each.
  py::list CheckBatches(const std::vector<uint64_t>& ids, const std::vector<bool>& owned) {
    if (owned.size() != ids.size()) {
      Raise(ferry::InvalidArgumentError(std::to_string(ids.size()) + " batch ids but " +
                                        std::to_string(owned.size()) + " owned flags"));
    }
    std::vector<Ended> ended;
    Check(Run([&](ferry::Engine& e) -> Status {
      for (size_t i = 0; i < ids.size(); ++i) {
        std::optional<Ended> x = CheckOne(e, ids[i], owned[i], std::chrono::microseconds(0));
        if (!x) continue;
        x->index = i;
        ended.push_back(*std::move(x));
      }
      return Status();
    }));
    py::list out;
    for (const Ended& x : ended) out.append(EndedTuple(x));
    return out;
  }

  // (state, submitted, completed, failed, first error or None)
  // wait_us: how long to wait for pending requests first (Engine::PollBatch).
  py::tuple BatchStatus(uint64_t batch, int64_t wait_us) {
    ferry::BatchStatus s = Unwrap(Run([&](ferry::Engine& e) {
      return e.PollBatch(ferry::BatchId{batch},
                         std::chrono::microseconds(std::max<int64_t>(0, wait_us)));
    }));
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
    Check(Run(
        [&](ferry::Engine& e) { return e.WaitBatch(ferry::BatchId{batch}, Millis(timeout_s)); }));
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
    std::vector<ferry::Notification> notes =
        Unwrap(Run([](ferry::Engine& e) -> StatusOr<std::vector<ferry::Notification>> {
          return e.GetNotifications();
        }));
    py::list out;
    for (const ferry::Notification& n : notes) {
      out.append(py::make_tuple(LossyStr(n.sender), LossyStr(n.name), py::bytes(n.message)));
    }
    return out;
  }

  // ---- Prepared transfers ------------------------------------------------------
  // (handle, entries) of a list of rows (see RowsFromBuffer); `segment` None:
  // a local list, else the segment handle of a remote one.
  py::tuple PrepareList(const py::object& rows, const std::optional<uint64_t>& segment) {
    IntBuffer buffer;
    std::vector<ferry::DescRow> from_sequence;
    const bool is_buffer = buffer.Open(rows);
    if (!is_buffer) from_sequence = Unwrap(RowsFromSequence(rows));
    uint64_t entries = 0;
    ferry::DescListHandle list =
        Unwrap(Run([&](ferry::Engine& e) -> StatusOr<ferry::DescListHandle> {
          std::vector<ferry::DescRow> from_buffer;
          if (is_buffer) {
            FERRY_ASSIGN_OR_RETURN(from_buffer, RowsFromBuffer(buffer.view()));
          }
          std::span<const ferry::DescRow> span(is_buffer ? from_buffer : from_sequence);
          StatusOr<ferry::DescListHandle> h =
              segment.has_value() ? e.PrepareRemoteList(ferry::SegmentHandle{*segment}, span)
                                  : e.PrepareLocalList(span);
          if (!h.ok()) return h.status();
          StatusOr<size_t> n = e.DescListEntries(*h);
          if (!n.ok()) {
            (void)e.ReleaseDescList(*h);
            return n.status();
          }
          entries = *n;
          return *h;
        }));
    return py::make_tuple(list.value, entries);
  }

  uint64_t DescListEntries(uint64_t list) {
    return Unwrap(
        Run([&](ferry::Engine& e) { return e.DescListEntries(ferry::DescListHandle{list}); }));
  }

  void ReleaseDescList(uint64_t list) {
    Check(Run([&](ferry::Engine& e) { return e.ReleaseDescList(ferry::DescListHandle{list}); }));
  }

  uint64_t MakeTransfer(int opcode, uint64_t local, const py::object& local_indices,
                        uint64_t remote, const py::object& remote_indices,
                        const py::object& notification) {
    if (opcode != static_cast<int>(ferry::Opcode::kRead) &&
        opcode != static_cast<int>(ferry::Opcode::kWrite)) {
      Raise(ferry::InvalidArgumentError("unknown opcode " + std::to_string(opcode)));
    }
    std::vector<uint32_t> li = Unwrap(Indices(local_indices, "local"));
    std::vector<uint32_t> ri = Unwrap(Indices(remote_indices, "remote"));
    std::optional<ferry::Notification> note = NotificationArg(notification);
    return Unwrap(Run([&](ferry::Engine& e) {
             return e.MakeTransfer(static_cast<ferry::Opcode>(opcode), ferry::DescListHandle{local},
                                   li, ferry::DescListHandle{remote}, ri, std::move(note));
           }))
        .value;
  }

  void PostTransfer(uint64_t transfer, const py::object& notification) {
    std::optional<ferry::Notification> note = NotificationArg(notification);
    Check(Run([&](ferry::Engine& e) {
      return e.PostTransfer(ferry::TransferHandle{transfer}, std::move(note));
    }));
  }

  // (state, error or None); wait_us as for BatchStatus (Engine::PollTransfer).
  py::tuple TransferState(uint64_t transfer, int64_t wait_us) {
    ferry::TransferStatus s = Unwrap(Run([&](ferry::Engine& e) {
      return e.PollTransfer(ferry::TransferHandle{transfer},
                            std::chrono::microseconds(std::max<int64_t>(0, wait_us)));
    }));
    return py::make_tuple(static_cast<int>(s.state), ErrorOrNone(s.status));
  }

  // (state, error or None) after Engine::SpinTransfer for the options' await_spin.
  py::tuple SpinTransfer(uint64_t transfer) {
    ferry::TransferStatus s = Unwrap(Run([&](ferry::Engine& e) {
      return e.SpinTransfer(ferry::TransferHandle{transfer}, e.options().await_spin);
    }));
    return py::make_tuple(static_cast<int>(s.state), ErrorOrNone(s.status));
  }

  void WaitTransfer(uint64_t transfer, double timeout_s) {
    Check(Run([&](ferry::Engine& e) {
      return e.WaitTransfer(ferry::TransferHandle{transfer}, Millis(timeout_s));
    }));
  }

  // (start_us, post_us, transfer_us, bytes, entries)
  py::tuple TransferTelemetry(uint64_t transfer) {
    ferry::TransferTelemetry t = Unwrap(Run(
        [&](ferry::Engine& e) { return e.GetTransferTelemetry(ferry::TransferHandle{transfer}); }));
    return py::make_tuple(t.start_us, t.post_us, t.transfer_us, t.bytes, t.entries);
  }

  void CancelTransfer(uint64_t transfer) {
    Check(Run([&](ferry::Engine& e) { return e.CancelTransfer(ferry::TransferHandle{transfer}); }));
  }

  void ReleaseTransfer(uint64_t transfer) {
    Check(
        Run([&](ferry::Engine& e) { return e.ReleaseTransfer(ferry::TransferHandle{transfer}); }));
  }

  void CancelBatch(uint64_t batch) {
    Check(Run([&](ferry::Engine& e) { return e.CancelBatch(ferry::BatchId{batch}); }));
  }

  // ---- Agent metadata ------------------------------------------------------------
  py::bytes ExportMetadata() {
    std::string bytes =
        Unwrap(Run([](ferry::Engine& e) -> StatusOr<std::string> { return e.ExportMetadata(); }));
    return py::bytes(bytes);
  }

  uint64_t ImportMetadata(const py::object& metadata) {
    BufferView b(metadata, /*writable=*/false);
    std::string_view bytes(static_cast<const char*>(b.view.buf), static_cast<size_t>(b.view.len));
    return Unwrap(Run([&](ferry::Engine& e) { return e.ImportMetadata(bytes); })).value;
  }

  // The peer id of a segment handle (what the last handshake or import
  // said; no round trip).
  std::string SegmentPeerId(uint64_t segment) {
    return Unwrap(Run([&](ferry::Engine& e) -> StatusOr<std::string> {
      FERRY_ASSIGN_OR_RETURN(ferry::SegmentInfo info,
                             e.DescribeSegment(ferry::SegmentHandle{segment}));
      return info.peer_id;
    }));
  }

  // ---- Telemetry -----------------------------------------------------------------
  py::dict Metrics() {
    ferry::EngineMetrics m = Unwrap(
        Run([](ferry::Engine& e) -> StatusOr<ferry::EngineMetrics> { return e.GetMetrics(); }));
    py::list routes;
    for (const ferry::RouteMetrics& r : m.routes) {
      py::dict d;
      d["peer"] = r.peer;
      d["transport"] = r.transport;
      d["opcode"] = r.opcode == ferry::Opcode::kRead ? "read" : "write";
      d["requests_completed"] = r.requests_completed;
      d["requests_failed"] = r.requests_failed;
      d["bytes_completed"] = r.bytes_completed;
      d["bytes_failed"] = r.bytes_failed;
      routes.append(d);
    }
    py::dict counters;
    counters["batches_finished"] = m.batches_finished;
    counters["batches_open"] = m.batches_open;
    counters["notifications_sent"] = m.notifications_sent;
    counters["notifications_received"] = m.notifications_received;
    counters["cancelled_requests"] = m.cancelled_requests;
    // Peer links (docs/architecture.md, "Peer links").
    counters["peer_links_open"] = m.peer_links_open;
    counters["links_opened"] = m.links_opened;
    counters["links_closed_idle"] = m.links_closed_idle;
    counters["links_evicted"] = m.links_evicted;
    counters["file_direct_ops"] = m.file_direct_ops;
    counters["target_staging_bytes"] = m.target_staging_bytes;
    counters["target_staging_bytes_peak"] = m.target_staging_bytes_peak;
    counters["file_direct_bytes"] = m.file_direct_bytes;
    counters["file_buffered_ops"] = m.file_buffered_ops;
    counters["file_buffered_bytes"] = m.file_buffered_bytes;
    py::dict out;
    out["routes"] = routes;
    out["transfer_latency"] = HistogramDict(m.transfer_latency);
    out["counters"] = counters;
    return out;
  }

  std::string MetricsText() {
    return Unwrap(Run([](ferry::Engine& e) -> StatusOr<std::string> { return e.MetricsText(); }));
  }

  std::string MetricsAddress() {
    return Unwrap(
        Run([](ferry::Engine& e) -> StatusOr<std::string> { return e.MetricsAddress(); }));
  }

  // ---- Event loops (ferry.aio) ---------------------------------------------------
  // The engine's completion eventfd (Engine::CompletionFd; arms the signal
  // on the first call): owned by the engine and closed with it. With `dup`,
  // a duplicate (close-on-exec) that the caller owns and closes, made while
  // the engine is pinned, so it can never be some other, reused descriptor.
  int CompletionFd(bool dup) {
    return Unwrap(Run([dup](ferry::Engine& e) -> StatusOr<int> {
      const int fd = e.CompletionFd();
      if (!dup) return fd;
      const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
      if (copy < 0) {
        return ferry::ResourceExhaustedError(
            std::string("cannot duplicate the completion descriptor: ") + std::strerror(errno));
      }
      return copy;
    }));
  }

  // ([batch ids], [transfer handles], overflowed): Engine::TakeFinished.
  py::tuple TakeFinished() {
    ferry::FinishedWork done = Unwrap(
        Run([](ferry::Engine& e) -> StatusOr<ferry::FinishedWork> { return e.TakeFinished(); }));
    py::list batches(done.batches.size()), transfers(done.transfers.size());
    for (size_t i = 0; i < done.batches.size(); ++i) batches[i] = py::int_(done.batches[i].value);
    for (size_t i = 0; i < done.transfers.size(); ++i) {
      transfers[i] = py::int_(done.transfers[i].value);
    }
    return py::make_tuple(batches, transfers, done.overflowed);
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

void* Address(uint64_t addr) { return reinterpret_cast<void*>(static_cast<uintptr_t>(addr)); }

// ---- Bulk request columns ------------------------------------------------------
// transfer_sync_columns / submit_columns: one opcode and one segment for the
// whole batch, and three columns (local addresses, remote addresses,
// lengths), each a 1-D integer array or a sequence of ints. The requests are
// built in one pass over the columns, with no per-element Python object
// (Mooncake's batch calls and ferry.Engine's *_many / *_async hand their
// lists straight here). As with the list arguments of transfer_sync, an
// element that is not a non-negative 64-bit integer raises TypeError.

// An int as 64 bits (-1 with an exception set when negative or too large).
// PyLong_AsUnsignedLong, not ...LongLong: up to Python 3.11 the latter goes
// through _PyLong_AsByteArray for every int above 2^30 (every address), which
// was 11 % of a Mooncake batch of 8,192 2 KiB writes over mapped memory.
static_assert(sizeof(unsigned long) == sizeof(uint64_t), "LP64 only");
inline unsigned long AsU64(PyObject* o) { return PyLong_AsUnsignedLong(o); }

// One column, open for reading (a buffer export or the sequence's items).
class RequestColumn {
 public:
  RequestColumn(const py::handle& obj, const char* name) : name_(name) {
    PyObject* o = obj.ptr();
    if (PyUnicode_Check(o) || PyBytes_Check(o) || PyByteArray_Check(o)) {
      throw py::type_error(std::string(name) +
                           " must be a 1-D integer array or a sequence of "
                           "ints, got " +
                           Py_TYPE(o)->tp_name);
    }
    if (buffer_.Open(obj)) {
      const Py_buffer& v = buffer_.view();
      std::optional<IntFormat> f = ParseIntFormat(v.format, v.itemsize);
      if (!f || v.ndim != 1) {
        throw py::type_error(std::string(name) +
                             " must be a 1-D integer array or a sequence of "
                             "ints, got " +
                             Describe(v));
      }
      format_ = *f;
      size_ = static_cast<size_t>(v.shape[0]);
      return;
    }
    PyObject* seq = PySequence_Fast(obj.ptr(), "");
    if (seq == nullptr) {
      PyErr_Clear();
      throw py::type_error(std::string(name) +
                           " must be a 1-D integer array or a sequence of "
                           "ints, got " +
                           Py_TYPE(obj.ptr())->tp_name);
    }
    seq_ = py::reinterpret_steal<py::object>(seq);
    items_ = PySequence_Fast_ITEMS(seq);
    size_ = static_cast<size_t>(PySequence_Fast_GET_SIZE(seq));
  }

  size_t size() const { return size_; }

  // Element i (i < size()); raises TypeError for a negative, too large or
  // non-integer element.
  uint64_t operator[](size_t i) const {
    if (items_ == nullptr) {
      const Py_buffer& v = buffer_.view();
      IntValue x = ReadInt(
          static_cast<const char*>(v.buf) + static_cast<Py_ssize_t>(i) * v.strides[0], format_);
      if (x.negative) Fail(i, "is negative");
      return x.value;
    }
    PyObject* o = items_[i];
    if (PyLong_CheckExact(o)) {  // the common case: no new reference
      const unsigned long value = AsU64(o);
      if (value == static_cast<unsigned long>(-1) && PyErr_Occurred()) {
        PyErr_Clear();
        Fail(i, "is negative or does not fit in 64 bits");
      }
      return value;
    }
    if (PyFloat_Check(o)) Fail(i, "is not an integer (float)");
    PyObject* index = PyNumber_Index(o);
    if (index == nullptr) {
      PyErr_Clear();
      Fail(i, std::string("is not an integer (") + Py_TYPE(o)->tp_name + ")");
    }
    const unsigned long value = AsU64(index);
    Py_DECREF(index);
    if (value == static_cast<unsigned long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      Fail(i, "is negative or does not fit in 64 bits");
    }
    return value;
  }

 private:
  [[noreturn]] void Fail(size_t i, const std::string& what) const {
    throw py::type_error(std::string(name_) + "[" + std::to_string(i) + "] " + what);
  }

  const char* name_;
  IntBuffer buffer_;
  IntFormat format_;
  py::object seq_;              // keeps the items alive
  PyObject** items_ = nullptr;  // null: read from buffer_
  size_t size_ = 0;
};

// The requests of one batch; needs the GIL (reads Python objects).
StatusOr<std::vector<ferry::TransferRequest>> RequestsFromColumns(int opcode, uint64_t segment,
                                                                  const py::handle& locals,
                                                                  const py::handle& remotes,
                                                                  const py::handle& lengths) {
  if (opcode != static_cast<int>(ferry::Opcode::kRead) &&
      opcode != static_cast<int>(ferry::Opcode::kWrite)) {
    return ferry::InvalidArgumentError("unknown opcode " + std::to_string(opcode));
  }
  const RequestColumn local(locals, "local addresses");
  const RequestColumn remote(remotes, "remote addresses");
  const RequestColumn length(lengths, "lengths");
  const size_t n = local.size();
  if (remote.size() != n || length.size() != n) {
    return ferry::InvalidArgumentError("request lists differ in length: " + std::to_string(n) +
                                       " local addresses, " + std::to_string(remote.size()) +
                                       " remote addresses, " + std::to_string(length.size()) +
                                       " lengths");
  }
  std::vector<ferry::TransferRequest> requests(n);
  for (size_t i = 0; i < n; ++i) {
    ferry::TransferRequest& r = requests[i];
    r.opcode = static_cast<ferry::Opcode>(opcode);
    r.local = Address(local[i]);
    r.segment = ferry::SegmentHandle{segment};
    r.remote_addr = remote[i];
    r.length = length[i];
  }
  return requests;
}

void TransferSyncColumns(NativeEngine& engine, int opcode, uint64_t segment,
                         const py::object& locals, const py::object& remotes,
                         const py::object& lengths) {
  std::vector<ferry::TransferRequest> requests =
      Unwrap(RequestsFromColumns(opcode, segment, locals, remotes, lengths));
  Check(engine.Run([&](ferry::Engine& e) -> Status {
    if (requests.size() == 1) return e.TransferSync(requests[0]);
    return e.TransferSync(std::span<const ferry::TransferRequest>(requests));
  }));
}

void SubmitColumns(NativeEngine& engine, uint64_t batch, int opcode, uint64_t segment,
                   const py::object& locals, const py::object& remotes, const py::object& lengths) {
  std::vector<ferry::TransferRequest> requests =
      Unwrap(RequestsFromColumns(opcode, segment, locals, remotes, lengths));
  Check(engine.Run([&](ferry::Engine& e) { return e.Submit(ferry::BatchId{batch}, requests); }));
}

// Copies below this size are not worth dropping the GIL for.
constexpr size_t kReleaseGilAbove = 64 * 1024;

// ---- Engine options ------------------------------------------------------------
// Every row of ferry::OptionTable() is a property of EngineOptions and a
// keyword of ferry.Engine: an int, a str, or for durations (rows in "ms" or
// "us") seconds as a float. Values are set through ferry::SetOption, so the
// table's ranges and messages apply; nothing here names an option.

bool IsDuration(const ferry::OptionSpec& s) { return s.unit == "ms" || s.unit == "us"; }

// "int", "str" or "seconds": what Python passes for the option.
const char* OptionType(const ferry::OptionSpec& s) {
  if (s.string_value != nullptr) return "str";
  return IsDuration(s) ? "seconds" : "int";
}

py::object OptionValue(const ferry::OptionSpec& s, const ferry::EngineOptions& o) {
  if (s.string_value != nullptr) return py::str(s.string_value(o));
  const int64_t v = s.integer_value(o);
  if (s.unit == "ms") return py::float_(Seconds(std::chrono::milliseconds(v)));
  if (s.unit == "us") return py::float_(Seconds(std::chrono::microseconds(v)));
  return py::int_(v);
}

// Seconds in the row's unit: milliseconds rounded up, microseconds to the
// nearest; not positive (or NaN) gives 0, which the ranges of timeouts refuse.
int64_t FromSeconds(const ferry::OptionSpec& s, double seconds) {
  if (s.unit == "ms") return Millis(seconds).count();
  if (!(seconds > 0)) return 0;
  return static_cast<int64_t>(std::llround(std::min(seconds, 1e6) * 1e6));
}

[[noreturn]] void WrongType(const ferry::OptionSpec& s, const py::handle& value) {
  throw py::type_error("option " + std::string(s.name) + " takes " +
                       (IsDuration(s) ? std::string("seconds (a number)") : OptionType(s)) +
                       ", got " + Py_TYPE(value.ptr())->tp_name);
}

// The text ferry::SetOption takes for `value`; TypeError if it has the wrong type.
std::string OptionText(const ferry::OptionSpec& s, const py::handle& value) {
  if (s.string_value != nullptr) {
    if (!py::isinstance<py::str>(value)) WrongType(s, value);
    return value.cast<std::string>();
  }
  if (IsDuration(s)) {
    if (py::isinstance<py::str>(value)) WrongType(s, value);
    const double seconds = PyFloat_AsDouble(value.ptr());
    if (seconds == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      WrongType(s, value);
    }
    return std::to_string(FromSeconds(s, seconds));
  }
  PyObject* index = PyNumber_Index(value.ptr());
  if (index == nullptr) {
    PyErr_Clear();
    WrongType(s, value);
  }
  return py::str(py::reinterpret_steal<py::object>(index));
}

// EngineOptions.set(name, value): TypeError for an unknown name (naming the
// closest ones) or a value of the wrong type; InvalidArgument outside the range.
void SetOptionFromPython(ferry::EngineOptions& o, const std::string& name,
                         const py::handle& value) {
  const ferry::OptionSpec* s = ferry::FindOption(name);
  if (s == nullptr) throw py::type_error(std::string(ferry::SetOption(o, name, "").message()));
  Check(ferry::SetOption(o, name, OptionText(*s, value)));
}

// ferry.option_table(): one dict per row, in the table's order.
py::list OptionTableList() {
  const ferry::EngineOptions defaults{};
  py::list rows;
  for (const ferry::OptionSpec& s : ferry::OptionTable()) {
    py::dict row;
    row["name"] = std::string(s.name);
    row["belongs_to"] = std::string(s.belongs_to);
    row["type"] = OptionType(s);
    row["default"] = OptionValue(s, defaults);
    row["variable"] = std::string(s.variable);
    row["unit"] = std::string(s.unit);
    row["range"] = std::string(s.range);
    // The bounds of `range`, in `unit` (None for strings).
    row["min"] = s.integer_value != nullptr ? py::object(py::int_(s.min)) : py::object(py::none());
    row["max"] = s.integer_value != nullptr ? py::object(py::int_(s.max)) : py::object(py::none());
    row["meaning"] = std::string(s.meaning);
    rows.append(row);
  }
  return rows;
}

void BindEngineOptions(py::module_& m) {
  py::class_<ferry::EngineOptions> options(m, "EngineOptions");
  options.def(py::init<>())
      .def("with_environment", &ferry::EngineOptions::WithEnvironment,
           "A copy with FERRY_* environment variables overlaid.")
      .def("set", &SetOptionFromPython, py::arg("name"), py::arg("value"),
           "Sets the option `name` (a row of option_table()) to `value`.");
  for (const ferry::OptionSpec& spec : ferry::OptionTable()) {
    const ferry::OptionSpec* s = &spec;
    options.def_property(
        std::string(s->name).c_str(),
        [s](const ferry::EngineOptions& o) { return OptionValue(*s, o); },
        [s](ferry::EngineOptions& o, const py::object& v) {
          Check(ferry::SetOption(o, s->name, OptionText(*s, v)));
        },
        std::string(s->meaning).c_str());
  }
  // Test-only settings (ferry/testing_options.h), outside the table.
  options
      .def_property(
          "testing_wire_version_min",
          [](const ferry::EngineOptions& o) { return o.testing.wire_version_min; },
          [](ferry::EngineOptions& o, uint16_t v) { o.testing.wire_version_min = v; })
      .def_property(
          "testing_wire_version_max",
          [](const ferry::EngineOptions& o) { return o.testing.wire_version_max; },
          [](ferry::EngineOptions& o, uint16_t v) { o.testing.wire_version_max = v; })
      .def_property(
          "testing_cuda_driver",
          [](const ferry::EngineOptions& o) { return o.testing.cuda_driver; },
          [](ferry::EngineOptions& o, const std::string& path) { o.testing.cuda_driver = path; },
          "Test-only: load the CUDA driver from this library (a path) instead of libcuda.so.1, "
          "e.g. the tests' fake driver; \"\" = the real driver.");
}

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

  // Maps [addr, addr + length) again, in place, as a private (copy-on-write)
  // mapping of `fd` from offset 0: what a forked child does with the managed
  // buffers' shared arenas (ferry/_pool.py), so that its writes stay its own
  // instead of landing in its parent's memory. Raises OSError.
  m.def(
      "remap_private",
      [](uint64_t addr, uint64_t length, int fd) {
        void* p = mmap(reinterpret_cast<void*>(addr), length, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_FIXED, fd, 0);
        if (p == MAP_FAILED) {
          PyErr_SetFromErrno(PyExc_OSError);
          throw py::error_already_set();
        }
      },
      py::arg("addr"), py::arg("length"), py::arg("fd"));

  // memcpy(dest, src buffer, length) from Python memory into raw memory.
  m.def(
      "copy_from_buffer",
      [](uint64_t dest, const py::object& src, uint64_t length) {
        BufferView b(src, /*writable=*/false);
        if (length > static_cast<uint64_t>(b.view.len)) {
          Raise(ferry::InvalidArgumentError("length " + std::to_string(length) +
                                            " exceeds the source's " + std::to_string(b.view.len) +
                                            " bytes"));
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

  BindEngineOptions(m);
  m.def("option_table", &OptionTableList,
        "Every engine option: name, belongs_to, type, default, variable, unit, range, min, max, "
        "meaning.");

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
           py::arg("location") = "*", py::arg("exported") = true, py::arg("fd") = -1,
           py::arg("fd_offset") = 0)
      .def("allocate_shared", &NativeEngine::AllocateShared, py::arg("length"),
           py::arg("location") = "cpu", py::arg("exported") = true)
      .def("free_shared", &NativeEngine::FreeShared, py::arg("addr"))
      .def("register_memory_list", &NativeEngine::RegisterMemoryList, py::arg("addrs"),
           py::arg("lengths"), py::arg("locations"), py::arg("exported") = true)
      .def("unregister_memory", &NativeEngine::UnregisterMemory)
      .def("register_file", &NativeEngine::RegisterFile, py::arg("path"), py::arg("fd"),
           py::arg("offset"), py::arg("length"), py::arg("writable"), py::arg("durable"),
           py::arg("direct"), py::arg("exported"))
      .def("open_segment", &NativeEngine::OpenSegment)
      .def("close_segment", &NativeEngine::CloseSegment)
      .def("query_segment", &NativeEngine::QuerySegment)
      .def("allocate_batch", &NativeEngine::AllocateBatch)
      .def("submit", &NativeEngine::Submit)
      .def("check_batches", &NativeEngine::CheckBatches, py::arg("ids"), py::arg("owned"))
      .def("submit_one", &NativeEngine::SubmitOne, py::arg("opcode"), py::arg("segment"),
           py::arg("local"), py::arg("remote"), py::arg("length"), py::arg("spin") = false)
      .def("spin_batch", &NativeEngine::SpinBatch, py::arg("id"), py::arg("owned"))
      .def("batch_status", &NativeEngine::BatchStatus, py::arg("batch"),
           py::arg("wait_us") = kPollWait.count())
      .def("transfer_statuses", &NativeEngine::TransferStatuses)
      .def("wait_batch", &NativeEngine::WaitBatch)
      .def("free_batch", &NativeEngine::FreeBatch)
      .def("transfer_sync", &NativeEngine::TransferSync)
      .def("send_notification", &NativeEngine::SendNotification)
      .def("get_notifications", &NativeEngine::GetNotifications)
      .def("prepare_list", &NativeEngine::PrepareList, py::arg("rows"),
           py::arg("segment") = py::none())
      .def("desc_list_entries", &NativeEngine::DescListEntries)
      .def("release_desc_list", &NativeEngine::ReleaseDescList)
      .def("make_transfer", &NativeEngine::MakeTransfer, py::arg("opcode"), py::arg("local"),
           py::arg("local_indices"), py::arg("remote"), py::arg("remote_indices"),
           py::arg("notification") = py::none())
      .def("post_transfer", &NativeEngine::PostTransfer, py::arg("transfer"),
           py::arg("notification") = py::none())
      .def("transfer_state", &NativeEngine::TransferState, py::arg("transfer"),
           py::arg("wait_us") = kPollWait.count())
      .def("spin_transfer", &NativeEngine::SpinTransfer, py::arg("transfer"))
      .def("wait_transfer", &NativeEngine::WaitTransfer)
      .def("transfer_telemetry", &NativeEngine::TransferTelemetry)
      .def("cancel_transfer", &NativeEngine::CancelTransfer)
      .def("release_transfer", &NativeEngine::ReleaseTransfer)
      .def("cancel_batch", &NativeEngine::CancelBatch)
      .def("export_metadata", &NativeEngine::ExportMetadata)
      .def("import_metadata", &NativeEngine::ImportMetadata)
      .def("segment_peer_id", &NativeEngine::SegmentPeerId)
      .def("metrics", &NativeEngine::Metrics)
      .def("metrics_text", &NativeEngine::MetricsText)
      .def("metrics_address", &NativeEngine::MetricsAddress)
      .def("completion_fd", &NativeEngine::CompletionFd, py::arg("dup") = false)
      .def("take_finished", &NativeEngine::TakeFinished);

  // Bulk request columns (see RequestColumn).
  py::reinterpret_borrow<py::class_<NativeEngine>>(m.attr("NativeEngine"))
      .def("transfer_sync_columns", &TransferSyncColumns, py::arg("opcode"), py::arg("segment"),
           py::arg("locals"), py::arg("remotes"), py::arg("lengths"))
      .def("submit_columns", &SubmitColumns, py::arg("batch"), py::arg("opcode"),
           py::arg("segment"), py::arg("locals"), py::arg("remotes"), py::arg("lengths"));
}
