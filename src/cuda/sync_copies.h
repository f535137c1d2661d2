// Synchronous GPU copies for a target-side service that stages GPU memory
// through host memory (the tcp stream service): one stream per device, made
// on first use; each Copy waits for its own stream only, never the device.
// Not thread-safe: one per stream service (its loop thread).
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "common/cuda_driver.h"

namespace ferry::internal::cuda {

class SyncCopies {
 public:
  explicit SyncCopies(const CudaDriver& d) : d_(d) {}
  ~SyncCopies();
  SyncCopies(const SyncCopies&) = delete;
  SyncCopies& operator=(const SyncCopies&) = delete;

  // Copies `n` bytes (host or GPU memory on either side) in device
  // `device`'s context and returns once they (and whatever was queued
  // before) are in place: Queue, then WaitAll.
  Status Copy(int device, void* dst, const void* src, size_t n);
  // Queues such a copy; WaitAll then waits for every device queued on since
  // the last WaitAll and says, by device, whether its copies all landed.
  Status Queue(int device, void* dst, const void* src, size_t n);
  std::map<int, Status> WaitAll();

 private:
  const CudaDriver& d_;
  StatusOr<CudaDriver::Stream> StreamOf(int device);  // with its context current
  std::map<int, CudaDriver::Stream> streams_;
  std::vector<int> queued_;  // devices with copies queued since the last WaitAll
};

}  // namespace ferry::internal::cuda
