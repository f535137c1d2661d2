#include "transport/stream/request.h"

namespace ferry::internal::stream {

uint64_t WriteTracker::Issue() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t t = next_++;
  outstanding_.insert(t);
  return t;
}

void WriteTracker::Done(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  outstanding_.erase(ticket);
  cv_.notify_all();
}

uint64_t WriteTracker::Next() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_;
}

bool WriteTracker::WaitBelow(uint64_t bound, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline,
                        [&] { return outstanding_.empty() || *outstanding_.begin() >= bound; });
}

bool PeerBudget::TryAcquire(uint64_t slices, uint64_t bytes) {
  const uint64_t s0 = slices_.fetch_add(slices, std::memory_order_acq_rel);
  const uint64_t b0 = bytes_.fetch_add(bytes, std::memory_order_acq_rel);
  if ((s0 == 0 && b0 == 0) || (s0 + slices <= max_slices_ && b0 + bytes <= max_bytes_)) return true;
  // Undone without a wake-up (the caller may hold mu_): a waiter that failed
  // because of this brief excess retries within its 10 ms timed wait.
  slices_.fetch_sub(slices, std::memory_order_acq_rel);
  bytes_.fetch_sub(bytes, std::memory_order_acq_rel);
  return false;
}

bool PeerBudget::Acquire(uint64_t slices, uint64_t bytes, Clock::time_point deadline) {
  if (TryAcquire(slices, bytes)) return true;
  std::unique_lock<std::mutex> lock(mu_);
  waiters_.fetch_add(1, std::memory_order_acq_rel);
  bool got = false;
  // Release notifies under mu_ when it sees a waiter, so no wake-up is lost
  // between a failed try and the wait; the timed wait is a second guard.
  // Room that comes only at the deadline comes too late: the frame could not
  // be sent in time (and a waiter woken late, on a loaded machine, must not
  // take the room that the requests timing out at the same deadline freed).
  while (!(got = TryAcquire(slices, bytes))) {
    if (Clock::now() >= deadline) break;
    cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(10)));
    if (Clock::now() >= deadline) break;
  }
  waiters_.fetch_sub(1, std::memory_order_acq_rel);
  return got;
}

void PeerBudget::Release(uint64_t slices, uint64_t bytes) {
  slices_.fetch_sub(slices, std::memory_order_acq_rel);
  bytes_.fetch_sub(bytes, std::memory_order_acq_rel);
  if (waiters_.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
}

std::string PeerBudget::Describe() const {
  return "limits peer_max_requests = " + std::to_string(max_slices_) + " slices (" +
         std::to_string(slices_.load(std::memory_order_relaxed)) +
         " outstanding), peer_max_bytes = " + std::to_string(max_bytes_) + " bytes (" +
         std::to_string(bytes_.load(std::memory_order_relaxed)) + " outstanding)";
}

void NotifyWaiter::Set(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(s);
  cv_.notify_all();
}

Status NotifyWaiter::Wait(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return done_; })) {
    return DeadlineExceededError("notification not acknowledged before the deadline");
  }
  return status_;
}

void AppendRange(std::vector<iovec>* iov, void* addr, size_t length) {
  if (!iov->empty()) {
    iovec& last = iov->back();
    // Integer arithmetic: `addr` may come from a peer (anything, up to the
    // top of the address space), where pointer arithmetic would be undefined.
    if (reinterpret_cast<uintptr_t>(last.iov_base) + last.iov_len ==
        reinterpret_cast<uintptr_t>(addr)) {
      last.iov_len += length;
      return;
    }
  }
  iov->push_back({addr, length});
}

void FailFrame(RequestFrame& r, const Status& why) {
  if (r.batch) {
    BatchState::Completer done(*r.batch);
    for (const Slice& s : r.slices) done.Complete(s.request, 1, why);
  }
  r.batch.reset();
  if (r.notify) r.notify->Set(why);
  SettleFrame(r);
}

void SettleFrame(RequestFrame& r) {
  if (r.tracker && r.ticket) r.tracker->Done(r.ticket);
  r.tracker.reset();
  if (r.budget) r.budget->Release(r.slices.size(), r.bytes);
  r.budget.reset();
}

}  // namespace ferry::internal::stream
