#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <type_traits>
#include <vector>

#include "ferry/cuda.h"

namespace ferry::internal {
namespace {

// Driver API facts (the values cuda.h gives them); nothing of cuda.h itself.
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorOutOfMemory = 2;
constexpr int kCudaErrorNotInitialized = 3;
constexpr int kCudaErrorDeinitialized = 4;
constexpr int kCudaErrorNoDevice = 100;
constexpr int kCudaErrorInvalidDevice = 101;
constexpr int kPointerAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kMemoryTypeDevice = 2;          // CU_MEMORYTYPE_DEVICE
constexpr int kCudaErrorNotReady = 600;
constexpr unsigned kStreamNonBlocking = 0x1;        // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 0x2;       // CU_EVENT_DISABLE_TIMING
constexpr unsigned kMemHostAllocPortable = 0x1;     // CU_MEMHOSTALLOC_PORTABLE
constexpr unsigned kIpcLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

unsigned long long AsPtr(const void* p) {
  return static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p));
}
void* FromPtr(unsigned long long p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

std::string DlErrorText() {
  const char* e = ::dlerror();
  return e != nullptr ? e : "no error text";
}

}  // namespace

const CudaDriver& CudaDriver::Get() {
  static const CudaDriver driver(kLibrary);
  return driver;
}

const CudaDriver& CudaDriver::Load(const std::string& library) {
  if (library == kLibrary) return Get();
  // Never destroyed: drivers are never unloaded (see Get()).
  static std::mutex* mu = new std::mutex;
  static auto* loaded = new std::map<std::string, std::unique_ptr<CudaDriver>>;
  std::lock_guard<std::mutex> lock(*mu);
  auto& slot = (*loaded)[library];
  if (!slot) slot = std::make_unique<CudaDriver>(library);
  return *slot;
}

bool CudaDriver::LoadedInProcess() {
  void* h = ::dlopen(kLibrary, RTLD_NOW | RTLD_NOLOAD);
  if (h == nullptr) {
    // The probe's failure is no error of the application's: clear it from
    // this thread's dlerror state (the first call reads the message, the
    // second frees it), so the application's own dlerror() never reports it.
    (void)::dlerror();
    (void)::dlerror();
    return false;
  }
  ::dlclose(h);  // drops only the reference RTLD_NOLOAD took
  return true;
}

