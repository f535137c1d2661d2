#include "transport/fabric/fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_set>

#include "common/log.h"
#include "transport/fabric/fabric_info.h"
#include "transport/fabric/fabric_messages.h"
#include "transport/fabric/fabric_tuning.h"

namespace ferry::internal::fabric {

std::string RemotePeer::why_broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return why_broken_;
}

namespace {

// Slices per operation, further capped by the provider's iov limits.
constexpr uint32_t kMaxIov = 16;
// Receive buffers posted for notifications and acknowledgements.
constexpr int kRecvBuffers = 4;
constexpr int kPollBatch = 64;
// Peers a target answers (their addresses stay in its address vector).
constexpr size_t kMaxReplyAddresses = 4096;
// How often the progress thread looks for operations past their deadline.
constexpr auto kDeadlineScan = std::chrono::milliseconds(10);

template <class T>
void CloseFid(T*& p) {
  if (p != nullptr) {
    (void)fi_close(&p->fid);
    p = nullptr;
  }
}

enum class Kind : uint8_t { kRma, kRecv, kSend };

// What every posted operation carries as its context: libfabric's scratch
// space first (FI_CONTEXT / FI_CONTEXT2 modes), then what it is.
struct Context {
  fi_context2 fi{};
  Kind kind = Kind::kRma;
};

// One vectored write or read.
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

// A message buffer: one of the posted receives, or a send.
struct MsgBuf : Context {
  std::string data;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  fi_addr_t to = FI_ADDR_UNSPEC;
  uint64_t notify_seq = 0;  // a notification's send: its number; 0 for acks
};

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

bool IsConnectionError(int err) {
  switch (err) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ETIMEDOUT:
    case FI_EIO:
    case FI_EADDRNOTAVAIL:
      return true;
    default:
      return false;
  }
}

StatusCode CodeOf(int err) {
  if (err == FI_ECANCELED) return StatusCode::kCancelled;
  if (IsConnectionError(err)) return StatusCode::kUnavailable;
  switch (err) {
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
    case FI_EINVAL:
    case FI_EFAULT:
    case FI_ETRUNC:
    case FI_EMSGSIZE:
    case FI_ENOENT:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kUnavailable;
  }
}

std::string_view OpName(Opcode op) { return op == Opcode::kWrite ? "write" : "read"; }

}  // namespace

struct Endpoint::Impl {
  EndpointConfig cfg;
  InfoPtr info;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  bool cq_waits = true;  // the CQ has a wait object (fi_cq_sread works)
  bool mr_local = false, virt_addr = false, prov_key = false, mr_endpoint = false;
  uint32_t iov_limit = 1;
  uint64_t max_msg = 0;
  std::string address;
  std::atomic<uint64_t> next_key{1};

  // Registered memory, by start address.
  struct Mr {
    uint64_t end = 0;
    fid_mr* mr = nullptr;
    void* desc = nullptr;
  };
  mutable std::shared_mutex mr_mu;
  std::map<uint64_t, Mr> mrs;

  // Posting. `mu` guards everything down to `sends`.
  std::mutex mu;
  std::deque<std::unique_ptr<Chunk>> queue;
  uint32_t inflight = 0;
  Op inflight_head;  // sentinel of the in-flight list
  std::vector<Op*> free_ops;
  std::deque<MsgBuf*> sends;   // messages not yet posted (-FI_EAGAIN or from other threads)
  // Messages the provider took and has not completed: freed by their
  // completion, or by Shutdown once the endpoint is closed.
  std::unordered_set<MsgBuf*> sending;
  bool stopped = false;

  // Notifications: acknowledgements awaited, by sequence number.
  std::mutex notify_mu;
  std::condition_variable notify_cv;
  std::map<uint64_t, std::optional<Status>> acks;
  uint64_t next_seq = 1;

  // Progress thread only.
  std::map<std::string, fi_addr_t> reply_addrs;
  std::vector<std::unique_ptr<MsgBuf>> recvs;
  Clock::time_point last_scan{};

  std::thread progress;
  std::atomic<bool> stop{false};
  std::atomic<bool> sleeping{false};
  // Bumped whenever work is queued: the progress thread does not go to
  // sleep past work it has not seen.
  std::atomic<uint64_t> work_gen{0};

  Impl() { inflight_head.prev = inflight_head.next = &inflight_head; }

