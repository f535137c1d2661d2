// The one seam between the core and the transports.
//
// The core validates requests, picks a transport per (peer, local memory
// kind, remote memory kind), slices requests (at most Transport::MaxSlice()
// bytes per slice), counts completions and enforces nothing else; a
// transport moves slices to one peer and completes each slice exactly once
// through BatchState (CompleteSlice, or a Completer for a whole frame) —
// success, or a Status that names the reason — before the deadline it was
// given (or shortly after, with kDeadlineExceeded).
//
// What a transport may use of the core: BatchState (base/batch.h), the
// registered memory and inbox of its engine (base/target.h,
// base/memory_registry.h). Nothing else of the engine's internals.
// How a transport is added: docs/architecture.md, "Adding a transport".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/batch.h"
#include "base/memory_registry.h"
#include "common/memory_kind.h"
#include "ferry/status.h"
#include "ferry/types.h"
#include "wire/descriptor.h"
#include "wire/frame.h"

namespace ferry::internal {

using Clock = std::chrono::steady_clock;

inline constexpr uint32_t kNoRegion = 0xffffffffu;

// One contiguous piece of a request. 32 bytes: batches carry 100,000s.
struct Slice {
  Opcode opcode = Opcode::kWrite;
  // Index of the peer region holding `remote` in PeerInfo::desc.regions, or
  // kNoRegion (the peer registered it after its descriptor was fetched: the
  // target still validates it). Transports with per-region keys find them
  // there.
  uint32_t remote_region = kNoRegion;
  char* local = nullptr;
  uint64_t remote = 0;
  uint32_t length = 0;
  uint32_t request = 0;  // index of the request in its batch
};
static_assert(sizeof(Slice) == 32);

// A peer's descriptor as the core posts against it: immutable once built,
// shared by the core and the links (a re-handshake builds a new one).
class PeerInfo {
 public:
  explicit PeerInfo(wire::PeerDescriptor d);
  const wire::PeerDescriptor& desc() const { return desc_; }
  // The region holding [addr, addr + length), or kNoRegion.
  uint32_t FindRegion(uint64_t addr, uint64_t length) const;
  // Its kind; cpu for kNoRegion (the target validates it in any case).
  MemoryKind KindOf(uint32_t region) const;
  // Its key for `transport`, if the peer published one.
  std::optional<uint64_t> KeyOf(uint32_t region, std::string_view transport) const;
  // "NAME at HOST:PORT (instance N)": how errors of a link to this peer
  // name it, so a failure says which incarnation of a restarted peer it hit.
  std::string Label() const;

 private:
  wire::PeerDescriptor desc_;
  std::vector<uint32_t> by_addr_;  // region indexes sorted by address
  std::vector<MemoryKind> kinds_;
};

// Everything a link needs to post one chunk of slices.
struct PostContext {
  std::shared_ptr<BatchState> batch;
  Clock::time_point deadline;
  std::shared_ptr<const PeerInfo> peer;  // what the slices' remote_region index
};

// The route to one peer instance through one transport. Thread-safe: any
// of its methods may run on several threads at once.
//
// Threads: the core calls Post from the threads that submit transfers
// (Engine::Submit, Engine::PostTransfer; several at once, never under a
// segment's lock), and a wrapping link (GPU staging) from its own worker
// thread too; Notify and Flush from the thread that sends a notification
// (the application's, or the engine's notifier thread for prepared
// transfers); Healthy and Retire under the segment's lock. No method is
// called from a thread that completes slices (a transport's own threads):
// Post and Notify may wait for completions only such a thread delivers.
class PeerLink {
 public:
  virtual ~PeerLink() = default;
  // Moves the slices; completes each through ctx.batch (CompleteSlice or a
  // BatchState::Completer), possibly before returning. All slices go to the
  // same peer.
  //
  // May block until ctx.deadline: the stream transports (tcp, shm) bound
  // what one link has outstanding at the peer (the peer budget,
  // EngineOptions peer_max_requests and peer_max_bytes), and a Post that
  // finds no room sends what it built, then waits for earlier frames to be
  // answered; what finds no room by the deadline fails kResourceExhausted,
  // naming the limit. Other transports queue instead (fabric waits for
  // room in its provider's queue on its progress thread) or copy in place
  // (local), so their Post returns without waiting for the peer.
  virtual void Post(const PostContext& ctx, std::vector<Slice> slices) = 0;
  // Delivers a notification after every write posted to this link before it
  // has completed; returns once the peer has it (blocks for that round
  // trip, until about `deadline`).
  virtual Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) = 0;
  // Returns once every write posted to this link before the call has
  // completed (its bytes are in the peer's memory), or at `deadline`. The
  // core calls it on a peer's other links before a notification goes out on
  // the cpu route's link, so a notification still follows every earlier
  // write to that peer, whichever route it took. Links whose writes are
  // ordered with that link's notifications anyway keep the default.
  virtual Status Flush(Clock::time_point /*deadline*/) { return OkStatus(); }
  // False once the link lost its peer; the core then builds a new one.
  virtual bool Healthy() const = 0;
  // True if nothing posted to this link is still moving (no slice or
  // notification unanswered, nothing queued): closing it now loses nothing.
  // The core asks only while no caller is posting to the link (its users
  // are counted), so the answer cannot turn false meanwhile. Links that
  // cannot tell keep the default and are never closed for idleness
  // (EngineOptions::idle_link_timeout, max_peer_links).
  virtual bool Idle() const { return false; }
  // True once the peer asked to close this link (it had no request there for
  // the peer's idle_link_timeout): it still works, and the core closes it as
  // it closes an idle link (no caller using it, Idle()), at the next request
  // or sweep, and opens a new one for what follows.
  virtual bool Closing() const { return false; }
  // Lets in-flight work finish, then releases the link's resources.
  virtual void Retire() = 0;
};

