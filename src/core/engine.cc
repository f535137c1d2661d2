// Engine: ties the memory registry, segments, batches, metadata and
// transports together. The data path of one write: Submit validates the
// requests, picks a transport per (peer, local memory kind, remote memory
// kind), reserves the requests in the batch, slices them
// (Transport::MaxSlice) and posts the slices to that route's PeerLink; the
// transport completes each slice through BatchState; WaitBatch returns when
// the batch is idle. The engine knows transports only through
// transport/transport.h and transport/registry.h.
#include "ferry/engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>

#include "common/auth.h"
#include "common/handle_table.h"
#include "common/log.h"
#include "common/memory_kind.h"
#include "common/net.h"
#include "core/batch.h"
#include "core/slice_order.h"
#include "core/target.h"
#include "ferry/limits.h"
#include "ferry/version.h"
#include "metadata/metadata.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry {

std::string_view Version() { return FERRY_VERSION; }

namespace internal {

uint64_t ProcessToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  }();
  return token;
}

namespace {

uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) | rd();
  return v;
}

std::string Hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

const std::vector<std::string>& Features() {
  static const std::vector<std::string> f = {"read", "write", "notify", "batch", "p2p-handshake",
                                              // shm targets answer kCopyLendRead (the initiator copies)
                                              "shm-lend-reads"};
  return f;
}

// An opened peer segment. `mu` serializes (re)connection.
struct Segment {
  explicit Segment(std::string n) : name(std::move(n)) {}
  const std::string name;
  std::mutex mu;
  uint64_t handle = 0;                    // 0 until the first handshake succeeded
  std::shared_ptr<const PeerInfo> peer;   // guarded by mu
  uint16_t wire_version = 0;              // guarded by mu
  // The transport chosen for each pair of memory kinds (the first one is
  // cpu/cpu, chosen at handshake), and the links by transport. Guarded by mu.
  struct Route {
    MemoryKind local, remote;
    Transport* transport = nullptr;
  };
  std::vector<Route> routes;
  std::vector<std::pair<Transport*, std::shared_ptr<PeerLink>>> links;
  // Transports `auto` found unable to connect to this peer while another one
  // could (e.g. shm without ptrace access); skipped from then on. Guarded by mu.
  std::vector<Transport*> unusable;
  // Set by a metadata watch: the peer published a new descriptor; fetch it
  // before the next transfer.
  std::atomic<bool> stale{false};

  std::shared_ptr<PeerLink>* LinkOf(Transport* t) {
    for (auto& [tr, link] : links) {
      if (tr == t) return &link;
    }
    return nullptr;
  }
  void RetireLinks() {
    for (auto& [t, link] : links) link->Retire();
    links.clear();
  }
};

// A request's route: which peer, which memory kinds.
struct RouteKey {
  Segment* seg = nullptr;
  MemoryKind local, remote;
  friend bool operator==(const RouteKey& a, const RouteKey& b) {
    return a.seg == b.seg && a.local == b.local && a.remote == b.remote;
  }
};

}  // namespace
}  // namespace internal

using internal::BatchState;
using internal::Clock;
using internal::MemoryKind;
using internal::PeerInfo;
using internal::Segment;
using internal::Transport;

class Engine::Impl {
 public:
  EngineOptions options;
  std::string peer_id;
  uint64_t instance_id = 0;
  std::shared_ptr<internal::EngineTarget> target;
  std::unique_ptr<internal::TransportSet> transports;
  std::unique_ptr<internal::MetadataStore> metadata;
  uint16_t wire_min = kWireVersionMin, wire_max = kWireVersionMax;
  uint16_t descriptor_format_max = wire::kDescriptorFormatMax;
  std::mutex publish_mu;  // one Publish at a time, each with the registry's latest state

  std::mutex segments_mu;
  std::unordered_map<std::string, std::shared_ptr<Segment>> by_name;  // guarded by segments_mu
  internal::HandleTable<Segment> segments;
  internal::HandleTable<BatchState> batches;

