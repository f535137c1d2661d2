#include "transport/fabric/fabric_posting.h"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>

#include "base/memory_registry.h"
#include "transport/fabric/fabric_domain.h"
#include "transport/fabric/fabric_info.h"
#include "transport/fabric/fabric_progress.h"
#include "transport/fabric/fabric_tuning.h"

namespace ferry::internal::fabric {
namespace {

std::string_view OpName(Opcode op) { return op == Opcode::kWrite ? "write" : "read"; }

Status ShutDownError() { return CancelledError("the fabric endpoint was shut down"); }

}  // namespace

std::string SliceName(const std::string& provider, const Slice& s, const RemotePeer& peer) {
  return "fabric " + provider + ": " + std::string(OpName(s.opcode)) + " of request " +
         std::to_string(s.request) + " (remote " + FormatRange(s.remote, s.length) + ") to " +
         peer.label();
}

Posting::Posting(const EndpointConfig& cfg, const Fids& fids, const MemoryDomain& md,
                 Wakeup& wakeup, std::function<void()> writes_drained)
    : cfg_(cfg), fids_(fids), md_(md), wakeup_(wakeup), writes_drained_(std::move(writes_drained)) {
  inflight_head_.prev = inflight_head_.next = &inflight_head_;
}

Posting::~Posting() {
  for (Op* op : free_ops_) delete op;
}

// ---- callers ----------------------------------------------------------------

void Posting::Post(const std::shared_ptr<RemotePeer>& peer, const PostContext& ctx,
                   std::vector<Slice> slices) {
  uint64_t writes = 0;
  for (const Slice& s : slices) writes += s.opcode == Opcode::kWrite;
  peer->writes_pending_.fetch_add(writes, std::memory_order_acq_rel);
  auto c = std::make_unique<Chunk>();
  c->peer = peer;
  c->batch = ctx.batch;
  c->info = ctx.peer;
  c->deadline = ctx.deadline;
  c->slices = std::move(slices);
  // While the progress thread runs, it posts a batch of slices between its
  // completion reads: one thread in the provider at a time (a caller
  // posting whole batches contended with it, and large reads ran slower).
  // A single slice goes out from the caller, without a hand-off, which
  // costs a small slice more than posting it here; so does everything when
  // the progress thread sleeps, as it would first have to wake up
  // (docs/benchmarks-history.md, fabric).
  const bool asleep = wakeup_.asleep();
  const uint32_t post_here = asleep ? UINT32_MAX : c->slices.size() == 1 ? 1 : 0;
  std::vector<Failure> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(c));
    PumpLocked(&failed, stopped_ ? UINT32_MAX : post_here);
  }
  Complete(failed);
  wakeup_.Wake();
}

bool Posting::QueueSend(MsgBuf* b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return false;
  sends_.push_back(b);
  return true;
}

// ---- the progress thread ----------------------------------------------------

void Posting::Pump() {
  std::vector<Failure> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    PumpLocked(&failed);
  }
  Complete(failed);
}

std::vector<Posting::RefusedSend> Posting::PostSends() {
  std::vector<RefusedSend> failed;
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  // Destinations the provider refused this round: their later messages
  // wait (each peer's messages go in order), the others' go on.
  std::vector<fi_addr_t> refused;
  for (auto it = sends_.begin(); it != sends_.end();) {
    MsgBuf* b = *it;
    if (std::find(refused.begin(), refused.end(), b->to) != refused.end()) {
      ++it;
      continue;
    }
    const ssize_t ret = fi_send(fids_.ep, b->data.data(), b->data.size(), b->desc, b->to, &b->fi);
    if (ret == -FI_EAGAIN) {
      const auto since = send_refused_since_.try_emplace(b->to, now).first;
      if (now - since->second <= cfg_.unreachable_after) {
        refused.push_back(b->to);
        ++it;
        continue;
      }
      send_refused_since_.erase(since);
      it = sends_.erase(it);
      failed.push_back({b, static_cast<int>(ret),
                        "the provider refused it (FI_EAGAIN) for " +
                            std::to_string(cfg_.unreachable_after.count()) +
                            " ms: the peer is not listening, or gone"});
      continue;
    }
    send_refused_since_.erase(b->to);
    it = sends_.erase(it);
    if (ret != 0) {
      failed.push_back({b, static_cast<int>(ret), "posting the message failed"});
    } else {
      sending_.insert(b);
    }
  }
  return failed;
}

