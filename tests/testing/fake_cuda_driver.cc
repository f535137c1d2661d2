// A stand-in for the CUDA driver (libcuda.so.1) for the tests of Ferry's
// cuda memory kind on machines without a GPU: the entry points Ferry looks up
// (common/cuda_driver.cc), answering like the driver does (CUresult values of
// the driver API), with two devices and one range of "device memory" the
// test chooses. Loaded by path (FERRY_FAKE_CUDA_PATH), never named libcuda.
// The test reaches the ferry_fake_cuda_* controls with dlopen/dlsym of the
// same path (the loader hands back the same copy, so the state is shared).
#include <cstdint>
#include <cstring>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidValue = 1;
constexpr int kNotInitialized = 3;
constexpr int kNoDevice = 100;
constexpr int kInvalidDevice = 101;
constexpr int kMemoryTypeDevice = 2;  // CU_MEMORYTYPE_DEVICE
constexpr int kAttributeMemoryType = 2;
constexpr int kAttributeDeviceOrdinal = 9;
constexpr int kDevices = 2;

// Only the test's thread touches these, between driver calls.
int init_result = kSuccess;
bool initialized = false;
uintptr_t device_lo = 0, device_hi = 0;
int device_ordinal = 0;
int pointer_result = kSuccess;  // forced result of cuPointerGetAttribute, if not kSuccess

}  // namespace

extern "C" {

// Controls for the tests.
__attribute__((visibility("default"))) void ferry_fake_cuda_set_init_result(int r) { init_result = r; }
__attribute__((visibility("default"))) void ferry_fake_cuda_set_device_memory(uintptr_t lo, uintptr_t hi, int ordinal) {
  device_lo = lo;
  device_hi = hi;
  device_ordinal = ordinal;
}
__attribute__((visibility("default"))) void ferry_fake_cuda_set_pointer_result(int r) { pointer_result = r; }

// The driver API subset.
__attribute__((visibility("default"))) int cuInit(unsigned int flags) {
  if (flags != 0) return kInvalidValue;
  if (init_result != kSuccess) return init_result;
  initialized = true;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDriverGetVersion(int* version) {
  if (version == nullptr) return kInvalidValue;
  *version = 13000;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGetCount(int* count) {
  if (!initialized) return kNotInitialized;
  if (count == nullptr) return kInvalidValue;
  *count = kDevices;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGet(int* device, int ordinal) {
  if (!initialized) return kNotInitialized;
  if (device == nullptr) return kInvalidValue;
  if (ordinal < 0 || ordinal >= kDevices) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuDeviceGetName(char* name, int len, int device) {
  if (!initialized) return kNotInitialized;
  if (name == nullptr || len <= 0) return kInvalidValue;
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  const char* names[kDevices] = {"Ferry Fake GPU 0", "Ferry Fake GPU 1"};
  std::strncpy(name, names[device], static_cast<size_t>(len) - 1);
  name[len - 1] = '\0';
  return kSuccess;
}

__attribute__((visibility("default"))) int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  if (!initialized) return kNotInitialized;
  if (data == nullptr) return kInvalidValue;
  if (pointer_result != kSuccess) return pointer_result;
  if (ptr < device_lo || ptr >= device_hi) return kInvalidValue;  // memory the driver does not know
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

__attribute__((visibility("default"))) int cuGetErrorName(int error, const char** str) {
  if (str == nullptr) return kInvalidValue;
  switch (error) {
    case kSuccess: *str = "CUDA_SUCCESS"; return kSuccess;
    case kInvalidValue: *str = "CUDA_ERROR_INVALID_VALUE"; return kSuccess;
    case kNotInitialized: *str = "CUDA_ERROR_NOT_INITIALIZED"; return kSuccess;
    case kNoDevice: *str = "CUDA_ERROR_NO_DEVICE"; return kSuccess;
    case kInvalidDevice: *str = "CUDA_ERROR_INVALID_DEVICE"; return kSuccess;
    default: *str = nullptr; return kInvalidValue;
  }
}

__attribute__((visibility("default"))) int cuGetErrorString(int error, const char** str) {
  if (str == nullptr) return kInvalidValue;
  switch (error) {
    case kSuccess: *str = "no error"; return kSuccess;
    case kInvalidValue: *str = "invalid argument"; return kSuccess;
    case kNotInitialized: *str = "initialization error"; return kSuccess;
    case kNoDevice: *str = "no CUDA-capable device is detected"; return kSuccess;
    case kInvalidDevice: *str = "invalid device ordinal"; return kSuccess;
    default: *str = nullptr; return kInvalidValue;
  }
}

}  // extern "C"
