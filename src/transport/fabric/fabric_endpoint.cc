#include "transport/fabric/fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/log.h"
#include "transport/fabric/fabric_domain.h"
#include "transport/fabric/fabric_info.h"
#include "transport/fabric/fabric_messages.h"
#include "transport/fabric/fabric_notify.h"
#include "transport/fabric/fabric_posting.h"
#include "transport/fabric/fabric_progress.h"

namespace ferry::internal::fabric {
namespace {

// How long Shutdown waits for the operations and messages in flight.
constexpr auto kShutdownDrain = std::chrono::seconds(1);

}  // namespace

Status Fids::CheckAddress(std::string_view a) const {
  if (addr_format == FI_ADDR_STR) {
    if (a.empty() || a.back() != '\0' || a.size() > kMaxAddress) {
      return InvalidArgumentError("a fabric address of this provider is a NUL-terminated string");
    }
  } else if (a.size() != address.size()) {
    return InvalidArgumentError("a fabric address of this provider has " +
                                std::to_string(address.size()) + " bytes, got " +
                                std::to_string(a.size()));
  }
  return OkStatus();
}

// The parts, in the order they depend on each other (fabric_endpoint.h).
struct Endpoint::Impl {
  EndpointConfig cfg;
  InfoPtr info;
  Fids fids;
  MemoryDomain md{cfg, fids};
  Wakeup wakeup{fids};
  Posting posting{cfg, fids, md, wakeup, [this] { notify.WakeWriteWaiters(); }};
  Notifications notify{cfg, fids, md, posting, wakeup};
  Progress progress{cfg, fids, wakeup, posting, notify};

  Status Open() {
    FERRY_ASSIGN_OR_RETURN(info, GetInfo(cfg.node, cfg.provider));
    // GetInfo lists every domain of the provider; the first is this endpoint's.
    fi_info& fi = *info;
    fids.addr_format = fi.addr_format;
    FERRY_RETURN_IF_ERROR(md.Configure(fi));
    fids.iov_limit = static_cast<uint32_t>(std::max<size_t>(
        1, std::min<size_t>({kMaxIov, fi.tx_attr->iov_limit, fi.tx_attr->rma_iov_limit})));
    fids.max_msg =
        std::min<uint64_t>({fi.ep_attr->max_msg_size, uint64_t{1} << 30, cfg.max_op_bytes});
    if (fi.tx_attr->size != 0) {
      cfg.max_ops = std::min<uint32_t>(cfg.max_ops, static_cast<uint32_t>(fi.tx_attr->size));
    }
    cfg.max_ops = std::max<uint32_t>(cfg.max_ops, 1);
    FERRY_RETURN_IF_ERROR(OpenObjects(fi));
    FERRY_RETURN_IF_ERROR(notify.PostReceives());
    progress.Start();
    return OkStatus();
  }

  // The fabric, the domain, the completion queue, the address vector and
  // the endpoint bound to both, enabled and named.
  Status OpenObjects(fi_info& fi) {
    int ret = fi_fabric(fi.fabric_attr, &fids.fabric, nullptr);
    if (ret != 0) return UnavailableError("fi_fabric: " + ErrorText(ret));
    ret = fi_domain(fids.fabric, &fi, &fids.domain, nullptr);
    if (ret != 0) {
      return UnavailableError("fi_domain " + std::string(fi.domain_attr->name) + ": " +
                              ErrorText(ret));
    }
    FERRY_RETURN_IF_ERROR(OpenCq());
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_UNSPEC;
    ret = fi_av_open(fids.domain, &av_attr, &fids.av, nullptr);
    if (ret != 0) return UnavailableError("fi_av_open: " + ErrorText(ret));
    ret = fi_endpoint(fids.domain, &fi, &fids.ep, nullptr);
    if (ret != 0) return UnavailableError("fi_endpoint: " + ErrorText(ret));
    ret = fi_ep_bind(fids.ep, &fids.av->fid, 0);
    if (ret == 0) ret = fi_ep_bind(fids.ep, &fids.cq->fid, FI_TRANSMIT | FI_RECV);
    if (ret != 0) return UnavailableError("fi_ep_bind: " + ErrorText(ret));
    ret = fi_enable(fids.ep);
    if (ret != 0) return UnavailableError("fi_enable: " + ErrorText(ret));
    size_t len = kMaxAddress;
    fids.address.assign(kMaxAddress, '\0');
    ret = fi_getname(&fids.ep->fid, fids.address.data(), &len);
    if (ret != 0) return UnavailableError("fi_getname: " + ErrorText(ret));
    fids.address.resize(std::min(len, kMaxAddress));
    return OkStatus();
  }

