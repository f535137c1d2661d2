// BatchState: the requests of one batch and their completion, counted once
// here for every transport. Published by the core for the transports (with
// core/memory_registry.h and core/target.h): the only parts of the core they
// include.
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
  void Begin(size_t index, uint32_t slices) {
    BeginRange(index, 1, [slices](size_t) { return slices; });
  }
  // Marks requests [first, first + n) pending, request i with
  // slices_of(i) > 0 slices outstanding; one update of the shared counter.
  template <class SlicesOf>
  void BeginRange(size_t first, size_t n, SlicesOf slices_of) {
    for (size_t i = first; i < first + n; ++i) {
      Slot& r = slots_[i];
      r.remaining.store(slices_of(i), std::memory_order_relaxed);
      r.state.store(static_cast<uint8_t>(TransferState::kPending), std::memory_order_relaxed);
    }
    // Pairs with the acq_rel decrement in Completer::Publish.
    pending_.fetch_add(n, std::memory_order_acq_rel);
  }
  // Completes one slice of request `index` (transports call this).
  void CompleteSlice(size_t index, const Status& status);
  // Completes `slices` slices of request `index` at once with one status.
  void CompleteSlices(size_t index, uint32_t slices, const Status& status);

  // Completes the slices of many requests (a transport frame's) and
  // publishes the batch's counters once, when it goes out of scope: per
  // request one atomic on its own slot instead of four, two of them on
  // counters that every stream's thread shares. Each request's own state is
  // final as soon as Complete returns; Summary and WaitIdle see the requests
  // when the Completer publishes. One thread, short-lived (one frame).
  class Completer {
   public:
    explicit Completer(BatchState& batch) : batch_(batch) {}
    ~Completer() { Publish(); }
    Completer(const Completer&) = delete;
    Completer& operator=(const Completer&) = delete;

    void Complete(size_t index, uint32_t slices, const Status& status);
    void Publish();
    // Starts loading request `index`'s slot. A frame's slices are ordered
    // by address, so their requests are scattered over the batch: without
    // it, each Complete waits for a cache miss.
    void Prefetch(size_t index) const { __builtin_prefetch(&batch_.slots_[index], 1); }

   private:
    BatchState& batch_;
    size_t completed_ = 0;
    size_t failed_ = 0;
  };

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
  // One request's state. 8 bytes: batches of 100,000s of requests are
  // allocated per transfer.
  struct Slot {
    std::atomic<uint32_t> remaining{0};
    std::atomic<uint8_t> state{0};  // TransferState
    std::atomic<bool> failed{false};
  };

  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<size_t> reserved_{0};
  std::atomic<size_t> pending_{0};
  std::atomic<size_t> completed_{0};
  std::atomic<size_t> failed_{0};

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  Status first_error_;  // guarded by mu_
  // The first failure of each failed request, by index (failures are rare,
  // so they live here rather than in every Slot). Guarded by mu_.
  std::unordered_map<size_t, Status> errors_;
};

}  // namespace ferry::internal
