// The controls of the fake CUDA driver (tests/testing/fake_cuda_driver.cc,
// built as ferry_fake_cuda; FERRY_FAKE_CUDA_PATH names it): what cuInit and
// cuPointerGetAttribute answer, and which address range is "device memory"
// (two devices); the streams' copy delay, cuIpcOpenMemHandle's and
// cuMemHostAlloc's forced results, the bytes copied by direction, the live
// allocations. The
// destructor puts everything back (and zeroes the copy counters). The test
// binary opens the same copy a CudaDriver of that path loads, so the
// settings reach it.
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
    SetCopyDelayUs(kDefaultCopyDelayUs);
    HoldStreams(false);
    SetIpcOpenResult(0);
    SetBatchResult(0);
    SetModuleResult(0);
    SetHostAllocResult(0);
    ResetCopiedBytes();
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

  // How long a stream's worker waits before each copy it runs (so that data
  // used before its event completed is caught); kDefaultCopyDelayUs unless set.
  static constexpr unsigned kDefaultCopyDelayUs = 200;
  void SetCopyDelayUs(unsigned us) {
    Fn<void (*)(unsigned)>("ferry_fake_cuda_set_copy_delay_us")(us);
  }
  // While held, no stream runs its next operation (what is queued waits for
  // HoldStreams(false)): "not run yet" without relying on a delay.
  void HoldStreams(bool hold) { Fn<void (*)(int)>("ferry_fake_cuda_hold_streams")(hold ? 1 : 0); }
  // What cuIpcOpenMemHandle_v2 answers instead of opening (0: it opens).
  void SetIpcOpenResult(int r) { Fn<void (*)(int)>("ferry_fake_cuda_set_ipc_open_result")(r); }
  // What cuMemcpyBatchAsync_v2 answers instead of copying (0: it copies), and
  // how many of its calls copied so far.
  void SetBatchResult(int r) { Fn<void (*)(int)>("ferry_fake_cuda_set_batch_result")(r); }
  // What cuModuleLoadData answers instead of loading (0: it loads), and how
  // many kernel launches (of Ferry's copy kernel) were queued so far.
  void SetModuleResult(int r) { Fn<void (*)(int)>("ferry_fake_cuda_set_module_result")(r); }
  // What cuMemHostAlloc answers instead of allocating (0: it allocates).
  void SetHostAllocResult(int r) { Fn<void (*)(int)>("ferry_fake_cuda_set_host_alloc_result")(r); }
  unsigned long long KernelLaunches() {
    return Fn<unsigned long long (*)()>("ferry_fake_cuda_kernel_launches")();
  }
  unsigned long long BatchCalls() {
    return Fn<unsigned long long (*)()>("ferry_fake_cuda_batch_calls")();
  }
  // Bytes the copies that ran so far moved, by direction (cuMemcpyAsync
  // tells device memory from host memory, pinned or not, on either side).
  enum Direction { kHostToDevice = 0, kDeviceToHost = 1, kDeviceToDevice = 2, kHostToHost = 3 };
  unsigned long long CopiedBytes(Direction d) {
    return Fn<unsigned long long (*)(int)>("ferry_fake_cuda_copied_bytes")(static_cast<int>(d));
  }
  void ResetCopiedBytes() { Fn<void (*)()>("ferry_fake_cuda_reset_copied_bytes")(); }
  // Mappings of this process the fake holds now (not reset: a test that
  // checks for leaks compares before and after).
  enum Kind { kDeviceAllocations = 0, kImportedMappings = 1, kHostAllocations = 2 };
  int LiveAllocations(Kind k) {
    return Fn<int (*)(int)>("ferry_fake_cuda_live_allocations")(static_cast<int>(k));
  }

 private:
  template <typename F>
  F Fn(const char* name) {
    return reinterpret_cast<F>(::dlsym(h_, name));
  }
  void* h_;
};

}  // namespace ferry::test
