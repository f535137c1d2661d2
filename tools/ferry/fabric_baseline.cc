#include "fabric_baseline.h"

#ifdef FERRY_HAVE_FABRIC

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "control.h"

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kStall = std::chrono::seconds(5);

std::string Err(const char* what, long ret) {
  const int code = static_cast<int>(ret < 0 ? -ret : ret);
  return std::string(what) + ": " + fi_strerror(code) + " (" + std::to_string(ret) + ")";
}

void Close(fid* f) {
  if (f != nullptr) fi_close(f);
}

// Anonymous memory of `n` bytes, faulted in.
struct Mapping {
  explicit Mapping(uint64_t n) : length(n) {
    void* p =
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Mapping() {
    if (data != nullptr) munmap(data, length);
  }
  uint8_t* data = nullptr;
  uint64_t length = 0;
};

// One endpoint with its own fabric, domain, CQ, AV and registered buffer.
struct Side {
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  fid_mr* mr = nullptr;
  bool waitable = false;  // fi_cq_sread works
  std::string name;       // fi_getname
  uint64_t key = 0;
  void* desc = nullptr;

  ~Side() {
    // Endpoint before what it is bound to.
    Close(ep ? &ep->fid : nullptr);
    Close(mr ? &mr->fid : nullptr);
    Close(av ? &av->fid : nullptr);
    Close(cq ? &cq->fid : nullptr);
    Close(domain ? &domain->fid : nullptr);
    Close(fabric ? &fabric->fid : nullptr);
  }

  std::string Open(fi_info* info, uint8_t* buf, uint64_t len, uint64_t requested_key) {
    int ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
    if (ret) return Err("fi_fabric", ret);
    ret = fi_domain(fabric, info, &domain, nullptr);
    if (ret) return Err("fi_domain", ret);
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    cq_attr.size = 4096;
    cq_attr.wait_obj = FI_WAIT_UNSPEC;
    waitable = fi_cq_open(domain, &cq_attr, &cq, nullptr) == 0;
    if (!waitable) {  // shm has no wait object
      cq_attr.wait_obj = FI_WAIT_NONE;
      ret = fi_cq_open(domain, &cq_attr, &cq, nullptr);
      if (ret) return Err("fi_cq_open", ret);
    }
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    ret = fi_av_open(domain, &av_attr, &av, nullptr);
    if (ret) return Err("fi_av_open", ret);
    ret = fi_endpoint(domain, info, &ep, nullptr);
    if (ret) return Err("fi_endpoint", ret);
    ret = fi_ep_bind(ep, &av->fid, 0);
    if (ret) return Err("fi_ep_bind(av)", ret);
    ret = fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret) return Err("fi_ep_bind(cq)", ret);
    ret = fi_enable(ep);
    if (ret) return Err("fi_enable", ret);
    char addr[256];
    size_t alen = sizeof(addr);
    ret = fi_getname(&ep->fid, addr, &alen);
    if (ret) return Err("fi_getname", ret);
    name.assign(addr, alen);
    ret = fi_mr_reg(domain, buf, len, FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, 0,
                    requested_key, 0, &mr, nullptr);
    if (ret) return Err("fi_mr_reg", ret);
    if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
      ret = fi_mr_bind(mr, &ep->fid, 0);
      if (ret) return Err("fi_mr_bind", ret);
      ret = fi_mr_enable(mr);
      if (ret) return Err("fi_mr_enable", ret);
    }
    key = fi_mr_key(mr);
    desc = fi_mr_desc(mr);
    return "";
  }
};

// fi_getinfo for RDM endpoints with RMA of `provider` bound to `node`; null
// with *error set when there is none.
fi_info* GetInfo(const std::string& provider, const std::string& node, std::string* error) {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) {
    *error = "fi_allocinfo failed";
    return nullptr;
  }
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->fabric_attr->prov_name = strdup(provider.c_str());  // fi_freeinfo frees it
  fi_info* info = nullptr;
  int ret = fi_getinfo(FI_VERSION(1, 17), node.empty() ? nullptr : node.c_str(), nullptr,
                       node.empty() ? 0 : FI_SOURCE, hints, &info);
  fi_freeinfo(hints);
  if (ret) {
    *error = Err("fi_getinfo", ret);
    return nullptr;
  }
  return info;
}