  ~Impl() {
    if (metadata) {
      (void)metadata->Remove(options.local_name);
      metadata.reset();  // no watch callback runs after this
    }
    std::unordered_map<std::string, std::shared_ptr<Segment>> open;
    {
      std::lock_guard<std::mutex> lock(segments_mu);
      open.swap(by_name);
    }
    // Lock order everywhere: a segment's mu may be held while taking
    // segments_mu (OpenSegment), never the other way round.
    for (auto& [name, seg] : open) {
      std::lock_guard<std::mutex> l(seg->mu);
      seg->RetireLinks();
    }
    if (transports) transports->Shutdown();
  }

  wire::PeerDescriptor Describe() const {
    wire::PeerDescriptor d;
    d.engine_name = options.local_name;
    d.peer_id = peer_id;
    d.instance_id = instance_id;
    d.process_token = internal::ProcessToken();
    d.hostname = internal::Hostname();
    d.pid = static_cast<uint32_t>(::getpid());
    d.version = std::string(Version());
    d.wire_min = wire_min;
    d.wire_max = wire_max;
    transports->Describe(&d);
    d.features = internal::Features();
    d.features.push_back(wire::DescriptorFormatsFeature(wire::kDescriptorFormatMin, descriptor_format_max));
    d.regions = target->registry().Snapshot(/*exported_only=*/true);
    if (descriptor_format_max < 2) {
      for (auto& r : d.regions) r = {r.addr, r.length, r.location, "cpu", {}};
    }
    return d;
  }

  // Makes the metadata store show the registry's current regions.
  Status Republish() {
    std::lock_guard<std::mutex> lock(publish_mu);
    return metadata->Publish(Describe()).WithPrefix("publishing this engine's descriptor");
  }

  // A watch saw `name` change: fetch it again before the next transfer.
  void OnPeerChanged(const std::string& name) {
    std::lock_guard<std::mutex> lock(segments_mu);
    auto it = by_name.find(name);
    if (it != by_name.end()) it->second->stale.store(true, std::memory_order_release);
  }

  Clock::time_point ConnectDeadline() const { return Clock::now() + options.connect_timeout; }

  // The first transport (by preference) that `options.transport` allows, that
  // can reach `desc` and move bytes between the two kinds, that is not
  // unusable for this segment and comes after `after` (nullptr: from the
  // start). REQUIRES: seg.mu held.
  Transport* PickTransport(const Segment& seg, const wire::PeerDescriptor& desc, MemoryKind local,
                           MemoryKind remote, Transport* after) const {
    bool past = after == nullptr;
    for (const auto& t : transports->transports()) {
      if (!past) {
        past = t.get() == after;
        continue;
      }
      if (options.transport != "auto" && t->Name() != options.transport) continue;
      if (std::find(seg.unusable.begin(), seg.unusable.end(), t.get()) != seg.unusable.end()) continue;
      if (t->Handles(local, remote) && t->CanReach(desc)) return t.get();
    }
    return nullptr;
  }

  std::string NoRoute(const Segment& seg, MemoryKind local, MemoryKind remote) const {
    std::string offered, kinds;
    for (const auto& e : seg.peer->desc().transports) offered += (offered.empty() ? "" : ", ") + e.name;
    for (const auto& t : transports->transports()) {
      if (!t->Handles(local, remote)) continue;
      kinds += (kinds.empty() ? "" : ", ") + std::string(t->Name());
    }
    return "no transport moves bytes between " + local.Name() + " memory here and " + remote.Name() +
           " memory of peer " + seg.name + " (this engine uses '" + options.transport +
           "'; transports for these kinds: " + (kinds.empty() ? "none" : kinds) +
           "; the peer offers: " + offered + ")";
  }

