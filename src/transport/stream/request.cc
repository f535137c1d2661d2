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
    if (static_cast<char*>(last.iov_base) + last.iov_len == addr) {
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
  if (r.tracker && r.ticket) r.tracker->Done(r.ticket);
  r.tracker.reset();
}

}  // namespace ferry::internal::stream