// The target's progress: a thread reads its CQ (nothing completes there for
// RMA, but reading drives the provider), blocking briefly when idle.
class TargetProgress {
 public:
  explicit TargetProgress(const Side& target) : target_(target), thread_([this] { Run(); }) {}
  ~TargetProgress() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    const Side& target = target_;
    fi_cq_entry e[8];
    auto last = Clock::now();
    while (!stop_.load(std::memory_order_relaxed)) {
      ssize_t n = fi_cq_read(target.cq, e, 8);
      if (n > 0) {
        last = Clock::now();
      } else if (n == -FI_EAVAIL) {
        fi_cq_err_entry err{};
        fi_cq_readerr(target.cq, &err, 0);
      } else if (target.waitable && Clock::now() - last > std::chrono::microseconds(50)) {
        fi_cq_sread(target.cq, e, 1, nullptr, 1);
        last = Clock::now();
      }
    }
  }

  const Side& target_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: started once the members above exist
};

// The initiator's side of the loop: the entries posted in order,
// cyclically, one operation each, at most `depth` in flight.
class RmaLoop {
 public:
  RmaLoop(const Side& init, const Side& target, fi_addr_t peer, uint64_t mr_mode, uint8_t* local,
          uint64_t remote_base, const std::vector<Entry>& entries, uint32_t depth)
      : init_(init),
        target_(target),
        peer_(peer),
        mr_mode_(mr_mode),
        local_(local),
        remote_base_(remote_base),
        entries_(entries),
        ctx_(depth),
        slot_len_(depth) {
    for (uint32_t i = 0; i < depth; ++i) free_slots_.push_back(depth - 1 - i);
  }

  // Posts entries while slots are free; -FI_EAGAIN leaves it for later.
  // Returns "" or an error.
  std::string Post() {
    while (!free_slots_.empty()) {
      const Entry& en = entries_[next_];
      const uint32_t slot = free_slots_.back();
      ssize_t ret = PostOne(en, slot);
      if (ret == -FI_EAGAIN) return "";
      if (ret) return Err(en.opcode == Opcode::kWrite ? "fi_writemsg" : "fi_readmsg", ret);
      free_slots_.pop_back();
      slot_len_[slot] = en.length;
      ++inflight_;
      next_ = (next_ + 1) % entries_.size();
    }
    return "";
  }

  // Reaps completions; returns "" or an error (also after 5 s without a
  // completion while operations are in flight).
  std::string Reap() {
    fi_cq_entry e[16];
    ssize_t n = fi_cq_read(init_.cq, e, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) Completed(static_cast<fi_context2*>(e[i].op_context));
      last_completion_ = Clock::now();
    } else if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(init_.cq, &err, 0);
      return std::string("operation failed: ") + fi_strerror(err.err) + " (prov_errno " +
             std::to_string(err.prov_errno) + ")";
    } else if (n != -FI_EAGAIN) {
      return Err("fi_cq_read", n);
    } else if (inflight_ > 0 && Clock::now() - last_completion_ > kStall) {
      return "no completion for 5 s";
    }
    return "";
  }

  uint64_t inflight() const { return inflight_; }
  // Completed operations and their bytes since the last ResetCounts().
  uint64_t bytes() const { return bytes_; }
  uint64_t ops() const { return ops_; }
  void ResetCounts() { bytes_ = ops_ = 0; }

 private:
  ssize_t PostOne(const Entry& en, uint32_t slot) {
    iovec iov{local_ + en.local_off, en.length};
    void* desc = init_.desc;
    fi_rma_iov rma{remote_base_ + en.remote_off, en.length, target_.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = (mr_mode_ & FI_MR_LOCAL) ? &desc : nullptr;
    msg.iov_count = 1;
    msg.addr = peer_;
    msg.rma_iov = &rma;
    msg.rma_iov_count = 1;
    msg.context = &ctx_[slot];
    return en.opcode == Opcode::kWrite ? fi_writemsg(init_.ep, &msg, FI_DELIVERY_COMPLETE)
                                       : fi_readmsg(init_.ep, &msg, 0);
  }

  void Completed(fi_context2* c) {
    const uint32_t slot = static_cast<uint32_t>(c - ctx_.data());
    bytes_ += slot_len_[slot];
    ++ops_;
    free_slots_.push_back(slot);
    --inflight_;
  }

  const Side& init_;
  const Side& target_;
  const fi_addr_t peer_;
  const uint64_t mr_mode_;
  uint8_t* const local_;
  const uint64_t remote_base_;
  const std::vector<Entry>& entries_;
  std::vector<fi_context2> ctx_;
  std::vector<uint64_t> slot_len_;
  std::vector<uint32_t> free_slots_;
  size_t next_ = 0;
  uint64_t inflight_ = 0, bytes_ = 0, ops_ = 0;
  Clock::time_point last_completion_ = Clock::now();
};