  // Handshakes with the segment's peer and picks the cpu/cpu transport.
  // REQUIRES: seg.mu held.
  Status Handshake(Segment& seg) {
    const wire::PeerDescriptor self = Describe();
    FERRY_ASSIGN_OR_RETURN(wire::PeerDescriptor desc, metadata->Fetch(seg.name, self, ConnectDeadline()));
    FERRY_ASSIGN_OR_RETURN(uint16_t version, wire::NegotiateWireVersion(self, desc));
    for (const char* f : {"read", "write"}) {
      if (!desc.HasFeature(f)) {
        return FailedPreconditionError("peer " + seg.name + " (ferry " + desc.version +
                                       ") lacks the capability '" + f + "' this engine needs");
      }
    }
    Transport* chosen = PickTransport(seg, desc, MemoryKind::Cpu(), MemoryKind::Cpu(), nullptr);
    if (chosen == nullptr) {
      std::string offered;
      for (const auto& e : desc.transports) offered += (offered.empty() ? "" : ", ") + e.name;
      return FailedPreconditionError("no transport reaches peer " + seg.name + " (this engine uses '" +
                                     options.transport + "', the peer offers: " + offered + ")");
    }
    const bool restarted = seg.peer && seg.peer->desc().instance_id != desc.instance_id;
    if (restarted) {
      FERRY_LOG(kInfo, "peer " << seg.name << " restarted (instance " << seg.peer->desc().instance_id << " -> "
                               << desc.instance_id << "); reconnecting");
      seg.RetireLinks();
      seg.routes.clear();
    }
    if (!seg.routes.empty() && seg.routes.front().transport != chosen) {
      if (auto* link = seg.LinkOf(seg.routes.front().transport)) (*link)->Retire();
      seg.links.erase(std::remove_if(seg.links.begin(), seg.links.end(),
                                     [&](const auto& l) { return l.first == seg.routes.front().transport; }),
                      seg.links.end());
      seg.routes.clear();
    }
    if (seg.routes.empty()) seg.routes.push_back({MemoryKind::Cpu(), MemoryKind::Cpu(), chosen});
    seg.peer = std::make_shared<const PeerInfo>(std::move(desc));
    seg.wire_version = version;
    return OkStatus();
  }

  // Re-handshakes if a watch said the peer changed. REQUIRES: seg.mu held.
  Status Refresh(Segment& seg) {
    if (seg.stale.exchange(false, std::memory_order_acq_rel)) return Handshake(seg);
    return OkStatus();
  }

  struct Routed {
    std::shared_ptr<internal::PeerLink> link;
    Transport* transport = nullptr;
  };

  // The live link for moving bytes between the two kinds, reconnecting (and
  // re-handshaking) if needed. REQUIRES: seg.mu held.
  StatusOr<Routed> EnsureRouteLocked(Segment& seg, MemoryKind local, MemoryKind remote) {
    auto route = std::find_if(seg.routes.begin(), seg.routes.end(),
                              [&](const Segment::Route& r) { return r.local == local && r.remote == remote; });
    if (route == seg.routes.end()) {
      Transport* t = PickTransport(seg, seg.peer->desc(), local, remote, nullptr);
      if (t == nullptr) return FailedPreconditionError(NoRoute(seg, local, remote));
      seg.routes.push_back({local, remote, t});
      route = seg.routes.end() - 1;
    }
    Transport* transport = route->transport;
    if (auto* link = seg.LinkOf(transport); link != nullptr && (*link)->Healthy()) {
      return Routed{*link, transport};
    }
    if (seg.LinkOf(transport) != nullptr) {
      // The link broke: the peer may have restarted. Learn its current
      // instance before reconnecting.
      seg.RetireLinks();
      FERRY_RETURN_IF_ERROR(Handshake(seg));
      return EnsureRouteLocked(seg, local, remote);  // the routes may have changed
    }
    auto link = transport->Connect(seg.peer, seg.wire_version, ConnectDeadline());
    if (!link.ok() && link.status().code() == StatusCode::kFailedPrecondition) {
      // Stale descriptor (the peer restarted between handshake and connect).
      FERRY_RETURN_IF_ERROR(Handshake(seg));
      route = std::find_if(seg.routes.begin(), seg.routes.end(),
                           [&](const Segment::Route& r) { return r.local == local && r.remote == remote; });
      if (route == seg.routes.end()) return EnsureRouteLocked(seg, local, remote);
      transport = route->transport;
      link = transport->Connect(seg.peer, seg.wire_version, ConnectDeadline());
    }
    // auto: a transport that says it can reach the peer may still fail to
    // connect (shm: another network namespace, no ptrace access). Try the
    // next one; if that works, skip the first for this segment from now on.
    // Not after a timeout: a peer that does not answer would only cost the
    // caller another connect_timeout.
    const bool timed_out = !link.ok() && link.status().code() == StatusCode::kDeadlineExceeded;
    for (Transport* next = PickTransport(seg, seg.peer->desc(), local, remote, transport);
         !link.ok() && !timed_out && options.transport == "auto" && next != nullptr;
         next = PickTransport(seg, seg.peer->desc(), local, remote, next)) {
      auto other = next->Connect(seg.peer, seg.wire_version, ConnectDeadline());
      if (!other.ok()) continue;
      FERRY_LOG(kWarning, "peer " << seg.name << ": transport " << transport->Name() << " cannot be used ("
                                  << link.status().message() << "); using " << next->Name());
      seg.unusable.push_back(transport);
      for (auto& r : seg.routes) {
        if (r.transport == transport) r.transport = next;
      }
      transport = next;
      link = std::move(other);
    }
    if (!link.ok()) return link.status();
    seg.links.emplace_back(transport, *link);
    return Routed{*link, transport};
  }