// The order the core sorts a peer's slices in before posting them (writes
// always before reads). kByDestination: the address the bytes land at, so
// the receiver's stores run forward (tcp, local). kByLocal: this engine's
// own addresses (shm: the kernel pins the initiator's pages per range, so
// adjacent initiator ranges are what it needs; the target's side may scatter).
enum class SliceOrder { kByDestination, kByLocal };

// Where a transport's peers can be.
enum class Reach { kSameProcess, kSameHost, kNetwork };
std::string_view ReachName(Reach r);

// What a transport is and can do; the registry lists one per transport.
struct TransportCaps {
  std::string_view name;
  Reach reach = Reach::kNetwork;
  // Memory kinds it reads and writes on this engine's side of a transfer
  // (and on the peer's, unless remote_kinds says otherwise).
  std::vector<MemoryKind::Type> memory_kinds = {MemoryKind::Type::kCpu};
  // If not empty, the kinds it reaches on the peer's side instead (cuda_ipc:
  // cuda only; tcp: cpu and cuda, which the peer stages).
  std::vector<MemoryKind::Type> remote_kinds;
  // Whether peers need a per-region key from it (RegisterRegion) to reach
  // registered memory.
  bool needs_region_keys = false;
  // Whether it hears of every registration (RegisterRegion, and may publish
  // keys) although peers reach memory without them (shm: the regions
  // same-host peers may map).
  bool sees_registrations = false;
  // Whether a request outside every region of the peer's descriptor should
  // fetch the descriptor again, once per submit, before it is posted (the
  // peer may have registered the region since, with a key that helps):
  // always where keys are needed (needs_region_keys); shm's keys let it map
  // shared memory.
  bool refresh_for_keys = false;
  // Largest slice; 0 = the engine's slice_size.
  uint32_t max_slice = 0;
  SliceOrder order = SliceOrder::kByDestination;
};

// One kind of transport of one engine, made at engine start (registry.h)
// and shut down when the engine is destroyed.
//
// Threads: Describe and CanReach may run on any threads at once (building
// this engine's descriptor; choosing a route). The core calls Connect with
// the segment's lock held, so Connects for one segment run one at a time,
// but Connects for different segments (different peers, or two segments
// naming the same peer) may run concurrently with each other and with the
// data path of links already made; Connect may block until its deadline
// (handshakes), which holds up only that segment. RegisterRegion runs under
// the memory registry's lock (registrations one at a time; it must not
// call back into the registry); UnregisterRegion under it too when it
// undoes a failed registration, else outside it on the unregistering
// thread, possibly beside another region's RegisterRegion. The core calls
// Shutdown once, from the engine's destructor, after retiring every link;
// the engine's notifier thread may still wait in a retired link's Notify
// then (Shutdown makes it return), or even call Connect during or after
// Shutdown (it must fail, by its deadline at the latest), and stops only
// afterwards. A
// transport's destructor may call Shutdown again: it must be idempotent.
class Transport {
 public:
  // `caps.max_slice` resolved (non-zero).
  explicit Transport(TransportCaps caps) : caps_(std::move(caps)) {}
  virtual ~Transport() = default;
  const TransportCaps& caps() const { return caps_; }
  std::string_view Name() const { return caps_.name; }
  uint32_t MaxSlice() const { return caps_.max_slice; }
  SliceOrder PreferredOrder() const { return caps_.order; }
  // Whether it can move bytes between memory of these kinds (the caps'
  // kinds; a transport may add pairs of its own).
  virtual bool Handles(MemoryKind local, MemoryKind remote) const;

  // Adds this transport's endpoint to the engine's own descriptor.
  virtual void Describe(wire::PeerDescriptor* self) const = 0;
  // Whether this transport can reach the peer (locality, endpoints).
  virtual bool CanReach(const wire::PeerDescriptor& peer) const = 0;
  virtual StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> peer,
                                                      uint16_t wire_version,
                                                      Clock::time_point deadline) = 0;
  // The memory half (caps.needs_region_keys or sees_registrations): registers `region` with this
  // transport's devices and returns the keys peers use for it, each named
  // ("fabric"; a transport with several devices may add "fabric.1", ...);
  // undone by UnregisterRegion once no transfer uses the region any more.
  virtual StatusOr<std::vector<wire::RegionKey>> RegisterRegion(const Region&) {
    return std::vector<wire::RegionKey>{};
  }
  virtual void UnregisterRegion(const Region&) {}
  // Before a region is unregistered: returns once nothing this transport
  // reported failed may still touch the region's memory (a one-sided
  // operation that failed at its deadline while the device still holds
  // it); kFailedPrecondition naming one at `deadline`, and the region
  // stays registered. Stream transports have nothing in flight after a
  // failure.
  virtual Status QuiesceRegion(const Region&, Clock::time_point /*deadline*/) { return OkStatus(); }
  // Stops its threads; fails everything in flight with kCancelled.
  virtual void Shutdown() = 0;

 private:
  const TransportCaps caps_;
};

}  // namespace ferry::internal
