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

#include "common/fd_limit.h"
#include "ferry/status.h"

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

  // Called once per finished batch or post, after its final state is
  // visible to status readers: writes the eventfd (if armed) and wakes the
  // in-process waiters (WaitForChange).
  void Notify() {
    Wake();
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (armed_.load(std::memory_order_relaxed)) Write();
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

  const int fd_;
  std::atomic<bool> armed_{false};
  std::atomic<uint64_t> changes_{0};
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace ferry::internal