  StatusOr<Routed> EnsureRoute(Segment& seg, MemoryKind local, MemoryKind remote) {
    std::lock_guard<std::mutex> lock(seg.mu);
    FERRY_RETURN_IF_ERROR(Refresh(seg));
    return EnsureRouteLocked(seg, local, remote);
  }

  StatusOr<std::shared_ptr<Segment>> GetSegment(SegmentHandle h) const {
    auto seg = segments.Get(h.value);
    if (!seg) {
      return InvalidArgumentError("segment handle " + std::to_string(h.value) +
                                  " is not open (closed, stale or never issued)");
    }
    return seg;
  }

  StatusOr<std::shared_ptr<BatchState>> GetBatch(BatchId id) const {
    auto b = batches.Get(id.value);
    if (!b) {
      return InvalidArgumentError("batch id " + std::to_string(id.value) +
                                  " is not allocated (freed, stale or never issued)");
    }
    return b;
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  FERRY_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.transport != "auto" && internal::FindTransport(options.transport) == nullptr) {
    std::string names = internal::TransportNames();
    return InvalidArgumentError("transport must be auto or one of " + names + ", got '" + options.transport +
                                "'");
  }
  std::shared_ptr<const internal::ClusterSecret> secret;
  if (!options.secret_file.empty()) {
    FERRY_ASSIGN_OR_RETURN(secret, internal::ClusterSecret::Load(options.secret_file));
  }
  auto impl = std::make_unique<Impl>();
  if (options.testing.wire_version_max != 0) {
    impl->wire_min = options.testing.wire_version_min;
    impl->wire_max = options.testing.wire_version_max;
    if (impl->wire_min > impl->wire_max) {
      return InvalidArgumentError("testing wire version range is empty");
    }
  }
  if (options.testing.descriptor_format_max != 0) {
    impl->descriptor_format_max = std::clamp<uint16_t>(options.testing.descriptor_format_max,
                                                       wire::kDescriptorFormatMin, wire::kDescriptorFormatMax);
  }
  if (options.io_threads == 0) options.io_threads = std::min(options.tcp_streams, 4);

  FERRY_ASSIGN_OR_RETURN(impl->transports, internal::TransportSet::Create(options));
  impl->peer_id = impl->transports->peer_id();
  if (options.local_name.empty()) options.local_name = impl->peer_id;
  impl->instance_id = internal::NewInstanceId();
  impl->target = std::make_shared<internal::EngineTarget>(impl->instance_id, impl->peer_id,
                                                          options.notify_inbox_bytes);
  impl->options = options;

  internal::TransportContext ctx;
  ctx.options = &impl->options;
  ctx.target = impl->target;
  ctx.peer_id = impl->peer_id;
  ctx.instance_id = impl->instance_id;
  ctx.wire_min = impl->wire_min;
  ctx.wire_max = impl->wire_max;
  ctx.secret = secret;
  FERRY_RETURN_IF_ERROR(impl->transports->Start(ctx));