void Posting::Sent(MsgBuf* b) {
  std::lock_guard<std::mutex> lock(mu_);
  sending_.erase(b);
}

void Posting::Finish(Op* op, int err, const std::string& provider_text) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    UnlinkLocked(op);
    if (op->reported) late_done_.notify_all();  // WaitForLate
  }
  if (op->landing) op->batch->EndLanding();
  const std::string provider = provider_text.empty() ? "" : " (provider: " + provider_text + ")";
  if (err != 0 && IsConnectionError(err)) {
    op->peer->MarkBroken("fabric " + cfg_.provider + ": " + op->peer->label() +
                         " is unreachable: " + ErrorText(err) + provider);
  }
  if (!op->reported) {
    BatchState::Completer done(*op->batch);
    for (uint32_t i = 0; i < op->n; ++i) {
      const Slice& s = op->slices[i];
      if (err == 0) {
        done.Complete(s.request, 1, OkStatus());
      } else {
        done.Complete(s.request, 1,
                      Status(CodeOf(err), SliceName(cfg_.provider, s, *op->peer) +
                                              " failed: " + ErrorText(err) + provider));
      }
    }
  }
  if (op->opcode == Opcode::kWrite) WritesDone(*op->peer, op->n);
  std::lock_guard<std::mutex> lock(mu_);
  FreeOpLocked(op);
}

std::vector<Op*> Posting::TakeLate(Clock::time_point now) {
  std::vector<Op*> late;
  std::lock_guard<std::mutex> lock(mu_);
  for (Op* op = inflight_head_.next; op != &inflight_head_; op = op->next) {
    if (!op->reported && now > op->deadline) {
      op->reported = true;
      late.push_back(op);
    }
  }
  return late;
}

Status Posting::WaitForLate(uintptr_t lo, uintptr_t hi, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto touching = [&]() -> const Op* {
    for (const Op* op = inflight_head_.next; op != &inflight_head_; op = op->next) {
      if (!op->reported) continue;
      for (uint32_t i = 0; i < op->n; ++i) {
        const auto a = reinterpret_cast<uintptr_t>(op->slices[i].local);
        if (a < hi && lo < a + op->slices[i].length) return op;
      }
    }
    return nullptr;
  };
  if (late_done_.wait_until(lock, deadline, [&] { return touching() == nullptr; })) {
    return OkStatus();
  }
  const Op* op = touching();
  return FailedPreconditionError(
      SliceName(cfg_.provider, op->slices[0], *op->peer) +
      " failed at its deadline but the provider still holds it: it may still " +
      (op->opcode == Opcode::kRead ? "store into" : "read") + " this memory");
}

uint32_t Posting::InFlight() {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_;
}

bool Posting::Busy() {
  std::lock_guard<std::mutex> lock(mu_);
  return !queue_.empty() || !sends_.empty();
}

bool Posting::Idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() && sends_.empty() && inflight_ == 0;
}

// ---- shutdown -----------------------------------------------------------------

void Posting::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

bool Posting::Quiet() {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_ == 0 && sends_.empty() && sending_.empty();
}

size_t Posting::MessagesPending() {
  std::lock_guard<std::mutex> lock(mu_);
  return sends_.size() + sending_.size();
}

std::vector<MsgBuf*> Posting::Stop() {
  std::vector<Failure> failed;
  std::vector<Op*> ops;
  std::vector<MsgBuf*> unsent;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    for (auto& c : queue_) {
      for (; c->next < c->slices.size(); ++c->next) {
        failed.push_back({c->batch, c->peer, c->slices[c->next], ShutDownError()});
      }
    }
    queue_.clear();
    for (Op* op = inflight_head_.next; op != &inflight_head_; op = op->next) ops.push_back(op);
    unsent.assign(sends_.begin(), sends_.end());
    sends_.clear();
    // Posted, never completed (an acknowledgement in flight when the
    // progress thread stopped): the closed endpoint no longer uses them.
    unsent.insert(unsent.end(), sending_.begin(), sending_.end());
    sending_.clear();
  }
  Complete(failed);
  for (Op* op : ops) Finish(op, FI_ECANCELED, "the fabric endpoint was shut down");
  return unsent;
}

// ---- the posting loop ---------------------------------------------------------

