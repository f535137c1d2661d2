// The CUDA driver, loaded at run time: Ferry builds and runs without CUDA.
//
// Nothing here includes cuda.h or links libcuda: the few driver entry points
// Ferry calls are declared in cuda_driver.cc and looked up with dlsym in
// libcuda.so.1 (the driver's own library, installed with the kernel driver,
// not with the toolkit). On a machine without a driver every query answers
// kFailedPrecondition naming why.
//
// What it is for today: telling GPU memory from host memory (so a device
// pointer is never handed to memcpy, sendmsg or process_vm_writev as if it
// were host memory), refusing "cuda:N" registrations with the right reason,
// and `ferry info`. No GPU data path uses it yet.
#pragma once

#include <optional>
#include <string>

#include "ferry/status.h"

namespace ferry::internal {

class CudaDriver {
 public:
  // The driver's library, as the loader finds it.
  static constexpr const char* kLibrary = "libcuda.so.1";

  // The process's driver: libcuda.so.1 loaded (and cuInit(0) called) the
  // first time this is called, from any thread; immutable after, so it is
  // safe to share without locks. A function-local static (C++ initialises it
  // exactly once, thread-safely) because the driver itself is per process:
  // one dlopen reference, one cuInit, whatever the number of engines. It is
  // never unloaded (device pointers may outlive any engine).
  static const CudaDriver& Get();

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
  // CUDA_ERROR_INVALID_VALUE and CUDA_ERROR_INVALID_DEVICE; kInternal for any
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
};

}  // namespace ferry::internal