  internal::MetadataContext mctx;
  mctx.rpc_openers = &impl->transports->rpc_openers();
  mctx.secret = secret;
  mctx.descriptor_format_max = impl->descriptor_format_max;
  mctx.cluster = options.metadata_cluster;
  mctx.ttl = options.metadata_ttl;
  mctx.timeout = options.connect_timeout;
  FERRY_ASSIGN_OR_RETURN(impl->metadata, internal::MakeMetadataStore(options.metadata, mctx));
  FERRY_RETURN_IF_ERROR(impl->Republish());
  Impl* raw = impl.get();  // the store (and its watch) dies in ~Impl before raw
  Status watching = impl->metadata->Watch([raw](const std::string& name) { raw->OnPeerChanged(name); });
  if (!watching.ok() && watching.code() != StatusCode::kUnimplemented) return watching;
  FERRY_RETURN_IF_ERROR(impl->transports->Serve());
  FERRY_LOG(kInfo, "engine " << impl->options.local_name << " listening on " << impl->peer_id);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const std::string& Engine::PeerId() const { return impl_->peer_id; }
uint16_t Engine::RpcPort() const {
  auto hp = internal::ParsePeerId(impl_->peer_id);
  return hp.ok() ? hp->port : 0;
}
const std::string& Engine::LocalName() const { return impl_->options.local_name; }
const EngineOptions& Engine::options() const { return impl_->options; }

Capabilities Engine::GetCapabilities() const {
  Capabilities c;
  c.version = std::string(Version());
  c.wire_version_min = impl_->wire_min;
  c.wire_version_max = impl_->wire_max;
  for (const auto& t : impl_->transports->transports()) c.transports.emplace_back(t->Name());
  c.features = internal::Features();
  return c;
}

// ---- memory ------------------------------------------------------------------

Status Engine::RegisterMemory(void* addr, size_t length, std::string_view location) {
  MemoryRegion r{addr, length, std::string(location)};
  return RegisterMemory({&r, 1});
}

Status Engine::RegisterMemory(std::span<const MemoryRegion> regions) {
  if (regions.empty()) return InvalidArgumentError("empty list of regions to register");
  std::vector<MemoryKind> kinds;
  kinds.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    auto kind = MemoryKind::FromLocation(regions[i].location, impl_->options.testing.allow_test_memory_kind);
    if (!kind.ok()) {
      return regions.size() > 1 ? kind.status().WithPrefix("region " + std::to_string(i) + " of the list")
                                : kind.status();
    }
    kinds.push_back(*kind);
  }
  FERRY_RETURN_IF_ERROR(impl_->target->registry().Register(regions, kinds, impl_->transports.get()));
  return impl_->Republish();
}

Status Engine::UnregisterMemory(void* addr) {
  FERRY_RETURN_IF_ERROR(
      impl_->target->registry().Unregister(reinterpret_cast<uint64_t>(addr), impl_->transports.get()));
  return impl_->Republish();
}

Status Engine::UnregisterMemory(std::span<void* const> addrs) {
  Status first;
  for (void* a : addrs) {
    Status s = UnregisterMemory(a);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

// ---- segments ------------------------------------------------------------------

StatusOr<SegmentHandle> Engine::OpenSegment(std::string_view peer_id) {
  if (peer_id.empty()) return InvalidArgumentError("empty segment name");
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(impl_->segments_mu);
    auto& slot = impl_->by_name[std::string(peer_id)];
    if (!slot) slot = std::make_shared<Segment>(std::string(peer_id));
    seg = slot;
  }
  std::lock_guard<std::mutex> lock(seg->mu);
  if (seg->handle != 0) return SegmentHandle{seg->handle};
  Status s = impl_->Handshake(*seg);
  if (!s.ok()) {
    std::lock_guard<std::mutex> l(impl_->segments_mu);
    auto it = impl_->by_name.find(seg->name);
    if (it != impl_->by_name.end() && it->second == seg) impl_->by_name.erase(it);
    return s;
  }
  seg->handle = impl_->segments.Insert(seg);
  return SegmentHandle{seg->handle};
}

Status Engine::CloseSegment(SegmentHandle h) {
  auto seg = impl_->segments.Erase(h.value);
  if (!seg) return impl_->GetSegment(h).status();
  {
    std::lock_guard<std::mutex> lock(impl_->segments_mu);
    auto it = impl_->by_name.find(seg->name);
    if (it != impl_->by_name.end() && it->second == seg) impl_->by_name.erase(it);
  }
  std::lock_guard<std::mutex> lock(seg->mu);
  seg->RetireLinks();
  return OkStatus();
}

StatusOr<SegmentInfo> Engine::QuerySegment(SegmentHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(h));
  std::lock_guard<std::mutex> lock(seg->mu);
  FERRY_RETURN_IF_ERROR(impl_->Handshake(*seg));
  SegmentInfo info;
  const auto& d = seg->peer->desc();
  info.peer_id = d.peer_id;
  info.engine_name = d.engine_name;
  info.instance_id = d.instance_id;
  info.wire_version = seg->wire_version;
  info.transport = std::string(seg->routes.front().transport->Name());
  info.capabilities.version = d.version;
  info.capabilities.wire_version_min = d.wire_min;
  info.capabilities.wire_version_max = d.wire_max;
  for (const auto& t : d.transports) info.capabilities.transports.push_back(t.name);
  info.capabilities.features = d.features;
  for (const auto& r : d.regions) info.regions.push_back({r.addr, r.length, r.location, r.kind});
  return info;
}

