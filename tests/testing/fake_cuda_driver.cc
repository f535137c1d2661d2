// A stand-in for the CUDA driver (libcuda.so.1) for the tests of Ferry's
// cuda memory kind and GPU data paths on machines without a GPU: the entry
// points Ferry looks up (common/cuda_driver.cc), answering like the driver
// does (CUresult values of the driver API), with two devices. Loaded by path
// (FERRY_FAKE_CUDA_PATH), never named libcuda. The test reaches the
// ferry_fake_cuda_* controls (tests/testing/fake_cuda.h) with dlopen/dlsym of
// the same path (the loader hands back the same copy, so the state is shared).
//
// A CPU emulation that fails where a GPU would:
// - Device memory (cuMemAlloc) is a memfd mapped twice: the "device view",
//   whose address is the CUdeviceptr, is PROT_NONE, so a CPU access of a
//   device pointer faults (memcpy) or fails with EFAULT (write, sendmsg,
//   process_vm_writev), like a real device pointer; the fake copies through
//   a private read-write "shadow view" of the same pages.
// - Contexts: a per-thread stack of current contexts (the devices' primary
//   contexts); the calls that need one answer CUDA_ERROR_INVALID_CONTEXT on
//   a thread without one.
// - Streams are in-order queues run by one worker thread each, which waits a
//   little (ferry_fake_cuda_set_copy_delay_us) before each copy, so that data
//   used before its event completed is caught; events complete when every
//   marker recorded on them has run.
// - IPC handles carry the exporter's pid and memfd; another process opens
//   /proc/<pid>/fd/<fd> (the exporting process itself is refused, like CUDA).
// Nothing of cuda.h is included: the values are those cuda.h gives.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// CUresult values.
constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kOutOfMemory = 2;
constexpr int kNotInitialized = 3;
constexpr int kDeinitialized = 4;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;
constexpr int kInvalidImage = 200;
constexpr int kInvalidContext = 201;
constexpr int kMapFailed = 205;
constexpr int kAlreadyMapped = 208;
constexpr int kNotMapped = 211;
constexpr int kInvalidHandle = 400;
constexpr int kNotFound = 500;
constexpr int kNotReady = 600;
constexpr int kIllegalAddress = 700;
constexpr int kNotPermitted = 800;
constexpr int kNotSupported = 801;

constexpr int kMemoryTypeHost = 1;    // CU_MEMORYTYPE_HOST
constexpr int kMemoryTypeDevice = 2;  // CU_MEMORYTYPE_DEVICE
constexpr int kAttributeContext = 1;  // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kAttributeMemoryType = 2;
constexpr int kAttributeDeviceOrdinal = 9;
constexpr int kAttributeRangeStart = 11;      // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kAttributeRangeSize = 12;       // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned kStreamNonBlocking = 0x1;  // CU_STREAM_NON_BLOCKING
constexpr uintptr_t kStreamLegacy = 0x1;      // CU_STREAM_LEGACY
constexpr uintptr_t kStreamPerThread = 0x2;   // CU_STREAM_PER_THREAD
constexpr unsigned kEventFlags = 0x1 | 0x2;   // CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING
constexpr unsigned kMemHostAllocFlags = 0x1 | 0x2 | 0x4;  // PORTABLE | DEVICEMAP | WRITECOMBINED
constexpr unsigned kIpcLazyEnablePeerAccess = 0x1;        // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
constexpr size_t kIpcHandleSize = 64;                     // CU_IPC_HANDLE_SIZE
constexpr int kDevices = 2;

// Copy directions of the counters (tests/testing/fake_cuda.h).
enum Direction { kHtoD = 0, kDtoH = 1, kDtoD = 2, kHtoH = 3, kDirections = 4 };

// Controls, and cuInit's state: read by any thread.
std::atomic<int> init_result{kSuccess};
std::atomic<bool> initialized{false};
std::atomic<uintptr_t> device_lo{0}, device_hi{0};
std::atomic<int> device_ordinal{0};
std::atomic<int> pointer_result{
    kSuccess};  // forced result of cuPointerGetAttribute, if not kSuccess
std::atomic<int> ipc_open_result{
    kSuccess};  // forced result of cuIpcOpenMemHandle_v2, if not kSuccess
constexpr unsigned kDefaultCopyDelayUs = 200;
std::atomic<unsigned> copy_delay_us{kDefaultCopyDelayUs};
std::atomic<int> module_result{0};                   // what cuModuleLoadData answers (0: loads)
std::atomic<int> host_alloc_result{0};               // what cuMemHostAlloc answers (0: allocates)
std::atomic<unsigned long long> kernel_launches{0};  // cuLaunchKernel calls queued
std::atomic<int> batch_result{0};                // what cuMemcpyBatchAsync_v2 answers (0: copies)
std::atomic<unsigned long long> batch_calls{0};  // cuMemcpyBatchAsync_v2 calls that copied
std::atomic<unsigned long long> copied[kDirections];
std::atomic<unsigned long long> next_allocation_id{1};

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}
size_t RoundUp(size_t n) { return (n + PageSize() - 1) / PageSize() * PageSize(); }