  // ---- set-up -------------------------------------------------------------
  Status Open() {
    FERRY_ASSIGN_OR_RETURN(info, GetInfo(cfg.node, cfg.provider));
    fi_info* fi = info.get();
    // GetInfo lists every domain of the provider; the first is this endpoint's.
    const int mode = fi->domain_attr->mr_mode;
    mr_local = (mode & FI_MR_LOCAL) != 0;
    virt_addr = (mode & FI_MR_VIRT_ADDR) != 0;
    prov_key = (mode & FI_MR_PROV_KEY) != 0;
    mr_endpoint = (mode & FI_MR_ENDPOINT) != 0;
    if ((mode & ~kMrModes) != 0) {
      return FailedPreconditionError("provider " + cfg.provider + " asks for memory-registration modes Ferry does not honour (mr_mode " +
                                     std::to_string(mode) + ")");
    }
    if (fi->domain_attr->mr_key_size > 8) {
      return FailedPreconditionError("provider " + cfg.provider + " uses " +
                                     std::to_string(fi->domain_attr->mr_key_size) +
                                     "-byte memory keys (FI_MR_RAW); Ferry publishes 8-byte keys");
    }
    iov_limit = static_cast<uint32_t>(std::max<size_t>(
        1, std::min<size_t>({kMaxIov, fi->tx_attr->iov_limit, fi->tx_attr->rma_iov_limit})));
    max_msg = std::min<uint64_t>({fi->ep_attr->max_msg_size, uint64_t{1} << 30, cfg.max_op_bytes});
    if (fi->tx_attr->size != 0) cfg.max_ops = std::min<uint32_t>(cfg.max_ops, static_cast<uint32_t>(fi->tx_attr->size));
    cfg.max_ops = std::max<uint32_t>(cfg.max_ops, 1);

    int ret = fi_fabric(fi->fabric_attr, &fabric, nullptr);
    if (ret != 0) return UnavailableError("fi_fabric: " + ErrorText(ret));
    ret = fi_domain(fabric, fi, &domain, nullptr);
    if (ret != 0) return UnavailableError("fi_domain " + std::string(fi->domain_attr->name) + ": " + ErrorText(ret));
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.size = cfg.max_ops * 2 + kRecvBuffers + 64;
    cq_attr.wait_obj = FI_WAIT_UNSPEC;
    ret = fi_cq_open(domain, &cq_attr, &cq, nullptr);
    if (ret != 0) {
      // No wait object: the progress thread naps instead of blocking.
      cq_waits = false;
      cq_attr.wait_obj = FI_WAIT_NONE;
      ret = fi_cq_open(domain, &cq_attr, &cq, nullptr);
      if (ret != 0) return UnavailableError("fi_cq_open: " + ErrorText(ret));
    }
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_UNSPEC;
    ret = fi_av_open(domain, &av_attr, &av, nullptr);
    if (ret != 0) return UnavailableError("fi_av_open: " + ErrorText(ret));
    ret = fi_endpoint(domain, fi, &ep, nullptr);
    if (ret != 0) return UnavailableError("fi_endpoint: " + ErrorText(ret));
    ret = fi_ep_bind(ep, &av->fid, 0);
    if (ret == 0) ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret != 0) return UnavailableError("fi_ep_bind: " + ErrorText(ret));
    ret = fi_enable(ep);
    if (ret != 0) return UnavailableError("fi_enable: " + ErrorText(ret));
    size_t len = kMaxAddress;
    address.assign(kMaxAddress, '\0');
    ret = fi_getname(&ep->fid, address.data(), &len);
    if (ret != 0) return UnavailableError("fi_getname: " + ErrorText(ret));
    address.resize(std::min(len, kMaxAddress));
    for (int i = 0; i < kRecvBuffers; ++i) {
      auto b = std::make_unique<MsgBuf>();
      b->kind = Kind::kRecv;
      b->data.resize(kMaxMessage);
      FERRY_RETURN_IF_ERROR(RegisterBuffer(*b, FI_RECV));
      FERRY_RETURN_IF_ERROR(PostRecv(*b));
      recvs.push_back(std::move(b));
    }
    progress = std::thread([this] { Run(); });
    return OkStatus();
  }

  Status RegisterBuffer(MsgBuf& b, uint64_t access) {
    if (!mr_local) return OkStatus();
    const int ret = fi_mr_reg(domain, b.data.data(), b.data.size(), access, 0,
                              prov_key ? 0 : next_key.fetch_add(1), 0, &b.mr, nullptr);
    if (ret != 0) return UnavailableError("registering a message buffer: " + ErrorText(ret));
    if (mr_endpoint) {
      int r = fi_mr_bind(b.mr, &ep->fid, 0);
      if (r == 0) r = fi_mr_enable(b.mr);
      if (r != 0) return UnavailableError("binding a message buffer to the endpoint: " + ErrorText(r));
    }
    b.desc = fi_mr_desc(b.mr);
    return OkStatus();
  }

  Status PostRecv(MsgBuf& b) {
    const ssize_t ret = fi_recv(ep, b.data.data(), b.data.size(), b.desc, FI_ADDR_UNSPEC, &b.fi);
    if (ret != 0) return UnavailableError("posting a receive: " + ErrorText(static_cast<int>(ret)));
    return OkStatus();
  }

  void Close() {
    CloseFid(ep);
    for (auto& b : recvs) CloseFid(b->mr);
    recvs.clear();
    {
      std::unique_lock lock(mr_mu);
      for (auto& [addr, m] : mrs) CloseFid(m.mr);
      mrs.clear();
    }
    CloseFid(av);
    CloseFid(cq);
    CloseFid(domain);
    CloseFid(fabric);
  }

  // ---- memory -------------------------------------------------------------
  StatusOr<uint64_t> Register(const Region& r) {
    uint64_t access = FI_READ | FI_WRITE;
    if (r.exported) access |= FI_REMOTE_READ | FI_REMOTE_WRITE;
    fid_mr* mr = nullptr;
    int ret = fi_mr_reg(domain, reinterpret_cast<void*>(r.addr), r.length, access, 0,
                        prov_key ? 0 : next_key.fetch_add(1), 0, &mr, nullptr);
    if (ret != 0) return UnavailableError("fi_mr_reg of " + FormatRange(r.addr, r.length) + ": " + ErrorText(ret));
    if (mr_endpoint) {
      ret = fi_mr_bind(mr, &ep->fid, 0);
      if (ret == 0) ret = fi_mr_enable(mr);
      if (ret != 0) {
        CloseFid(mr);
        return UnavailableError("binding " + FormatRange(r.addr, r.length) + " to the endpoint: " + ErrorText(ret));
      }
    }
    const uint64_t key = fi_mr_key(mr);
    if (key == FI_KEY_NOTAVAIL) {
      CloseFid(mr);
      return FailedPreconditionError("provider " + cfg.provider + " gave no 8-byte key for " +
                                     FormatRange(r.addr, r.length));
    }
    std::unique_lock lock(mr_mu);
    mrs[r.addr] = Mr{r.end(), mr, fi_mr_desc(mr)};
    return key;
  }

  void Unregister(const Region& r) {
    fid_mr* mr = nullptr;
    {
      std::unique_lock lock(mr_mu);
      auto it = mrs.find(r.addr);
      if (it == mrs.end()) return;
      mr = it->second.mr;
      mrs.erase(it);
    }
    CloseFid(mr);
  }

  // The descriptor of the registered memory holding [addr, addr + len), or
  // false if none (FI_MR_LOCAL only).
  bool LocalDesc(const char* p, uint32_t len, void** desc) const {
    const uint64_t addr = reinterpret_cast<uintptr_t>(p);
    std::shared_lock lock(mr_mu);
    auto it = mrs.upper_bound(addr);
    if (it == mrs.begin()) return false;
    --it;
    if (addr + len > it->second.end) return false;
    *desc = it->second.desc;
    return true;
  }

  // ---- posting ------------------------------------------------------------
  Op* AllocOp() {
    if (free_ops.empty()) return new Op();
    Op* op = free_ops.back();
    free_ops.pop_back();
    return op;
  }
  void FreeOpLocked(Op* op) {
    op->batch.reset();
    op->peer.reset();
    op->reported = op->landing = false;
    op->n = 0;
    free_ops.push_back(op);
  }
  void LinkLocked(Op* op) {
    op->next = &inflight_head;
    op->prev = inflight_head.prev;
    inflight_head.prev->next = op;
    inflight_head.prev = op;
    ++inflight;
    ++op->peer->ops_inflight_;
  }
  void UnlinkLocked(Op* op) {
    op->prev->next = op->next;
    op->next->prev = op->prev;
    op->prev = op->next = nullptr;
    --inflight;
    --op->peer->ops_inflight_;
  }

  std::string SliceName(const Slice& s, const RemotePeer& peer) const {
    return "fabric " + cfg.provider + ": " + std::string(OpName(s.opcode)) + " of request " +
           std::to_string(s.request) + " (remote " + FormatRange(s.remote, s.length) + ") to " + peer.label();
  }

  // Where slice `s` goes: the remote address as the provider wants it, and
  // the key; or why it cannot go.
  Status Resolve(const Chunk& c, const Slice& s, fi_rma_iov* rma) const {
    if (s.remote_region == kNoRegion || s.remote_region >= c.info->desc().regions.size()) {
      return InvalidArgumentError(SliceName(s, *c.peer) + ": the remote range is in no region the peer exported, as its "
                                  "descriptor says (unregistered, or registered but not exported; RMA needs the "
                                  "region's key)");
    }
    auto key = c.info->KeyOf(s.remote_region, cfg.key_name);
    if (!key && cfg.key_name != "fabric") key = c.info->KeyOf(s.remote_region, "fabric");
    if (!key) {
      return FailedPreconditionError(SliceName(s, *c.peer) + ": the peer published no fabric key for the region");
    }
    const wire::RegionEntry& region = c.info->desc().regions[s.remote_region];
    rma->addr = virt_addr ? s.remote : s.remote - region.addr;
    rma->len = s.length;
    rma->key = *key;
    return OkStatus();
  }

  void MarkBroken(RemotePeer& peer, const std::string& why) {
    std::lock_guard<std::mutex> lock(peer.mu_);
    if (peer.broken_.load()) return;
    peer.why_broken_ = why;
    peer.broken_.store(true, std::memory_order_release);
  }

  // Posts queued slices while operations may be added; collects slices
  // that failed on the way (completed by the caller, outside `mu`). Chunks
  // of one peer go in order; a peer the provider refuses (-FI_EAGAIN) waits
  // for the next round while the others go on.
  void PumpLocked(std::vector<Failure>* failed, uint32_t max_posts = UINT32_MAX) {
    const Clock::time_point now = Clock::now();
    std::vector<const RemotePeer*> refused;  // this round
    auto was_refused = [&](const RemotePeer* p) {
      return std::find(refused.begin(), refused.end(), p) != refused.end();
    };
    uint32_t posted = 0;
    for (auto it = queue.begin(); it != queue.end() && inflight < cfg.max_ops && posted < max_posts;) {
      Chunk& c = **it;
      if (c.next == c.slices.size()) {
        it = queue.erase(it);
        continue;
      }
      if (was_refused(c.peer.get())) {
        ++it;
        continue;
      }
      RemotePeer& peer = *c.peer;
      if (peer.ops_inflight_ == 0 && peer.refused_since_ != Clock::time_point{} &&
          now - peer.refused_since_ > cfg.unreachable_after) {
        MarkBroken(peer, "fabric " + cfg.provider + ": " + peer.label() + " is unreachable: the provider refused every "
                         "operation to it (FI_EAGAIN) for " + std::to_string(cfg.unreachable_after.count()) +
                         " ms with none in flight (not listening, or gone)");
      }
      if (stopped || now > c.deadline || peer.broken() || c.batch->cancelled()) {
        Status why = stopped ? CancelledError("the fabric endpoint was shut down")
                     : peer.broken()     ? UnavailableError(peer.why_broken())
                     : c.batch->cancelled()
                         ? CancelledError("the request's batch was cancelled")
                         : DeadlineExceededError("not posted before its deadline: the fabric endpoint had " +
                                                 std::to_string(inflight) + " operations in flight");
        for (; c.next < c.slices.size(); ++c.next) failed->push_back({c.batch, c.peer, c.slices[c.next], why});
        it = queue.erase(it);
        continue;
      }
      // One operation: the slices GatherCount picks (fabric_tuning.h).
      Op* op = AllocOp();
      iovec iov[kMaxIov];
      void* desc[kMaxIov];
      fi_rma_iov rma[kMaxIov];
      const Opcode opcode = c.slices[c.next].opcode;
      const size_t end =
          c.next + GatherCount(c.slices, c.next, iov_limit, std::min<uint64_t>(max_msg, cfg.max_gather_bytes));
      while (c.next < end) {
        const Slice& s = c.slices[c.next];
        Status ok = Resolve(c, s, &rma[op->n]);
        void* d = nullptr;
        if (ok.ok() && mr_local && !LocalDesc(s.local, s.length, &d)) {
          ok = InvalidArgumentError(SliceName(s, peer) + ": local buffer " +
                                    FormatRange(reinterpret_cast<uintptr_t>(s.local), s.length) +
                                    " is not registered with the fabric domain");
        }
        if (!ok.ok()) {
          if (op->n > 0) break;  // post what is gathered; this one fails next round
          failed->push_back({c.batch, c.peer, s, std::move(ok)});
          ++c.next;
          continue;
        }
        iov[op->n] = {s.local, s.length};
        desc[op->n] = d;
        op->slices[op->n] = s;
        ++op->n;
        ++c.next;
      }
      if (op->n == 0) {
        FreeOpLocked(op);
        continue;
      }
      const size_t start = c.next - op->n;  // the op's first slice (failures before it are done)
      op->kind = Kind::kRma;
      op->batch = c.batch;
      op->peer = c.peer;
      op->deadline = c.deadline;
      op->opcode = opcode;
      if (opcode == Opcode::kRead) {
        if (!c.batch->BeginLanding()) {
          for (uint32_t i = 0; i < op->n; ++i) {
            failed->push_back({c.batch, c.peer, op->slices[i], CancelledError("the request's batch was cancelled")});
          }
          FreeOpLocked(op);
          continue;
        }
        op->landing = true;
      }
      fi_msg_rma msg{};
      msg.msg_iov = iov;
      msg.desc = mr_local ? desc : nullptr;
      msg.iov_count = op->n;
      msg.addr = peer.addr_;
      msg.rma_iov = rma;
      msg.rma_iov_count = op->n;
      msg.context = &op->fi;
      const ssize_t ret = opcode == Opcode::kWrite
                              ? fi_writemsg(ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE)
                              : fi_readmsg(ep, &msg, FI_COMPLETION);
      if (ret == -FI_EAGAIN) {
        // The provider cannot take it now (its queue is full, or it is
        // still connecting to the peer): the rest waits for the next round.
        if (op->landing) c.batch->EndLanding();
        c.next = start;
        FreeOpLocked(op);
        refused.push_back(c.peer.get());
        if (peer.ops_inflight_ == 0 && peer.refused_since_ == Clock::time_point{}) peer.refused_since_ = now;
        ++it;
        continue;
      }
      if (ret != 0) {
        if (op->landing) c.batch->EndLanding();
        for (uint32_t i = 0; i < op->n; ++i) {
          failed->push_back({c.batch, c.peer, op->slices[i],
                             Status(CodeOf(static_cast<int>(-ret)),
                                    SliceName(op->slices[i], peer) + ": posting failed: " +
                                        ErrorText(static_cast<int>(ret)))});
        }
        FreeOpLocked(op);
        continue;
      }
      peer.refused_since_ = {};
      LinkLocked(op);
      ++posted;
    }
  }

  void Complete(std::vector<Failure>& failed) {
    for (Failure& f : failed) {
      f.batch->CompleteSlice(f.slice.request, f.status);
      if (f.slice.opcode == Opcode::kWrite) WriteDone(*f.peer, 1);
    }
    failed.clear();
  }

  void WriteDone(RemotePeer& peer, uint64_t n) {
    if (peer.writes_pending_.fetch_sub(n, std::memory_order_acq_rel) == n) {
      std::lock_guard<std::mutex> lock(notify_mu);
      notify_cv.notify_all();
    }
  }

  void Pump() {
    std::vector<Failure> failed;
    {
      std::lock_guard<std::mutex> lock(mu);
      PumpLocked(&failed);
    }
    Complete(failed);
  }

  void Wake() {
    work_gen.fetch_add(1, std::memory_order_seq_cst);
    // A CQ without a wait object has nothing to signal: its nap is short.
    if (cq_waits && sleeping.load(std::memory_order_seq_cst)) (void)fi_cq_signal(cq);
  }

  void Post(const std::shared_ptr<RemotePeer>& peer, const PostContext& ctx, std::vector<Slice> slices) {
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
    // posting whole batches contended with it: 1 MiB reads ran ~10 % slower,
    // docs/benchmarks.md). A single slice goes out from the caller, without
    // a hand-off (4 KiB one at a time: 35 or 91 us when handed off, 50
    // posted here); so does everything when the progress thread sleeps, as
    // it would first have to wake up.
    const bool asleep = sleeping.load(std::memory_order_seq_cst);
    const uint32_t post_here = asleep ? UINT32_MAX : c->slices.size() == 1 ? 1 : 0;
    std::vector<Failure> failed;
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(c));
      PumpLocked(&failed, stopped ? UINT32_MAX : post_here);
    }
    Complete(failed);
    Wake();
  }

  // ---- completions ----------------------------------------------------------
  void FinishOp(Op* op, int err, const std::string& provider_text) {
    {
      std::lock_guard<std::mutex> lock(mu);
      UnlinkLocked(op);
    }
    if (op->landing) op->batch->EndLanding();
    if (err != 0 && IsConnectionError(err)) {
      MarkBroken(*op->peer, "fabric " + cfg.provider + ": " + op->peer->label() + " is unreachable: " +
                                ErrorText(err) + (provider_text.empty() ? "" : " (provider: " + provider_text + ")"));
    }
    if (!op->reported) {
      BatchState::Completer done(*op->batch);
      for (uint32_t i = 0; i < op->n; ++i) {
        const Slice& s = op->slices[i];
        if (err == 0) {
          done.Complete(s.request, 1, OkStatus());
        } else {
          done.Complete(s.request, 1,
                        Status(CodeOf(err), SliceName(s, *op->peer) + " failed: " + ErrorText(err) +
                                                (provider_text.empty() ? "" : " (provider: " + provider_text + ")")));
        }
      }
    }
    if (op->opcode == Opcode::kWrite) WriteDone(*op->peer, op->n);
    std::lock_guard<std::mutex> lock(mu);
    FreeOpLocked(op);
  }

  void ScanDeadlines(Clock::time_point now) {
    std::vector<Op*> late;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (Op* op = inflight_head.next; op != &inflight_head; op = op->next) {
        if (!op->reported && now > op->deadline) {
          op->reported = true;
          late.push_back(op);
        }
      }
    }
    // The operations stay in flight (their buffers are the provider's until
    // they complete or the endpoint closes); their slices fail now.
    for (Op* op : late) {
      // A read past its deadline no longer holds its batch's landing fence,
      // so a cancel is bounded by the deadline; the provider may still
      // store its bytes until the operation ends (docs/reliability.md).
      if (op->landing) {
        op->landing = false;
        op->batch->EndLanding();
      }
      BatchState::Completer done(*op->batch);
      for (uint32_t i = 0; i < op->n; ++i) {
        done.Complete(op->slices[i].request, 1,
                      DeadlineExceededError(SliceName(op->slices[i], *op->peer) + ": no completion before the deadline"));
      }
    }
  }

  void OnRecv(MsgBuf& b, size_t len) {
    auto m = DecodeMessage(std::string_view(b.data.data(), std::min(len, b.data.size())));
    if (!m.ok()) {
      FERRY_LOG(kWarning, "fabric " << cfg.provider << ": dropped a message: " << m.status());
    } else if (m->type == MessageType::kAck) {
      std::lock_guard<std::mutex> lock(notify_mu);
      auto it = acks.find(m->seq);
      if (it != acks.end()) it->second = m->status;
      notify_cv.notify_all();
    } else {
      Status delivered = cfg.target->Deliver({m->notify.sender, m->notify.name, m->notify.message});
      SendAck(m->reply_to, m->seq, delivered);
    }
    if (!stop.load()) {
      Status s = PostRecv(b);
      if (!s.ok()) FERRY_LOG(kError, "fabric " << cfg.provider << ": " << s);
    }
  }

  void SendAck(const std::string& to, uint64_t seq, const Status& status) {
    auto it = reply_addrs.find(to);
    if (it == reply_addrs.end()) {
      Status ok = CheckAddress(to);
      fi_addr_t a = FI_ADDR_UNSPEC;
      if (ok.ok() && reply_addrs.size() >= kMaxReplyAddresses) {
        ok = ResourceExhaustedError("answering more than " + std::to_string(kMaxReplyAddresses) + " peers");
      }
      if (ok.ok() && fi_av_insert(av, to.data(), 1, &a, 0, nullptr) != 1) {
        ok = InvalidArgumentError("the address could not be inserted");
      }
      if (!ok.ok()) {
        FERRY_LOG(kWarning, "fabric " << cfg.provider << ": cannot acknowledge notification " << seq << ": " << ok);
        return;
      }
      it = reply_addrs.emplace(to, a).first;
    }
    Message ack;
    ack.type = MessageType::kAck;
    ack.seq = seq;
    ack.status = status;
    auto b = std::make_unique<MsgBuf>();
    b->kind = Kind::kSend;
    EncodeMessage(ack, &b->data);
    b->to = it->second;
    if (Status s = RegisterBuffer(*b, FI_SEND); !s.ok()) {
      FERRY_LOG(kWarning, "fabric " << cfg.provider << ": " << s);
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    sends.push_back(b.release());
  }

  // Posts queued messages (progress thread).
  void PostSends() {
    std::vector<MsgBuf*> failed;
    {
      std::lock_guard<std::mutex> lock(mu);
      while (!sends.empty()) {
        MsgBuf* b = sends.front();
        const ssize_t ret = fi_send(ep, b->data.data(), b->data.size(), b->desc, b->to, &b->fi);
        if (ret == -FI_EAGAIN) break;
        sends.pop_front();
        if (ret != 0) {
          failed.push_back(b);
        } else {
          sending.insert(b);
        }
      }
    }
    for (MsgBuf* b : failed) OnSendDone(b, -FI_EIO, "posting the message failed");
  }

  void OnSendDone(MsgBuf* b, int err, const std::string& text) {
    {
      std::lock_guard<std::mutex> lock(mu);
      sending.erase(b);
    }
    if (b->notify_seq != 0 && err != 0) {
      std::lock_guard<std::mutex> lock(notify_mu);
      auto it = acks.find(b->notify_seq);
      if (it != acks.end()) {
        it->second = UnavailableError("fabric " + cfg.provider + ": sending the notification failed: " +
                                      ErrorText(err) + (text.empty() ? "" : " (" + text + ")"));
      }
      notify_cv.notify_all();
    }
    CloseFid(b->mr);
    delete b;
  }

  void Handle(const fi_cq_data_entry& e) {
    auto* c = static_cast<Context*>(e.op_context);
    if (c == nullptr) return;
    switch (c->kind) {
      case Kind::kRma: FinishOp(static_cast<Op*>(c), 0, ""); break;
      case Kind::kRecv: OnRecv(*static_cast<MsgBuf*>(c), e.len); break;
      case Kind::kSend: OnSendDone(static_cast<MsgBuf*>(c), 0, ""); break;
    }
  }

  void HandleError() {
    fi_cq_err_entry err{};
    if (fi_cq_readerr(cq, &err, 0) < 0) return;
    char buf[256] = {0};
    const char* text = fi_cq_strerror(cq, err.prov_errno, err.err_data, buf, sizeof(buf));
    std::string provider_text = text != nullptr ? text : "";
    if (err.prov_errno != 0) provider_text += " [prov_errno " + std::to_string(err.prov_errno) + "]";
    auto* c = static_cast<Context*>(err.op_context);
    if (c == nullptr) {
      FERRY_LOG(kWarning, "fabric " << cfg.provider << ": completion error without context: " << ErrorText(err.err));
      return;
    }
    // tcp;ofi_rxm cancels what was in flight to a peer whose connection
    // broke (prov_errno ENOTCONN, ENOENT): the peer is gone, not this engine.
    int code = err.err;
    if (code == FI_ECANCELED && !stop.load()) {
      code = FI_ECONNABORTED;
      provider_text = "the provider cancelled it: " + provider_text;
    }
    switch (c->kind) {
      case Kind::kRma: FinishOp(static_cast<Op*>(c), code, provider_text); break;
      case Kind::kRecv:
        if (!stop.load()) {
          FERRY_LOG(kWarning, "fabric " << cfg.provider << ": a receive failed: " << ErrorText(err.err) << " "
                                        << provider_text);
          (void)PostRecv(*static_cast<MsgBuf*>(c));
        }
        break;
      case Kind::kSend: OnSendDone(static_cast<MsgBuf*>(c), code, provider_text); break;
    }
  }

  // Returns how many completions it handled (<0: none and a hard error).
  ssize_t Drain(fi_cq_data_entry* e, ssize_t n) {
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) Handle(e[i]);
      return n;
    }
    if (n == -FI_EAVAIL) {
      HandleError();
      return 1;
    }
    return 0;
  }

  bool Busy() {
    std::lock_guard<std::mutex> lock(mu);
    return !queue.empty() || !sends.empty();
  }
  uint32_t InFlight() {
    std::lock_guard<std::mutex> lock(mu);
    return inflight;
  }
  bool Idle() {
    std::lock_guard<std::mutex> lock(mu);
    return queue.empty() && sends.empty() && inflight == 0;
  }

  void Run() {
    fi_cq_data_entry e[kPollBatch];
    Clock::time_point active = Clock::now();
    while (!stop.load(std::memory_order_acquire)) {
      const uint64_t gen = work_gen.load(std::memory_order_seq_cst);
      ssize_t handled = Drain(e, fi_cq_read(cq, e, kPollBatch));
      PostSends();
      Pump();
      const Clock::time_point now = Clock::now();
      if (now - last_scan > kDeadlineScan) {
        ScanDeadlines(now);
        last_scan = now;
      }
      if (handled > 0) {
        active = now;
        continue;
      }
      if (now - active < cfg.spin) continue;
      // A pipeline of operations in flight that keep completing: keep
      // polling. Sleeping between two completions costs a wake-up each
      // (tcp;ofi_rxm, 512 KiB reads: 3.9 GB/s sleeping, 4.7 polling). A
      // single operation does not: its caller is likely spinning in its
      // wait, and a third spinning thread on two cores starved the peer's
      // (4 KiB writes one at a time: 55 us -> 97 us, docs/benchmarks.md).
      if (now - active < cfg.spin_in_flight && InFlight() >= 2) continue;
      // Block: briefly while work waits for room, longer when all is quiet
      // (a peer's incoming data wakes the wait in any case).
      const int timeout_ms = Busy() ? 1 : Idle() ? 100 : 10;
      if (!cq_waits) {
        sleeping.store(true, std::memory_order_seq_cst);
        if (!stop.load() && work_gen.load(std::memory_order_seq_cst) == gen) {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        sleeping.store(false, std::memory_order_seq_cst);
        continue;
      }
      sleeping.store(true, std::memory_order_seq_cst);
      if (stop.load() || work_gen.load(std::memory_order_seq_cst) != gen) {
        sleeping.store(false);
        continue;
      }
      const ssize_t n = fi_cq_sread(cq, e, kPollBatch, nullptr, timeout_ms);
      sleeping.store(false, std::memory_order_seq_cst);
      if (Drain(e, n) > 0) active = Clock::now();
    }
  }

  Status CheckAddress(std::string_view a) const {
    if (info->addr_format == FI_ADDR_STR) {
      if (a.empty() || a.back() != '\0' || a.size() > kMaxAddress) {
        return InvalidArgumentError("a fabric address of this provider is a NUL-terminated string");
      }
    } else if (a.size() != address.size()) {
      return InvalidArgumentError("a fabric address of this provider has " + std::to_string(address.size()) +
                                  " bytes, got " + std::to_string(a.size()));
    }
    return OkStatus();
  }

  // ---- shut down ----------------------------------------------------------
  void Shutdown() {
    if (stop.exchange(true)) return;
    if (cq != nullptr) (void)fi_cq_signal(cq);
    if (progress.joinable()) progress.join();
    // Closing the endpoint ends every transfer into or out of this
    // engine's memory; then what was queued or in flight fails.
    CloseFid(ep);
    std::vector<Failure> failed;
    std::vector<Op*> ops;
    std::vector<MsgBuf*> unsent;
    {
      std::lock_guard<std::mutex> lock(mu);
      stopped = true;
      for (auto& c : queue) {
        for (; c->next < c->slices.size(); ++c->next) {
          failed.push_back({c->batch, c->peer, c->slices[c->next], CancelledError("the fabric endpoint was shut down")});
        }
      }
      queue.clear();
      for (Op* op = inflight_head.next; op != &inflight_head; op = op->next) ops.push_back(op);
      unsent.assign(sends.begin(), sends.end());
      sends.clear();
      // Posted, never completed (an acknowledgement in flight when the
      // progress thread stopped): the closed endpoint no longer uses them.
      unsent.insert(unsent.end(), sending.begin(), sending.end());
      sending.clear();
    }
    Complete(failed);
    for (Op* op : ops) FinishOp(op, FI_ECANCELED, "the fabric endpoint was shut down");
    for (MsgBuf* b : unsent) OnSendDone(b, FI_ECANCELED, "the fabric endpoint was shut down");
    {
      std::lock_guard<std::mutex> lock(notify_mu);
      for (auto& [seq, st] : acks) {
        if (!st) st = CancelledError("the fabric endpoint was shut down");
      }
      notify_cv.notify_all();
    }
    for (Op* op : free_ops) delete op;
    free_ops.clear();
    Close();
  }
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  provider_ = impl_->cfg.provider;
  address_ = impl_->address;
  addr_format_ = impl_->info->addr_format;
  max_msg_ = impl_->max_msg;
}

