#include "core/segment_table.h"

#include <algorithm>

#include "common/log.h"

namespace ferry::internal {

// ---- Segment ------------------------------------------------------------------

namespace {
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}
}  // namespace

LinkLease::LinkLease(std::shared_ptr<LinkUse> use, std::shared_ptr<LinkRoom> room)
    : use_(std::move(use)), room_(std::move(room)) {
  use_->users.fetch_add(1, std::memory_order_acq_rel);
}

LinkLease::~LinkLease() {
  use_->last_used_ns.store(NowNs(), std::memory_order_relaxed);
  const int left = use_->users.fetch_sub(1, std::memory_order_acq_rel) - 1;
  // A waiter for room re-checks: this link may be idle now (or soon: its
  // waits are bounded, so a wake-up missed here only delays it).
  if (left == 0 && room_) room_->cv.notify_all();
}

Segment::Link* Segment::LinkOf(Transport* t) {
  for (Link& l : links_) {
    if (l.transport == t) return &l;
  }
  return nullptr;
}

void Segment::RetireLinks() {
  for (Link& l : links_) l.link->Retire();
  open_links_->fetch_sub(links_.size(), std::memory_order_relaxed);
  links_.clear();
}

void Segment::DropLink(Transport* t) {
  for (size_t i = 0; i < links_.size(); ++i) {
    if (links_[i].transport == t) {
      CloseLink(i);
      return;
    }
  }
}

void Segment::CloseLink(size_t i) {
  links_[i].link->Retire();
  links_.erase(links_.begin() + static_cast<std::ptrdiff_t>(i));
  open_links_->fetch_sub(1, std::memory_order_relaxed);
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

SegmentTable::~SegmentTable() { StopSweeper(); }

std::shared_ptr<Segment> SegmentTable::Slot(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = by_name_[name];
  if (!slot) slot = std::make_shared<Segment>(name, &open_links_);
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
  StopSweeper();
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
  for (const auto& t : d.transports) {
    if (t.IsTransport()) info.capabilities.transports.push_back(t.name);
  }
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
    for (const auto& e : desc.transports) {
      if (e.IsTransport()) offered += (offered.empty() ? "" : ", ") + e.name;
    }
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
    if (e.IsTransport()) offered += (offered.empty() ? "" : ", ") + e.name;
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
    if (Segment::Link* link = seg.LinkOf(transport)) {
      if (link->link->Closing() && link->use->users.load(std::memory_order_acquire) == 0 &&
          link->link->Idle()) {
        // The peer asked to close it and nothing uses it: as an idle close
        // (no lease can start meanwhile: this is under the segment's lock).
        FERRY_LOG(kDebug, "closing the link to " << seg.name() << ": the peer asked (idle there)");
        seg.DropLink(transport);
        seg.reopen_ = true;
        metrics_.AddLinkClosedIdle();
        continue;
      }
      if (link->link->Healthy()) return Routed{link->link, transport, {}, nullptr, Lease(*link)};
      seg.RetireLinks();
      FERRY_RETURN_IF_ERROR(Handshake(seg));
      continue;
    }
    FERRY_RETURN_IF_ERROR(ReserveLink(seg).WithPrefix("peer " + seg.name()));
    auto link = transport->Connect(seg.peer_, seg.wire_version_, ConnectDeadline());
    // A stale descriptor (the peer restarted between handshake and
    // connect), or a link closed for idleness whose peer no longer answers
    // where it did (it may have restarted elsewhere): learn where it is now.
    const StatusCode code = link.ok() ? StatusCode::kOk : link.status().code();
    const bool moved = seg.reopen_ && code != StatusCode::kOk &&
                       code != StatusCode::kDeadlineExceeded &&
                       code != StatusCode::kResourceExhausted;
    if ((code == StatusCode::kFailedPrecondition || moved) && !refetched) {
      open_links_.fetch_sub(1, std::memory_order_relaxed);  // the reservation
      refetched = true;
      seg.reopen_ = false;
      FERRY_RETURN_IF_ERROR(Handshake(seg));
      continue;
    }
    std::shared_ptr<PeerLink> live;
    if (link.ok()) {
      live = *std::move(link);
    } else {
      auto next = FallBack(seg, local, remote, transport, link.status());
      if (!next.ok()) {
        open_links_.fetch_sub(1, std::memory_order_relaxed);
        return next.status();
      }
      transport = next->first;
      live = std::move(next->second);
    }
    seg.reopen_ = false;
    seg.links_.push_back({transport, live, std::make_shared<LinkUse>()});
    seg.links_.back().use->last_used_ns.store(NowNs(), std::memory_order_relaxed);
    metrics_.AddLinkOpened();
    StartSweeper();
    return Routed{live, transport, {}, nullptr, Lease(seg.links_.back())};
  }
}

