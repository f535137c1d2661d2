#include "core/segment_table.h"

#include <algorithm>

#include "common/log.h"

namespace ferry::internal {

// ---- Segment ------------------------------------------------------------------

std::shared_ptr<PeerLink>* Segment::LinkOf(Transport* t) {
  for (auto& [tr, link] : links_) {
    if (tr == t) return &link;
  }
  return nullptr;
}

void Segment::RetireLinks() {
  for (auto& [t, link] : links_) link->Retire();
  links_.clear();
}

void Segment::DropLink(Transport* t) {
  if (auto* link = LinkOf(t)) (*link)->Retire();
  std::erase_if(links_, [&](const auto& l) { return l.first == t; });
}

Segment::Route* Segment::FindRoute(MemoryKind local, MemoryKind remote) {
  for (Route& r : routes_) {
    if (r.local == local && r.remote == remote) return &r;
  }
  return nullptr;
}

// ---- SegmentTable: opening and closing ------------------------------------------------

SegmentTable::SegmentTable(const EngineOptions& options, const TransportSet& transports,
                           MetadataStore& metadata, Metrics& metrics,
                           std::function<wire::PeerDescriptor()> describe)
    : options_(options),
      transports_(transports),
      metadata_(metadata),
      metrics_(metrics),
      describe_(std::move(describe)) {}

std::shared_ptr<Segment> SegmentTable::Slot(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = by_name_[name];
  if (!slot) slot = std::make_shared<Segment>(name);
  return slot;
}

void SegmentTable::ForgetIfUnopened(const std::shared_ptr<Segment>& seg) {
  if (seg->handle() != 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(seg->name());
  if (it != by_name_.end() && it->second == seg) by_name_.erase(it);
}

StatusOr<SegmentHandle> SegmentTable::Open(std::string_view name) {
  if (name.empty()) return InvalidArgumentError("empty segment name");
  std::shared_ptr<Segment> seg = Slot(std::string(name));
  std::lock_guard<std::mutex> lock(seg->mu_);
  if (seg->handle() != 0) return SegmentHandle{seg->handle()};
  Status s = Handshake(*seg);
  if (!s.ok()) {
    ForgetIfUnopened(seg);
    return s;
  }
  seg->handle_.store(segments_.Insert(seg), std::memory_order_release);
  return SegmentHandle{seg->handle()};
}

StatusOr<SegmentHandle> SegmentTable::Import(const std::string& name, wire::PeerDescriptor desc) {
  std::shared_ptr<Segment> seg = Slot(name);
  std::lock_guard<std::mutex> lock(seg->mu_);
  Status s = Adopt(*seg, describe_(), std::move(desc));
  if (!s.ok()) {
    ForgetIfUnopened(seg);
    return s.WithPrefix("importing the metadata of " + name);
  }
  seg->stale_.store(false, std::memory_order_release);
  if (seg->handle() == 0) seg->handle_.store(segments_.Insert(seg), std::memory_order_release);
  return SegmentHandle{seg->handle()};
}

Status SegmentTable::Close(SegmentHandle h) {
  auto seg = segments_.Erase(h.value);
  if (!seg) return Get(h).status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_name_.find(seg->name());
    if (it != by_name_.end() && it->second == seg) by_name_.erase(it);
  }
  std::lock_guard<std::mutex> lock(seg->mu_);
  seg->RetireLinks();
  return OkStatus();
}

StatusOr<std::shared_ptr<Segment>> SegmentTable::Get(SegmentHandle h) const {
  auto seg = segments_.Get(h.value);
  if (!seg) {
    return InvalidArgumentError("segment handle " + std::to_string(h.value) +
                                " is not open (closed, stale or never issued)");
  }
  return seg;
}

void SegmentTable::OnPeerChanged(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_name_.find(name);
  if (it != by_name_.end()) MarkStale(*it->second);
}

void SegmentTable::RetireAll() {
  std::unordered_map<std::string, std::shared_ptr<Segment>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    open.swap(by_name_);
  }
  for (auto& [name, seg] : open) {
    std::lock_guard<std::mutex> l(seg->mu_);
    seg->RetireLinks();
  }
}

// ---- descriptors ------------------------------------------------------------------

Status SegmentTable::Rehandshake(Segment& seg) {
  std::lock_guard<std::mutex> lock(seg.mu_);
  return Handshake(seg);
}

SegmentInfo SegmentTable::Info(Segment& seg) {
  std::lock_guard<std::mutex> lock(seg.mu_);
  SegmentInfo info;
  const auto& d = seg.peer_->desc();
  info.peer_id = d.peer_id;
  info.engine_name = d.engine_name;
  info.instance_id = d.instance_id;
  info.wire_version = seg.wire_version_;
  info.transport = std::string(seg.routes_.front().transport->Name());
  info.capabilities.version = d.version;
  info.capabilities.wire_version_min = d.wire_min;
  info.capabilities.wire_version_max = d.wire_max;
  for (const auto& t : d.transports) info.capabilities.transports.push_back(t.name);
  info.capabilities.features = d.features;
  for (const auto& r : d.regions) info.regions.push_back({r.addr, r.length, r.location, r.kind});
  return info;
}