Endpoint::~Endpoint() { Shutdown(); }

StatusOr<std::unique_ptr<Endpoint>> Endpoint::Open(const EndpointConfig& cfg) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = cfg;
  Status s = impl->Open();
  if (!s.ok()) {
    impl->Shutdown();
    return s.WithPrefix("fabric provider " + cfg.provider);
  }
  return std::unique_ptr<Endpoint>(new Endpoint(std::move(impl)));
}

StatusOr<uint64_t> Endpoint::Register(const Region& region) { return impl_->Register(region); }
void Endpoint::Unregister(const Region& region) { impl_->Unregister(region); }

StatusOr<std::shared_ptr<RemotePeer>> Endpoint::AddPeer(std::shared_ptr<const PeerInfo> info,
                                                        std::string_view address) {
  FERRY_RETURN_IF_ERROR(impl_->CheckAddress(address).WithPrefix("peer " + info->Label()));
  auto p = std::make_shared<RemotePeer>();
  p->label_ = info->Label();
  p->info_ = std::move(info);
  const int ret = fi_av_insert(impl_->av, address.data(), 1, &p->addr_, 0, nullptr);
  if (ret != 1) {
    return UnavailableError("fabric " + provider_ + ": inserting the address of " + p->label_ +
                            " into the address vector failed" + (ret < 0 ? ": " + ErrorText(ret) : ""));
  }
  return p;
}