std::shared_ptr<LinkLease> SegmentTable::Lease(const Segment::Link& l) {
  return std::make_shared<LinkLease>(l.use, options_.max_peer_links > 0 ? room_ : nullptr);
}

// ---- peer links: the budget and idle links ---------------------------------------

Status SegmentTable::ReserveLink(Segment& seg) {
  const uint32_t max = options_.max_peer_links;
  if (max == 0) {
    open_links_.fetch_add(1, std::memory_order_relaxed);
    return OkStatus();
  }
  const Clock::time_point deadline = ConnectDeadline();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(room_mu_);
      if (open_links_.load(std::memory_order_relaxed) < max) {
        open_links_.fetch_add(1, std::memory_order_relaxed);
        return OkStatus();
      }
    }
    if (EvictIdle(seg)) continue;
    if (Clock::now() >= deadline) {
      return ResourceExhaustedError(
          "no room for another peer link: all max_peer_links = " + std::to_string(max) +
          " links are in use (requests in flight on each) and none became idle within "
          "connect_timeout (" +
          std::to_string(options_.connect_timeout.count()) +
          " ms); raise max_peer_links (FERRY_MAX_PEER_LINKS; 0 = no limit)");
    }
    // Woken when a lease ends; links also turn idle when their last answer
    // arrives, which wakes nobody, so the wait is bounded.
    std::unique_lock<std::mutex> lock(room_->mu);
    room_->cv.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(10)));
  }
}

std::vector<std::shared_ptr<Segment>> SegmentTable::AllSegments() {
  std::vector<std::shared_ptr<Segment>> all;
  std::lock_guard<std::mutex> lock(mu_);
  all.reserve(by_name_.size());
  for (auto& [name, seg] : by_name_) all.push_back(seg);
  return all;
}

