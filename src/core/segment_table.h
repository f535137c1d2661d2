// SegmentTable: the peers an engine opened (segments), how it reaches each
// (routes: a transport per pair of memory kinds, and its live links), and how
// it learns a peer's current descriptor (handshakes through the metadata
// store, imported metadata, and a watch's "this peer changed").
//
// Lock order: a segment's lock may be held while taking the table's lock
// (Open, Import), never the other way round; no other lock of the engine is
// held while either is. A segment's lock serialises its (re)connection: a
// handshake or a transport's Connect runs under it, so a caller that needs
// a link to a peer that is connecting waits for that connect.
//
// Links are counted and closed when idle (EngineOptions::idle_link_timeout)
// or to make room under EngineOptions::max_peer_links; the rules, stated in
// docs/architecture.md ("Peer links"): a link is closed only under its
// segment's lock, while no caller holds a lease on it (Routed::lease, taken
// under that lock by Route) and the link says nothing is moving
// (PeerLink::Idle); a caller that comes later finds no link and connects
// a new one.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/metrics.h"
#include "base/transport.h"
#include "common/handle_table.h"
#include "ferry/engine.h"
#include "metadata/metadata.h"
#include "transport/registry.h"

namespace ferry::internal {

class SegmentTable;

// How a link is used: the callers holding a lease on it (between Route and
// the end of their Post or Notify) and when the last one let go. Shared by
// the link's entry and its leases.
struct LinkUse {
  std::atomic<int> users{0};
  std::atomic<int64_t> last_used_ns{0};  // steady clock
};

// The budget's waiters (max_peer_links): woken when a lease ends (a link
// may have become idle) or a link closes.
struct LinkRoom {
  std::mutex mu;
  std::condition_variable cv;
};

// A caller's hold on a link: while it lives the link is not closed for
// idleness nor evicted. Ends (any thread) after the caller's Post or Notify.
class LinkLease {
 public:
  LinkLease(std::shared_ptr<LinkUse> use, std::shared_ptr<LinkRoom> room);
  ~LinkLease();
  LinkLease(const LinkLease&) = delete;
  LinkLease& operator=(const LinkLease&) = delete;

 private:
  const std::shared_ptr<LinkUse> use_;
  const std::shared_ptr<LinkRoom> room_;  // null without max_peer_links
};

// An opened peer. Its state belongs to the table; callers hold it by
// shared_ptr and pass it back.
class Segment {
 public:
  // `open_links` counts the links of every segment of the table.
  Segment(std::string name, std::atomic<size_t>* open_links)
      : name_(std::move(name)), open_links_(open_links) {}
  // The name the metadata store knows the peer by.
  const std::string& name() const { return name_; }
  // Its handle; 0 until the first handshake succeeded.
  uint64_t handle() const { return handle_.load(std::memory_order_acquire); }

 private:
  friend class SegmentTable;

  // The transport chosen for a pair of memory kinds (the first is cpu/cpu,
  // chosen at handshake).
  struct Route {
    MemoryKind local, remote;
    Transport* transport = nullptr;
  };
  // The metrics' counters of this peer per transport, by opcode: found once
  // instead of on every submit.
  struct Counters {
    Transport* transport;
    std::string peer_id;
    RouteCounters* by_opcode[2];
  };

  struct Link {
    Transport* transport;
    std::shared_ptr<PeerLink> link;
    std::shared_ptr<LinkUse> use;
  };

  Link* LinkOf(Transport* t);
  void RetireLinks();
  void DropLink(Transport* t);
  // Closes links_[i] (its in-flight work, if any, still finishes).
  void CloseLink(size_t i);
  Route* FindRoute(MemoryKind local, MemoryKind remote);

  const std::string name_;
  std::atomic<size_t>* const open_links_;
  std::atomic<uint64_t> handle_{0};  // written under mu_
  // Set by a metadata watch: the peer published a new descriptor; fetch it
  // before the next transfer.
  std::atomic<bool> stale_{false};
  std::mutex mu_;
  std::shared_ptr<const PeerInfo> peer_;  // guarded by mu_; null until the first handshake
  uint16_t wire_version_ = 0;             // guarded by mu_
  std::vector<Route> routes_;             // guarded by mu_
  std::vector<Link> links_;               // guarded by mu_
  // A link was closed for idleness or evicted: if connecting again fails,
  // the peer may have moved (restarted elsewhere); handshake once and retry.
  bool reopen_ = false;  // guarded by mu_
  // Transports `auto` found unable to connect to this peer while another
  // one could (e.g. shm without ptrace access); skipped from then on.
  std::vector<Transport*> unusable_;  // guarded by mu_
  std::vector<Counters> counters_;    // guarded by mu_
};

// A connected route: the link to post on and the metrics' counters.
struct Routed {
  std::shared_ptr<PeerLink> link;
  Transport* transport = nullptr;
  RouteCounters* counters[2] = {nullptr, nullptr};  // by Opcode
  // The descriptor the route was connected against (the segment's current
  // one when Route returned).
  std::shared_ptr<const PeerInfo> peer;
  // Keeps the link open while the caller posts on it: hold it until Post
  // (or Notify) returned.
  std::shared_ptr<LinkLease> lease;
};

class SegmentTable {
 public:
  // Borrows everything: the engine owns them and destroys the table first.
  // `describe` returns this engine's current descriptor (for handshakes).
  SegmentTable(const EngineOptions& options, const TransportSet& transports,
               MetadataStore& metadata, Metrics& metrics,
               std::function<wire::PeerDescriptor()> describe);
  // Stops the idle sweeper.
  ~SegmentTable();

