#include "base/batch.h"

#include <thread>

#include "base/metrics.h"
#include "common/cpu_relax.h"

namespace ferry::internal {

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

BatchState::BatchState(size_t capacity, std::shared_ptr<Metrics> metrics)
    : capacity_(capacity),
      slots_(std::make_unique<Slot[]>(capacity)),
      info_(metrics ? std::make_unique<uint64_t[]>(capacity) : nullptr),
      metrics_(std::move(metrics)) {}

uint8_t BatchState::RouteTag(RouteCounters* route) {
  if (!metrics_ || route == nullptr) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < route_count_; ++i) {
    if (RouteEntry(i).load(std::memory_order_relaxed) == route) {
      return static_cast<uint8_t>(i + 1);
    }
  }
  if (route_count_ == 255) return 0;
  if (route_count_ == kInlineRoutes) {
    more_routes_ = std::make_unique<std::atomic<RouteCounters*>[]>(255 - kInlineRoutes);
    more_.store(more_routes_.get(), std::memory_order_release);
  }
  // Release: a Completer that reads a request's tag (written after this, and
  // published to it through the request's slot) finds the route.
  RouteEntry(route_count_).store(route, std::memory_order_release);
  return static_cast<uint8_t>(++route_count_);
}

std::atomic<RouteCounters*>& BatchState::RouteEntry(size_t i) const {
  if (i < kInlineRoutes) return routes_[i];
  return more_.load(std::memory_order_acquire)[i - kInlineRoutes];
}

void BatchState::MarkBusy() { busy_since_ns_.store(NowNs(), std::memory_order_relaxed); }

void BatchState::OnIdle() {
  if (metrics_) {
    metrics_->ObserveLatency(
        std::chrono::nanoseconds(NowNs() - busy_since_ns_.load(std::memory_order_relaxed)));
  }
  if (on_idle_) on_idle_();
}

void BatchState::FailRangeLocked(size_t first, size_t n) {
  for (size_t i = first; i < first + n; ++i) {
    slots_[i].failed.store(true, std::memory_order_relaxed);
    slots_[i].state.store(static_cast<uint8_t>(TransferState::kFailed), std::memory_order_release);
  }
  failed_.fetch_add(n, std::memory_order_acq_rel);
  if (first_error_.ok()) first_error_ = cancel_status_;
}

void BatchState::CountCancelled(size_t index) {
  if (!info_) return;
  const uint64_t info = info_[index];
  const uint8_t tag = info & 0xff;
  if (tag == 0) return;
  RouteCounters* r = RouteEntry(tag - 1).load(std::memory_order_acquire);
  r->requests_failed.fetch_add(1, std::memory_order_relaxed);
  r->bytes_failed.fetch_add(info >> 8, std::memory_order_relaxed);
}

size_t BatchState::Cancel(const Status& why) {
  size_t failed = 0;
  bool idle = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cancelled_.load(std::memory_order_relaxed)) {
      cancel_status_ = why;
      // seq_cst: pairs with BeginLanding and the Completer's constructor (a
      // transport thread either sees the flag or is counted in landing_ /
      // completing_ before this thread waits for it).
      cancelled_.store(true, std::memory_order_seq_cst);
      // Completers that began before the flag store final states without a
      // compare-and-swap: let them finish (one frame's worth; they may take
      // mu_ for a failure, so not under it).
      lock.unlock();
      while (completing_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
      lock.lock();
      const size_t n = reserved();
      const auto pending = static_cast<uint8_t>(TransferState::kPending);
      for (size_t i = 0; i < n; ++i) {
        uint8_t expected = pending;
        if (slots_[i].state.compare_exchange_strong(expected,
                                                    static_cast<uint8_t>(TransferState::kFailed),
                                                    std::memory_order_acq_rel)) {
          slots_[i].failed.store(true, std::memory_order_relaxed);
          CountCancelled(i);
          ++failed;
        }
      }
      if (failed > 0) {
        if (first_error_.ok()) first_error_ = why;
        failed_.fetch_add(failed, std::memory_order_acq_rel);
        idle = pending_.fetch_sub(failed, std::memory_order_acq_rel) == failed;
        if (metrics_) metrics_->AddCancelled(failed);
      }
    }
    idle_cv_.notify_all();
  }
  if (idle) OnIdle();
  // Transports store read data only between BeginLanding and EndLanding,
  // around one recv or copy: microseconds.
  while (landing_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  return failed;
}

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

void BatchState::CompleteSlice(size_t index, const Status& status) {
  CompleteSlices(index, 1, status);
}

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
  // above). A request Cancel already failed stays failed and was counted
  // there.
  const uint8_t final_state =
      static_cast<uint8_t>(failed ? TransferState::kFailed : TransferState::kCompleted);
  if (!careful_) {
    r.state.store(final_state,
                  std::memory_order_release);  // no cancel claims states while this lives
  } else {
    uint8_t expected = static_cast<uint8_t>(TransferState::kPending);
    if (!r.state.compare_exchange_strong(expected, final_state, std::memory_order_acq_rel)) return;
  }
  ++(failed ? failed_ : completed_);
  if (batch_.info_) Count(batch_.info_[index], failed);
}