// ---- contexts -----------------------------------------------------------------

struct Context {
  int device;
};
Context contexts[kDevices] = {{0}, {1}};  // the primary contexts
thread_local std::vector<Context*> current;

Context* Current() { return current.empty() ? nullptr : current.back(); }
Context* AsContext(void* p) {
  for (auto& c : contexts) {
    if (p == &c) return &c;
  }
  return nullptr;
}

// ---- memory -------------------------------------------------------------------

// One mapping the fake knows: device memory (allocated here or imported from
// another process) or page-locked host memory. Unmapped when the last
// reference goes: the table's (until cuMemFree...) or a queued copy's.
struct Mapping {
  enum Kind { kDevice, kImported, kHost } kind = kDevice;
  uintptr_t base = 0;      // the device view (kDevice, kImported) or the host memory
  size_t size = 0;         // as asked for
  size_t mapped = 0;       // rounded up to pages
  char* shadow = nullptr;  // read-write view of the device memory; == base for kHost
  int device = 0;
  int fd = -1;
  unsigned long long id = 0;  // names the memfd: "ferry-fake-cuda-<id>"
  pid_t owner = 0;            // the process that mapped it (fork copies tables)

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (kind == kHost) {
      if (base != 0) ::munmap(reinterpret_cast<void*>(base), mapped);
      return;
    }
    if (base != 0) ::munmap(reinterpret_cast<void*>(base), mapped);
    if (shadow != nullptr) ::munmap(shadow, mapped);
    if (fd >= 0) ::close(fd);
  }
};

std::mutex mu;  // guards the tables below (never held across a wait)
std::map<uintptr_t, std::shared_ptr<Mapping>>& Table() {
  static auto* t = new std::map<uintptr_t, std::shared_ptr<Mapping>>;  // by base; never destroyed
  return *t;
}

// The mapping whose [base, base + mapped) holds p, or null; with `any`, also
// one a forked child inherited from its parent (unusable there, as CUDA's
// are in a child). Holds mu.
std::shared_ptr<Mapping> FindLocked(uintptr_t p, bool any = false) {
  auto& t = Table();
  auto it = t.upper_bound(p);
  if (it == t.begin()) return nullptr;
  --it;
  if (p - it->first >= it->second->mapped) return nullptr;
  if (!any && it->second->owner != ::getpid()) return nullptr;
  return it->second;
}
// The mapping of this process starting at `base` exactly, of `kind`, or null.
std::map<uintptr_t, std::shared_ptr<Mapping>>::iterator FindBaseLocked(uintptr_t base, int kind) {
  auto it = Table().find(base);
  if (it == Table().end() || it->second->kind != kind || it->second->owner != ::getpid())
    return Table().end();
  return it;
}

