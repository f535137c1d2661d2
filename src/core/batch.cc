#include "core/batch.h"

#include <thread>

namespace ferry::internal {

BatchState::BatchState(size_t capacity)
    : capacity_(capacity), slots_(std::make_unique<Slot[]>(capacity)) {}

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

void BatchState::CompleteSlice(size_t index, const Status& status) { CompleteSlices(index, 1, status); }

void BatchState::CompleteSlices(size_t index, uint32_t slices, const Status& status) {
  Completer c(*this);
  c.Complete(index, slices, status);
}

void BatchState::Completer::Complete(size_t index, uint32_t slices, const Status& status) {
  Slot& r = batch_.slots_[index];
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(batch_.mu_);
    if (!r.failed.load(std::memory_order_relaxed)) {
      batch_.errors_.emplace(index, status);
      r.failed.store(true, std::memory_order_release);
      if (batch_.first_error_.ok())
        batch_.first_error_ = status.WithPrefix("request " + std::to_string(index));
    }
  }
  // When every slice still outstanding is one of these, no other thread
  // touches `remaining` any more: a load (acquire: pairs with the others'
  // decrements, so their bytes and failures are seen) replaces the
  // read-modify-write, which is the common case of one slice per request.
  if (r.remaining.load(std::memory_order_acquire) == slices) {
    r.remaining.store(0, std::memory_order_relaxed);
  } else if (r.remaining.fetch_sub(slices, std::memory_order_acq_rel) != slices) {
    return;
  }
  const bool failed = r.failed.load(std::memory_order_acquire);
  // Order matters to observers: the request's final state first (release: a
  // reader that sees it also sees the bytes and the error), then, in
  // Publish, the counters (a reader that counts every request done finds
  // every state final), then pending_ (waiters and FreeBatch see everything
  // above).
  r.state.store(static_cast<uint8_t>(failed ? TransferState::kFailed : TransferState::kCompleted),
                std::memory_order_release);
  ++(failed ? failed_ : completed_);
}

void BatchState::Completer::Publish() {
  const size_t n = completed_ + failed_;
  if (n == 0) return;
  if (completed_ > 0) batch_.completed_.fetch_add(completed_, std::memory_order_acq_rel);
  if (failed_ > 0) batch_.failed_.fetch_add(failed_, std::memory_order_acq_rel);
  completed_ = failed_ = 0;
  if (batch_.pending_.fetch_sub(n, std::memory_order_acq_rel) == n) {
    std::lock_guard<std::mutex> lock(batch_.mu_);  // no lost wake-up: waiters test under mu_
    batch_.idle_cv_.notify_all();
  }
}

bool BatchState::SettleIfFinal() const {
  if (pending() == 0) return true;
  const size_t n = reserved();
  for (size_t i = 0; i < n; ++i) {
    if (slots_[i].state.load(std::memory_order_acquire) ==
        static_cast<uint8_t>(TransferState::kPending)) {
      return false;
    }
  }
  // Every request is final: the threads that completed the last ones are
  // between their state store and the pending_ decrement (at most the rest
  // of one frame, see Completer). Microseconds.
  while (pending() != 0) std::this_thread::yield();
  return true;
}

TransferStatus BatchState::Get(size_t index) const {
  const Slot& r = slots_[index];
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
