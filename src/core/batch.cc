#include "core/batch.h"

#include <thread>

namespace ferry::internal {

BatchState::BatchState(size_t capacity)
    : capacity_(capacity), requests_(std::make_unique<Request[]>(capacity)) {}

StatusOr<size_t> BatchState::Reserve(size_t n) {
  size_t cur = reserved_.load(std::memory_order_relaxed);
  do {
    if (n > capacity_ - cur) {
      return ResourceExhaustedError("batch capacity is " + std::to_string(capacity_) + ", " +
                                    std::to_string(cur) + " requests already submitted, " +
                                    std::to_string(n) + " more do not fit");
    }
  } while (!reserved_.compare_exchange_weak(cur, cur + n, std::memory_order_acq_rel));
  return cur;
}

void BatchState::Begin(size_t index, uint32_t slices) {
  Request& r = requests_[index];
  r.remaining.store(slices, std::memory_order_relaxed);
  r.state.store(static_cast<uint8_t>(TransferState::kPending), std::memory_order_relaxed);
  // Pairs with the acq_rel decrement in CompleteSlices.
  pending_.fetch_add(1, std::memory_order_acq_rel);
}

void BatchState::CompleteSlice(size_t index, const Status& status) { CompleteSlices(index, 1, status); }

void BatchState::CompleteSlices(size_t index, uint32_t slices, const Status& status) {
  Request& r = requests_[index];
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!r.failed.load(std::memory_order_relaxed)) {
      errors_.emplace(index, status);
      r.failed.store(true, std::memory_order_release);
      if (first_error_.ok()) first_error_ = status.WithPrefix("request " + std::to_string(index));
    }
  }
  if (r.remaining.fetch_sub(slices, std::memory_order_acq_rel) != slices) return;
  bool failed = r.failed.load(std::memory_order_acquire);
  // Order matters to observers: the request's final state first (release: a
  // reader that sees it also sees the bytes and the error), then the
  // counters (a reader that counts every request done finds every state
  // final), then pending_ (waiters and FreeBatch see everything above).
  r.state.store(static_cast<uint8_t>(failed ? TransferState::kFailed : TransferState::kCompleted),
                std::memory_order_release);
  (failed ? failed_ : completed_).fetch_add(1, std::memory_order_acq_rel);
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(mu_);  // no lost wake-up: waiters test under mu_
    idle_cv_.notify_all();
  }
}

bool BatchState::SettleIfFinal() const {
  if (pending() == 0) return true;
  const size_t n = reserved();
  for (size_t i = 0; i < n; ++i) {
    if (requests_[i].state.load(std::memory_order_acquire) ==
        static_cast<uint8_t>(TransferState::kPending)) {
      return false;
    }
  }
  // Every request is final: the threads that completed the last ones are
  // between their state store and the pending_ decrement. Nanoseconds.
  while (pending() != 0) std::this_thread::yield();
  return true;
}

TransferStatus BatchState::Get(size_t index) const {
  const Request& r = requests_[index];
  TransferStatus out;
  out.state = static_cast<TransferState>(r.state.load(std::memory_order_acquire));
  if (out.state == TransferState::kFailed) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = errors_.find(index);
    if (it != errors_.end()) out.status = it->second;
  }
  return out;
}

BatchStatus BatchState::Summary() const {
  BatchStatus s;
  s.submitted = reserved();
  s.completed = completed_.load(std::memory_order_acquire);
  s.failed = failed_.load(std::memory_order_acquire);
  if (s.failed > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    s.first_error = first_error_;
  }
  if (pending() > 0 || s.completed + s.failed < s.submitted) {
    s.state = TransferState::kPending;
  } else {
    s.state = s.failed > 0 ? TransferState::kFailed : TransferState::kCompleted;
  }
  return s;
}

bool BatchState::WaitIdle(std::chrono::steady_clock::time_point deadline,
                          std::chrono::microseconds spin) {
  if (pending() == 0) return true;
  auto spin_end = std::chrono::steady_clock::now() + spin;
  while (std::chrono::steady_clock::now() < spin_end) {
    if (pending() == 0) return true;
    std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_until(lock, deadline, [&] { return pending() == 0; });
}

}  // namespace ferry::internal