void Endpoint::RemovePeer(const std::shared_ptr<RemotePeer>&) {
  // Nothing to release before the endpoint closes: operations still queued
  // or in flight for the peer finish with its address, and the address
  // vector keeps one entry per peer instance reached (a few dozen bytes; a
  // restarted peer adds one), which fi_close releases.
}

void Endpoint::Post(const std::shared_ptr<RemotePeer>& peer, const PostContext& ctx, std::vector<Slice> slices) {
  impl_->Post(peer, ctx, std::move(slices));
}

Status Endpoint::WaitForWrites(const std::shared_ptr<RemotePeer>& peer, Clock::time_point deadline) {
  Impl& im = *impl_;
  std::unique_lock<std::mutex> lock(im.notify_mu);
  if (!im.notify_cv.wait_until(lock, deadline, [&] {
        return peer->writes_pending_.load(std::memory_order_acquire) == 0 || im.stop.load();
      })) {
    return DeadlineExceededError("fabric " + provider_ + ": notification to " + peer->label() +
                                 " not sent before its deadline: " +
                                 std::to_string(peer->writes_pending_.load()) + " earlier writes still pending");
  }
  if (im.stop.load()) return CancelledError("the fabric endpoint was shut down");
  return OkStatus();
}

Status Endpoint::Notify(const std::shared_ptr<RemotePeer>& peer, const wire::NotifyBody& body,
                        Clock::time_point deadline) {
  Impl& im = *impl_;
  if (peer->broken()) return UnavailableError(peer->why_broken());
  // After every earlier write of this engine to the peer.
  FERRY_RETURN_IF_ERROR(WaitForWrites(peer, deadline));
  std::unique_lock<std::mutex> lock(im.notify_mu);
  if (im.stop.load()) return CancelledError("the fabric endpoint was shut down");
  const uint64_t seq = im.next_seq++;
  im.acks[seq] = std::nullopt;
  lock.unlock();

  Message m;
  m.type = MessageType::kNotify;
  m.seq = seq;
  m.reply_to = address_;
  m.notify = body;
  auto b = std::make_unique<MsgBuf>();
  b->kind = Kind::kSend;
  b->notify_seq = seq;
  b->to = peer->addr_;
  EncodeMessage(m, &b->data);
  Status reg = im.RegisterBuffer(*b, FI_SEND);
  lock.lock();
  if (!reg.ok()) {
    im.acks.erase(seq);
    return reg;
  }
  {
    std::lock_guard<std::mutex> l(im.mu);
    if (im.stopped) {
      im.acks.erase(seq);
      CloseFid(b->mr);
      return CancelledError("the fabric endpoint was shut down");
    }
    im.sends.push_back(b.release());
  }
  lock.unlock();
  im.Wake();
  lock.lock();
  const bool answered = im.notify_cv.wait_until(lock, deadline, [&] { return im.acks[seq].has_value(); });
  Status result = answered ? *im.acks[seq]
                           : DeadlineExceededError("fabric " + provider_ + ": " + peer->label() +
                                                   " did not acknowledge the notification before its deadline");
  im.acks.erase(seq);
  if (answered && !result.ok() && result.code() != StatusCode::kCancelled &&
      result.message().find("fabric ") != 0) {
    return result.WithPrefix("peer " + peer->label() + " refused");
  }
  return result;
}

void Endpoint::Shutdown() {
  if (impl_) impl_->Shutdown();
}

}  // namespace ferry::internal::fabric