// ---- batches -------------------------------------------------------------------

StatusOr<BatchId> Engine::AllocateBatch(size_t capacity) {
  if (capacity == 0 || capacity > kMaxBatchCapacity) {
    return InvalidArgumentError("batch capacity must be in [1, " + std::to_string(kMaxBatchCapacity) +
                                "], got " + std::to_string(capacity));
  }
  return BatchId{impl_->batches.Insert(std::make_shared<BatchState>(capacity))};
}

// Requests sliced, ordered and posted at a time by Submit.
constexpr size_t kPostChunk = 8192;

Status Engine::Submit(BatchId id, std::span<const TransferRequest> requests) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (requests.empty()) return InvalidArgumentError("no requests to submit");
  // 1. Validate everything before anything moves.
  std::vector<Segment*> segs(requests.size());  // owned by `distinct`
  std::vector<MemoryKind> local_kinds;          // filled only once some local memory is not cpu
  bool mixed_kinds = false;
  std::map<uint64_t, std::shared_ptr<Segment>> distinct;
  internal::MemoryRegistry::Found local_region;  // the last local region found; most requests share it
  local_region.length = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    auto bad = [&](const Status& s) { return s.WithPrefix("request " + std::to_string(i)); };
    if (r.opcode != Opcode::kRead && r.opcode != Opcode::kWrite) {
      return bad(InvalidArgumentError("unknown opcode " + std::to_string(static_cast<int>(r.opcode))));
    }
    if (r.local == nullptr) return bad(InvalidArgumentError("local address is null"));
    if (r.length == 0) return bad(InvalidArgumentError("length is zero"));
    const uint64_t local = reinterpret_cast<uint64_t>(r.local);
    if (!(local >= local_region.addr && r.length <= local_region.length &&
          local - local_region.addr <= local_region.length - r.length)) {
      Status s = impl_->target->registry().Check(local, r.length, "local buffer", &local_region);
      if (!s.ok()) return bad(s);
      if (!local_region.kind.cpu_accessible() && !mixed_kinds) {
        mixed_kinds = true;
        local_kinds.assign(i, MemoryKind::Cpu());
      }
    }
    if (mixed_kinds) local_kinds.push_back(local_region.kind);
    if (r.remote_addr + r.length < r.remote_addr) {
      return bad(InvalidArgumentError("remote range " + internal::FormatRange(r.remote_addr, r.length) +
                                      " wraps around the address space"));
    }
    auto seg = distinct.find(r.segment.value);
    if (seg == distinct.end()) {
      auto got = impl_->GetSegment(r.segment);
      if (!got.ok()) return bad(got.status());
      seg = distinct.emplace(r.segment.value, *got).first;
    }
    segs[i] = seg->second.get();
  }
  // 2. Each peer's current descriptor (fetched again if a watch said it
  // changed), then the route of every request: its peer and the memory kinds
  // on both sides. Routes mostly repeat: one lookup per run of them.
  // 3. Make sure every route is connected (connects lazily). Connecting may
  // find that a peer restarted (a new descriptor): then the routes are worked
  // out again against it, so every slice's region index (and so its key)
  // belongs to the descriptor it is posted with.
  struct PeerPost {
    internal::RouteKey key;
    std::shared_ptr<const PeerInfo> peer;
    std::shared_ptr<internal::PeerLink> link;
    uint32_t max_slice = 0;
    internal::SliceOrder order = internal::SliceOrder::kByDestination;
    std::vector<internal::Slice> slices;  // of the chunk being prepared
  };
  std::vector<PeerPost> posts;  // a handful: one per route
  std::vector<uint8_t> post_of(requests.size());
  std::vector<uint32_t> region_of(requests.size());
  for (int attempt = 0;; ++attempt) {
    std::map<Segment*, std::shared_ptr<const PeerInfo>> infos;
    for (auto& [h, seg] : distinct) {
      std::lock_guard<std::mutex> lock(seg->mu);
      Status s = impl_->Refresh(*seg);
      if (!s.ok()) return s.WithPrefix("peer " + seg->name);
      infos[seg.get()] = seg->peer;
    }
    posts.clear();
    Segment* last_seg = nullptr;
    const PeerInfo* info = nullptr;
    uint32_t last_region = internal::kNoRegion;
    size_t last_post = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const TransferRequest& r = requests[i];
      if (segs[i] != last_seg) {
        last_seg = segs[i];
        info = infos[last_seg].get();
        last_region = internal::kNoRegion;
      }
      // The peer's region holding the remote range (requests mostly share one).
      uint32_t region = last_region;
      if (region == internal::kNoRegion ||
          !(r.remote_addr >= info->desc().regions[region].addr &&
            r.length <= info->desc().regions[region].length &&
            r.remote_addr - info->desc().regions[region].addr <= info->desc().regions[region].length - r.length)) {
        region = info->FindRegion(r.remote_addr, r.length);
        if (region != internal::kNoRegion) last_region = region;
      }
      region_of[i] = region;
      const internal::RouteKey key{segs[i], mixed_kinds ? local_kinds[i] : MemoryKind::Cpu(),
                                   info->KindOf(region)};
      if (posts.empty() || !(posts[last_post].key == key)) {
        auto it = std::find_if(posts.begin(), posts.end(), [&](const PeerPost& p) { return p.key == key; });
        if (it == posts.end()) {
          if (posts.size() == 255) return InvalidArgumentError("requests of one submit use more than 255 routes");
          posts.push_back({key, infos[segs[i]], nullptr, 0, {}, {}});
          it = posts.end() - 1;
        }
        last_post = static_cast<size_t>(it - posts.begin());
      }
      post_of[i] = static_cast<uint8_t>(last_post);
    }
    bool changed = false;
    for (PeerPost& p : posts) {
      auto routed = impl_->EnsureRoute(*p.key.seg, p.key.local, p.key.remote);
      if (!routed.ok()) return routed.status().WithPrefix("peer " + p.key.seg->name);
      p.link = routed->link;
      p.max_slice = routed->transport->MaxSlice();
      p.order = routed->transport->PreferredOrder();
      std::lock_guard<std::mutex> lock(p.key.seg->mu);
      changed = changed || p.key.seg->peer != p.peer;
    }
    if (!changed || attempt == 1) break;  // a second restart within one submit: its target validates
  }
  // 4. Reserve, then slice, order and post chunk by chunk: the transport
  // starts sending the first chunk while the next ones are prepared (for
  // 262,144 requests, preparing them all first left the streams idle for
  // 30-80 ms per batch).
  FERRY_ASSIGN_OR_RETURN(size_t base, batch->Reserve(requests.size()));
  // Every request is pending before the first slice moves, so no observer
  // sees the batch idle between chunks.
  batch->BeginRange(base, requests.size(), [&](size_t index) {
    const size_t i = index - base;
    const uint32_t max_slice = posts[post_of[i]].max_slice;
    const uint64_t length = requests[i].length;
    return length <= max_slice ? 1u : static_cast<uint32_t>((length + max_slice - 1) / max_slice);
  });
  const Clock::time_point deadline = Clock::now() + impl_->options.transfer_timeout;
  for (size_t begin = 0; begin < requests.size(); begin += kPostChunk) {
    const size_t end = std::min(requests.size(), begin + kPostChunk);
    for (size_t i = begin; i < end; ++i) {
      const TransferRequest& r = requests[i];
      PeerPost& p = posts[post_of[i]];
      if (p.slices.capacity() == 0) p.slices.reserve(end - i);  // emptied by the last chunk's Post
      for (uint64_t off = 0; off < r.length; off += p.max_slice) {
        uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(p.max_slice, r.length - off));
        p.slices.push_back({.opcode = r.opcode,
                            .remote_region = region_of[i],
                            .local = static_cast<char*>(r.local) + off,
                            .remote = r.remote_addr + off,
                            .length = len,
                            .request = static_cast<uint32_t>(base + i)});
      }
    }
    for (PeerPost& p : posts) {
      if (p.slices.empty()) continue;
      internal::OrderForSending(p.slices, p.order);
      p.link->Post({batch, deadline, p.peer}, std::move(p.slices));
      p.slices.clear();  // moved-from: empty and ready for the next chunk
    }
  }
  return OkStatus();
}