void BatchState::Completer::Count(uint64_t info, bool failed) {
  const uint8_t tag = info & 0xff;
  if (tag == 0) return;
  Tally* t = nullptr;
  for (Tally& x : tally_) {
    if (x.tag == tag || x.tag == 0) {
      t = &x;
      break;
    }
  }
  if (t == nullptr) {  // a third route in one frame: rare
    Publish();
    t = &tally_[0];
  }
  t->tag = tag;
  (failed ? t->failed : t->ok) += 1;
  (failed ? t->failed_bytes : t->ok_bytes) += info >> 8;
}

void BatchState::Completer::Publish() {
  for (Tally& t : tally_) {
    if (t.tag == 0) continue;
    RouteCounters* r = batch_.RouteEntry(t.tag - 1).load(std::memory_order_acquire);
    if (t.ok) r->requests_completed.fetch_add(t.ok, std::memory_order_relaxed);
    if (t.failed) r->requests_failed.fetch_add(t.failed, std::memory_order_relaxed);
    if (t.ok_bytes) r->bytes_completed.fetch_add(t.ok_bytes, std::memory_order_relaxed);
    if (t.failed_bytes) r->bytes_failed.fetch_add(t.failed_bytes, std::memory_order_relaxed);
    t = Tally{};
  }
  const size_t n = completed_ + failed_;
  if (n == 0) return;
  if (completed_ > 0) batch_.completed_.fetch_add(completed_, std::memory_order_acq_rel);
  if (failed_ > 0) batch_.failed_.fetch_add(failed_, std::memory_order_acq_rel);
  completed_ = failed_ = 0;
  if (batch_.pending_.fetch_sub(n, std::memory_order_acq_rel) == n) {
    {
      std::lock_guard<std::mutex> lock(batch_.mu_);  // no lost wake-up: waiters test under mu_
      batch_.idle_cv_.notify_all();
    }
    batch_.OnIdle();
  }
}

bool BatchState::SettleIfFinal() const {
  if (pending() == 0) return true;
  const size_t n = reserved();
  for (size_t i = 0; i < n; ++i) {
    const uint8_t state = slots_[i].state.load(std::memory_order_acquire);
    if (state == static_cast<uint8_t>(TransferState::kPending) || state == kNotBegun) return false;
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
  const uint8_t state = r.state.load(std::memory_order_acquire);
  out.state = state == kNotBegun ? TransferState::kPending : static_cast<TransferState>(state);
  if (out.state == TransferState::kFailed) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = errors_.find(index);
    out.status = it != errors_.end() ? it->second : cancel_status_;
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

void BatchState::OfferProgress(const std::shared_ptr<BatchProgress>& p) {
  if (has_progress_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (has_progress_.load(std::memory_order_relaxed)) return;
  progress_ = p;
  has_progress_.store(true, std::memory_order_release);
}

bool BatchState::WaitIdle(std::chrono::steady_clock::time_point deadline,
                          std::chrono::microseconds spin) {
  if (pending() == 0) return true;
  auto spin_end = std::chrono::steady_clock::now() + spin;
  std::shared_ptr<BatchProgress> progress;
  if (spin.count() > 0 && has_progress_.load(std::memory_order_acquire)) {
    progress = progress_.lock();
  }
  if (progress) {
    // Polls the transport itself while it spins (the batch's replies may
    // be read on this thread). When there was nothing: for the first 10 µs
    // a pause (a same-host reply takes ~3 µs; a sched_yield per round added
    // ~0.3 µs to the median), then the core is yielded each round (other
    // callers and the loops may be waiting for it: docs/benchmarks.md,
    // "Request rings").
    progress->BeginProgress();
    const auto pure_end = std::chrono::steady_clock::now() + std::chrono::microseconds(10);
    bool idle = false;
    while (std::chrono::steady_clock::now() < spin_end) {
      if (pending() == 0) {
        idle = true;
        break;
      }
      if (!progress->Progress()) {
        if (std::chrono::steady_clock::now() < pure_end) {
          CpuRelax();
        } else {
          std::this_thread::yield();
        }
      }
    }
    progress->EndProgress();
    if (idle || pending() == 0) return true;
  }
  while (std::chrono::steady_clock::now() < spin_end) {
    if (pending() == 0) return true;
    std::this_thread::yield();
  }
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_until(lock, deadline, [&] { return pending() == 0; });
}

bool BatchState::PollIdle(std::chrono::microseconds wait, std::chrono::microseconds spin,
                          std::optional<std::chrono::microseconds> tight,
                          const std::function<void(std::chrono::steady_clock::time_point)>& block) {
  if (pending() == 0) return true;
  const int64_t now_ns = NowNs();
  const int64_t tight_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(tight.value_or(4 * wait)).count();
  const int64_t since_last_poll = now_ns - last_poll_ns_.load(std::memory_order_relaxed);
  bool idle = false;
  if (since_last_poll > tight_ns) {
    // Not polled in a tight loop: nothing to leave the core for.
  } else if (now_ns - busy_since_ns_.load(std::memory_order_relaxed) <
             std::chrono::duration_cast<std::chrono::nanoseconds>(spin).count()) {
    std::this_thread::yield();
    idle = pending() == 0;
  } else {
    const std::chrono::steady_clock::time_point now{std::chrono::nanoseconds(now_ns)};
    if (block) {
      block(now + wait);
      idle = pending() == 0;
    } else {
      idle = WaitIdle(now + wait, std::chrono::microseconds(0));
    }
  }
  last_poll_ns_.store(NowNs(), std::memory_order_relaxed);
  return idle;
}

}  // namespace ferry::internal
