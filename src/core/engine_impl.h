// Engine::Impl and the engine's internal objects (segments, routes,
// prepared transfers), shared by the files that implement Engine:
// engine.cc (memory, segments, batches, notifications) and
// engine_prepared.cc (prepared lists and transfers, metadata export and
// import, telemetry). Not part of any other layer's view of the core.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/auth.h"
#include "common/handle_table.h"
#include "common/log.h"
#include "common/memory_kind.h"
#include "common/net.h"
#include "core/batch.h"
#include "core/metrics.h"
#include "core/metrics_server.h"
#include "core/prepared.h"
#include "core/slice_order.h"
#include "core/target.h"
#include "ferry/engine.h"
#include "ferry/limits.h"
#include "ferry/version.h"
#include "metadata/metadata.h"
#include "transport/registry.h"
#include "transport/transport.h"

namespace ferry {
namespace internal {

inline uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) | rd();
  return v;
}

inline std::string Hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

inline const std::vector<std::string>& Features() {
  static const std::vector<std::string> f = {"read", "write", "notify", "batch", "p2p-handshake",
                                              // shm targets answer kCopyLendRead (the initiator copies)
                                              "shm-lend-reads",
                                              // takes notifications of up to kMaxNotificationMessage bytes
                                              "notify-1m"};
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
  // The metrics' counters of this peer per transport (by opcode), found
  // once instead of on every submit. Guarded by mu.
  struct Counters {
    Transport* transport;
    std::string peer_id;
    RouteCounters* by_opcode[2];
  };
  std::vector<Counters> counters;

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

// Runs jobs one at a time, in order, on its own thread (started on first
// use): the notifications of finished prepared transfers, which block for
// a round trip and so must not run on a transport's thread. A job is called
// with run = false instead when the engine is shutting down.
class Notifier {
 public:
  ~Notifier() { Stop(); }
  void Push(std::function<void(bool run)> job) {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_) {
      lock.unlock();
      job(false);
      return;
    }
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
    cv_.notify_one();
  }
  // Drops the jobs not started (calling them with run = false), waits for
  // the one running.
  void Stop() {
    std::unique_lock<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_one();
    lock.unlock();
    if (thread_.joinable()) thread_.join();
    lock.lock();
    std::deque<std::function<void(bool)>> left;
    left.swap(jobs_);
    lock.unlock();
    for (auto& j : left) j(false);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
      if (stopped_) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job(true);
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(bool)>> jobs_;  // guarded by mu_
  bool stopped_ = false;                         // guarded by mu_
  std::thread thread_;
};

// One post of a prepared transfer: its batch, telemetry and notification.
struct PostState {
  std::shared_ptr<BatchState> batch;
  TransferTelemetry telemetry;   // start_us, post_us, bytes, entries; transfer_us once finished
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;         // guarded by mu: data done (or failed) and the notification settled
  Status notify_status;          // guarded by mu
  // Marks the post finished at `now_us`.
  void Finish(Status notify, uint64_t now_us) {
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return;
    finished = true;
    notify_status = std::move(notify);
    telemetry.transfer_us = now_us > telemetry.start_us ? now_us - telemetry.start_us : 0;
    cv.notify_all();
  }
};

// A prepared list as the engine keeps it: remote lists with their segment.
struct PreparedList {
  std::shared_ptr<const DescList> list;
  std::shared_ptr<Segment> seg;  // remote lists only
};

struct PreparedTransfer {
  uint64_t handle = 0;
  Opcode opcode = Opcode::kWrite;
  std::shared_ptr<Segment> seg;
  std::shared_ptr<const DescList> local;   // kept for StillRegistered
  std::shared_ptr<const PeerInfo> peer;    // the instance the remote list was checked against
  PreparedPairs pairs;
  std::optional<Notification> notification;
  std::mutex mu;                           // one Post / Cancel / status check at a time
  std::shared_ptr<PostState> current;      // guarded by mu; null until posted
};

inline Status CheckNotificationSize(std::string_view name, std::string_view message) {
  if (name.size() > kMaxNotificationName || message.size() > kMaxNotificationMessage) {
    return InvalidArgumentError("notification too large: name " + std::to_string(name.size()) +
                                " bytes (at most " + std::to_string(kMaxNotificationName) + "), message " +
                                std::to_string(message.size()) + " bytes (at most " +
                                std::to_string(kMaxNotificationMessage) + ")");
  }
  return OkStatus();
}

// Peers of builds before "notify-1m" take messages of at most
// kMaxNotificationMessageV1 bytes.
inline Status CheckPeerTakes(const PeerInfo& peer, size_t message_size) {
  if (message_size <= kMaxNotificationMessageV1 || peer.desc().HasFeature("notify-1m")) return OkStatus();
  return FailedPreconditionError("peer " + peer.Label() + " (ferry " + peer.desc().version +
                                 ") takes notification messages of at most " +
                                 std::to_string(kMaxNotificationMessageV1) + " bytes; this one has " +
                                 std::to_string(message_size));
}

inline uint64_t SteadyMicros() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count());
}

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
  internal::HandleTable<internal::PreparedList> lists;
  internal::HandleTable<internal::PreparedTransfer> transfers;
  std::shared_ptr<internal::Metrics> metrics = std::make_shared<internal::Metrics>();
  internal::Notifier notifier;
  std::unique_ptr<internal::MetricsServer> metrics_server;

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
    notifier.Stop();  // after the shutdown: a notification in flight has failed
    metrics_server.reset();
  }

  // internal::Features(), less what options.testing.omit_features leaves out.
  std::vector<std::string> AdvertisedFeatures() const {
    std::vector<std::string> f = internal::Features();
    std::erase_if(f, [&](const std::string& x) {
      return std::find(options.testing.omit_features.begin(), options.testing.omit_features.end(), x) !=
             options.testing.omit_features.end();
    });
    return f;
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
    d.features = AdvertisedFeatures();
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
    return Adopt(seg, self, std::move(desc));
  }

  // Makes `desc` (fetched, or imported from exported metadata) the
  // segment's descriptor: negotiates the wire version, checks capabilities,
  // picks the cpu/cpu transport, and retires the links of an instance that
  // restarted. REQUIRES: seg.mu held.
  Status Adopt(Segment& seg, const wire::PeerDescriptor& self, wire::PeerDescriptor desc) {
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
    internal::RouteCounters* counters[2] = {nullptr, nullptr};  // by Opcode (EnsureRoute fills them)
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
    FERRY_ASSIGN_OR_RETURN(Routed routed, EnsureRouteLocked(seg, local, remote));
    const std::string& peer = seg.peer->desc().peer_id;
    auto c = std::find_if(seg.counters.begin(), seg.counters.end(),
                          [&](const Segment::Counters& x) { return x.transport == routed.transport && x.peer_id == peer; });
    if (c == seg.counters.end()) {
      c = seg.counters.insert(seg.counters.end(),
                              {routed.transport, peer,
                               {metrics->Route(peer, routed.transport->Name(), Opcode::kRead),
                                metrics->Route(peer, routed.transport->Name(), Opcode::kWrite)}});
    }
    routed.counters[0] = c->by_opcode[0];
    routed.counters[1] = c->by_opcode[1];
    return routed;
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

  StatusOr<std::shared_ptr<internal::PreparedList>> GetList(DescListHandle h) const {
    auto l = lists.Get(h.value);
    if (!l) {
      return InvalidArgumentError("descriptor list " + std::to_string(h.value) +
                                  " is not prepared (released, stale or never issued)");
    }
    return l;
  }

  StatusOr<std::shared_ptr<internal::PreparedTransfer>> GetTransfer(TransferHandle h) const {
    auto t = transfers.Get(h.value);
    if (!t) {
      return InvalidArgumentError("transfer " + std::to_string(h.value) +
                                  " is not prepared (released, stale or never issued)");
    }
    return t;
  }

  // Makes every write posted to the segment's links other than `notifier`
  // complete (PeerLink::Flush), so a notification sent on `notifier` next
  // follows them all.
  Status FlushOtherLinks(Segment& seg, internal::PeerLink& notifier, Clock::time_point deadline) {
    std::vector<std::shared_ptr<internal::PeerLink>> others;
    {
      std::lock_guard<std::mutex> lock(seg.mu);
      for (auto& [t, link] : seg.links) {
        if (link.get() != &notifier) others.push_back(link);
      }
    }
    for (auto& l : others) FERRY_RETURN_IF_ERROR(l->Flush(deadline));
    return OkStatus();
  }

  // Sends a finished transfer's notification (on the notifier's thread).
  Status SendTransferNotification(Segment& seg, uint64_t instance, const Notification& note) {
    auto routed = EnsureRoute(seg, MemoryKind::Cpu(), MemoryKind::Cpu());
    if (!routed.ok()) return routed.status().WithPrefix("peer " + seg.name);
    {
      std::lock_guard<std::mutex> lock(seg.mu);
      if (seg.peer->desc().instance_id != instance) {
        return UnavailableError("peer " + seg.name + " restarted before the transfer's notification was sent");
      }
    }
    wire::NotifyBody body{peer_id, note.name, note.message};
    const Clock::time_point deadline = Clock::now() + options.transfer_timeout;
    Status s = FlushOtherLinks(seg, *routed->link, deadline);
    if (s.ok()) s = routed->link->Notify(body, deadline);
    if (!s.ok()) return s.WithPrefix("notification to " + seg.name);
    metrics->AddNotificationSent();
    return OkStatus();
  }

  // Where the slices of one route go, and its metrics tag per opcode.
  struct RoutePost {
    std::shared_ptr<internal::PeerLink> link;
    std::shared_ptr<const PeerInfo> peer;
    uint32_t max_slice = 0;
    internal::SliceOrder order = internal::SliceOrder::kByDestination;
    uint8_t tags[2] = {0, 0};  // by Opcode
    std::vector<internal::Slice> slices;  // of the chunk being prepared

    void SetRoute(const std::shared_ptr<internal::PeerLink>& l, const Transport& t) {
      link = l;
      max_slice = t.MaxSlice();
      order = t.PreferredOrder();
    }
    void Tag(BatchState& batch, const Routed& routed) {
      for (int op = 0; op < 2; ++op) tags[op] = batch.RouteTag(routed.counters[op]);
    }
  };
  // One request as SliceAndPost sees it.
  struct PostEntry {
    Opcode opcode;
    char* local;
    uint64_t remote;
    uint64_t length;
    uint32_t region;
    uint8_t route;  // index into the routes
  };

  // Begins requests [base, base + n) of the batch (request base + i is
  // entry_at(i)), then slices, orders and posts them chunk by chunk: the
  // transport starts sending the first chunk while the next ones are
  // prepared (for 262,144 requests, preparing them all first left the
  // streams idle for 30-80 ms per batch). False if the batch was cancelled
  // (its requests failed at once; nothing was posted).
  template <class EntryAt>
  bool SliceAndPost(const std::shared_ptr<BatchState>& batch, size_t base, size_t n, std::vector<RoutePost>& routes,
                    Clock::time_point deadline, EntryAt entry_at) {
    // Requests sliced, ordered and posted at a time.
    constexpr size_t kPostChunk = 8192;
    // Every request is pending before the first slice moves, so no observer
    // sees the batch idle between chunks.
    const bool begun = batch->BeginRange(base, n, [&](size_t index) {
      const PostEntry e = entry_at(index - base);
      const RoutePost& r = routes[e.route];
      batch->Describe(index, e.length, r.tags[static_cast<int>(e.opcode)]);
      return e.length <= r.max_slice ? 1u : static_cast<uint32_t>((e.length + r.max_slice - 1) / r.max_slice);
    });
    if (!begun) return false;
    for (size_t begin = 0; begin < n; begin += kPostChunk) {
      const size_t end = std::min(n, begin + kPostChunk);
      for (size_t i = begin; i < end; ++i) {
        const PostEntry e = entry_at(i);
        RoutePost& p = routes[e.route];
        if (p.slices.capacity() == 0) p.slices.reserve(end - i);  // emptied by the last chunk's Post
        for (uint64_t off = 0; off < e.length; off += p.max_slice) {
          const uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(p.max_slice, e.length - off));
          p.slices.push_back({.opcode = e.opcode,
                              .remote_region = e.region,
                              .local = e.local + off,
                              .remote = e.remote + off,
                              .length = len,
                              .request = static_cast<uint32_t>(base + i)});
        }
      }
      for (RoutePost& p : routes) {
        if (p.slices.empty()) continue;
        internal::OrderForSending(p.slices, p.order);
        p.link->Post({batch, deadline, p.peer}, std::move(p.slices));
        p.slices.clear();  // moved-from: empty and ready for the next chunk
      }
    }
    return true;
  }
};

}  // namespace ferry