StatusOr<TransferStatus> Engine::GetTransferStatus(BatchId id, size_t index) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (index >= batch->reserved()) {
    return InvalidArgumentError("request index " + std::to_string(index) + " is out of range: batch " +
                                std::to_string(id.value) + " has " + std::to_string(batch->reserved()) +
                                " submitted requests");
  }
  return batch->Get(index);
}

StatusOr<BatchStatus> Engine::GetBatchStatus(BatchId id) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  return batch->Summary();
}

Status Engine::WaitBatch(BatchId id, std::chrono::milliseconds timeout) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (!batch->WaitIdle(Clock::now() + timeout, impl_->options.wait_spin)) {
    return DeadlineExceededError("batch " + std::to_string(id.value) + " still has " +
                                 std::to_string(batch->pending()) + " requests pending after " +
                                 std::to_string(timeout.count()) + " ms");
  }
  BatchStatus s = batch->Summary();
  return s.failed > 0 ? s.first_error : OkStatus();
}

Status Engine::FreeBatch(BatchId id) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (!batch->SettleIfFinal()) {
    return FailedPreconditionError("batch " + std::to_string(id.value) + " still has " +
                                   std::to_string(batch->pending()) +
                                   " requests in flight; wait for them (each ends by its transfer deadline)");
  }
  impl_->batches.Erase(id.value);
  return OkStatus();
}