CudaDriver::CudaDriver(const std::string& library) : library_(library) {
  // Never dlclose'd: the driver must not go away under device pointers or
  // under other users of it in this process.
  void* h = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    why_unavailable_ = library + " not found (" + DlErrorText() + ")";
    why_no_data_path_ = why_unavailable_;
    return;
  }
  auto find = [&](const char* name, auto& fn, bool required) {
    ::dlerror();
    void* sym = ::dlsym(h, name);
    if (sym == nullptr) {
      if (required && why_unavailable_.empty()) {
        why_unavailable_ = library + " has no " + name + " (" + DlErrorText() + ")";
      }
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  find("cuInit", init_, true);
  find("cuDriverGetVersion", driver_get_version_, true);
  find("cuDeviceGetCount", device_get_count_, true);
  find("cuDeviceGet", device_get_, true);
  find("cuDeviceGetName", device_get_name_, true);
  find("cuPointerGetAttribute", pointer_get_attribute_, true);
  find("cuGetErrorString", get_error_string_, true);
  find("cuGetErrorName", get_error_name_, false);
  if (!why_unavailable_.empty()) {
    why_no_data_path_ = why_unavailable_;
    return;
  }
  loaded_ = true;
  // The data paths' entry points, by the names cuda.h maps the calls to.
  std::string missing;
  auto need = [&](const char* name, auto& fn) {
    ::dlerror();
    void* sym = ::dlsym(h, name);
    if (sym == nullptr) {
      if (missing.empty()) missing = library + " has no " + name + " (" + DlErrorText() + ")";
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(sym);
  };
  need("cuDevicePrimaryCtxRetain", primary_ctx_retain_);
  need("cuCtxPushCurrent_v2", ctx_push_);
  need("cuCtxPopCurrent_v2", ctx_pop_);
  need("cuStreamCreate", stream_create_);
  need("cuStreamDestroy_v2", stream_destroy_);
  need("cuStreamSynchronize", stream_synchronize_);
  need("cuEventCreate", event_create_);
  need("cuEventDestroy_v2", event_destroy_);
  need("cuEventRecord", event_record_);
  need("cuEventQuery", event_query_);
  need("cuEventSynchronize", event_synchronize_);
  need("cuMemcpyAsync", memcpy_async_);
  need("cuMemAlloc_v2", mem_alloc_);
  need("cuMemFree_v2", mem_free_);
  need("cuMemHostAlloc", mem_host_alloc_);
  need("cuMemFreeHost", mem_free_host_);
  need("cuMemsetD8_v2", memset_d8_);
  need("cuMemGetAddressRange_v2", mem_get_address_range_);
  need("cuIpcGetMemHandle", ipc_get_mem_handle_);
  need("cuIpcOpenMemHandle_v2", ipc_open_mem_handle_);
  need("cuIpcCloseMemHandle", ipc_close_mem_handle_);
  memcpy_batch_async_ =
      reinterpret_cast<decltype(memcpy_batch_async_)>(::dlsym(h, "cuMemcpyBatchAsync_v2"));
  if (memcpy_batch_async_ == nullptr) {
    memcpy_batch_v1_ =
        reinterpret_cast<decltype(memcpy_batch_v1_)>(::dlsym(h, "cuMemcpyBatchAsync"));
  }
  // Kernels: all four or none.
  module_load_data_ = reinterpret_cast<decltype(module_load_data_)>(::dlsym(h, "cuModuleLoadData"));
  module_get_function_ =
      reinterpret_cast<decltype(module_get_function_)>(::dlsym(h, "cuModuleGetFunction"));
  module_unload_ = reinterpret_cast<decltype(module_unload_)>(::dlsym(h, "cuModuleUnload"));
  launch_kernel_ = reinterpret_cast<decltype(launch_kernel_)>(::dlsym(h, "cuLaunchKernel"));
  if (module_get_function_ == nullptr || module_unload_ == nullptr || launch_kernel_ == nullptr)
    module_load_data_ = nullptr;
  const Result r = init_(0);
  if (r != kCudaSuccess) {
    why_unavailable_ = "cuInit failed: " + ResultText(r);
    why_no_data_path_ = why_unavailable_;
    return;
  }
  available_ = true;
  data_path_ = missing.empty();
  why_no_data_path_ = missing;
}

std::string CudaDriver::ResultText(int result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name_ != nullptr && get_error_name_(result, &name) != kCudaSuccess) name = nullptr;
  if (get_error_string_ != nullptr && get_error_string_(result, &text) != kCudaSuccess)
    text = nullptr;
  std::string out = name != nullptr ? name : "CUresult " + std::to_string(result);
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

Status CudaDriver::CallFailed(const char* call, Result r) const {
  std::string m = std::string(call) + " failed: " + ResultText(r);
  switch (r) {
    case kCudaErrorNotInitialized:
    case kCudaErrorDeinitialized:
    case kCudaErrorNoDevice:
      return FailedPreconditionError(std::move(m));
    case kCudaErrorInvalidValue:
    case kCudaErrorInvalidDevice:
      return InvalidArgumentError(std::move(m));
    case kCudaErrorOutOfMemory:
      return ResourceExhaustedError(std::move(m));
    default:
      return InternalError(std::move(m));
  }
}

Status CudaDriver::NotAvailable(const char* call) const {
  return FailedPreconditionError(std::string(call) + ": no CUDA driver: " + why_unavailable_);
}

StatusOr<int> CudaDriver::DeviceCount() const {
  if (!available_) return NotAvailable("cuDeviceGetCount");
  int n = 0;
  const Result r = device_get_count_(&n);
  if (r != kCudaSuccess) return CallFailed("cuDeviceGetCount", r);
  return n;
}

StatusOr<std::string> CudaDriver::DeviceName(int ordinal) const {
  if (!available_) return NotAvailable("cuDeviceGetName");
  int dev = 0;
  Result r = device_get_(&dev, ordinal);
  if (r != kCudaSuccess)
    return CallFailed(("cuDeviceGet(" + std::to_string(ordinal) + ")").c_str(), r);
  char name[256] = {};
  r = device_get_name_(name, static_cast<int>(sizeof(name) - 1), dev);
  if (r != kCudaSuccess)
    return CallFailed(("cuDeviceGetName(" + std::to_string(ordinal) + ")").c_str(), r);
  return std::string(name);
}

StatusOr<int> CudaDriver::DriverVersion() const {
  if (!loaded_) return NotAvailable("cuDriverGetVersion");
  int v = 0;
  const Result r = driver_get_version_(&v);
  if (r != kCudaSuccess) return CallFailed("cuDriverGetVersion", r);
  return v;
}

StatusOr<std::optional<int>> CudaDriver::DeviceOfPointer(const void* p) const {
  if (!available_) return NotAvailable("cuPointerGetAttribute");
  const auto ptr = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p));
  unsigned type = 0;
  Result r = pointer_get_attribute_(&type, kPointerAttributeMemoryType, ptr);
  if (r == kCudaErrorInvalidValue) return std::optional<int>();  // not memory CUDA knows
  if (r != kCudaSuccess)
    return CallFailed("cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)", r);
  if (type != kMemoryTypeDevice) return std::optional<int>();  // host (pinned) memory
  int ordinal = -1;
  r = pointer_get_attribute_(&ordinal, kPointerAttributeDeviceOrdinal, ptr);
  if (r != kCudaSuccess)
    return CallFailed("cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)", r);
  return std::optional<int>(ordinal);
}

