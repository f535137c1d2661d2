#include "common/cuda_driver.h"

#include <dlfcn.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "ferry/cuda.h"

namespace ferry::internal {
namespace {

// Driver API facts (the values cuda.h gives them); nothing of cuda.h itself.
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorInvalidValue = 1;
constexpr int kCudaErrorNotInitialized = 3;
constexpr int kCudaErrorDeinitialized = 4;
constexpr int kCudaErrorNoDevice = 100;
constexpr int kCudaErrorInvalidDevice = 101;
constexpr int kPointerAttributeMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPointerAttributeDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr unsigned kMemoryTypeDevice = 2;          // CU_MEMORYTYPE_DEVICE

std::string DlErrorText() {
  const char* e = ::dlerror();
  return e != nullptr ? e : "no error text";
}

}  // namespace

const CudaDriver& CudaDriver::Get() {
  static const CudaDriver driver(kLibrary);
  return driver;
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
  if (!why_unavailable_.empty()) return;
  loaded_ = true;
  const Result r = init_(0);
  if (r != kCudaSuccess) {
    why_unavailable_ = "cuInit failed: " + ResultText(r);
    return;
  }
  available_ = true;
}

std::string CudaDriver::ResultText(int result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (get_error_name_ != nullptr && get_error_name_(result, &name) != kCudaSuccess) name = nullptr;
  if (get_error_string_ != nullptr && get_error_string_(result, &text) != kCudaSuccess) text = nullptr;
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
  if (r != kCudaSuccess) return CallFailed(("cuDeviceGet(" + std::to_string(ordinal) + ")").c_str(), r);
  char name[256] = {};
  r = device_get_name_(name, static_cast<int>(sizeof(name) - 1), dev);
  if (r != kCudaSuccess) return CallFailed(("cuDeviceGetName(" + std::to_string(ordinal) + ")").c_str(), r);
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
  if (r != kCudaSuccess) return CallFailed("cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)", r);
  if (type != kMemoryTypeDevice) return std::optional<int>();  // host (pinned) memory
  int ordinal = -1;
  r = pointer_get_attribute_(&ordinal, kPointerAttributeDeviceOrdinal, ptr);
  if (r != kCudaSuccess) return CallFailed("cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)", r);
  return std::optional<int>(ordinal);
}

}  // namespace ferry::internal

namespace ferry {

CudaInfo DescribeCuda() {
  const internal::CudaDriver& d = internal::CudaDriver::Get();
  CudaInfo info;
  info.library = d.library();
  info.loaded = d.loaded();
  info.available = d.available();
  info.why_unavailable = d.why_unavailable();
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