Status Engine::TransferSync(const TransferRequest& request) { return TransferSync({&request, 1}); }

Status Engine::TransferSync(std::span<const TransferRequest> requests) {
  if (requests.empty()) return InvalidArgumentError("no requests to transfer");
  FERRY_ASSIGN_OR_RETURN(BatchId id, AllocateBatch(requests.size()));
  Status s = Submit(id, requests);
  if (s.ok()) {
    auto batch = impl_->GetBatch(id);
    // Each request ends by its deadline; wait a little longer than that so
    // the transport's own deadline is what reports a timeout.
    if (batch.ok()) {
      (*batch)->WaitIdle(Clock::now() + impl_->options.transfer_timeout + std::chrono::seconds(5),
                         impl_->options.wait_spin);
    }
    s = WaitBatch(id, std::chrono::milliseconds(0));
  }
  Status f = FreeBatch(id);
  if (!f.ok() && s.ok()) s = f;
  return s;
}

// ---- notifications --------------------------------------------------------------

Status Engine::SendNotification(SegmentHandle h, std::string_view name, std::string_view message) {
  if (name.size() > kMaxNotificationName || message.size() > kMaxNotificationMessage) {
    return InvalidArgumentError("notification too large: name " + std::to_string(name.size()) +
                                " bytes (at most " + std::to_string(kMaxNotificationName) + "), message " +
                                std::to_string(message.size()) + " bytes (at most " +
                                std::to_string(kMaxNotificationMessage) + ")");
  }
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(h));
  FERRY_ASSIGN_OR_RETURN(auto routed, impl_->EnsureRoute(*seg, MemoryKind::Cpu(), MemoryKind::Cpu()));
  wire::NotifyBody body{impl_->peer_id, std::string(name), std::string(message)};
  return routed.link->Notify(body, Clock::now() + impl_->options.transfer_timeout)
      .WithPrefix("notification to " + seg->name);
}

std::vector<Notification> Engine::GetNotifications() { return impl_->target->Drain(); }

}  // namespace ferry