StatusOr<std::shared_ptr<const PeerInfo>> SegmentTable::Current(Segment& seg) {
  std::lock_guard<std::mutex> lock(seg.mu_);
  FERRY_RETURN_IF_ERROR(Refresh(seg).WithPrefix("peer " + seg.name()));
  return seg.peer_;
}

Status SegmentTable::Handshake(Segment& seg) {
  const wire::PeerDescriptor self = describe_();
  FERRY_ASSIGN_OR_RETURN(wire::PeerDescriptor desc,
                         metadata_.Fetch(seg.name(), self, ConnectDeadline()));
  return Adopt(seg, self, std::move(desc));
}

// Negotiates the wire version, checks capabilities, picks the cpu/cpu
// transport and retires the links of an instance that restarted.
Status SegmentTable::Adopt(Segment& seg, const wire::PeerDescriptor& self,
                           wire::PeerDescriptor desc) {
  FERRY_ASSIGN_OR_RETURN(uint16_t version, wire::NegotiateWireVersion(self, desc));
  for (const char* f : {"read", "write"}) {
    if (!desc.HasFeature(f)) {
      return FailedPreconditionError("peer " + seg.name() + " (ferry " + desc.version +
                                     ") lacks the capability '" + f + "' this engine needs");
    }
  }
  Transport* chosen = PickTransport(seg, desc, MemoryKind::Cpu(), MemoryKind::Cpu(), nullptr);
  if (chosen == nullptr) {
    std::string offered;
    for (const auto& e : desc.transports) offered += (offered.empty() ? "" : ", ") + e.name;
    return FailedPreconditionError("no transport reaches peer " + seg.name() +
                                   " (this engine uses '" + options_.transport +
                                   "', the peer offers: " + offered + ")");
  }
  if (seg.peer_ && seg.peer_->desc().instance_id != desc.instance_id) {
    FERRY_LOG(kInfo, "peer " << seg.name() << " restarted (instance "
                             << seg.peer_->desc().instance_id << " -> " << desc.instance_id
                             << "); reconnecting");
    seg.RetireLinks();
    seg.routes_.clear();
  }
  ReplaceCpuRoute(seg, chosen);
  seg.peer_ = std::make_shared<const PeerInfo>(std::move(desc));
  seg.wire_version_ = version;
  return OkStatus();
}

// The cpu/cpu route (the first) goes by `chosen`; if it went by another
// transport, that one's link and every other route are dropped.
void SegmentTable::ReplaceCpuRoute(Segment& seg, Transport* chosen) {
  if (!seg.routes_.empty() && seg.routes_.front().transport != chosen) {
    seg.DropLink(seg.routes_.front().transport);
    seg.routes_.clear();
  }
  if (seg.routes_.empty()) seg.routes_.push_back({MemoryKind::Cpu(), MemoryKind::Cpu(), chosen});
}

Status SegmentTable::Refresh(Segment& seg) {
  if (seg.stale_.exchange(false, std::memory_order_acq_rel)) return Handshake(seg);
  return OkStatus();
}

// ---- routes ------------------------------------------------------------------

// The first transport (by preference) that `options.transport` allows, that
// can reach `desc` and move bytes between the two kinds, that is not
// unusable for this segment and comes after `after` (nullptr: from the
// start).
Transport* SegmentTable::PickTransport(const Segment& seg, const wire::PeerDescriptor& desc,
                                       MemoryKind local, MemoryKind remote,
                                       Transport* after) const {
  bool past = after == nullptr;
  for (const auto& t : transports_.transports()) {
    if (!past) {
      past = t.get() == after;
      continue;
    }
    if (options_.transport != "auto" && t->Name() != options_.transport) continue;
    if (std::find(seg.unusable_.begin(), seg.unusable_.end(), t.get()) != seg.unusable_.end()) {
      continue;
    }
    if (t->Handles(local, remote) && t->CanReach(desc)) return t.get();
  }
  return nullptr;
}

std::string SegmentTable::NoRoute(const Segment& seg, MemoryKind local, MemoryKind remote) const {
  std::string offered, kinds;
  for (const auto& e : seg.peer_->desc().transports) {
    offered += (offered.empty() ? "" : ", ") + e.name;
  }
  for (const auto& t : transports_.transports()) {
    if (!t->Handles(local, remote)) continue;
    kinds += (kinds.empty() ? "" : ", ") + std::string(t->Name());
  }
  return "no transport moves bytes between " + local.Name() + " memory here and " + remote.Name() +
         " memory of peer " + seg.name() + " (this engine uses '" + options_.transport +
         "'; transports for these kinds: " + (kinds.empty() ? "none" : kinds) +
         "; the peer offers: " + offered + ")";
}

