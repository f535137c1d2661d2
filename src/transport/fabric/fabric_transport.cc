#include "transport/fabric/fabric_transport.h"

#include <rdma/fabric.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/log.h"
#include "ferry/transports.h"
#include "transport/fabric/fabric_endpoint.h"
#include "transport/fabric/fabric_info.h"

namespace ferry::internal {
namespace {

using fabric::Endpoint;
using fabric::RemotePeer;

// What measurement chose per provider (docs/benchmarks.md, "fabric"):
// the largest slice (one operation's bytes), the slices gathered into one
// operation and the operations in flight.
struct Tuning {
  uint32_t max_op_bytes;
  uint32_t max_ops;
};
Tuning TuningFor(std::string_view provider) {
  const std::string_view core = provider.substr(0, provider.find(';'));
  // tcp;ofi_rxm: 1 MiB operations, as the plain libfabric loop posts them
  // (the "above 64 KiB runs 3-4x slower" was not reproduced:
  // tools/fabric_probe/README.md, section 4; 64 KiB operations made 1 MiB
  // writes 16 operations each).
  if (core == "tcp") return {1u << 20, 256};
  if (core == "shm") return {1u << 20, 64};
  return {1u << 20, 256};
}

bool SameHostOnly(std::string_view provider) {
  const std::string_view core = provider.substr(0, provider.find(';'));
  return core == "shm" || core == "sm2";
}

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

StatusOr<std::string> Unhex(std::string_view hex) {
  if (hex.size() % 2 != 0) return InvalidArgumentError("odd number of hex digits");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    auto digit = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgumentError("not a hex digit");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

// A descriptor's "fabric" entry: "PROVIDER/ADDR_FORMAT/HEX".
struct FabricAddress {
  std::string provider;
  uint32_t format = 0;
  std::string raw;
};

std::string EncodeAddress(const FabricAddress& a) {
  return a.provider + "/" + std::to_string(a.format) + "/" + Hex(a.raw);
}

StatusOr<FabricAddress> DecodeAddress(std::string_view s) {
  const size_t a = s.find('/'), b = a == std::string_view::npos ? a : s.find('/', a + 1);
  if (b == std::string_view::npos) return InvalidArgumentError("fabric endpoint '" + std::string(s.substr(0, 64)) + "' is not PROVIDER/FORMAT/HEX");
  FabricAddress out;
  out.provider = std::string(s.substr(0, a));
  const std::string format(s.substr(a + 1, b - a - 1));
  if (format.empty() || format.size() > 9 || format.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgumentError("fabric endpoint has a bad address format '" + format + "'");
  }
  out.format = static_cast<uint32_t>(std::stoul(format));
  auto raw = Unhex(s.substr(b + 1));
  if (!raw.ok()) return raw.status().WithPrefix("fabric endpoint address");
  out.raw = std::move(*raw);
  return out;
}

// Where the endpoint binds: the engine's listen host, so an engine on
// 127.0.0.1 stays on loopback (with no node, libfabric's tcp provider takes
// the machine's first interface). Same-host providers take no node.
std::string NodeFor(const EngineOptions& o, std::string_view provider) {
  if (SameHostOnly(provider)) return "";
  if (o.listen_host.empty() || o.listen_host == "0.0.0.0" || o.listen_host == "::") return "";
  return o.listen_host;
}

class FabricLink : public PeerLink {
 public:
  FabricLink(std::shared_ptr<Endpoint> ep, std::shared_ptr<RemotePeer> peer)
      : ep_(std::move(ep)), peer_(std::move(peer)) {}
  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    ep_->Post(peer_, ctx, std::move(slices));
  }
  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override {
    return ep_->Notify(peer_, body, deadline);
  }
  bool Healthy() const override { return !peer_->broken(); }
  void Retire() override { ep_->RemovePeer(peer_); }

 private:
  const std::shared_ptr<Endpoint> ep_;
  const std::shared_ptr<RemotePeer> peer_;
};

class FabricTransport : public Transport {
 public:
  FabricTransport(TransportCaps caps, std::shared_ptr<Endpoint> ep, std::string hostname)
      : Transport(std::move(caps)), ep_(std::move(ep)), hostname_(std::move(hostname)) {}
  ~FabricTransport() override { Shutdown(); }

  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"fabric", EncodeAddress({ep_->provider(), ep_->addr_format(), ep_->address()})});
  }

  bool CanReach(const wire::PeerDescriptor& peer) const override {
    const wire::TransportEndpoint* e = peer.FindTransport("fabric");
    if (e == nullptr) return false;
    auto a = DecodeAddress(e->endpoint);
    if (!a.ok() || a->provider != ep_->provider() || a->format != ep_->addr_format()) return false;
    return !SameHostOnly(ep_->provider()) || peer.hostname == hostname_;
  }

  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> info, uint16_t,
                                              Clock::time_point) override {
    const wire::TransportEndpoint* e = info->desc().FindTransport("fabric");
    if (e == nullptr) return UnimplementedError("peer " + info->Label() + " offers no fabric endpoint");
    auto a = DecodeAddress(e->endpoint);
    if (!a.ok()) return a.status().WithPrefix("peer " + info->Label());
    if (a->provider != ep_->provider()) {
      return FailedPreconditionError("peer " + info->Label() + " uses fabric provider " + a->provider +
                                     ", this engine " + ep_->provider());
    }
    if (SameHostOnly(ep_->provider()) && info->desc().hostname != hostname_) {
      return FailedPreconditionError("fabric provider " + ep_->provider() + " reaches only this host; peer " +
                                     info->Label() + " is on " + info->desc().hostname);
    }
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<RemotePeer> p, ep_->AddPeer(info, a->raw));
    return std::shared_ptr<PeerLink>(std::make_shared<FabricLink>(ep_, std::move(p)));
  }

  StatusOr<std::optional<uint64_t>> RegisterRegion(const Region& r) override {
    if (!r.kind.cpu_accessible()) return std::optional<uint64_t>();
    FERRY_ASSIGN_OR_RETURN(uint64_t key, ep_->Register(r));
    return std::optional<uint64_t>(key);
  }
  void UnregisterRegion(const Region& r) override { ep_->Unregister(r); }

  void Shutdown() override { ep_->Shutdown(); }

 private:
  const std::shared_ptr<Endpoint> ep_;
  const std::string hostname_;
};