// Maps `fd` (mapped bytes) as a PROT_NONE device view and a read-write
// shadow view; false when either mmap fails.
bool MapViews(Mapping& m, int fd) {
  void* view = ::mmap(nullptr, m.mapped, PROT_NONE, MAP_SHARED, fd, 0);
  if (view == MAP_FAILED) return false;
  void* shadow = ::mmap(nullptr, m.mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (shadow == MAP_FAILED) {
    ::munmap(view, m.mapped);
    return false;
  }
  m.base = reinterpret_cast<uintptr_t>(view);
  m.shadow = static_cast<char*>(shadow);
  m.fd = fd;
  return true;
}

// One side of a copy, resolved at call time.
struct Side {
  char* address = nullptr;  // where the fake reads or writes it
  bool device = false;
  std::shared_ptr<Mapping> mapping;  // kept until the copy ran
};

// [p, p + n) as the fake accesses it: inside one device mapping (its shadow),
// inside page-locked host memory, or other host memory (used as is; it must
// not run into device memory).
int Resolve(unsigned long long ptr, size_t n, Side* side) {
  if (ptr == 0) return kInvalidValue;
  const auto p = static_cast<uintptr_t>(ptr);
  if (p + n < p) return kInvalidValue;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Mapping> m = FindLocked(p, /*any=*/true);
  if (m != nullptr) {
    if (m->owner != ::getpid()) return kInvalidValue;  // the parent's, in a forked child
    const size_t offset = p - m->base;
    if (offset + n > m->size) return kInvalidValue;  // not all of it in one allocation
    side->mapping = m;
    if (m->kind == Mapping::kHost) {
      side->address = reinterpret_cast<char*>(p);
      side->device = false;
    } else {
      side->address = m->shadow + offset;
      side->device = true;
    }
    return kSuccess;
  }
  // Pageable host memory: none of it may be device memory.
  auto it = Table().upper_bound(p);
  if (it != Table().end() && it->first < p + n && it->second->kind != Mapping::kHost)
    return kInvalidValue;
  side->address = reinterpret_cast<char*>(p);
  side->device = false;
  return kSuccess;
}

// ---- streams and events -------------------------------------------------------

// While held (ferry_fake_cuda_hold_streams), no stream runs its next
// operation: a test queues work, does what must come first, and releases, so
// "not run yet" is certain however the machine is loaded (a delay is not).
std::mutex hold_mu;
std::condition_variable hold_cv;
bool streams_held = false;  // guarded by hold_mu

void WaitWhileHeld() {
  std::unique_lock<std::mutex> lock(hold_mu);
  hold_cv.wait(lock, [] { return !streams_held; });
}

// An in-order queue run by its own worker thread.
class Stream {
 public:
  explicit Stream(int device)
      : device_(device), owner_(::getpid()), worker_(new std::thread([this] { Run(); })) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  // Runs what is queued, then ends the worker. In a forked child the worker
  // is not there (fork copies one thread): nothing is joined.
  ~Stream() {
    if (owner_ != ::getpid()) return;  // the thread object stays reachable, never joined
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_->join();
    delete worker_;
  }

  int device() const { return device_; }
  bool Usable() const { return owner_ == ::getpid(); }

  void Push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
  }
  // Waits until everything queued so far has run.
  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return queue_.empty() && !busy_; });
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, and drained
      std::function<void()> op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      WaitWhileHeld();
      op();
      op = nullptr;  // drops what the operation held (mappings, events) outside the lock
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }

  const int device_;
  const pid_t owner_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread* worker_;
};

struct Event {
  std::mutex mu;
  std::condition_variable cv;
  unsigned long long pending = 0;  // markers recorded and not yet run
};

std::map<void*, std::unique_ptr<Stream>>& Streams() {  // guarded by mu
  static auto* s = new std::map<void*, std::unique_ptr<Stream>>;
  return *s;
}
std::map<void*, std::shared_ptr<Event>>& Events() {  // guarded by mu
  static auto* e = new std::map<void*, std::shared_ptr<Event>>;
  return *e;
}

// The null stream's stand-in: one per process, its worker joined at exit (or
// when the library is unloaded).
struct DefaultStream {
  std::mutex mu;
  Stream* stream = nullptr;
  ~DefaultStream() {
    if (stream != nullptr && stream->Usable()) delete stream;
  }
  Stream* Get() {
    std::lock_guard<std::mutex> lock(mu);
    // A forked child has no copy of the parent's worker: it gets its own.
    if (stream == nullptr || !stream->Usable()) stream = new Stream(-1);
    return stream;
  }
};
DefaultStream& TheDefaultStream() {
  static DefaultStream s;
  return s;
}

bool IsDefaultStream(void* s) {
  const auto v = reinterpret_cast<uintptr_t>(s);
  return v == 0 || v == kStreamLegacy || v == kStreamPerThread;
}

// The stream `s` names (the default stream for 0), or null for a handle the
// fake does not know. A user stream stays valid while the caller uses it
// (destroying a stream in use is the caller's bug, as with CUDA).
Stream* FindStream(void* s) {
  if (IsDefaultStream(s)) return TheDefaultStream().Get();
  std::lock_guard<std::mutex> lock(mu);
  auto it = Streams().find(s);
  if (it == Streams().end() || !it->second->Usable()) return nullptr;
  return it->second.get();
}

std::shared_ptr<Event> FindEvent(void* e) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = Events().find(e);
  return it == Events().end() ? nullptr : it->second;
}

// A fork while another thread holds mu must not leave it held in the child.
void ForkPrepare() { mu.lock(); }
void ForkRelease() { mu.unlock(); }
__attribute__((constructor)) void RegisterForkHandlers() {
  ::pthread_atfork(ForkPrepare, ForkRelease, ForkRelease);
}

// ---- IPC ----------------------------------------------------------------------

struct IpcHandle {  // the 64 bytes of a CUipcMemHandle, as the fake fills them
  uint64_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t size;
  uint64_t mapped;
  uint64_t id;
  int32_t device;
  int32_t unused;
  char reserved[kIpcHandleSize - 48];
};
static_assert(sizeof(IpcHandle) == kIpcHandleSize);
constexpr uint64_t kIpcMagic = 0x4650434941435546ull;  // "FUCAIPCF"

std::string MemfdName(unsigned long long id) { return "ferry-fake-cuda-" + std::to_string(id); }

}  // namespace

