// The CUDA driver, loaded at run time: Ferry builds and runs without CUDA.
//
// Nothing here includes cuda.h or links libcuda: the few driver entry points
// Ferry calls are declared in cuda_driver.cc and looked up with dlsym in
// libcuda.so.1 (the driver's own library, installed with the kernel driver,
// not with the toolkit). On a machine without a driver every query answers
// kFailedPrecondition naming why.
//
// What it is for: telling GPU memory from host memory (so a device pointer is
// never handed to memcpy, sendmsg or process_vm_writev as if it were host
// memory), checking "cuda:N" registrations, `ferry info`, and the GPU data
// paths' calls: primary contexts, streams, events, asynchronous copies,
// allocations and IPC handles.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::internal {

class CudaDriver {
 public:
  // The driver's library, as the loader finds it.
  static constexpr const char* kLibrary = "libcuda.so.1";

  // The process's driver: libcuda.so.1 loaded (and cuInit(0) called) the
  // first time this is called, from any thread; immutable after (but for the
  // primary contexts PushContext retains, behind a mutex), so it is
  // safe to share without locks. A function-local static (C++ initialises it
  // exactly once, thread-safely) because the driver itself is per process:
  // one dlopen reference, one cuInit, whatever the number of engines. It is
  // never unloaded (device pointers may outlive any engine).
  static const CudaDriver& Get();
  // The driver in `library` (a path, or a name the loader looks up), loaded
  // once per process and name and never unloaded, like Get(); Load(kLibrary)
  // is Get(). How engines given another driver (EngineOptions::testing.
  // cuda_driver: the fake driver of the tests) find theirs.
  static const CudaDriver& Load(const std::string& library);

  // Whether this process has already loaded libcuda.so.1 (an application, a
  // framework or Get()). Loads nothing. Without the driver in the process no
  // pointer of it can be device memory, so registrations of host memory ask
  // this first and never initialise CUDA in a process that does not use it.
  static bool LoadedInProcess();

  // Loads `library` (a name the loader looks up, or a path) and calls
  // cuInit(0). For the tests (a fake driver, or a library that does not
  // exist); everything else uses Get(). Never unloads the library.
  explicit CudaDriver(const std::string& library);
  CudaDriver(const CudaDriver&) = delete;
  CudaDriver& operator=(const CudaDriver&) = delete;

  const std::string& library() const { return library_; }
  // The library loaded and has every entry point Ferry calls.
  bool loaded() const { return loaded_; }
  // Loaded, and cuInit(0) succeeded: devices can be asked about.
  bool available() const { return available_; }
  // "" when available(); else why not, e.g. "libcuda.so.1 not found
  // (libcuda.so.1: cannot open shared object file: ...)" or "cuInit failed:
  // CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)".
  const std::string& why_unavailable() const { return why_unavailable_; }

  // Every failure names the driver call and its CUresult (name and text).
  // Codes: kFailedPrecondition when the driver is not available (naming
  // why_unavailable()) or answers CUDA_ERROR_NOT_INITIALIZED,
  // CUDA_ERROR_DEINITIALIZED or CUDA_ERROR_NO_DEVICE; kInvalidArgument for
  // CUDA_ERROR_INVALID_VALUE and CUDA_ERROR_INVALID_DEVICE; kResourceExhausted for
  // CUDA_ERROR_OUT_OF_MEMORY; kInternal for any
  // other CUresult.

  // The number of CUDA devices.
  StatusOr<int> DeviceCount() const;
  // Device `ordinal`'s name ("NVIDIA H200").
  StatusOr<std::string> DeviceName(int ordinal) const;
  // The driver's CUDA version as cuDriverGetVersion reports it (13000 for
  // 13.0). Needs only loaded(), not available().
  StatusOr<int> DriverVersion() const;
  // The ordinal of the device whose memory `p` is, or nullopt when `p` is
  // not device memory: host memory (pinned by CUDA or not) or an address
  // CUDA does not know (cuPointerGetAttribute answers
  // CUDA_ERROR_INVALID_VALUE). Managed memory reports a device if the driver
  // says CU_MEMORYTYPE_DEVICE for it. kFailedPrecondition when the driver is
  // not available.
  StatusOr<std::optional<int>> DeviceOfPointer(const void* p) const;

  // "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)", or
  // "CUresult 100" when the driver cannot name it.
  std::string ResultText(int result) const;

