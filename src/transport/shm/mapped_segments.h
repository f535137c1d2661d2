// Mapped segments (docs/architecture.md, "Mapped segments"): same-host
// copies to and from a peer's shared memory (Engine::AllocateShared,
// MemoryRegion::fd) with plain loads and stores through a mapping of the
// same pages, no request to the peer.
//
// The target publishes each such region in a slot of its slot table, a
// memfd every same-host peer maps read-write (its layout:
// docs/wire-format.md, "Slot table"), and gives the region the key
// "shm" = generation << 32 | slot in its descriptor. An initiator opens the
// region's memfd through /proc/PID/fd (the same ptrace access cross-memory
// attach needs), checks that it is the file the slot names and that it is
// sealed against shrinking and large enough (so a copy can never fault),
// maps it, and then around each group of copies:
//
//   initiator: active += 1; if state == live and generation unchanged:
//              copy; active -= 1            (else: active -= 1, ask the peer)
//   target (UnregisterMemory): state = revoked; wait until active == 0;
//              generation += 1; state = free
//
// Slot 0 is the table's header instead: a process-shared robust mutex the
// target holds (from a thread of its own) while its transport runs. An
// initiator's trylock, a few loads and no syscall, tells it before every post
// whether the target still runs: busy = yes; "owner died" (the kernel marks
// it while the process exits, before anyone can reap it) or free (the engine
// shut down) = no, and the slices go through the stream link, which fails
// them naming the peer.
//
// With sequentially consistent operations on both sides either the
// initiator sees the revocation (and sends the request through the peer,
// which refuses it) or the target waits for its copy: no byte moves through
// a mapping after UnregisterMemory returns. The target only ever reads the
// `active` counts of the table, never an address: a peer that scribbles on
// the table can delay an unregistration (bounded: kRevokeWait) or make other
// peers ask the target instead of copying, nothing more.
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/memory_registry.h"
#include "base/transport.h"
#include "common/net.h"
#include "common/shared_mapping.h"
#include "ferry/status.h"

namespace ferry::internal::shm {

// The region key's transport name, and the descriptor entry that names the
// slot table ("PID:FD:DEV:INO:SLOTS").
inline constexpr const char* kMapKey = "shm";
inline constexpr const char* kMapEndpoint = "shm-map";
inline constexpr uint32_t kMapSlots = 16384;  // 1 MiB of table, touched as used
// How long an unregistration waits for peers' copies through mappings (a
// peer that died mid-copy never finishes its count).
inline constexpr std::chrono::seconds kRevokeWait{5};

enum SlotState : uint32_t { kSlotFree = 0, kSlotLive = 1, kSlotRevoked = 2 };

// One slot of the table, in memory shared with every same-host peer.
struct MapSlot {
  std::atomic<uint32_t> state;
  std::atomic<uint32_t> generation;
  std::atomic<uint32_t> active;  // peers' copies in progress
  std::atomic<int32_t> fd;       // the memfd's number in the target process
  std::atomic<uint64_t> addr;    // the region, in the target's addresses
  std::atomic<uint64_t> length;
  std::atomic<uint64_t> offset;  // file offset of its first byte
  std::atomic<uint64_t> dev;
  std::atomic<uint64_t> ino;
  uint64_t reserved;
};
static_assert(sizeof(MapSlot) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free &&
              std::atomic<uint64_t>::is_always_lock_free);
// Slot 0: the header.
struct TableHeader {
  pthread_mutex_t alive;  // process-shared, robust; held by the target while it runs
};
static_assert(sizeof(TableHeader) <= sizeof(MapSlot));

// The target's side: publishes regions, revokes them.
class SlotTable {
 public:
  // `revoke_wait`: how long Revoke waits for peers' copies at most.
  static StatusOr<std::unique_ptr<SlotTable>> Create(
      uint32_t slots = kMapSlots, std::chrono::milliseconds revoke_wait = kRevokeWait);
  ~SlotTable();
  // What this engine advertises as kMapEndpoint.
  const std::string& Endpoint() const { return endpoint_; }
  // The key peers map `region` by, or nullopt (not shared memory, not
  // exported, or the table is full: peers then copy through this engine).
  std::optional<uint64_t> Publish(const Region& region);
  // Revokes the region published under `key`: returns once no peer copies
  // through its mapping any more (or after kRevokeWait, logged).
  void Revoke(uint64_t key);
  // Revokes every region and releases the header's mutex: peers see this
  // engine gone (the transport's shutdown). Idempotent.
  void Close();

 private:
  SlotTable(SharedMemory mem, uint32_t slots, std::chrono::milliseconds revoke_wait);
  MapSlot& slot(uint32_t i) const { return static_cast<MapSlot*>(mem_.data())[i]; }
  TableHeader& header() const { return *static_cast<TableHeader*>(mem_.data()); }
  void RevokeSlot(uint32_t i);
  // The thread that holds the header's mutex until Close.
  void HoldAlive();

