// The posting side of a fabric endpoint (with Progress, UCX's iface):
// everything that enters the provider's transmit queue. Slices queue per
// endpoint and are posted as vectored one-sided writes and reads
// (fi_writemsg / fi_readmsg), up to the provider's iov limits and
// `max_gather_bytes` per operation (GatherCount, fabric_tuning.h) and
// `max_ops` operations in flight. -FI_EAGAIN leaves the rest queued until
// completions make room (back-pressure, no spinning); a peer refused that
// way for `unreachable_after` with nothing in flight is broken. Writes ask
// for FI_DELIVERY_COMPLETE: their completion means the bytes are in the
// target's memory. A read holds its batch's landing fence
// (BatchState::BeginLanding) until it completed, so a cancel returns only
// once no read of the batch can still store into this engine. Messages
// (Notifications' sends) queue here too and go out with fi_send.
//
// Threads:
// - Post: any caller thread (the engine's submitters, a staging worker),
//   several at once. It queues the slices; while the progress thread is
//   awake that thread posts them, except a single slice, which the caller
//   posts itself, as it does everything while the progress thread sleeps.
//   Never blocks on the provider or on the peer.
// - QueueSend: any thread (a notifying caller; the progress thread's
//   acknowledgements).
// - Pump, PostSends, Sent, Finish, TakeLate, InFlight, Busy, Idle: the
//   progress thread (Finish also Shutdown's, once that thread stopped).
// - Close, Quiet, then Stop: Endpoint::Shutdown (Close and Quiet while the
//   progress thread still completes what is in flight, Stop after the
//   endpoint closed).
//
// Lock: mu_ guards the queue, the list of operations in flight and its
// count, the free operations, both message lists, stopped_, and every
// peer's ops_inflight_ / refused_since_. Every fi_writemsg, fi_readmsg and
// fi_send is called under it: one thread posts into the provider at a
// time. Under it Posting takes a peer's lock (RemotePeer::MarkBroken) and
// the memory domain's (LocalDesc, shared); it completes slices, and tells
// Notifications that a peer's writes drained, only after releasing it (a
// batch's completion may post again).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_rma.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/transport.h"
#include "transport/fabric/fabric_common.h"
#include "transport/fabric/fabric_peer.h"

namespace ferry::internal::fabric {

class MemoryDomain;
class Wakeup;

// One vectored write or read, from its post to its completion (or the
// endpoint's close).
struct Op : Context {
  std::shared_ptr<BatchState> batch;
  std::shared_ptr<RemotePeer> peer;
  Clock::time_point deadline;
  Opcode opcode = Opcode::kWrite;
  bool reported = false;  // its slices were already failed (deadline)
  bool landing = false;   // holds batch->BeginLanding()
  uint32_t n = 0;
  Slice slices[kMaxIov];
  Op* prev = nullptr;
  Op* next = nullptr;
};

// "fabric PROVIDER: write of request N (remote RANGE) to PEER": how errors
// name a slice.
std::string SliceName(const std::string& provider, const Slice& s, const RemotePeer& peer);

class Posting {
 public:
  // `writes_drained` is called (outside mu_) whenever a peer's pending
  // writes reach zero.
  Posting(const EndpointConfig& cfg, const Fids& fids, const MemoryDomain& md, Wakeup& wakeup,
          std::function<void()> writes_drained);
  ~Posting();  // deletes the free operations (none is in flight any more)
  Posting(const Posting&) = delete;
  Posting& operator=(const Posting&) = delete;

  void Post(const std::shared_ptr<RemotePeer>& peer, const PostContext& ctx,
            std::vector<Slice> slices);
  // Takes `b` to send with the next PostSends; false (and `b` stays the
  // caller's) once the endpoint stopped.
  bool QueueSend(MsgBuf* b);