// Chunks of one peer go in order; a peer the provider refuses (-FI_EAGAIN)
// waits for the next round while the others go on. Slices that fail on the
// way are collected in `failed` (completed by the caller, outside mu_).
void Posting::PumpLocked(std::vector<Failure>* failed, uint32_t max_posts) {
  const Clock::time_point now = Clock::now();
  std::vector<const RemotePeer*> refused;  // this round
  uint32_t posted = 0;
  for (auto it = queue_.begin();
       it != queue_.end() && inflight_ < cfg_.max_ops && posted < max_posts;) {
    Chunk& c = **it;
    if (c.next == c.slices.size()) {
      it = queue_.erase(it);
      continue;
    }
    if (std::find(refused.begin(), refused.end(), c.peer.get()) != refused.end()) {
      ++it;
      continue;
    }
    if (DropLocked(c, now, failed)) {
      it = queue_.erase(it);
      continue;
    }
    Op* op = AllocOpLocked();
    Vectors v;
    GatherLocked(c, op, &v, failed);
    if (op->n == 0) {
      FreeOpLocked(op);
      continue;
    }
    switch (PostOpLocked(c, op, &v, now, failed)) {
      case Outcome::kPosted:
        ++posted;
        break;
      case Outcome::kRefused:
        refused.push_back(c.peer.get());
        ++it;
        break;
      case Outcome::kFailed:
        break;
    }
  }
}

bool Posting::DropLocked(Chunk& c, Clock::time_point now, std::vector<Failure>* failed) {
  RemotePeer& peer = *c.peer;
  if (peer.ops_inflight_ == 0 && peer.refused_since_ != Clock::time_point{} &&
      now - peer.refused_since_ > cfg_.unreachable_after) {
    peer.MarkBroken("fabric " + cfg_.provider + ": " + peer.label() +
                    " is unreachable: the provider refused every operation to it (FI_EAGAIN) for " +
                    std::to_string(cfg_.unreachable_after.count()) +
                    " ms with none in flight (not listening, or gone)");
  }
  if (!stopped_ && now <= c.deadline && !peer.broken() && !c.batch->cancelled()) return false;
  Status why =
      stopped_        ? ShutDownError()
      : peer.broken() ? UnavailableError(peer.why_broken())
      : c.batch->cancelled()
          ? CancelledError("the request's batch was cancelled")
          : DeadlineExceededError("not posted before its deadline: the fabric endpoint had " +
                                  std::to_string(inflight_) + " operations in flight");
  for (; c.next < c.slices.size(); ++c.next) {
    failed->push_back({c.batch, c.peer, c.slices[c.next], why});
  }
  return true;
}

// Where slice `s` goes: the remote address as the provider wants it, and
// the key; or why it cannot go.
Status Posting::Resolve(const Chunk& c, const Slice& s, fi_rma_iov* rma) const {
  if (s.remote_region == kNoRegion || s.remote_region >= c.info->desc().regions.size()) {
    return InvalidArgumentError(SliceName(cfg_.provider, s, *c.peer) +
                                ": the remote range is in no region the peer exported, as its "
                                "descriptor says (unregistered, or registered but not exported; "
                                "RMA needs the region's key)");
  }
  auto key = c.info->KeyOf(s.remote_region, cfg_.key_name);
  if (!key && cfg_.key_name != "fabric") key = c.info->KeyOf(s.remote_region, "fabric");
  if (!key) {
    return FailedPreconditionError(SliceName(cfg_.provider, s, *c.peer) +
                                   ": the peer published no fabric key for the region");
  }
  const wire::RegionEntry& region = c.info->desc().regions[s.remote_region];
  rma->addr = md_.virt_addr() ? s.remote : s.remote - region.addr;
  rma->len = s.length;
  rma->key = *key;
  return OkStatus();
}

void Posting::GatherLocked(Chunk& c, Op* op, Vectors* v, std::vector<Failure>* failed) {
  const size_t end = c.next + GatherCount(c.slices, c.next, fids_.iov_limit,
                                          std::min<uint64_t>(fids_.max_msg, cfg_.max_gather_bytes));
  while (c.next < end) {
    const Slice& s = c.slices[c.next];
    Status ok = Resolve(c, s, &v->rma[op->n]);
    void* d = nullptr;
    if (ok.ok() && md_.mr_local() && !md_.LocalDesc(s.local, s.length, &d)) {
      ok = InvalidArgumentError(SliceName(cfg_.provider, s, *c.peer) + ": local buffer " +
                                FormatRange(reinterpret_cast<uintptr_t>(s.local), s.length) +
                                " is not registered with the fabric domain");
    }
    if (!ok.ok()) {
      if (op->n > 0) break;  // post what is gathered; this one fails next round
      failed->push_back({c.batch, c.peer, s, std::move(ok)});
      ++c.next;
      continue;
    }
    v->iov[op->n] = {s.local, s.length};
    v->desc[op->n] = d;
    op->slices[op->n] = s;
    ++op->n;
    ++c.next;
  }
}