// ---- the data paths' calls ---------------------------------------------------

#define FERRY_CUDA_DATA_PATH(call)                                                         \
  do {                                                                                     \
    if (!data_path_) {                                                                     \
      return FailedPreconditionError(std::string(call) +                                   \
                                     ": the CUDA driver cannot move GPU "                  \
                                     "memory: " +                                          \
                                     (available_ ? why_no_data_path_ : why_unavailable_)); \
    }                                                                                      \
  } while (0)

Status CudaDriver::PushContext(int ordinal) const {
  FERRY_CUDA_DATA_PATH("cuCtxPushCurrent");
  if (ordinal < 0) return InvalidArgumentError("no CUDA device " + std::to_string(ordinal));
  void* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(contexts_mu_);
    if (static_cast<size_t>(ordinal) < contexts_.size()) ctx = contexts_[ordinal];
    if (ctx == nullptr) {
      int dev = 0;
      Result r = device_get_(&dev, ordinal);
      if (r != kCudaSuccess)
        return CallFailed(("cuDeviceGet(" + std::to_string(ordinal) + ")").c_str(), r);
      r = primary_ctx_retain_(&ctx, dev);
      if (r != kCudaSuccess) {
        return CallFailed(("cuDevicePrimaryCtxRetain(" + std::to_string(ordinal) + ")").c_str(), r);
      }
      if (contexts_.size() <= static_cast<size_t>(ordinal)) contexts_.resize(ordinal + 1, nullptr);
      contexts_[ordinal] = ctx;  // kept for the process's life, like the driver
    }
  }
  const Result r = ctx_push_(ctx);
  if (r != kCudaSuccess) return CallFailed("cuCtxPushCurrent", r);
  return OkStatus();
}

void CudaDriver::PopContext() const {
  if (!data_path_) return;
  void* ctx = nullptr;
  (void)ctx_pop_(&ctx);
}

StatusOr<CudaDriver::Stream> CudaDriver::CreateStream() const {
  FERRY_CUDA_DATA_PATH("cuStreamCreate");
  void* s = nullptr;
  const Result r = stream_create_(&s, kStreamNonBlocking);
  if (r != kCudaSuccess) return CallFailed("cuStreamCreate", r);
  return s;
}

void CudaDriver::DestroyStream(Stream s) const {
  if (data_path_ && s != nullptr) (void)stream_destroy_(s);
}

StatusOr<CudaDriver::Event> CudaDriver::CreateEvent() const {
  FERRY_CUDA_DATA_PATH("cuEventCreate");
  void* e = nullptr;
  const Result r = event_create_(&e, kEventDisableTiming);
  if (r != kCudaSuccess) return CallFailed("cuEventCreate", r);
  return e;
}

void CudaDriver::DestroyEvent(Event e) const {
  if (data_path_ && e != nullptr) (void)event_destroy_(e);
}

Status CudaDriver::CopyAsync(void* dst, const void* src, size_t length, Stream stream) const {
  FERRY_CUDA_DATA_PATH("cuMemcpyAsync");
  const Result r = memcpy_async_(AsPtr(dst), AsPtr(src), length, stream);
  if (r != kCudaSuccess) return CallFailed("cuMemcpyAsync", r);
  return OkStatus();
}

