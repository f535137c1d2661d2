#include "cuda/sync_copies.h"

#include <algorithm>

namespace ferry::internal::cuda {

SyncCopies::~SyncCopies() {
  for (auto& [device, s] : streams_) {
    CudaContextScope scope(d_, device);
    if (scope.status().ok()) d_.DestroyStream(s);
  }
}

StatusOr<CudaDriver::Stream> SyncCopies::StreamOf(int device) {
  auto it = streams_.find(device);
  if (it == streams_.end()) {
    FERRY_ASSIGN_OR_RETURN(CudaDriver::Stream s, d_.CreateStream());
    it = streams_.emplace(device, s).first;
  }
  return it->second;
}

Status SyncCopies::Copy(int device, void* dst, const void* src, size_t n) {
  FERRY_RETURN_IF_ERROR(Queue(device, dst, src, n));
  return WaitAll().at(device);
}

Status SyncCopies::Queue(int device, void* dst, const void* src, size_t n) {
  CudaContextScope scope(d_, device);
  FERRY_RETURN_IF_ERROR(scope.status());
  FERRY_ASSIGN_OR_RETURN(CudaDriver::Stream s, StreamOf(device));
  FERRY_RETURN_IF_ERROR(d_.CopyAsync(dst, src, n, s));
  if (std::find(queued_.begin(), queued_.end(), device) == queued_.end()) queued_.push_back(device);
  return OkStatus();
}

std::map<int, Status> SyncCopies::WaitAll() {
  std::map<int, Status> out;
  for (int device : queued_) {
    CudaContextScope scope(d_, device);
    out[device] = scope.status().ok() ? d_.WaitStream(streams_.at(device)) : scope.status();
  }
  queued_.clear();
  return out;
}

}  // namespace ferry::internal::cuda
