// BatchState: the requests of one batch and their completion, counted once
// here for every transport.
//
// Thread contract: Reserve/Begin are called by the submitting thread;
// CompleteSlice by any transport thread; readers (Get, Summary, Wait) by
// anyone. Request slots are allocated up front (capacity), so completions
// never race with a reallocation.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::internal {

class BatchState {
 public:
  explicit BatchState(size_t capacity);

  size_t capacity() const { return capacity_; }
  // Number of requests reserved so far (submitted or being submitted).
  size_t reserved() const { return reserved_.load(std::memory_order_acquire); }

  // Reserves `n` request slots; returns the index of the first.
  // kResourceExhausted if they do not fit.
  StatusOr<size_t> Reserve(size_t n);
  // Marks request `index` pending with `slices` slices outstanding.
  // REQUIRES: index was reserved; slices > 0.
  void Begin(size_t index, uint32_t slices);
  // Completes one slice of request `index` (transports call this).
  void CompleteSlice(size_t index, const Status& status);
  // Completes `slices` slices of request `index` at once with one status.
  void CompleteSlices(size_t index, uint32_t slices, const Status& status);

  TransferStatus Get(size_t index) const;
  BatchStatus Summary() const;
  size_t pending() const { return pending_.load(std::memory_order_acquire); }
  // True when no request is pending any more (waiting out completions that
  // already published their final state but have not finished their
  // bookkeeping): then the batch may be freed.
  bool SettleIfFinal() const;

  // Waits until no request is pending or the deadline passes; spins for up to
  // `spin` first (cheap when completion is imminent). OK when nothing is
  // pending any more (whatever the outcome).
  bool WaitIdle(std::chrono::steady_clock::time_point deadline, std::chrono::microseconds spin);

 private:
  // 8 bytes: batches of 100,000s of requests are allocated per transfer.
  struct Request {
    std::atomic<uint32_t> remaining{0};
    std::atomic<uint8_t> state{0};  // TransferState
    std::atomic<bool> failed{false};
  };

  const size_t capacity_;
  std::unique_ptr<Request[]> requests_;
  std::atomic<size_t> reserved_{0};
  std::atomic<size_t> pending_{0};
  std::atomic<size_t> completed_{0};
  std::atomic<size_t> failed_{0};

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  Status first_error_;  // guarded by mu_
  // The first failure of each failed request, by index (failures are rare,
  // so they live here rather than in every Request). Guarded by mu_.
  std::unordered_map<size_t, Status> errors_;
};

}  // namespace ferry::internal
