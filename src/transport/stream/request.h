// A request frame on its way from an initiator (one frame: many entries),
// and the bookkeeping around it: the write tickets a notification waits for,
// and the waiter of a notification frame.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/batch.h"
#include "base/transport.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

// Tickets of the writes posted to one peer that have not completed yet, so a
// notification can wait for every earlier write. Thread-safe.
class WriteTracker {
 public:
  uint64_t Issue();
  void Done(uint64_t ticket);
  // Ticket the next write will get.
  uint64_t Next();
  // Waits until every ticket below `bound` is done.
  bool WaitBelow(uint64_t bound, Clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint64_t> outstanding_;
  uint64_t next_ = 1;
};

// The slices and bytes posted to one peer (one link) and not answered yet,
// bounded by EngineOptions::peer_max_requests and peer_max_bytes. Frames
// take room before they queue and give it back when they complete (answered
// or failed). Thread-safe; the fast path is two atomic additions.
class PeerBudget {
 public:
  PeerBudget(uint64_t max_slices, uint64_t max_bytes)
      : max_slices_(max_slices), max_bytes_(max_bytes) {}
  // Takes room for a frame, waiting for earlier frames to complete until
  // `deadline`; false if there was none by then. A frame always fits when
  // nothing else is outstanding (a limit below one frame only serialises).
  bool Acquire(uint64_t slices, uint64_t bytes, Clock::time_point deadline);
  // Takes room if there is some now; never waits.
  bool TryAcquire(uint64_t slices, uint64_t bytes);
  void Release(uint64_t slices, uint64_t bytes);
  // Nothing outstanding.
  bool Idle() const { return slices_.load(std::memory_order_acquire) == 0; }
  // "limit peer_max_requests = N (N slices outstanding) ..." for errors.
  std::string Describe() const;

 private:
  const uint64_t max_slices_;
  const uint64_t max_bytes_;
  std::atomic<uint64_t> slices_{0};
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// Completion of a notification frame. Thread-safe.
class NotifyWaiter {
 public:
  void Set(Status s);
  Status Wait(Clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

struct RequestFrame;

// What an initiator does with the reply to a frame before its slices
// complete, on the stream's loop thread (so before, and never after, the
// frame can fail by its deadline): the same-host transport's lent reads copy
// the target's ranges here (`staged`: the entries the target staged in its
// own memory instead, with where; a kLendAck's). Adds the entries that
// failed (any order) to
// `failures` and may return a follow-up frame for the same stream, which is
// cumulative (a later one covers an earlier one). The stream does not send
// it at once: the body of every hooked frame starts with a u64 the stream
// fills in with the sequence number of the newest hooked frame it has
// handled (what that follow-up would say), so a stream in use never sends
// follow-ups; an idle one sends the pending one at its next tick (~50 ms).
class ReplyHook {
 public:
  virtual ~ReplyHook() = default;
  virtual std::optional<RequestFrame> OnReply(const RequestFrame& r, uint64_t seq,
                                              const std::vector<wire::StagedLend>& staged,
                                              std::vector<wire::EntryFailure>* failures) const = 0;
};

// One request frame from the initiator side: the slices (pieces of the
// batch's TransferRequests) it carries as entries. (In Ferry a "request" is
// a TransferRequest of the public API; a frame carries slices of many; a
// BatchState slot holds one request's state.)
struct RequestFrame {
  wire::FrameType type = wire::FrameType::kWrite;
  bool write = false;          // carries a write ticket (kWrite, kCopyWrite)
  std::string head;            // header + body; the seq is filled in when queued
  std::vector<iovec> payload;  // kWrite: local source ranges
  std::shared_ptr<BatchState> batch;
  std::vector<Slice> slices;  // one per entry, in order
  std::shared_ptr<NotifyWaiter> notify;
  std::shared_ptr<WriteTracker> tracker;
  uint64_t ticket = 0;                    // writes only
  std::shared_ptr<PeerBudget> budget;     // given back (slices.size(), bytes) on completion
  std::shared_ptr<const ReplyHook> hook;  // runs on the reply, before completion
  uint64_t bytes = 0;
  bool to_files = false;  // some entry is in a file region of the peer (it stages them)
  Clock::time_point deadline;
};

// Completes every slice of `r` (and its notification or write ticket) with
// `why`.
void FailFrame(RequestFrame& r, const Status& why);
// The bookkeeping of a frame that has completed (either way): its write
// ticket and its room in the peer's budget.
void SettleFrame(RequestFrame& r);

// Appends [addr, addr + length) to `iov`, extending the last iovec when the
// range continues it: entries in address order are often adjacent (whole
// pages of a buffer), and fewer iovecs are less for the kernel to walk.
void AppendRange(std::vector<iovec>* iov, void* addr, size_t length);

}  // namespace ferry::internal::stream