bool SegmentTable::EvictIdle(Segment& seg) {
  // Runs with seg.mu_ held: other segments' locks only by try_lock (one
  // that is connecting, or evicting from this one, is skipped).
  std::shared_ptr<Segment> best;
  int64_t best_ns = 0;
  for (const std::shared_ptr<Segment>& other : AllSegments()) {
    if (other.get() == &seg) continue;
    std::unique_lock<std::mutex> lock(other->mu_, std::try_to_lock);
    if (!lock.owns_lock()) continue;
    for (const Segment::Link& l : other->links_) {
      const int64_t t = l.use->last_used_ns.load(std::memory_order_relaxed);
      if (l.use->users.load(std::memory_order_acquire) == 0 && (!best || t < best_ns) &&
          l.link->Idle()) {
        best = other;
        best_ns = t;
      }
    }
  }
  if (!best) return false;
  std::unique_lock<std::mutex> lock(best->mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;  // busy now: the caller waits, then looks again
  for (size_t i = 0; i < best->links_.size(); ++i) {
    const Segment::Link& l = best->links_[i];
    // Checked again under the lock: no lease can start meanwhile.
    if (l.use->users.load(std::memory_order_acquire) == 0 && l.link->Idle()) {
      FERRY_LOG(kDebug,
                "closing the idle link to " << best->name() << " to make room (max_peer_links)");
      best->CloseLink(i);
      best->reopen_ = true;
      metrics_.AddLinkEvicted();
      return true;
    }
  }
  return false;
}

void SegmentTable::SweepIdle() {
  const int64_t timeout_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.idle_link_timeout).count();
  bool closed = false;
  for (const std::shared_ptr<Segment>& seg : AllSegments()) {
    std::unique_lock<std::mutex> lock(seg->mu_, std::try_to_lock);
    if (!lock.owns_lock()) continue;
    const int64_t now = NowNs();
    for (size_t i = 0; i < seg->links_.size();) {
      const Segment::Link& l = seg->links_[i];
      // users == 0 under the segment's lock: nobody posts on the link, and
      // nobody can start to (a lease is only taken under this lock).
      // Idle for our timeout, or the peer's (it asked to close the link).
      const bool timed_out =
          timeout_ns > 0 && now - l.use->last_used_ns.load(std::memory_order_relaxed) >= timeout_ns;
      if (l.use->users.load(std::memory_order_acquire) == 0 && (timed_out || l.link->Closing()) &&
          l.link->Idle()) {
        FERRY_LOG(kDebug, "closing the link to " << seg->name() << ": idle for "
                                                 << options_.idle_link_timeout.count()
                                                 << " ms here, or the peer asked");
        seg->CloseLink(i);
        seg->reopen_ = true;
        metrics_.AddLinkClosedIdle();
        closed = true;
        continue;
      }
      ++i;
    }
  }
  if (closed && options_.max_peer_links > 0) room_->cv.notify_all();
}

void SegmentTable::StartSweeper() {
  std::lock_guard<std::mutex> lock(sweep_mu_);
  if (sweeper_.joinable() || sweep_stop_) return;
  // A link is closed between one and 1.25 timeouts after its last use
  // (at least every second, so long timeouts are not late by minutes), and
  // within a second of its peer asking (PeerLink::Closing) — with no
  // timeout of ours (idle_link_timeout 0) the sweeper does only that.
  const auto period = options_.idle_link_timeout.count() == 0
                          ? std::chrono::milliseconds(std::chrono::seconds(1))
                          : std::clamp<std::chrono::milliseconds>(options_.idle_link_timeout / 4,
                                                                  std::chrono::milliseconds(1),
                                                                  std::chrono::seconds(1));
  sweeper_ = std::thread([this, period] {
    std::unique_lock<std::mutex> l(sweep_mu_);
    while (!sweep_stop_) {
      sweep_cv_.wait_for(l, period);
      if (sweep_stop_) break;
      l.unlock();
      SweepIdle();
      l.lock();
    }
  });
}

void SegmentTable::StopSweeper() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    sweep_stop_ = true;
    t = std::move(sweeper_);
  }
  sweep_cv_.notify_all();
  if (t.joinable()) t.join();
}

// auto: a transport that says it can reach the peer may still fail to
// connect (shm: another network namespace, no ptrace access). Tries the
// next ones; the first that connects replaces `failed` for this segment
// from now on. Not after a timeout: a peer that does not answer would only
// cost the caller another connect_timeout. `why` if none connects.
StatusOr<std::pair<Transport*, std::shared_ptr<PeerLink>>> SegmentTable::FallBack(
    Segment& seg, MemoryKind local, MemoryKind remote, Transport* failed, const Status& why) {
  // Out of descriptors (kResourceExhausted) says nothing about the
  // transport: the next one would fail alike, and must not be marked unusable.
  if (options_.transport != "auto" || why.code() == StatusCode::kDeadlineExceeded ||
      why.code() == StatusCode::kResourceExhausted) {
    return why;
  }
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
  for (const Segment::Link& l : seg.links_) {
    if (l.link.get() != &link) others.push_back(l.link);
  }
  return others;
}

}  // namespace ferry::internal