// The segment's route for the two kinds, picking its transport the first
// time.
StatusOr<Segment::Route*> SegmentTable::RouteOf(Segment& seg, MemoryKind local, MemoryKind remote) {
  if (Segment::Route* r = seg.FindRoute(local, remote)) return r;
  Transport* t = PickTransport(seg, seg.peer_->desc(), local, remote, nullptr);
  if (t == nullptr) return FailedPreconditionError(NoRoute(seg, local, remote));
  seg.routes_.push_back({local, remote, t});
  return &seg.routes_.back();
}

StatusOr<Routed> SegmentTable::Route(Segment& seg, MemoryKind local, MemoryKind remote) {
  std::lock_guard<std::mutex> lock(seg.mu_);
  FERRY_RETURN_IF_ERROR(Refresh(seg));
  FERRY_ASSIGN_OR_RETURN(Routed routed, ConnectLocked(seg, local, remote));
  FillCounters(seg, routed);
  routed.peer = seg.peer_;
  return routed;
}

// Reuses a healthy link, or connects one. A link that broke, or a connect
// refused for a stale descriptor (the peer restarted between handshake and
// connect), means learning the peer's current instance first (one handshake
// each); the routes may change with it.
StatusOr<Routed> SegmentTable::ConnectLocked(Segment& seg, MemoryKind local, MemoryKind remote) {
  bool refetched = false;
  while (true) {
    FERRY_ASSIGN_OR_RETURN(Segment::Route * route, RouteOf(seg, local, remote));
    Transport* transport = route->transport;
    if (auto* link = seg.LinkOf(transport)) {
      if ((*link)->Healthy()) return Routed{*link, transport, {}, nullptr};
      seg.RetireLinks();
      FERRY_RETURN_IF_ERROR(Handshake(seg));
      continue;
    }
    auto link = transport->Connect(seg.peer_, seg.wire_version_, ConnectDeadline());
    if (!link.ok() && link.status().code() == StatusCode::kFailedPrecondition && !refetched) {
      refetched = true;
      FERRY_RETURN_IF_ERROR(Handshake(seg));
      continue;
    }
    std::shared_ptr<PeerLink> live;
    if (link.ok()) {
      live = *std::move(link);
    } else {
      FERRY_ASSIGN_OR_RETURN(auto next, FallBack(seg, local, remote, transport, link.status()));
      transport = next.first;
      live = std::move(next.second);
    }
    seg.links_.emplace_back(transport, live);
    return Routed{live, transport, {}, nullptr};
  }
}

// auto: a transport that says it can reach the peer may still fail to
// connect (shm: another network namespace, no ptrace access). Tries the
// next ones; the first that connects replaces `failed` for this segment
// from now on. Not after a timeout: a peer that does not answer would only
// cost the caller another connect_timeout. `why` if none connects.
StatusOr<std::pair<Transport*, std::shared_ptr<PeerLink>>> SegmentTable::FallBack(
    Segment& seg, MemoryKind local, MemoryKind remote, Transport* failed, const Status& why) {
  if (options_.transport != "auto" || why.code() == StatusCode::kDeadlineExceeded) return why;
  for (Transport* next = PickTransport(seg, seg.peer_->desc(), local, remote, failed);
       next != nullptr; next = PickTransport(seg, seg.peer_->desc(), local, remote, next)) {
    auto other = next->Connect(seg.peer_, seg.wire_version_, ConnectDeadline());
    if (!other.ok()) continue;
    FERRY_LOG(kWarning, "peer " << seg.name() << ": transport " << failed->Name()
                                << " cannot be used (" << why.message() << "); using "
                                << next->Name());
    seg.unusable_.push_back(failed);
    for (auto& r : seg.routes_) {
      if (r.transport == failed) r.transport = next;
    }
    return std::make_pair(next, *std::move(other));
  }
  return why;
}

void SegmentTable::FillCounters(Segment& seg, Routed& routed) {
  const std::string& peer = seg.peer_->desc().peer_id;
  auto c = std::find_if(seg.counters_.begin(), seg.counters_.end(), [&](const auto& x) {
    return x.transport == routed.transport && x.peer_id == peer;
  });
  if (c == seg.counters_.end()) {
    const std::string_view name = routed.transport->Name();
    c = seg.counters_.insert(seg.counters_.end(), {routed.transport,
                                                   peer,
                                                   {metrics_.Route(peer, name, Opcode::kRead),
                                                    metrics_.Route(peer, name, Opcode::kWrite)}});
  }
  routed.counters[0] = c->by_opcode[0];
  routed.counters[1] = c->by_opcode[1];
}

std::vector<std::shared_ptr<PeerLink>> SegmentTable::OtherLinks(Segment& seg,
                                                                const PeerLink& link) {
  std::vector<std::shared_ptr<PeerLink>> others;
  std::lock_guard<std::mutex> lock(seg.mu_);
  for (auto& [t, l] : seg.links_) {
    if (l.get() != &link) others.push_back(l);
  }
  return others;
}

}  // namespace ferry::internal
