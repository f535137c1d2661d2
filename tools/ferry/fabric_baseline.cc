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
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
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
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) {
    r.error = "fi_allocinfo failed";
    return r;
  }
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
  hints->fabric_attr->prov_name = strdup(provider.c_str());  // fi_freeinfo frees it
  fi_info* info = nullptr;
  int ret = fi_getinfo(FI_VERSION(1, 17), node.empty() ? nullptr : node.c_str(), nullptr,
                       node.empty() ? 0 : FI_SOURCE, hints, &info);
  fi_freeinfo(hints);
  if (ret) {
    r.error = Err("fi_getinfo", ret);
    return r;
  }
  std::unique_ptr<fi_info, void (*)(fi_info*)> info_owner(info, fi_freeinfo);
  r.provider = info->fabric_attr->prov_name;
  const uint64_t mr_mode = info->domain_attr->mr_mode;
  depth = std::max<uint32_t>(1, std::min<uint32_t>(depth, static_cast<uint32_t>(info->tx_attr->size)));
  r.depth = depth;

  Mapping local(local_bytes), remote(remote_bytes);
  if (local.data == nullptr || remote.data == nullptr) {
    r.error = "cannot allocate the baseline's buffers";
    return r;
  }
  Side init, target;
  if (std::string e = target.Open(info, remote.data, remote_bytes, 2); !e.empty()) {
    r.error = "target endpoint: " + e;
    return r;
  }
  if (std::string e = init.Open(info, local.data, local_bytes, 1); !e.empty()) {
    r.error = "initiator endpoint: " + e;
    return r;
  }
  fi_addr_t peer = FI_ADDR_UNSPEC;
  if (fi_av_insert(init.av, target.name.data(), 1, &peer, 0, nullptr) != 1) {
    r.error = "fi_av_insert of the target's address failed";
    return r;
  }
  const uint64_t remote_base = (mr_mode & FI_MR_VIRT_ADDR) ? reinterpret_cast<uintptr_t>(remote.data) : 0;

  // The target's progress: read its CQ (nothing completes there for RMA, but
  // reading drives the provider), blocking briefly when idle.
  std::atomic<bool> stop{false};
  std::thread progress([&] {
    fi_cq_entry e[8];
    auto last = Clock::now();
    while (!stop.load(std::memory_order_relaxed)) {
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
  });

  std::vector<fi_context2> ctx(depth);
  std::vector<uint32_t> free_slots;
  for (uint32_t i = 0; i < depth; ++i) free_slots.push_back(depth - 1 - i);
  size_t next = 0;
  uint64_t inflight = 0, bytes = 0, ops = 0;
  std::vector<uint64_t> slot_len(depth);
  auto last_completion = Clock::now();

  // Reaps completions; returns "" or an error.
  auto reap = [&]() -> std::string {
    fi_cq_entry e[16];
    ssize_t n = fi_cq_read(init.cq, e, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        auto* c = static_cast<fi_context2*>(e[i].op_context);
        const uint32_t slot = static_cast<uint32_t>(c - ctx.data());
        bytes += slot_len[slot];
        ++ops;
        free_slots.push_back(slot);
        --inflight;
      }
      last_completion = Clock::now();
    } else if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      fi_cq_readerr(init.cq, &err, 0);
      return std::string("operation failed: ") + fi_strerror(err.err) + " (prov_errno " +
             std::to_string(err.prov_errno) + ")";
    } else if (n != -FI_EAGAIN) {
      return Err("fi_cq_read", n);
    } else if (inflight > 0 && Clock::now() - last_completion > kStall) {
      return "no completion for 5 s";
    }
    return "";
  };
  // Posts entries while slots are free; -FI_EAGAIN leaves it for later.
  auto post = [&]() -> std::string {
    while (!free_slots.empty()) {
      const Entry& en = entries[next];
      const uint32_t slot = free_slots.back();
      iovec iov{local.data + en.local_off, en.length};
      void* desc = init.desc;
      fi_rma_iov rma{remote_base + en.remote_off, en.length, target.key};
      fi_msg_rma msg{};
      msg.msg_iov = &iov;
      msg.desc = (mr_mode & FI_MR_LOCAL) ? &desc : nullptr;
      msg.iov_count = 1;
      msg.addr = peer;
      msg.rma_iov = &rma;
      msg.rma_iov_count = 1;
      msg.context = &ctx[slot];
      ssize_t ret = en.opcode == Opcode::kWrite ? fi_writemsg(init.ep, &msg, FI_DELIVERY_COMPLETE)
                                                : fi_readmsg(init.ep, &msg, 0);
      if (ret == -FI_EAGAIN) return "";
      if (ret) return Err(en.opcode == Opcode::kWrite ? "fi_writemsg" : "fi_readmsg", ret);
      free_slots.pop_back();
      slot_len[slot] = en.length;
      ++inflight;
      next = (next + 1) % entries.size();
    }
    return "";
  };

  std::string error;
  const auto warm_end = Clock::now() + std::chrono::milliseconds(100);
  const auto t_limit = warm_end + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  Clock::time_point t0{};
  double cpu0 = 0;
  bool measuring = false;
  while (error.empty()) {
    const auto now = Clock::now();
    if (!measuring && now >= warm_end) {
      measuring = true;
      bytes = ops = 0;
      t0 = now;
      cpu0 = ProcessCpuSeconds();
    }
    if (measuring && now >= t_limit) break;
    error = post();
    if (error.empty()) error = reap();
  }
  if (measuring && error.empty()) {
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    r.cpu_seconds = ProcessCpuSeconds() - cpu0;
    r.bytes = bytes;
    r.ops = ops;
  }
  // Drain what is in flight (bounded) before the endpoints close.
  while (inflight > 0 && error.empty()) error = reap();
  stop.store(true);
  progress.join();
  r.error = error;
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
