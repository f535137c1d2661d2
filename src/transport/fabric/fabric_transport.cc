#include "transport/fabric/fabric_transport.h"

#include <rdma/fabric.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <vector>

#include "common/log.h"
#include "ferry/transports.h"
#include "transport/fabric/fabric_endpoint.h"
#include "transport/fabric/fabric_info.h"
#include "transport/fabric/fabric_messages.h"
#include "transport/fabric/fabric_tuning.h"

namespace ferry::internal {
namespace {

using fabric::Endpoint;
using fabric::RemotePeer;

bool SameHostOnly(std::string_view provider) {
  const std::string_view core = provider.substr(0, provider.find(';'));
  return core == "shm" || core == "sm2";
}

// The NIC addresses an engine's rails bind to: fabric_nics, else one at the
// listen host, so an engine on 127.0.0.1 stays on loopback (with no node,
// libfabric's tcp provider takes the machine's first interface; "" = the
// provider's choice). Same-host providers: one rail, no node.
StatusOr<std::vector<std::string>> RailNodes(const EngineOptions& o, std::string_view provider) {
  if (SameHostOnly(provider)) return std::vector<std::string>{""};
  if (o.fabric_nics.empty()) {
    if (o.listen_host.empty() || o.listen_host == "0.0.0.0" || o.listen_host == "::") {
      return std::vector<std::string>{""};
    }
    return std::vector<std::string>{o.listen_host};
  }
  std::vector<std::string> nodes;
  std::string_view rest = o.fabric_nics;
  for (;;) {
    const size_t comma = rest.find(',');
    std::string node(rest.substr(0, comma));
    if (node.empty() || node.find_first_of(" \t/") != std::string::npos) {
      return InvalidArgumentError("fabric_nics '" + o.fabric_nics + "': entry " +
                                  std::to_string(nodes.size()) + " ('" + node +
                                  "') is not an address");
    }
    if (std::find(nodes.begin(), nodes.end(), node) != nodes.end()) {
      return InvalidArgumentError("fabric_nics '" + o.fabric_nics + "' names " + node + " twice");
    }
    nodes.push_back(std::move(node));
    if (nodes.size() > fabric::kMaxRails) {
      return InvalidArgumentError("fabric_nics '" + o.fabric_nics + "' names more than " +
                                  std::to_string(fabric::kMaxRails) + " NICs");
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return nodes;
}

std::string RailKeyName(size_t rail) {
  return rail == 0 ? "fabric" : "fabric." + std::to_string(rail);
}

// One path of a link: a rail of this engine and the peer's rail it posts to.
struct Path {
  std::shared_ptr<Endpoint> ep;
  std::shared_ptr<RemotePeer> peer;
};

class FabricLink : public PeerLink {
 public:
  explicit FabricLink(std::vector<Path> paths) : paths_(std::move(paths)) {}

  // One rail: everything goes there. Several: the slices (the core cut
  // requests into stripes, caps.max_slice) are dealt out in runs of about
  // equal bytes, in order, starting at the next rail in turn, so that
  // small posts spread too.
  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    const size_t n = paths_.size();
    if (n == 1 || slices.size() == 1) {
      const size_t r = n == 1 ? 0 : next_.fetch_add(1, std::memory_order_relaxed) % n;
      paths_[r].ep->Post(paths_[r].peer, ctx, std::move(slices));
      return;
    }
    uint64_t total = 0;
    for (const Slice& s : slices) total += s.length;
    const size_t first = next_.fetch_add(1, std::memory_order_relaxed) % n;
    size_t begin = 0;
    uint64_t done = 0;
    for (size_t k = 0; k < n && begin < slices.size(); ++k) {
      // This rail's run ends where the bytes so far reach its share.
      const uint64_t upto = total * (k + 1) / n;
      size_t end = begin;
      while (end < slices.size() && (k + 1 == n || done < upto)) done += slices[end++].length;
      if (end == begin) continue;
      std::vector<Slice> run(slices.begin() + static_cast<std::ptrdiff_t>(begin),
                             slices.begin() + static_cast<std::ptrdiff_t>(end));
      const Path& p = paths_[(first + k) % n];
      p.ep->Post(p.peer, ctx, std::move(run));
      begin = end;
    }
  }

  // After every earlier write on every rail: the others' first, then the
  // message on rail 0 (which waits for its own).
  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override {
    for (size_t i = 1; i < paths_.size(); ++i) {
      FERRY_RETURN_IF_ERROR(paths_[i].ep->WaitForWrites(paths_[i].peer, deadline));
      if (paths_[i].peer->broken()) return UnavailableError(paths_[i].peer->why_broken());
    }
    return paths_[0].ep->Notify(paths_[0].peer, body, deadline);
  }

  bool Healthy() const override {
    return std::none_of(paths_.begin(), paths_.end(),
                        [](const Path& p) { return p.peer->broken(); });
  }
  void Retire() override {
    for (const Path& p : paths_) p.ep->RemovePeer(p.peer);
  }

 private:
  const std::vector<Path> paths_;
  std::atomic<size_t> next_{0};
};

class FabricTransport : public Transport {
 public:
  FabricTransport(TransportCaps caps, std::vector<std::shared_ptr<Endpoint>> rails,
                  std::string hostname)
      : Transport(std::move(caps)), rails_(std::move(rails)), hostname_(std::move(hostname)) {}
  ~FabricTransport() override { Shutdown(); }

  void Describe(wire::PeerDescriptor* self) const override {
    fabric::FabricEndpoint a{provider(), rails_[0]->addr_format(), {}};
    for (const auto& r : rails_) a.rails.push_back(r->address());
    self->transports.push_back({"fabric", fabric::EncodeEndpoint(a)});
  }

  bool CanReach(const wire::PeerDescriptor& peer) const override {
    const wire::TransportEndpoint* e = peer.FindTransport("fabric");
    if (e == nullptr) return false;
    auto a = fabric::DecodeEndpoint(e->endpoint);
    if (!a.ok() || a->provider != provider() || a->format != rails_[0]->addr_format()) return false;
    return !SameHostOnly(provider()) || peer.hostname == hostname_;
  }

  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> info, uint16_t,
                                              Clock::time_point) override {
    const wire::TransportEndpoint* e = info->desc().FindTransport("fabric");
    if (e == nullptr)
      return UnimplementedError("peer " + info->Label() + " offers no fabric endpoint");
    auto a = fabric::DecodeEndpoint(e->endpoint);
    if (!a.ok()) return a.status().WithPrefix("peer " + info->Label());
    if (a->provider != provider()) {
      return FailedPreconditionError("peer " + info->Label() + " uses fabric provider " +
                                     a->provider + ", this engine " + provider());
    }
    if (SameHostOnly(provider()) && info->desc().hostname != hostname_) {
      return FailedPreconditionError("fabric provider " + provider() +
                                     " reaches only this host; peer " + info->Label() + " is on " +
                                     info->desc().hostname);
    }
    // Rail i posts to the peer's rail i (modulo its count).
    std::vector<Path> paths;
    for (size_t i = 0; i < rails_.size(); ++i) {
      const std::string& to = a->rails[i % a->rails.size()];
      auto p = rails_[i]->AddPeer(info, to);
      if (!p.ok())
        return rails_.size() == 1 ? p.status() : p.status().WithPrefix("rail " + std::to_string(i));
      paths.push_back({rails_[i], std::move(*p)});
    }
    return std::shared_ptr<PeerLink>(std::make_shared<FabricLink>(std::move(paths)));
  }

  // Every rail registers the region; rail 0's key is "fabric", another
  // rail's is published as "fabric.N" only where it differs.
  StatusOr<std::vector<wire::RegionKey>> RegisterRegion(const Region& r) override {
    std::vector<wire::RegionKey> keys;
    if (!r.kind.cpu_accessible()) return keys;
    for (size_t i = 0; i < rails_.size(); ++i) {
      auto key = rails_[i]->Register(r);
      if (!key.ok()) {
        for (size_t k = 0; k < i; ++k) rails_[k]->Unregister(r);
        return rails_.size() == 1 ? key.status()
                                  : key.status().WithPrefix("rail " + std::to_string(i));
      }
      if (i == 0) {
        keys.push_back({"fabric", *key, {}});
      } else if (*key != keys[0].key) {
        keys.push_back({RailKeyName(i), *key, {}});
      }
    }
    return keys;
  }
  void UnregisterRegion(const Region& r) override {
    for (const auto& rail : rails_) rail->Unregister(r);
  }
  Status QuiesceRegion(const Region& r, Clock::time_point deadline) override {
    for (const auto& rail : rails_) FERRY_RETURN_IF_ERROR(rail->WaitForLate(r, deadline));
    return OkStatus();
  }

  void Shutdown() override {
    for (const auto& rail : rails_) rail->Shutdown();
  }

 private:
  const std::string& provider() const { return rails_[0]->provider(); }
  const std::vector<std::shared_ptr<Endpoint>> rails_;
  const std::string hostname_;
};

std::string ThisHost() {
  char buf[256] = {0};
  (void)::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

std::string FabricAvailability() {
  auto domains = fabric::ListDomains("");
  if (!domains.ok()) return domains.status().message();
  if (domains->empty()) return "libfabric lists no provider with reliable datagrams and RMA";
  return "";
}

bool FabricEnabled(const EngineOptions& options) {
  if (!options.fabric_provider.empty()) return true;
  // Probed once per process: whether a hardware provider exists.
  static const bool kHardware = [] {
    auto domains = fabric::ListDomains("");
    return domains.ok() && std::any_of(domains->begin(), domains->end(),
                                       [](const FabricDomainInfo& d) { return d.hardware; });
  }();
  return kHardware;
}

StatusOr<std::unique_ptr<Transport>> MakeFabricTransport(const TransportContext& ctx) {
  const EngineOptions& o = *ctx.options;
  // Which provider, then where its rails bind.
  auto all = fabric::ListDomains("");
  if (!all.ok()) return all.status().WithPrefix("fabric transport");
  FERRY_ASSIGN_OR_RETURN(std::string provider, fabric::ResolveProvider(*all, o.fabric_provider));
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> nodes, RailNodes(o, provider));
  const fabric::Tuning tuning = fabric::TuningFor(provider);
  std::vector<std::shared_ptr<Endpoint>> rails;
  uint64_t max_message = tuning.max_op_bytes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    fabric::EndpointConfig cfg;
    cfg.provider = provider;
    cfg.node = nodes[i];
    cfg.max_ops = tuning.max_ops;
    cfg.max_op_bytes = tuning.max_op_bytes;
    cfg.max_gather_bytes = tuning.max_gather_bytes;
    cfg.spin = o.spin;
    cfg.unreachable_after = o.connect_timeout;
    cfg.target = ctx.target;
    cfg.key_name = RailKeyName(i);
    auto ep = Endpoint::Open(cfg);
    if (!ep.ok()) {
      for (const auto& r : rails) r->Shutdown();
      if (nodes.size() == 1) return ep.status();
      return ep.status().WithPrefix("fabric_nics entry " + std::to_string(i) + " (" + nodes[i] +
                                    ")");
    }
    max_message = std::min(max_message, (*ep)->max_message());
    rails.push_back(std::shared_ptr<Endpoint>(std::move(*ep)));
  }
  TransportCaps caps = FabricCaps();
  caps.max_slice = static_cast<uint32_t>(std::min<uint64_t>(o.slice_size, max_message));
  if (rails.size() > 1) {
    // Stripes: a request of one slice's size spreads over every rail, and
    // no stripe is smaller than kMinStripe.
    constexpr uint32_t kMinStripe = 64 * 1024;
    caps.max_slice = std::max<uint32_t>(std::min(caps.max_slice, kMinStripe),
                                        caps.max_slice / static_cast<uint32_t>(rails.size()));
  }
  return std::unique_ptr<Transport>(
      std::make_unique<FabricTransport>(std::move(caps), std::move(rails), ThisHost()));
}

}  // namespace ferry::internal

namespace ferry {

FabricInfo DescribeFabric(const std::string& provider, const std::string& node) {
  FabricInfo f;
  const uint32_t v = fi_version();
  f.library = "libfabric " + std::to_string(FI_MAJOR(v)) + "." + std::to_string(FI_MINOR(v));
  auto domains = internal::fabric::ListDomains(node);
  if (!domains.ok()) {
    f.error = domains.status().message();
    f.why_none = f.error;
    return f;
  }
  f.domains = std::move(*domains);
  auto chosen = internal::fabric::ResolveProvider(f.domains, provider);
  if (chosen.ok()) {
    f.chosen = *chosen;
  } else {
    f.why_none = chosen.status().message();
  }
  return f;
}

}  // namespace ferry