  Status OpenCq() {
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.size = cfg.max_ops * 2 + kRecvBuffers + 64;
    cq_attr.wait_obj = FI_WAIT_UNSPEC;
    int ret = fi_cq_open(fids.domain, &cq_attr, &fids.cq, nullptr);
    if (ret != 0) {
      // No wait object: the progress thread naps instead of blocking.
      fids.cq_waits = false;
      cq_attr.wait_obj = FI_WAIT_NONE;
      ret = fi_cq_open(fids.domain, &cq_attr, &fids.cq, nullptr);
      if (ret != 0) return UnavailableError("fi_cq_open: " + ErrorText(ret));
    }
    return OkStatus();
  }

  // Refuses new work and lets what the provider holds finish (for at most
  // kShutdownDrain), then stops the progress thread and closes the
  // endpoint, which ends every transfer into or out of this engine's
  // memory; then what was queued or still in flight fails, and every
  // object closes.
  //
  // Why the wait: libfabric 1.17's tcp;ofi_rxm (Debian 12) closing an
  // endpoint with transfers in flight flushes them as cancelled
  // completions, one of which can carry no context, and ofi_rxm's error
  // handling (rxm_handle_comp_error) reads through it: a crash inside
  // fi_close (LocalFilesTest.EngineDestroyedWithStagedSlicesInFlight/
  // fabric_tcp, ASan: 2 of 40 runs before this wait, 0 of 150 after). A peer that answers lets
  // them finish within milliseconds; one that does not costs the bound.
  void Shutdown() {
    if (!wakeup.running()) return;
    posting.Close();  // a caller posting now (a staging worker) no longer reaches the endpoint
    wakeup.Wake();    // the progress thread fails what is queued, and reaps
    const Clock::time_point until = Clock::now() + kShutdownDrain;
    while (!posting.Quiet() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!posting.Quiet()) {
      FERRY_LOG(kInfo, "fabric " << cfg.provider << ": closing the endpoint with "
                                 << posting.InFlight() << " operations and "
                                 << posting.MessagesPending() << " messages still in flight after "
                                 << kShutdownDrain.count() << " s (a peer not answering)");
    }
    if (!wakeup.Stop()) return;
    progress.Stop();
    CloseFid(fids.ep);
    for (MsgBuf* b : posting.Stop()) {
      notify.OnSendDone(b, FI_ECANCELED, "the fabric endpoint was shut down");
    }
    notify.CancelAll();
    notify.CloseReceives();
    md.CloseRegions();
    CloseFid(fids.av);
    CloseFid(fids.cq);
    CloseFid(fids.domain);
    CloseFid(fids.fabric);
  }
};

Endpoint::Endpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  provider_ = impl_->cfg.provider;
  address_ = impl_->fids.address;
  addr_format_ = impl_->fids.addr_format;
  max_msg_ = impl_->fids.max_msg;
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

StatusOr<uint64_t> Endpoint::Register(const Region& region) { return impl_->md.Register(region); }
void Endpoint::Unregister(const Region& region) { impl_->md.Unregister(region); }

Status Endpoint::WaitForLate(const Region& region, Clock::time_point deadline) {
  return impl_->posting.WaitForLate(region.addr, region.end(), deadline);
}

StatusOr<std::shared_ptr<RemotePeer>> Endpoint::AddPeer(std::shared_ptr<const PeerInfo> info,
                                                        std::string_view address) {
  const std::string label = info->Label();
  FERRY_RETURN_IF_ERROR(impl_->fids.CheckAddress(address).WithPrefix("peer " + label));
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int ret = fi_av_insert(impl_->fids.av, address.data(), 1, &addr, 0, nullptr);
  if (ret != 1) {
    return UnavailableError("fabric " + provider_ + ": inserting the address of " + label +
                            " into the address vector failed" +
                            (ret < 0 ? ": " + ErrorText(ret) : ""));
  }
  return std::make_shared<RemotePeer>(std::move(info), addr);
}

void Endpoint::RemovePeer(const std::shared_ptr<RemotePeer>&) {
  // Nothing to release before the endpoint closes: operations still queued
  // or in flight for the peer finish with its address, and the address
  // vector keeps one entry per peer instance reached (a few dozen bytes; a
  // restarted peer adds one), which fi_close releases.
}

void Endpoint::Post(const std::shared_ptr<RemotePeer>& peer, const PostContext& ctx,
                    std::vector<Slice> slices) {
  impl_->posting.Post(peer, ctx, std::move(slices));
}

Status Endpoint::WaitForWrites(const std::shared_ptr<RemotePeer>& peer,
                               Clock::time_point deadline) {
  return impl_->notify.WaitForWrites(peer, deadline);
}

Status Endpoint::Notify(const std::shared_ptr<RemotePeer>& peer, const wire::NotifyBody& body,
                        Clock::time_point deadline) {
  return impl_->notify.Notify(peer, body, deadline);
}

void Endpoint::Shutdown() {
  if (impl_) impl_->Shutdown();
}

}  // namespace ferry::internal::fabric
