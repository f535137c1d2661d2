// The controls of the fake CUDA driver (tests/testing/fake_cuda_driver.cc,
// built as ferry_fake_cuda; FERRY_FAKE_CUDA_PATH names it): what cuInit and
// cuPointerGetAttribute answer, and which address range is "device memory"
// (two devices). The destructor puts everything back. The test binary opens
// the same copy a CudaDriver of that path loads, so the settings reach it.
#pragma once

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>

namespace ferry::test {

class FakeCuda {
 public:
  FakeCuda() : h_(::dlopen(FERRY_FAKE_CUDA_PATH, RTLD_NOW | RTLD_LOCAL)) {}
  ~FakeCuda() {
    if (h_ == nullptr) return;
    SetInitResult(0);
    SetDeviceMemory(nullptr, 0, 0);
    SetPointerResult(0);
    ::dlclose(h_);
  }
  FakeCuda(const FakeCuda&) = delete;
  FakeCuda& operator=(const FakeCuda&) = delete;

  bool ok() const { return h_ != nullptr; }
  void SetInitResult(int r) { Fn<void (*)(int)>("ferry_fake_cuda_set_init_result")(r); }
  void SetDeviceMemory(const void* lo, size_t n, int ordinal) {
    const auto a = reinterpret_cast<uintptr_t>(lo);
    Fn<void (*)(uintptr_t, uintptr_t, int)>("ferry_fake_cuda_set_device_memory")(a, a + n, ordinal);
  }
  void SetPointerResult(int r) { Fn<void (*)(int)>("ferry_fake_cuda_set_pointer_result")(r); }

 private:
  template <typename F>
  F Fn(const char* name) {
    return reinterpret_cast<F>(::dlsym(h_, name));
  }
  void* h_;
};

}  // namespace ferry::test