  // ---- the data paths' calls -------------------------------------------
  // Available only when the driver also has these entry points (every
  // driver of CUDA 11.3 or later): data_path() is false otherwise, with
  // why_no_data_path() naming the missing one, and each call below answers
  // kFailedPrecondition.
  bool data_path() const { return data_path_; }
  const std::string& why_no_data_path() const { return why_no_data_path_; }

  // Opaque driver objects (CUcontext, CUstream, CUevent).
  using Stream = void*;
  using Event = void*;
  static constexpr size_t kIpcHandleSize = 64;  // CU_IPC_HANDLE_SIZE
  using IpcHandle = std::array<uint8_t, kIpcHandleSize>;
  struct Allocation {
    uint64_t base = 0;
    uint64_t size = 0;
  };

  // Makes device `ordinal`'s primary context current on the calling thread
  // (cuCtxPushCurrent; the context is retained once per process and kept)
  // until PopContext. Every call below except the event and stream queries
  // needs a current context; Ferry pushes and pops around each use, so an
  // application thread's own context is left as it was.
  Status PushContext(int ordinal) const;
  void PopContext() const;

  // A stream that does not synchronise with the legacy default stream
  // (CU_STREAM_NON_BLOCKING), and events without timing
  // (CU_EVENT_DISABLE_TIMING).
  StatusOr<Stream> CreateStream() const;
  void DestroyStream(Stream s) const;
  StatusOr<Event> CreateEvent() const;
  void DestroyEvent(Event e) const;
  // Queues a copy of `length` bytes on `stream` (cuMemcpyAsync: unified
  // addressing tells host from device memory on either side).
  Status CopyAsync(void* dst, const void* src, size_t length, Stream stream) const;
  // Whether the driver queues many copies in one call (cuMemcpyBatchAsync,
  // CUDA 12.8+; optional), and that call: copies i of `lengths[i]` bytes
  // from srcs[i] to dsts[i], in any order among themselves, after the
  // stream's earlier work (sources read in stream order). One driver call
  // instead of n: the cost per copy that dominates small copies on a GPU.
  bool has_batch_copies() const {
    return memcpy_batch_async_ != nullptr || memcpy_batch_v1_ != nullptr;
  }
  Status CopyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* lengths, size_t n,
                        Stream stream) const;
  // Kernels of a PTX image (optional entry points, every driver since CUDA
  // 4 has them): the module loaded into the current context (the driver
  // compiles the PTX for its device), a function of it, a launch on
  // `stream` with `params` as cuLaunchKernel takes them (one pointer to
  // each argument), and the module unloaded again.
  using Module = void*;    // CUmodule
  using Function = void*;  // CUfunction
  bool has_kernels() const { return module_load_data_ != nullptr; }
  StatusOr<Module> LoadModule(const char* ptx) const;
  StatusOr<Function> GetFunction(Module m, const char* name) const;
  Status Launch(Function f, unsigned grid, unsigned block, Stream stream, void** params) const;
  void UnloadModule(Module m) const;
  // Marks the point on `stream` that `event` completes at.
  Status RecordEvent(Event event, Stream stream) const;
  // Whether `event` completed (cuEventQuery: CUDA_SUCCESS or
  // CUDA_ERROR_NOT_READY); an error of work before it fails.
  StatusOr<bool> EventDone(Event event) const;
  // Waits for `event` only (never for the whole device).
  Status WaitEvent(Event event) const;
  Status WaitStream(Stream stream) const;

  // Device memory on the current context's device (cuMemAlloc), page-locked
  // host memory usable by every context (cuMemHostAlloc with
  // CU_MEMHOSTALLOC_PORTABLE), and a synchronous fill of device memory.
  StatusOr<void*> AllocateDevice(size_t length) const;
  Status FreeDevice(void* p) const;
  StatusOr<void*> AllocateHost(size_t length) const;
  Status FreeHost(void* p) const;
  Status Fill(void* device, uint8_t value, size_t length) const;

  // The device allocation holding `p` (cuMemGetAddressRange).
  StatusOr<Allocation> AllocationOf(const void* p) const;
  // The IPC handle of the allocation that starts at `base`; another process
  // of this host opens it to map the same memory (cuIpcOpenMemHandle with
  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) and closes that mapping again.
  StatusOr<IpcHandle> GetIpcHandle(const void* base) const;
  StatusOr<void*> OpenIpcHandle(const IpcHandle& handle) const;
  Status CloseIpcHandle(void* mapped) const;

 private:
  using Result = int;  // CUresult
  Status CallFailed(const char* call, Result r) const;
  Status NotAvailable(const char* call) const;

  std::string library_;
  bool loaded_ = false;
  bool available_ = false;
  std::string why_unavailable_;
  // Entry points (CUresult is an int-sized enum, CUdevice an int,
  // CUdeviceptr an unsigned long long on 64-bit hosts).
  Result (*init_)(unsigned int) = nullptr;
  Result (*driver_get_version_)(int*) = nullptr;
  Result (*device_get_count_)(int*) = nullptr;
  Result (*device_get_)(int*, int) = nullptr;
  Result (*device_get_name_)(char*, int, int) = nullptr;
  Result (*pointer_get_attribute_)(void*, int, unsigned long long) = nullptr;
  Result (*get_error_string_)(Result, const char**) = nullptr;
  Result (*get_error_name_)(Result, const char**) = nullptr;  // optional
  bool data_path_ = false;
  std::string why_no_data_path_;
  using Ptr = unsigned long long;  // CUdeviceptr
  Result (*primary_ctx_retain_)(void**, int) = nullptr;
  Result (*ctx_push_)(void*) = nullptr;
  Result (*ctx_pop_)(void**) = nullptr;
  Result (*stream_create_)(void**, unsigned) = nullptr;
  Result (*stream_destroy_)(void*) = nullptr;
  Result (*stream_synchronize_)(void*) = nullptr;
  Result (*event_create_)(void**, unsigned) = nullptr;
  Result (*event_destroy_)(void*) = nullptr;
  Result (*event_record_)(void*, void*) = nullptr;
  Result (*event_query_)(void*) = nullptr;
  Result (*event_synchronize_)(void*) = nullptr;
  Result (*memcpy_async_)(Ptr, Ptr, size_t, void*) = nullptr;
  // cuMemcpyBatchAsync_v2 (CUDA 13) and its 12.8 form with a failure index;
  // the attributes are CUmemcpyAttributes (4 + 8 + 8 + 4 bytes).
  struct BatchAttributes {
    int src_access_order = 1;  // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    int src_hint[2] = {0, 0};  // CUmemLocation {type, id}: ignored here
    int dst_hint[2] = {0, 0};
    unsigned flags = 0;
  };
  Result (*module_load_data_)(void**, const void*) = nullptr;            // optional
  Result (*module_get_function_)(void**, void*, const char*) = nullptr;  // optional
  Result (*module_unload_)(void*) = nullptr;                             // optional
  Result (*launch_kernel_)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           unsigned, void*, void**, void**) = nullptr;  // optional
  Result (*memcpy_batch_async_)(Ptr*, Ptr*, size_t*, size_t, BatchAttributes*, size_t*, size_t,
                                void*) = nullptr;  // optional
  Result (*memcpy_batch_v1_)(Ptr*, Ptr*, size_t*, size_t, BatchAttributes*, size_t*, size_t,
                             size_t*, void*) = nullptr;  // optional
  Result (*mem_alloc_)(Ptr*, size_t) = nullptr;
  Result (*mem_free_)(Ptr) = nullptr;
  Result (*mem_host_alloc_)(void**, size_t, unsigned) = nullptr;
  Result (*mem_free_host_)(void*) = nullptr;
  Result (*memset_d8_)(Ptr, unsigned char, size_t) = nullptr;
  Result (*mem_get_address_range_)(Ptr*, size_t*, Ptr) = nullptr;
  Result (*ipc_get_mem_handle_)(void*, Ptr) = nullptr;  // CUipcMemHandle* out
  struct RawIpcHandle {
    char reserved[kIpcHandleSize];  // CUipcMemHandle, passed by value
  };
  Result (*ipc_open_mem_handle_)(Ptr*, RawIpcHandle, unsigned) = nullptr;
  Result (*ipc_close_mem_handle_)(Ptr) = nullptr;
  // Primary contexts retained so far, by ordinal (PushContext).
  mutable std::mutex contexts_mu_;
  mutable std::vector<void*> contexts_;
};

// Device `ordinal`'s primary context current on this thread for the scope
// (CudaDriver::PushContext, then PopContext); status() says whether it is.
class CudaContextScope {
 public:
  CudaContextScope(const CudaDriver& driver, int ordinal)
      : driver_(driver), status_(driver.PushContext(ordinal)) {}
  ~CudaContextScope() {
    if (status_.ok()) driver_.PopContext();
  }
  CudaContextScope(const CudaContextScope&) = delete;
  CudaContextScope& operator=(const CudaContextScope&) = delete;
  const Status& status() const { return status_; }

 private:
  const CudaDriver& driver_;
  const Status status_;
};

}  // namespace ferry::internal