Status CudaDriver::CopyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* lengths,
                                  size_t n, Stream stream) const {
  FERRY_CUDA_DATA_PATH("cuMemcpyBatchAsync");
  if (!has_batch_copies()) {
    return UnimplementedError("cuMemcpyBatchAsync: " + library_ +
                              " has no batch copies (CUDA 12.8 or later has them)");
  }
  if (n == 0) return OkStatus();
  static_assert(sizeof(BatchAttributes) == 24, "CUmemcpyAttributes is 24 bytes");
  static_assert(sizeof(Ptr) == sizeof(void*));
  // The driver's arrays are not const; it does not write them.
  Ptr* d = reinterpret_cast<Ptr*>(const_cast<void**>(dsts));
  Ptr* s = reinterpret_cast<Ptr*>(const_cast<void**>(srcs));
  size_t* l = const_cast<size_t*>(lengths);
  BatchAttributes attrs;
  size_t first = 0;
  Result r;
  if (memcpy_batch_async_ != nullptr) {
    r = memcpy_batch_async_(d, s, l, n, &attrs, &first, 1, stream);
  } else {
    size_t failed = 0;
    r = memcpy_batch_v1_(d, s, l, n, &attrs, &first, 1, &failed, stream);
  }
  if (r != kCudaSuccess) return CallFailed("cuMemcpyBatchAsync", r);
  return OkStatus();
}

Status CudaDriver::RecordEvent(Event event, Stream stream) const {
  FERRY_CUDA_DATA_PATH("cuEventRecord");
  const Result r = event_record_(event, stream);
  if (r != kCudaSuccess) return CallFailed("cuEventRecord", r);
  return OkStatus();
}

StatusOr<bool> CudaDriver::EventDone(Event event) const {
  FERRY_CUDA_DATA_PATH("cuEventQuery");
  const Result r = event_query_(event);
  if (r == kCudaSuccess) return true;
  if (r == kCudaErrorNotReady) return false;
  return CallFailed("cuEventQuery", r);
}

Status CudaDriver::WaitEvent(Event event) const {
  FERRY_CUDA_DATA_PATH("cuEventSynchronize");
  const Result r = event_synchronize_(event);
  if (r != kCudaSuccess) return CallFailed("cuEventSynchronize", r);
  return OkStatus();
}

Status CudaDriver::WaitStream(Stream stream) const {
  FERRY_CUDA_DATA_PATH("cuStreamSynchronize");
  const Result r = stream_synchronize_(stream);
  if (r != kCudaSuccess) return CallFailed("cuStreamSynchronize", r);
  return OkStatus();
}

StatusOr<void*> CudaDriver::AllocateDevice(size_t length) const {
  FERRY_CUDA_DATA_PATH("cuMemAlloc");
  Ptr p = 0;
  const Result r = mem_alloc_(&p, length);
  if (r != kCudaSuccess)
    return CallFailed(("cuMemAlloc(" + std::to_string(length) + ")").c_str(), r);
  return FromPtr(p);
}

Status CudaDriver::FreeDevice(void* p) const {
  FERRY_CUDA_DATA_PATH("cuMemFree");
  const Result r = mem_free_(AsPtr(p));
  if (r != kCudaSuccess) return CallFailed("cuMemFree", r);
  return OkStatus();
}

StatusOr<void*> CudaDriver::AllocateHost(size_t length) const {
  FERRY_CUDA_DATA_PATH("cuMemHostAlloc");
  void* p = nullptr;
  const Result r = mem_host_alloc_(&p, length, kMemHostAllocPortable);
  if (r != kCudaSuccess)
    return CallFailed(("cuMemHostAlloc(" + std::to_string(length) + ")").c_str(), r);
  return p;
}

Status CudaDriver::FreeHost(void* p) const {
  FERRY_CUDA_DATA_PATH("cuMemFreeHost");
  const Result r = mem_free_host_(p);
  if (r != kCudaSuccess) return CallFailed("cuMemFreeHost", r);
  return OkStatus();
}

Status CudaDriver::Fill(void* device, uint8_t value, size_t length) const {
  FERRY_CUDA_DATA_PATH("cuMemsetD8");
  const Result r = memset_d8_(AsPtr(device), value, length);
  if (r != kCudaSuccess) return CallFailed("cuMemsetD8", r);
  return OkStatus();
}