// Runs the loop: a 100 ms warm-up, then `seconds` measured (into r), then
// what is in flight drained (bounded) before the endpoints close. Returns ""
// or an error.
std::string Measure(RmaLoop& loop, double seconds, FabricBaselineResult& r) {
  std::string error;
  const auto warm_end = Clock::now() + std::chrono::milliseconds(100);
  const auto t_limit = warm_end + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(seconds));
  Clock::time_point t0{};
  double cpu0 = 0;
  bool measuring = false;
  while (error.empty()) {
    const auto now = Clock::now();
    if (!measuring && now >= warm_end) {
      measuring = true;
      loop.ResetCounts();
      t0 = now;
      cpu0 = ProcessCpuSeconds();
    }
    if (measuring && now >= t_limit) break;
    error = loop.Post();
    if (error.empty()) error = loop.Reap();
  }
  if (measuring && error.empty()) {
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.cpu_seconds = ProcessCpuSeconds() - cpu0;
    r.bytes = loop.bytes();
    r.ops = loop.ops();
  }
  while (loop.inflight() > 0 && error.empty()) error = loop.Reap();
  return error;
}

// Opens both endpoints and inserts the target's address into the
// initiator's AV. Returns "" or an error.
std::string Connect(fi_info* info, Side& init, Mapping& local, Side& target, Mapping& remote,
                    fi_addr_t* peer) {
  if (std::string e = target.Open(info, remote.data, remote.length, 2); !e.empty()) {
    return "target endpoint: " + e;
  }
  if (std::string e = init.Open(info, local.data, local.length, 1); !e.empty()) {
    return "initiator endpoint: " + e;
  }
  if (fi_av_insert(init.av, target.name.data(), 1, peer, 0, nullptr) != 1) {
    return "fi_av_insert of the target's address failed";
  }
  return "";
}

}  // namespace

FabricBaselineResult RunFabricBaseline(const std::string& provider, const std::string& node,
                                       const std::vector<Entry>& entries, uint64_t local_bytes,
                                       uint64_t remote_bytes, uint32_t depth, double seconds) {
  FabricBaselineResult r;
  r.provider = provider;
  if (entries.empty()) {
    r.error = "no entries";
    return r;
  }
  fi_info* info = GetInfo(provider, node, &r.error);
  if (info == nullptr) return r;
  std::unique_ptr<fi_info, void (*)(fi_info*)> info_owner(info, fi_freeinfo);
  r.provider = info->fabric_attr->prov_name;
  const uint64_t mr_mode = info->domain_attr->mr_mode;
  depth =
      std::max<uint32_t>(1, std::min<uint32_t>(depth, static_cast<uint32_t>(info->tx_attr->size)));
  r.depth = depth;

  Mapping local(local_bytes), remote(remote_bytes);
  if (local.data == nullptr || remote.data == nullptr) {
    r.error = "cannot allocate the baseline's buffers";
    return r;
  }
  Side init, target;
  fi_addr_t peer = FI_ADDR_UNSPEC;
  r.error = Connect(info, init, local, target, remote, &peer);
  if (!r.error.empty()) return r;
  const uint64_t remote_base =
      (mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uintptr_t>(remote.data) : 0;

  TargetProgress progress(target);
  RmaLoop loop(init, target, peer, mr_mode, local.data, remote_base, entries, depth);
  r.error = Measure(loop, seconds, r);
  progress.Stop();
  return r;
}

}  // namespace ferry::bench

#else  // no libfabric in this build

namespace ferry::bench {

FabricBaselineResult RunFabricBaseline(const std::string& provider, const std::string&,
                                       const std::vector<Entry>&, uint64_t, uint64_t, uint32_t,
                                       double) {
  FabricBaselineResult r;
  r.provider = provider;
  r.error = "this build has no libfabric (install libfabric-dev and rebuild)";
  return r;
}

}  // namespace ferry::bench

#endif
