// CompletionSignal: the engine's completion file descriptor
// (Engine::CompletionFd, whose comment states the protocol a waiter
// follows). An eventfd the engine creates with itself; each batch or
// prepared transfer post that finishes adds 1 to it, once someone asked for
// the descriptor (Arm).
//
// Thread contract: Notify is called by whichever thread finished a batch or
// a post (a transport's thread, a cancelling caller, the notifier); Arm by
// any caller. Neither blocks (the eventfd is non-blocking).
//
// Ordering: Arm's store and a waiter's later status check, and a finisher's
// state update and Notify's load of `armed_`, are each separated by a
// sequentially consistent fence. So either the finisher sees the signal
// armed (and writes), or the waiter's check sees the finished state: a
// finish is never missed by a waiter that armed before checking.
//
// What finished (Engine::TakeFinished): once armed, each finish of a batch
// or post is recorded (its id) before the eventfd write, so a waiter that
// read the eventfd and then takes the record finds every finish that woke
// it, or is woken again. At most kMaxFinishedRecords unread ids are kept;
// past that the record stops and says it overflowed until the next take.
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/fd_limit.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::internal {

class CompletionSignal {
 public:
  // kResourceExhausted naming the reason when the eventfd cannot be made
  // (e.g. the process is out of descriptors).
  static StatusOr<std::unique_ptr<CompletionSignal>> Create() {
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
      return DescriptorError(StatusCode::kResourceExhausted, "cannot create the completion eventfd",
                             errno);
    }
    return std::unique_ptr<CompletionSignal>(new CompletionSignal(fd));
  }
  ~CompletionSignal() { ::close(fd_); }
  CompletionSignal(const CompletionSignal&) = delete;
  CompletionSignal& operator=(const CompletionSignal&) = delete;

  // From now on every finish writes. Returns the descriptor.
  int Arm() {
    armed_.store(true, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return fd_;
  }

  static constexpr size_t kMaxFinishedRecords = 65536;
  enum class Finished { kBatch, kTransfer };

  // Called once per finished batch or post, after its final state is
  // visible to status readers: records its id (`what`, if armed), writes
  // the eventfd (if armed) and wakes the in-process waiters
  // (WaitForChange). Without an id (the engine going away): no record.
  void Notify(Finished what, uint64_t id) { Notify(&what, id); }
  void Notify() { Notify(nullptr, 0); }

  // The ids recorded since the previous call (and whether the record
  // overflowed in between); empties the record.
  FinishedWork TakeFinished() {
    FinishedWork out;
    std::lock_guard<std::mutex> lock(finished_mu_);
    out.batches.swap(finished_.batches);
    out.transfers.swap(finished_.transfers);
    out.overflowed = finished_.overflowed;
    finished_.overflowed = false;
    return out;
  }

  // In-process waiting, for callers that poll their transfers in a loop
  // (Engine::PollBatch, PollTransfer): `changes()` counts Notify and Wake
  // calls; WaitForChange returns once it differs from `seen` (read before the
  // caller checked its own work) or at `deadline`. So a poller blocked on one
  // transfer wakes when any of the engine's work finishes, and can look at
  // its others at once. Wake alone: work that moved on (a prepared post's
  // data landed) without finishing a post.
  uint64_t changes() const { return changes_.load(std::memory_order_seq_cst); }
  void Wake() {
    changes_.fetch_add(1, std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mu_);  // no lost wake-up: waiters test under mu_
      cv_.notify_all();
    }
  }
  void WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point deadline) {
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, deadline, [&] { return changes() != seen; });
    }
    waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }

  // Adds 1 to the counter. EAGAIN (the counter at its maximum) leaves it
  // readable, which is all a waiter needs.
  void Write() {
    const uint64_t one = 1;
    while (::write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

 private:
  explicit CompletionSignal(int fd) : fd_(fd) {}

  void Notify(const Finished* what, uint64_t id) {
    Wake();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!armed_.load(std::memory_order_relaxed)) return;
    if (what != nullptr) Record(*what, id);
    Write();
  }
  void Record(Finished what, uint64_t id) {
    std::lock_guard<std::mutex> lock(finished_mu_);
    if (finished_.batches.size() + finished_.transfers.size() >= kMaxFinishedRecords) {
      finished_.overflowed = true;
    } else if (what == Finished::kBatch) {
      finished_.batches.push_back(BatchId{id});
    } else {
      finished_.transfers.push_back(TransferHandle{id});
    }
  }

  const int fd_;
  std::atomic<bool> armed_{false};
  std::atomic<uint64_t> changes_{0};
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::mutex finished_mu_;  // a leaf
  FinishedWork finished_;   // guarded by finished_mu_
};

}  // namespace ferry::internal