StatusOr<CudaDriver::Allocation> CudaDriver::AllocationOf(const void* p) const {
  FERRY_CUDA_DATA_PATH("cuMemGetAddressRange");
  Ptr base = 0;
  size_t size = 0;
  const Result r = mem_get_address_range_(&base, &size, AsPtr(p));
  if (r != kCudaSuccess) return CallFailed("cuMemGetAddressRange", r);
  return Allocation{base, size};
}

StatusOr<CudaDriver::IpcHandle> CudaDriver::GetIpcHandle(const void* base) const {
  FERRY_CUDA_DATA_PATH("cuIpcGetMemHandle");
  RawIpcHandle raw{};
  const Result r = ipc_get_mem_handle_(&raw, AsPtr(base));
  if (r != kCudaSuccess) return CallFailed("cuIpcGetMemHandle", r);
  IpcHandle h;
  std::memcpy(h.data(), raw.reserved, h.size());
  return h;
}

StatusOr<void*> CudaDriver::OpenIpcHandle(const IpcHandle& handle) const {
  FERRY_CUDA_DATA_PATH("cuIpcOpenMemHandle");
  RawIpcHandle raw;
  std::memcpy(raw.reserved, handle.data(), handle.size());
  Ptr p = 0;
  const Result r = ipc_open_mem_handle_(&p, raw, kIpcLazyEnablePeerAccess);
  if (r != kCudaSuccess) return CallFailed("cuIpcOpenMemHandle", r);
  return FromPtr(p);
}

Status CudaDriver::CloseIpcHandle(void* mapped) const {
  FERRY_CUDA_DATA_PATH("cuIpcCloseMemHandle");
  const Result r = ipc_close_mem_handle_(AsPtr(mapped));
  if (r != kCudaSuccess) return CallFailed("cuIpcCloseMemHandle", r);
  return OkStatus();
}

StatusOr<CudaDriver::Module> CudaDriver::LoadModule(const char* ptx) const {
  FERRY_CUDA_DATA_PATH("cuModuleLoadData");
  if (!has_kernels())
    return UnimplementedError("cuModuleLoadData: " + library_ + " has no kernels");
  void* m = nullptr;
  const Result r = module_load_data_(&m, ptx);
  if (r != kCudaSuccess) return CallFailed("cuModuleLoadData", r);
  return m;
}

StatusOr<CudaDriver::Function> CudaDriver::GetFunction(Module m, const char* name) const {
  FERRY_CUDA_DATA_PATH("cuModuleGetFunction");
  if (!has_kernels())
    return UnimplementedError("cuModuleGetFunction: " + library_ + " has no kernels");
  void* f = nullptr;
  const Result r = module_get_function_(&f, m, name);
  if (r != kCudaSuccess)
    return CallFailed(("cuModuleGetFunction(" + std::string(name) + ")").c_str(), r);
  return f;
}

Status CudaDriver::Launch(Function f, unsigned grid, unsigned block, Stream stream,
                          void** params) const {
  FERRY_CUDA_DATA_PATH("cuLaunchKernel");
  if (!has_kernels()) return UnimplementedError("cuLaunchKernel: " + library_ + " has no kernels");
  const Result r = launch_kernel_(f, grid, 1, 1, block, 1, 1, 0, stream, params, nullptr);
  if (r != kCudaSuccess) return CallFailed("cuLaunchKernel", r);
  return OkStatus();
}

void CudaDriver::UnloadModule(Module m) const {
  if (data_path_ && has_kernels() && m != nullptr) (void)module_unload_(m);
}

#undef FERRY_CUDA_DATA_PATH

}  // namespace ferry::internal

namespace ferry {

CudaInfo DescribeCuda() {
  const internal::CudaDriver& d = internal::CudaDriver::Get();
  CudaInfo info;
  info.library = d.library();
  info.loaded = d.loaded();
  info.available = d.available();
  info.why_unavailable = d.why_unavailable();
  info.data_path = d.data_path();
  info.why_no_data_path = d.why_no_data_path();
  if (d.loaded()) {
    auto v = d.DriverVersion();
    if (v.ok()) {
      info.driver_version = *v;
    } else {
      info.error = v.status().message();
    }
  }
  if (d.available()) {
    auto n = d.DeviceCount();
    if (!n.ok()) {
      info.error = n.status().message();
      return info;
    }
    for (int i = 0; i < *n; ++i) {
      auto name = d.DeviceName(i);
      info.devices.push_back({i, name.ok() ? *name : "(" + name.status().message() + ")"});
    }
  }
  return info;
}

}  // namespace ferry