// Posts `op` (the last op->n slices taken from `c`). Refused: the slices go
// back to `c` for the next round. Failed: they are in `failed`.
Posting::Outcome Posting::PostOpLocked(Chunk& c, Op* op, Vectors* v, Clock::time_point now,
                                       std::vector<Failure>* failed) {
  const size_t start = c.next - op->n;  // the op's first slice (failures before it are done)
  RemotePeer& peer = *c.peer;
  op->kind = Kind::kRma;
  op->batch = c.batch;
  op->peer = c.peer;
  op->deadline = c.deadline;
  op->opcode = op->slices[0].opcode;
  if (op->opcode == Opcode::kRead) {
    if (!c.batch->BeginLanding()) {
      for (uint32_t i = 0; i < op->n; ++i) {
        failed->push_back(
            {c.batch, c.peer, op->slices[i], CancelledError("the request's batch was cancelled")});
      }
      FreeOpLocked(op);
      return Outcome::kFailed;
    }
    op->landing = true;
  }
  fi_msg_rma msg{};
  msg.msg_iov = v->iov;
  msg.desc = md_.mr_local() ? v->desc : nullptr;
  msg.iov_count = op->n;
  msg.addr = peer.addr();
  msg.rma_iov = v->rma;
  msg.rma_iov_count = op->n;
  msg.context = &op->fi;
  const ssize_t ret = op->opcode == Opcode::kWrite
                          ? fi_writemsg(fids_.ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE)
                          : fi_readmsg(fids_.ep, &msg, FI_COMPLETION);
  if (ret == -FI_EAGAIN) {
    // The provider cannot take it now (its queue is full, or it is still
    // connecting to the peer): the rest waits for the next round.
    if (op->landing) c.batch->EndLanding();
    c.next = start;
    FreeOpLocked(op);
    if (peer.ops_inflight_ == 0 && peer.refused_since_ == Clock::time_point{}) {
      peer.refused_since_ = now;
    }
    return Outcome::kRefused;
  }
  if (ret != 0) {
    if (op->landing) c.batch->EndLanding();
    for (uint32_t i = 0; i < op->n; ++i) {
      failed->push_back({c.batch, c.peer, op->slices[i],
                         Status(CodeOf(static_cast<int>(-ret)),
                                SliceName(cfg_.provider, op->slices[i], peer) +
                                    ": posting failed: " + ErrorText(static_cast<int>(ret)))});
    }
    FreeOpLocked(op);
    return Outcome::kFailed;
  }
  peer.refused_since_ = {};
  LinkLocked(op);
  return Outcome::kPosted;
}

void Posting::Complete(std::vector<Failure>& failed) {
  for (Failure& f : failed) {
    f.batch->CompleteSlice(f.slice.request, f.status);
    if (f.slice.opcode == Opcode::kWrite) WritesDone(*f.peer, 1);
  }
  failed.clear();
}

void Posting::WritesDone(RemotePeer& peer, uint64_t n) {
  if (peer.writes_pending_.fetch_sub(n, std::memory_order_acq_rel) == n) writes_drained_();
}

// ---- operations -----------------------------------------------------------------

Op* Posting::AllocOpLocked() {
  if (free_ops_.empty()) return new Op();
  Op* op = free_ops_.back();
  free_ops_.pop_back();
  return op;
}

void Posting::FreeOpLocked(Op* op) {
  op->batch.reset();
  op->peer.reset();
  op->reported = op->landing = false;
  op->n = 0;
  free_ops_.push_back(op);
}

void Posting::LinkLocked(Op* op) {
  op->next = &inflight_head_;
  op->prev = inflight_head_.prev;
  inflight_head_.prev->next = op;
  inflight_head_.prev = op;
  ++inflight_;
  ++op->peer->ops_inflight_;
}

void Posting::UnlinkLocked(Op* op) {
  op->prev->next = op->next;
  op->next->prev = op->prev;
  op->prev = op->next = nullptr;
  --inflight_;
  --op->peer->ops_inflight_;
}

}  // namespace ferry::internal::fabric
