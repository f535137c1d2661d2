// GPU memory for the tests, through the CUDA driver the tests use: the fake
// (tests/testing/fake_cuda_driver.cc, FERRY_FAKE_CUDA_PATH) on machines
// without a GPU, or the library FERRY_TEST_CUDA_DRIVER names
// (scripts/device-check.sh: "libcuda.so.1"). Device memory is reached only
// through the driver: filled and checked by copies, never by the CPU.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "ferry/options.h"
#include "tests/testing/pattern.h"

namespace ferry::test {

// The driver the tests use: FERRY_TEST_CUDA_DRIVER, or the fake.
inline std::string TestCudaDriverLibrary() {
  const char* e = std::getenv("FERRY_TEST_CUDA_DRIVER");
  return e != nullptr && *e != '\0' ? e : FERRY_FAKE_CUDA_PATH;
}
inline bool TestCudaDriverIsFake() { return TestCudaDriverLibrary() == FERRY_FAKE_CUDA_PATH; }

// Points `o` at the tests' driver (the real one needs no option).
inline void UseTestCudaDriver(EngineOptions* o) {
  if (TestCudaDriverLibrary() != internal::CudaDriver::kLibrary)
    o->testing.cuda_driver = TestCudaDriverLibrary();
}

// Device memory of device 0, freed with the object, and a stream to copy with.
class GpuMemory {
 public:
  using Driver = internal::CudaDriver;
  explicit GpuMemory(const Driver& d) : d_(d) {
    internal::CudaContextScope scope(d_, 0);
    if (!scope.status().ok()) return;
    auto s = d_.CreateStream();
    if (s.ok()) stream_ = *s;
  }
  ~GpuMemory() {
    internal::CudaContextScope scope(d_, 0);
    for (void* p : allocations_) EXPECT_TRUE(d_.FreeDevice(p).ok());
    if (stream_ != nullptr) d_.DestroyStream(stream_);
  }
  GpuMemory(const GpuMemory&) = delete;
  GpuMemory& operator=(const GpuMemory&) = delete;

  // `size` bytes filled with pattern `seed` (position = offset); null on failure.
  unsigned char* Allocate(uint64_t size, uint64_t seed) {
    internal::CudaContextScope scope(d_, 0);
    if (!scope.status().ok()) return nullptr;
    auto p = d_.AllocateDevice(size);
    if (!p.ok()) return nullptr;
    allocations_.push_back(*p);
    std::vector<unsigned char> host(size);
    FillPattern(host.data(), size, seed, 0);
    return Copy(*p, host.data(), size).ok() ? static_cast<unsigned char*>(*p) : nullptr;
  }

  Status Copy(void* dst, const void* src, uint64_t n) const {
    internal::CudaContextScope scope(d_, 0);
    if (!scope.status().ok()) return scope.status();
    if (Status s = d_.CopyAsync(dst, src, n, stream_); !s.ok()) return s;
    return d_.WaitStream(stream_);
  }

  // Copies i of lengths[i] bytes from srcs[i] to dsts[i] on this helper's
  // stream, then waits: each with its own cuMemcpyAsync, or (batch) all in
  // one cuMemcpyBatchAsync. The benchmark's baselines.
  Status CopyMany(const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                  const std::vector<size_t>& lengths, bool batch) const {
    internal::CudaContextScope scope(d_, 0);
    if (!scope.status().ok()) return scope.status();
    if (batch) {
      if (Status s =
              d_.CopyBatchAsync(dsts.data(), srcs.data(), lengths.data(), dsts.size(), stream_);
          !s.ok()) {
        return s;
      }
    } else {
      for (size_t i = 0; i < dsts.size(); ++i) {
        if (Status s = d_.CopyAsync(dsts[i], srcs[i], lengths[i], stream_); !s.ok()) return s;
      }
    }
    return d_.WaitStream(stream_);
  }

  // Whether [off, off + len) of device memory `p` is pattern `seed` at `pos`.
  ::testing::AssertionResult Holds(const unsigned char* p, uint64_t off, uint64_t len,
                                   uint64_t seed, uint64_t pos) const {
    std::vector<unsigned char> host(len);
    const Status s = Copy(host.data(), p + off, len);
    if (!s.ok()) return ::testing::AssertionFailure() << s;
    const std::optional<size_t> bad = CheckPattern(host.data(), len, seed, pos);
    if (bad) return ::testing::AssertionFailure() << "byte " << off + *bad << " differs";
    return ::testing::AssertionSuccess();
  }

 private:
  const Driver& d_;
  Driver::Stream stream_ = nullptr;
  std::vector<void*> allocations_;
};

}  // namespace ferry::test