  // Posts queued slices while operations may be added.
  void Pump();
  // Posts queued messages; returns those the provider refused with an error
  // (not posted; the caller fails and frees them).
  // Each destination's messages go in order; one the provider refuses
  // (-FI_EAGAIN: still connecting) waits while the others' go on, and after
  // unreachable_after fails too: its peer is not listening, or gone (the
  // rule Pump applies to operations).
  struct RefusedSend {
    MsgBuf* buf;
    int err;           // negative fi errno
    std::string text;  // what happened, for the sender's status
  };
  std::vector<RefusedSend> PostSends();
  // A message the provider took has completed: it is no longer posting's.
  void Sent(MsgBuf* b);
  // An operation completed (err 0) or failed.
  void Finish(Op* op, int err, const std::string& provider_text);
  // Operations in flight past their deadline not yet reported; marked
  // reported (they stay in flight).
  std::vector<Op*> TakeLate(Clock::time_point now);
  // Waits until no operation reported failed (past its deadline) but still
  // with the provider touches this endpoint's memory in [lo, hi): the
  // provider may still read it (a write) or store into it (a read) until
  // that operation completes. kFailedPrecondition naming one such operation
  // at `deadline`. Any thread.
  Status WaitForLate(uintptr_t lo, uintptr_t hi, Clock::time_point deadline);
  uint32_t InFlight();
  bool Busy();  // slices or messages queued
  bool Idle();  // nothing queued, nothing in flight

  // Refuses work from now on: once it returns, no new post or send is
  // taken (a later Post fails its slices; queued slices fail at the next
  // Pump), so once the progress thread stopped the endpoint may close.
  void Close();
  // Nothing posted to the provider is in flight: no operation, no message.
  bool Quiet();
  // Messages queued or posted and not completed.
  size_t MessagesPending();
  // After Close and the endpoint's close: fails the queued slices and the
  // operations in flight with kCancelled, and returns the messages not
  // completed: queued, or posted and never completed.
  std::vector<MsgBuf*> Stop();

 private:
  // The slices of one Post, posted in order.
  struct Chunk {
    std::shared_ptr<RemotePeer> peer;
    std::shared_ptr<BatchState> batch;
    std::shared_ptr<const PeerInfo> info;
    Clock::time_point deadline;
    std::vector<Slice> slices;
    size_t next = 0;
  };
  struct Failure {
    std::shared_ptr<BatchState> batch;
    std::shared_ptr<RemotePeer> peer;
    Slice slice;
    Status status;
  };
  // One operation's vectors, as fi_writemsg / fi_readmsg take them.
  struct Vectors {
    iovec iov[kMaxIov];
    void* desc[kMaxIov];
    fi_rma_iov rma[kMaxIov];
  };
  enum class Outcome { kPosted, kRefused, kFailed };

  void PumpLocked(std::vector<Failure>* failed, uint32_t max_posts = UINT32_MAX);
  // Fails the rest of `c` if it cannot be posted any more (stopped, past
  // its deadline, peer broken, batch cancelled); true if it did.
  bool DropLocked(Chunk& c, Clock::time_point now, std::vector<Failure>* failed);
  // Gathers the next slices of `c` into `op` (GatherCount); fails those
  // that cannot be posted.
  void GatherLocked(Chunk& c, Op* op, Vectors* v, std::vector<Failure>* failed);
  Status Resolve(const Chunk& c, const Slice& s, fi_rma_iov* rma) const;
  Outcome PostOpLocked(Chunk& c, Op* op, Vectors* v, Clock::time_point now,
                       std::vector<Failure>* failed);
  void Complete(std::vector<Failure>& failed);
  void WritesDone(RemotePeer& peer, uint64_t n);

  Op* AllocOpLocked();
  void FreeOpLocked(Op* op);
  void LinkLocked(Op* op);
  void UnlinkLocked(Op* op);

  const EndpointConfig& cfg_;
  const Fids& fids_;
  const MemoryDomain& md_;
  Wakeup& wakeup_;
  const std::function<void()> writes_drained_;

  std::mutex mu_;
  std::deque<std::unique_ptr<Chunk>> queue_;
  uint32_t inflight_ = 0;
  Op inflight_head_;  // sentinel of the in-flight list
  std::vector<Op*> free_ops_;
  std::deque<MsgBuf*> sends_;  // messages not yet posted (-FI_EAGAIN or from other threads)
  // Per destination with messages waiting: refused (-FI_EAGAIN) since when.
  std::map<fi_addr_t, Clock::time_point> send_refused_since_;
  // Messages the provider took and has not completed: handed back by their
  // completion (Sent), or by Stop once the endpoint is closed.
  std::unordered_set<MsgBuf*> sending_;
  bool stopped_ = false;
  // Notified (under mu_) when a reported operation leaves the provider.
  std::condition_variable late_done_;
};

}  // namespace ferry::internal::fabric
