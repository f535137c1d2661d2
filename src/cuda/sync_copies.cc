#include "cuda/sync_copies.h"

namespace ferry::internal::cuda {

SyncCopies::~SyncCopies() {
  for (auto& [device, s] : streams_) {
    CudaContextScope scope(d_, device);
    if (scope.status().ok()) d_.DestroyStream(s);
  }
}

Status SyncCopies::Copy(int device, void* dst, const void* src, size_t n) {
  CudaContextScope scope(d_, device);
  FERRY_RETURN_IF_ERROR(scope.status());
  auto it = streams_.find(device);
  if (it == streams_.end()) {
    FERRY_ASSIGN_OR_RETURN(CudaDriver::Stream s, d_.CreateStream());
    it = streams_.emplace(device, s).first;
  }
  FERRY_RETURN_IF_ERROR(d_.CopyAsync(dst, src, n, it->second));
  return d_.WaitStream(it->second);
}

}  // namespace ferry::internal::cuda