  // Opens `name` (a handshake through the metadata store), or returns the
  // handle it is open under.
  StatusOr<SegmentHandle> Open(std::string_view name);
  // Makes `desc` (exported metadata of a peer) the descriptor of segment
  // `name`, opening it if needed.
  StatusOr<SegmentHandle> Import(const std::string& name, wire::PeerDescriptor desc);
  // Closes the segment and retires its links.
  Status Close(SegmentHandle h);
  // kInvalidArgument if `h` is not open.
  StatusOr<std::shared_ptr<Segment>> Get(SegmentHandle h) const;
  bool IsOpen(const Segment& seg) const { return segments_.Get(seg.handle()) != nullptr; }

  // Handshakes with the peer again (Engine::QuerySegment).
  Status Rehandshake(Segment& seg);
  SegmentInfo Info(Segment& seg);
  // The peer's current descriptor, fetched again first if a watch said it
  // changed.
  StatusOr<std::shared_ptr<const PeerInfo>> Current(Segment& seg);
  // The live link for moving bytes between the two kinds: refreshes the
  // descriptor if stale, connects (or reconnects, re-handshaking if the
  // peer restarted) as needed.
  StatusOr<Routed> Route(Segment& seg, MemoryKind local, MemoryKind remote);
  // The segment's links other than `link`.
  std::vector<std::shared_ptr<PeerLink>> OtherLinks(Segment& seg, const PeerLink& link);
  // The next transfer fetches the peer's descriptor first.
  void MarkStale(Segment& seg) { seg.stale_.store(true, std::memory_order_release); }
  // A metadata watch saw `name` change.
  void OnPeerChanged(const std::string& name);
  // Retires every segment's links (engine shutdown).
  void RetireAll();
  // Links open now, over every segment.
  size_t OpenLinks() const { return open_links_.load(std::memory_order_relaxed); }
  // Closes every link idle for idle_link_timeout, or whose peer asked to
  // close it, that nobody uses (the sweeper thread calls it; a segment busy
  // connecting is skipped until the next sweep).
  void SweepIdle();

 private:
  std::shared_ptr<Segment> Slot(const std::string& name);
  void ForgetIfUnopened(const std::shared_ptr<Segment>& seg);
  Clock::time_point ConnectDeadline() const { return Clock::now() + options_.connect_timeout; }

  // The rest REQUIRE seg.mu_ held.
  Status Handshake(Segment& seg);
  Status Adopt(Segment& seg, const wire::PeerDescriptor& self, wire::PeerDescriptor desc);
  void ReplaceCpuRoute(Segment& seg, Transport* chosen);
  Status Refresh(Segment& seg);
  Transport* PickTransport(const Segment& seg, const wire::PeerDescriptor& desc, MemoryKind local,
                           MemoryKind remote, Transport* after) const;
  std::string NoRoute(const Segment& seg, MemoryKind local, MemoryKind remote) const;
  StatusOr<Segment::Route*> RouteOf(Segment& seg, MemoryKind local, MemoryKind remote);
  StatusOr<Routed> ConnectLocked(Segment& seg, MemoryKind local, MemoryKind remote);
  StatusOr<std::pair<Transport*, std::shared_ptr<PeerLink>>> FallBack(
      Segment& seg, MemoryKind local, MemoryKind remote, Transport* failed, const Status& why);
  void FillCounters(Segment& seg, Routed& routed);
  // Room for one more link under max_peer_links (counted in open_links_
  // once it returns OK): evicts the least recently used idle link of
  // another segment, or waits for one until connect_timeout, then
  // kResourceExhausted naming the limit.
  Status ReserveLink(Segment& seg);
  // Closes the least recently used idle link of a segment other than
  // `seg`; false if there is none.
  bool EvictIdle(Segment& seg);
  // A lease on `l` for a caller of Route.
  std::shared_ptr<LinkLease> Lease(const Segment::Link& l);
  void StartSweeper();
  void StopSweeper();
  std::vector<std::shared_ptr<Segment>> AllSegments();

  const EngineOptions& options_;
  const TransportSet& transports_;
  MetadataStore& metadata_;
  Metrics& metrics_;
  const std::function<wire::PeerDescriptor()> describe_;
  HandleTable<Segment> segments_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Segment>> by_name_;  // guarded by mu_

  // Peer links: how many are open, the budget's waiters, the idle sweeper.
  std::atomic<size_t> open_links_{0};
  std::shared_ptr<LinkRoom> room_ = std::make_shared<LinkRoom>();
  std::mutex room_mu_;  // serialises reservations under max_peer_links
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool sweep_stop_ = false;  // guarded by sweep_mu_
  std::thread sweeper_;      // guarded by sweep_mu_; started with the first link
};

}  // namespace ferry::internal