  const SharedMemory mem_;
  const uint32_t slots_;
  const std::chrono::milliseconds revoke_wait_;
  const std::string endpoint_;
  std::mutex mu_;
  std::vector<uint32_t> free_;  // guarded by mu_
  uint32_t next_ = 1;           // first never-used slot (0: header); guarded by mu_
  bool full_logged_ = false;    // guarded by mu_
  // This process's own record of each slot (peers can write the table):
  // its generation and whether it is published. Guarded by mu_.
  struct Own {
    uint32_t generation = 0;
    bool live = false;
  };
  std::vector<Own> own_;
  // The header's holder: locks it, waits for Close, unlocks.
  std::mutex alive_mu_;
  std::condition_variable alive_cv_;
  bool held_ = false;     // guarded by alive_mu_
  bool closing_ = false;  // guarded by alive_mu_
  std::thread alive_;
};

// A peer's region, mapped here.
class MappedRegion {
 public:
  MappedRegion(MapSlot* slot, uint32_t generation, uint64_t addr,
               std::unique_ptr<PeerMapping> mapping)
      : slot_(slot), generation_(generation), addr_(addr), mapping_(std::move(mapping)) {}
  // Before copies: false if the peer revoked the region (ask the peer).
  bool Begin() const {
    slot_->active.fetch_add(1, std::memory_order_seq_cst);
    if (slot_->state.load(std::memory_order_seq_cst) == kSlotLive &&
        slot_->generation.load(std::memory_order_seq_cst) == generation_) {
      return true;
    }
    End();
    return false;
  }
  void End() const { slot_->active.fetch_sub(1, std::memory_order_seq_cst); }
  // Where the peer's [remote, remote + length) is mapped here; null if it is
  // not inside the region.
  char* Translate(uint64_t remote, uint64_t length) const {
    const uint64_t len = mapping_->length();
    if (remote < addr_ || length > len || remote - addr_ > len - length) return nullptr;
    return mapping_->data() + (remote - addr_);
  }

 private:
  MapSlot* const slot_;
  const uint32_t generation_;
  const uint64_t addr_;
  const std::unique_ptr<PeerMapping> mapping_;
};

// The initiator's side, one per link: the peer's slot table and the regions
// mapped so far. Thread-safe.
class PeerMaps {
 public:
  // `endpoint`: the peer's kMapEndpoint; `pid`: the process at the other end
  // of the link's socket (the endpoint must name it); `label`: the peer, for
  // errors.
  static StatusOr<std::shared_ptr<PeerMaps>> Open(const std::string& endpoint, int pid,
                                                  std::string label);
  // The region published under `key`, mapped (on first use); null if it
  // cannot be (revoked, reused, not mappable: the caller asks the peer).
  std::shared_ptr<const MappedRegion> Find(uint64_t key);
  // Drops the mapping of a key whose region was revoked (Begin said so).
  void Forget(uint64_t key);
  // Whether the target's transport still runs (the header's mutex is held);
  // once false, false for good. No syscall while it runs.
  bool PeerRuns();

 private:
  PeerMaps(int pid, std::unique_ptr<PeerMapping> table, uint32_t slots, std::string label)
      : pid_(pid), table_(std::move(table)), slots_(slots), label_(std::move(label)) {}
  StatusOr<std::shared_ptr<const MappedRegion>> Map(uint32_t index, uint32_t generation);
  MapSlot& slot(uint32_t i) const { return reinterpret_cast<MapSlot*>(table_->data())[i]; }

  const int pid_;
  const std::unique_ptr<PeerMapping> table_;
  const uint32_t slots_;
  const std::string label_;
  std::atomic<bool> gone_{false};
  std::mutex mu_;
  // By key; null: that key could not be mapped (asked once).
  std::unordered_map<uint64_t, std::shared_ptr<const MappedRegion>> maps_;  // guarded by mu_
};

// The initiator's link to a peer that publishes mapped segments (its Post:
// mapped_link.cc): slices to
// and from its shared regions are copied in Post, on the caller's thread,
// through mappings of the same pages; every other slice, notifications and
// flushes go through the stream link (`inner`) as before.
class MappedLink : public PeerLink {
 public:
  MappedLink(std::shared_ptr<PeerLink> inner, std::shared_ptr<PeerMaps> maps)
      : inner_(std::move(inner)), maps_(std::move(maps)) {}
  void Post(const PostContext& ctx, std::vector<Slice> slices) override;
  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override {
    return inner_->Notify(body, deadline);  // mapped writes completed in Post
  }
  Status Flush(Clock::time_point deadline) override { return inner_->Flush(deadline); }
  bool Healthy() const override { return inner_->Healthy(); }
  bool Idle() const override { return inner_->Idle(); }
  bool Closing() const override { return inner_->Closing(); }
  void Retire() override { inner_->Retire(); }

 private:
  // False once the peer process exited or its engine shut down (the slot
  // table's header says so): its memory may still be mapped here, but
  // nobody reads it any more.
  bool PeerRuns() const { return inner_->Healthy() && maps_->PeerRuns(); }

  const std::shared_ptr<PeerLink> inner_;
  const std::shared_ptr<PeerMaps> maps_;
};

}  // namespace ferry::internal::shm