std::string ThisHost() {
  char buf[256] = {0};
  (void)::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace

TransportCaps FabricCaps() {
  TransportCaps c;
  c.name = "fabric";
  c.reach = Reach::kNetwork;
  c.needs_region_keys = true;
  return c;
}

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
  // Which provider, then where it binds.
  auto all = fabric::ListDomains("");
  if (!all.ok()) return all.status().WithPrefix("fabric transport");
  FERRY_ASSIGN_OR_RETURN(std::string provider, fabric::ResolveProvider(*all, o.fabric_provider));
  fabric::EndpointConfig cfg;
  cfg.provider = provider;
  cfg.node = NodeFor(o, provider);
  const Tuning tuning = TuningFor(provider);
  cfg.max_ops = tuning.max_ops;
  cfg.max_op_bytes = tuning.max_op_bytes;
  cfg.spin = o.spin;
  cfg.unreachable_after = o.connect_timeout;
  cfg.target = ctx.target;
  auto ep = Endpoint::Open(cfg);
  if (!ep.ok()) return ep.status();
  TransportCaps caps = FabricCaps();
  caps.max_slice = static_cast<uint32_t>(
      std::min<uint64_t>({o.slice_size, tuning.max_op_bytes, (*ep)->max_message()}));
  return std::unique_ptr<Transport>(
      std::make_unique<FabricTransport>(std::move(caps), std::shared_ptr<Endpoint>(std::move(*ep)), ThisHost()));
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