extern "C" {

#define FERRY_FAKE_EXPORT __attribute__((visibility("default")))

// Controls for the tests.
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_init_result(int r) { init_result = r; }
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_device_memory(uintptr_t lo, uintptr_t hi, int ordinal) {
  device_lo = lo;
  device_hi = hi;
  device_ordinal = ordinal;
}
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_pointer_result(int r) { pointer_result = r; }
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_copy_delay_us(unsigned us) { copy_delay_us = us; }
FERRY_FAKE_EXPORT void ferry_fake_cuda_hold_streams(int hold) {
  {
    std::lock_guard<std::mutex> lock(hold_mu);
    streams_held = hold != 0;
  }
  hold_cv.notify_all();
}
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_ipc_open_result(int r) { ipc_open_result = r; }
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_batch_result(int r) { batch_result = r; }
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_module_result(int r) { module_result = r; }
FERRY_FAKE_EXPORT void ferry_fake_cuda_set_host_alloc_result(int r) { host_alloc_result = r; }
FERRY_FAKE_EXPORT unsigned long long ferry_fake_cuda_kernel_launches() {
  return kernel_launches.load();
}
FERRY_FAKE_EXPORT unsigned long long ferry_fake_cuda_batch_calls() { return batch_calls.load(); }
// Bytes copied so far (by copies that ran) in `direction`: 0 host to device,
// 1 device to host, 2 device to device, 3 host to host; 0 for another value.
FERRY_FAKE_EXPORT unsigned long long ferry_fake_cuda_copied_bytes(int direction) {
  if (direction < 0 || direction >= kDirections) return 0;
  return copied[direction].load();
}
FERRY_FAKE_EXPORT void ferry_fake_cuda_reset_copied_bytes() {
  for (auto& c : copied) c = 0;
}
// Mappings of this process the fake knows now: 0 device allocations, 1
// imported IPC mappings, 2 page-locked host allocations; -1 for another.
FERRY_FAKE_EXPORT int ferry_fake_cuda_live_allocations(int kind) {
  if (kind < 0 || kind > 2) return -1;
  std::lock_guard<std::mutex> lock(mu);
  int n = 0;
  for (const auto& [base, m] : Table()) {
    if (static_cast<int>(m->kind) == kind && m->owner == ::getpid()) ++n;
  }
  return n;
}

// ---- the driver API subset -----------------------------------------------------

FERRY_FAKE_EXPORT int cuInit(unsigned int flags) {
  if (flags != 0) return kInvalidValue;
  if (init_result != kSuccess) return init_result;
  initialized = true;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuDeviceGetCount(int* count) {
  if (!initialized) return kNotInitialized;
  if (count == nullptr) return kInvalidValue;
  *count = kDevices;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuDeviceGet(int* device, int ordinal) {
  if (!initialized) return kNotInitialized;
  if (device == nullptr) return kInvalidValue;
  if (ordinal < 0 || ordinal >= kDevices) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuDeviceGetName(char* name, int len, int device) {
  if (!initialized) return kNotInitialized;
  if (name == nullptr || len <= 0) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  const char* names[kDevices] = {"Ferry Fake GPU 0", "Ferry Fake GPU 1"};
  std::strncpy(name, names[device], static_cast<size_t>(len) - 1);
  name[len - 1] = '\0';
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  if (!initialized) return kNotInitialized;
  if (data == nullptr) return kInvalidValue;
  if (pointer_result != kSuccess) return pointer_result;
  // The test's range of "device memory" (ferry_fake_cuda_set_device_memory).
  if (ptr >= device_lo && ptr < device_hi) {
    if (attribute == kAttributeMemoryType) {
      *static_cast<unsigned*>(data) = kMemoryTypeDevice;
      return kSuccess;
    }
    if (attribute == kAttributeDeviceOrdinal) {
      *static_cast<int*>(data) = device_ordinal;
      return kSuccess;
    }
    return kInvalidValue;
  }
  std::shared_ptr<Mapping> m;
  {
    std::lock_guard<std::mutex> lock(mu);
    m = FindLocked(static_cast<uintptr_t>(ptr));
  }
  if (m == nullptr || static_cast<uintptr_t>(ptr) - m->base >= m->size)
    return kInvalidValue;  // unknown memory
  switch (attribute) {
    case kAttributeContext:
      *static_cast<void**>(data) = &contexts[m->device];
      return kSuccess;
    case kAttributeMemoryType:
      *static_cast<unsigned*>(data) =
          m->kind == Mapping::kHost ? kMemoryTypeHost : kMemoryTypeDevice;
      return kSuccess;
    case kAttributeDeviceOrdinal:
      *static_cast<int*>(data) = m->device;
      return kSuccess;
    case kAttributeRangeStart:
      *static_cast<unsigned long long*>(data) = m->base;
      return kSuccess;
    case kAttributeRangeSize:
      *static_cast<size_t*>(data) = m->size;
      return kSuccess;
    default:
      return kInvalidValue;
  }
}

// Contexts.

FERRY_FAKE_EXPORT int cuDevicePrimaryCtxRetain(void** ctx, int device) {
  if (!initialized) return kNotInitialized;
  if (ctx == nullptr) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  *ctx = &contexts[device];
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuCtxPushCurrent_v2(void* ctx) {
  if (!initialized) return kNotInitialized;
  if (ctx == nullptr) return kInvalidValue;
  Context* c = AsContext(ctx);
  if (c == nullptr) return kInvalidContext;
  current.push_back(c);
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuCtxPopCurrent_v2(void** ctx) {
  if (!initialized) return kNotInitialized;
  if (current.empty()) return kInvalidContext;
  if (ctx != nullptr) *ctx = current.back();
  current.pop_back();
  return kSuccess;
}

// Streams and events.

FERRY_FAKE_EXPORT int cuStreamCreate(void** stream, unsigned flags) {
  if (!initialized) return kNotInitialized;
  if (stream == nullptr) return kInvalidValue;
  if (flags != 0 && flags != kStreamNonBlocking) return kInvalidValue;
  Context* c = Current();
  if (c == nullptr) return kInvalidContext;
  auto s = std::make_unique<Stream>(c->device);
  void* handle = s.get();
  std::lock_guard<std::mutex> lock(mu);
  Streams()[handle] = std::move(s);
  *stream = handle;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuStreamDestroy_v2(void* stream) {
  if (!initialized) return kNotInitialized;
  if (IsDefaultStream(stream)) return kInvalidHandle;
  std::unique_ptr<Stream> s;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = Streams().find(stream);
    if (it == Streams().end()) return kInvalidHandle;
    s = std::move(it->second);
    Streams().erase(it);
  }
  s.reset();  // runs what is queued, joins the worker
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuStreamSynchronize(void* stream) {
  if (!initialized) return kNotInitialized;
  Stream* s = FindStream(stream);
  if (s == nullptr) return kInvalidHandle;
  s->Drain();
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuEventCreate(void** event, unsigned flags) {
  if (!initialized) return kNotInitialized;
  if (event == nullptr) return kInvalidValue;
  if ((flags & ~kEventFlags) != 0) return kInvalidValue;
  if (Current() == nullptr) return kInvalidContext;
  auto e = std::make_shared<Event>();
  void* handle = e.get();
  std::lock_guard<std::mutex> lock(mu);
  Events()[handle] = std::move(e);
  *event = handle;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuEventDestroy_v2(void* event) {
  if (!initialized) return kNotInitialized;
  std::shared_ptr<Event> e;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = Events().find(event);
    if (it == Events().end()) return kInvalidHandle;
    e = std::move(it->second);
    Events().erase(it);
  }
  return kSuccess;  // markers still queued keep it until they ran, as CUDA does
}

FERRY_FAKE_EXPORT int cuEventRecord(void* event, void* stream) {
  if (!initialized) return kNotInitialized;
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr) return kInvalidHandle;
  Stream* s = FindStream(stream);
  if (s == nullptr) return kInvalidHandle;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    ++e->pending;
  }
  s->Push([e] {
    {
      std::lock_guard<std::mutex> lock(e->mu);
      --e->pending;
    }
    e->cv.notify_all();
  });
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuEventQuery(void* event) {
  if (!initialized) return kNotInitialized;
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr) return kInvalidHandle;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->pending == 0 ? kSuccess : kNotReady;
}

FERRY_FAKE_EXPORT int cuEventSynchronize(void* event) {
  if (!initialized) return kNotInitialized;
  std::shared_ptr<Event> e = FindEvent(event);
  if (e == nullptr) return kInvalidHandle;
  std::unique_lock<std::mutex> lock(e->mu);
  e->cv.wait(lock, [&] { return e->pending == 0; });
  return kSuccess;
}

// Copies: validated now, run on the stream's worker after the copy delay.
FERRY_FAKE_EXPORT int cuMemcpyAsync(unsigned long long dst, unsigned long long src, size_t n,
                                    void* stream) {
  if (!initialized) return kNotInitialized;
  if (Current() == nullptr) return kInvalidContext;
  Stream* s = FindStream(stream);
  if (s == nullptr) return kInvalidHandle;
  if (n == 0) return kSuccess;
  Side to, from;
  int r = Resolve(dst, n, &to);
  if (r != kSuccess) return r;
  r = Resolve(src, n, &from);
  if (r != kSuccess) return r;
  const Direction direction =
      from.device ? (to.device ? kDtoD : kDtoH) : (to.device ? kHtoD : kHtoH);
  s->Push([to = std::move(to), from = std::move(from), n, direction] {
    const unsigned delay = copy_delay_us;
    if (delay != 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    std::memmove(to.address, from.address, n);
    copied[direction] += n;
  });
  return kSuccess;
}

// CUDA 13's batch of copies: every copy checked as cuMemcpyAsync checks it
// (none queued unless all pass), the attributes as the real driver demands
// them (a first index of 0, a source access order), never the legacy stream.
struct FakeBatchAttributes {  // CUmemcpyAttributes
  int src_access_order;
  int src_hint[2];
  int dst_hint[2];
  unsigned flags;
};
FERRY_FAKE_EXPORT int cuMemcpyBatchAsync_v2(unsigned long long* dsts, unsigned long long* srcs,
                                            size_t* sizes, size_t count, FakeBatchAttributes* attrs,
                                            size_t* attrs_idxs, size_t num_attrs, void* stream) {
  if (!initialized) return kNotInitialized;
  if (batch_result != kSuccess) return batch_result;
  if (Current() == nullptr) return kInvalidContext;
  if (stream == nullptr || stream == reinterpret_cast<void*>(1)) {
    return kInvalidValue;  // "must not be legacy NULL stream"
  }
  if (count == 0 || dsts == nullptr || srcs == nullptr || sizes == nullptr || attrs == nullptr ||
      attrs_idxs == nullptr || num_attrs == 0 || num_attrs > count || attrs_idxs[0] != 0) {
    return kInvalidValue;
  }
  for (size_t k = 0; k < num_attrs; ++k) {
    if (attrs[k].src_access_order < 1 || attrs[k].src_access_order > 3) return kInvalidValue;
  }
  Side side;
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] == 0) continue;
    if (int r = Resolve(dsts[i], sizes[i], &side); r != kSuccess) return r;
    if (int r = Resolve(srcs[i], sizes[i], &side); r != kSuccess) return r;
  }
  for (size_t i = 0; i < count; ++i) {
    if (int r = cuMemcpyAsync(dsts[i], srcs[i], sizes[i], stream); r != kSuccess) return r;
  }
  ++batch_calls;
  return kSuccess;
}

// Kernels: the fake knows one, Ferry's copy kernel (src/cuda/scatter_copy.cu),
// and runs it on the stream's worker as the GPU would: it reads the task
// list {src, dst, len} (page-locked host memory) when it runs, and copies
// each task. A module is any PTX image that defines the kernel.
namespace {
constexpr char kCopyKernel[] = "ferry_scatter_copy";
int fake_module_tag = 0;    // the one module handle
int fake_function_tag = 0;  // the one function handle
struct FakeCopyTask {
  unsigned long long src, dst, len;
};
}  // namespace

FERRY_FAKE_EXPORT int cuModuleLoadData(void** module, const void* image) {
  if (!initialized) return kNotInitialized;
  if (Current() == nullptr) return kInvalidContext;
  if (module_result != kSuccess) return module_result;
  if (module == nullptr || image == nullptr) return kInvalidValue;
  const std::string ptx(static_cast<const char*>(image));
  if (ptx.find(".entry " + std::string(kCopyKernel)) == std::string::npos) return kInvalidImage;
  *module = &fake_module_tag;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuModuleGetFunction(void** f, void* module, const char* name) {
  if (!initialized) return kNotInitialized;
  if (module != &fake_module_tag || f == nullptr || name == nullptr) return kInvalidHandle;
  if (std::string(name) != kCopyKernel) return kNotFound;
  *f = &fake_function_tag;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuModuleUnload(void* module) {
  if (!initialized) return kNotInitialized;
  return module == &fake_module_tag ? kSuccess : kInvalidHandle;
}

FERRY_FAKE_EXPORT int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                     unsigned by, unsigned bz, unsigned shared, void* stream,
                                     void** params, void** extra) {
  if (!initialized) return kNotInitialized;
  if (Current() == nullptr) return kInvalidContext;
  if (f != &fake_function_tag) return kInvalidHandle;
  if (gx == 0 || gy != 1 || gz != 1 || bx == 0 || bx > 1024 || by != 1 || bz != 1 || shared != 0 ||
      params == nullptr || extra != nullptr) {
    return kInvalidValue;
  }
  Stream* s = FindStream(stream);
  if (s == nullptr) return kInvalidHandle;
  const auto list = reinterpret_cast<unsigned long long>(*static_cast<void* const*>(params[0]));
  const unsigned long long n = *static_cast<const unsigned long long*>(params[1]);
  const int device = Current()->device;  // a kernel reaches its own device's memory only
  ++kernel_launches;
  s->Push([list, n, device] {
    const unsigned delay = copy_delay_us;
    if (delay != 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    // The task list: GPU memory (its shadow) or page-locked host memory.
    Side where;
    if (Resolve(list, n * sizeof(FakeCopyTask), &where) != kSuccess) {
      std::fprintf(stderr, "fake CUDA: the copy kernel's task list is not readable\n");
      std::abort();
    }
    const auto* tasks = reinterpret_cast<const FakeCopyTask*>(where.address);
    for (unsigned long long i = 0; i < n; ++i) {
      const FakeCopyTask t = tasks[i];
      Side to, from;
      // (A GPU would fault on a bad address and poison the context; the
      // fake aborts, so a test that launches one fails loudly.)
      if (Resolve(t.dst, t.len, &to) != kSuccess || Resolve(t.src, t.len, &from) != kSuccess ||
          !to.device || !from.device) {
        std::fprintf(stderr, "fake CUDA: the copy kernel's task %llu is not device memory\n", i);
        std::abort();
      }
      if (to.mapping->device != device || from.mapping->device != device) {
        std::fprintf(stderr,
                     "fake CUDA: the copy kernel on device %d touches memory of device %d "
                     "(task %llu; no peer access is enabled)\n",
                     device,
                     to.mapping->device != device ? to.mapping->device : from.mapping->device, i);
        std::abort();
      }
      std::memmove(to.address, from.address, t.len);
      copied[kDtoD] += t.len;
    }
  });
  return kSuccess;
}

// Memory.

FERRY_FAKE_EXPORT int cuMemAlloc_v2(unsigned long long* dptr, size_t n) {
  if (!initialized) return kNotInitialized;
  if (dptr == nullptr || n == 0) return kInvalidValue;
  Context* c = Current();
  if (c == nullptr) return kInvalidContext;
  auto m = std::make_shared<Mapping>();
  m->kind = Mapping::kDevice;
  m->size = n;
  m->mapped = RoundUp(n);
  m->device = c->device;
  m->id = next_allocation_id++;
  m->owner = ::getpid();
  const int fd = ::memfd_create(MemfdName(m->id).c_str(), MFD_CLOEXEC);
  if (fd < 0) return kOutOfMemory;
  if (::ftruncate(fd, static_cast<off_t>(m->mapped)) != 0 || !MapViews(*m, fd)) {
    ::close(fd);
    return kOutOfMemory;
  }
  std::lock_guard<std::mutex> lock(mu);
  Table()[m->base] = m;
  *dptr = m->base;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuMemFree_v2(unsigned long long dptr) {
  if (!initialized) return kNotInitialized;
  std::shared_ptr<Mapping> m;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = FindBaseLocked(static_cast<uintptr_t>(dptr), Mapping::kDevice);
    if (it == Table().end()) return kInvalidValue;
    m = std::move(it->second);
    Table().erase(it);
  }
  return kSuccess;  // unmapped now, or when the last queued copy of it ran
}

FERRY_FAKE_EXPORT int cuMemHostAlloc(void** p, size_t n, unsigned flags) {
  if (!initialized) return kNotInitialized;
  if (p == nullptr || n == 0 || (flags & ~kMemHostAllocFlags) != 0) return kInvalidValue;
  Context* c = Current();
  if (c == nullptr) return kInvalidContext;
  if (host_alloc_result != kSuccess) return host_alloc_result;
  auto m = std::make_shared<Mapping>();
  m->kind = Mapping::kHost;
  m->size = n;
  m->mapped = RoundUp(n);
  m->device = c->device;
  m->owner = ::getpid();
  void* a = ::mmap(nullptr, m->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) return kOutOfMemory;
  m->base = reinterpret_cast<uintptr_t>(a);
  m->shadow = static_cast<char*>(a);
  std::lock_guard<std::mutex> lock(mu);
  Table()[m->base] = m;
  *p = a;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuMemFreeHost(void* p) {
  if (!initialized) return kNotInitialized;
  std::shared_ptr<Mapping> m;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = FindBaseLocked(reinterpret_cast<uintptr_t>(p), Mapping::kHost);
    if (it == Table().end()) return kInvalidValue;
    m = std::move(it->second);
    Table().erase(it);
  }
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuMemsetD8_v2(unsigned long long dptr, unsigned char value, size_t n) {
  if (!initialized) return kNotInitialized;
  if (Current() == nullptr) return kInvalidContext;
  if (n == 0) return kSuccess;
  Side side;
  const int r = Resolve(dptr, n, &side);
  if (r != kSuccess) return r;
  if (!side.device) return kInvalidValue;  // device memory only
  std::memset(side.address, value, n);
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuMemGetAddressRange_v2(unsigned long long* base, size_t* size,
                                              unsigned long long dptr) {
  if (!initialized) return kNotInitialized;
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<Mapping> m = FindLocked(static_cast<uintptr_t>(dptr));
  if (m == nullptr || m->kind == Mapping::kHost ||
      static_cast<uintptr_t>(dptr) - m->base >= m->size) {
    return kInvalidValue;
  }
  if (base != nullptr) *base = m->base;
  if (size != nullptr) *size = m->size;
  return kSuccess;
}

// IPC.

FERRY_FAKE_EXPORT int cuIpcGetMemHandle(void* handle, unsigned long long dptr) {
  if (!initialized) return kNotInitialized;
  if (handle == nullptr) return kInvalidValue;
  if (Current() == nullptr) return kInvalidContext;
  IpcHandle h{};
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = FindBaseLocked(static_cast<uintptr_t>(dptr), Mapping::kDevice);
    if (it == Table().end()) return kInvalidValue;
    const Mapping& m = *it->second;
    h.magic = kIpcMagic;
    h.pid = static_cast<int32_t>(::getpid());
    h.fd = m.fd;
    h.size = m.size;
    h.mapped = m.mapped;
    h.id = m.id;
    h.device = m.device;
  }
  std::memcpy(handle, &h, sizeof(h));
  return kSuccess;
}

struct FakeIpcMemHandle {  // CUipcMemHandle
  char reserved[kIpcHandleSize];
};

FERRY_FAKE_EXPORT int cuIpcOpenMemHandle_v2(unsigned long long* dptr, FakeIpcMemHandle handle,
                                            unsigned flags) {
  if (!initialized) return kNotInitialized;
  if (dptr == nullptr || (flags & ~kIpcLazyEnablePeerAccess) != 0) return kInvalidValue;
  if (Current() == nullptr) return kInvalidContext;
  if (ipc_open_result != kSuccess) return ipc_open_result;
  IpcHandle h;
  std::memcpy(&h, handle.reserved, sizeof(h));
  if (h.magic != kIpcMagic || h.size == 0 || h.mapped < h.size || h.device < 0 ||
      h.device >= kDevices) {
    return kInvalidHandle;
  }
  if (h.pid == static_cast<int32_t>(::getpid()))
    return kInvalidContext;  // CUDA refuses the exporter itself
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  // The fd must still be that allocation's memfd (not freed, not reused).
  char target[256] = {};
  const ssize_t len = ::readlink(path.c_str(), target, sizeof(target) - 1);
  if (len <= 0 ||
      std::string(target, static_cast<size_t>(len)).rfind("/memfd:" + MemfdName(h.id) + " ", 0) !=
          0) {
    return kInvalidHandle;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return kInvalidHandle;  // the process is gone, or not ours to open
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < h.mapped) {
    ::close(fd);
    return kInvalidHandle;
  }
  auto m = std::make_shared<Mapping>();
  m->kind = Mapping::kImported;
  m->size = h.size;
  m->mapped = h.mapped;
  m->device = h.device;
  m->id = h.id;
  m->owner = ::getpid();
  if (!MapViews(*m, fd)) {
    ::close(fd);
    return kMapFailed;
  }
  std::lock_guard<std::mutex> lock(mu);
  Table()[m->base] = m;
  *dptr = m->base;
  return kSuccess;
}

FERRY_FAKE_EXPORT int cuIpcCloseMemHandle(unsigned long long dptr) {
  if (!initialized) return kNotInitialized;
  std::shared_ptr<Mapping> m;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = FindBaseLocked(static_cast<uintptr_t>(dptr), Mapping::kImported);
    if (it == Table().end()) return kInvalidValue;
    m = std::move(it->second);
    Table().erase(it);
  }
  return kSuccess;
}

// Errors.

namespace {
struct ErrorText {
  int code;
  const char* name;
  const char* text;
};
constexpr ErrorText kErrors[] = {
    {kSuccess, "CUDA_SUCCESS", "no error"},
    {kInvalidValue, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {kOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {kNotInitialized, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {kDeinitialized, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {kNoDevice, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {kInvalidDevice, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {kInvalidContext, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {kMapFailed, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {kAlreadyMapped, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {kNotMapped, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {kInvalidHandle, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {kNotReady, "CUDA_ERROR_NOT_READY", "device not ready"},
    {kIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {kNotPermitted, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {kNotSupported, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};
const ErrorText* FindError(int code) {
  for (const auto& e : kErrors) {
    if (e.code == code) return &e;
  }
  return nullptr;
}
}  // namespace

FERRY_FAKE_EXPORT int cuGetErrorName(int error, const char** str) {
  if (str == nullptr) return kInvalidValue;
  const ErrorText* e = FindError(error);
  *str = e != nullptr ? e->name : nullptr;
  return e != nullptr ? kSuccess : kInvalidValue;
}

FERRY_FAKE_EXPORT int cuGetErrorString(int error, const char** str) {
  if (str == nullptr) return kInvalidValue;
  const ErrorText* e = FindError(error);
  *str = e != nullptr ? e->text : nullptr;
  return e != nullptr ? kSuccess : kInvalidValue;
}

#undef FERRY_FAKE_EXPORT

}  // extern "C"
