// MemoryRegistry: the regions an engine registered, looked up by address.
// In src/base/ (below the core and the transports): a transport's target
// side pins the ranges peers name here.
//
// Thread-safe. Lookups take a shared lock; (un)registration an exclusive one.
// A transfer that touches a region holds a RegionPin; UnregisterMemory waits
// until no pin is left, so a peer's write never lands in memory the owner
// already considers freed (for one-sided transports, see RegionHooks).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "common/memory_kind.h"
#include "common/shared_mapping.h"
#include "ferry/status.h"
#include "ferry/types.h"
#include "wire/descriptor.h"

namespace ferry::internal {

namespace storage {
class FileSegment;  // src/storage/file_segment.h (the file kind's I/O, a layer above)
}

struct Region {
  uint64_t addr = 0;
  uint64_t length = 0;
  std::string location;
  MemoryKind kind;
  bool exported = true;  // peers may reach it (MemoryRegion::exported)
  // What peers need to reach it through transports with per-region keys
  // (filled by RegionHooks::OnRegister before the region is visible).
  std::vector<wire::RegionKey> keys;
  // The file a region of the file kind stands for (Engine::RegisterFile);
  // null for memory.
  std::shared_ptr<const storage::FileSegment> file;
  // The shared mapping the range is (MemoryRegion::fd), which same-host
  // peers may map; null if none.
  std::shared_ptr<const SharedBacking> shared;
  uint64_t order = 0;  // registration order (the first registered region is 0)
  std::atomic<int> pins{0};
  uint64_t end() const { return addr + length; }
};

// Keeps a region registered while held. Movable, not copyable.
class RegionPin {
 public:
  RegionPin() = default;
  explicit RegionPin(std::shared_ptr<Region> r) : region_(std::move(r)) {}
  RegionPin(RegionPin&&) noexcept = default;
  RegionPin& operator=(RegionPin&& o) noexcept {
    Release();
    region_ = std::move(o.region_);
    return *this;
  }
  ~RegionPin() { Release(); }
  const Region* region() const { return region_.get(); }

 private:
  void Release() {
    // Pairs with the acquire load in MemoryRegistry::Unregister.
    if (region_) region_->pins.fetch_sub(1, std::memory_order_release);
    region_.reset();
  }
  std::shared_ptr<Region> region_;
};

// The memory-domain hook: how transports that register memory with a device
// (and hand peers keys for it) learn of each region. Thread-safe.
class RegionHooks {
 public:
  virtual ~RegionHooks() = default;
  // Before `region` becomes visible; may add keys. A failure fails the
  // registration (the regions already hooked are undone).
  virtual Status OnRegister(Region& region) = 0;
  // Before the region is taken out (it is still visible): an error keeps it
  // registered (what failed may still touch its memory; see
  // Transport::QuiesceRegion). `deadline` bounds the wait.
  virtual Status BeforeUnregister(const Region& /*region*/,
                                  std::chrono::steady_clock::time_point /*deadline*/) {
    return OkStatus();
  }
  // After the region is no longer visible and no pin is left.
  virtual void OnUnregister(const Region& region) = 0;
};

class MemoryRegistry {
 public:
  // `kinds[i]` is the memory kind of regions[i] (none given: all cpu);
  // `files[i]` the file of a file-kind region (none given: no files). All
  // or nothing.
  Status Register(std::span<const MemoryRegion> regions, std::span<const MemoryKind> kinds = {},
                  RegionHooks* hooks = nullptr,
                  std::span<const std::shared_ptr<const storage::FileSegment>> files = {});
  // kNotFound if no region starts at `addr`. Returns once no transfer holds
  // the region any more and the hooks have undone their registration. The
  // hooks' BeforeUnregister runs first (bounded by `quiesce_deadline`); its
  // error is returned and the region stays registered.
  Status Unregister(uint64_t addr, RegionHooks* hooks = nullptr,
                    std::chrono::steady_clock::time_point quiesce_deadline = {});

  // OK iff [addr, addr+length) lies inside one registered region.
  // kInvalidArgument otherwise, naming the range and `what` ("local buffer").
  Status Check(uint64_t addr, uint64_t length, std::string_view what) const;
  // Like Check; on success also returns the containing region's bounds and
  // kind, so a caller checking many ranges can skip the lookup for ranges
  // inside it.
  struct Found {
    uint64_t addr = 0;
    uint64_t length = 0;
    MemoryKind kind;
  };
  Status Check(uint64_t addr, uint64_t length, std::string_view what, Found* found) const;
  // Like Check, and pins the region for the caller.
  StatusOr<RegionPin> Pin(uint64_t addr, uint64_t length, std::string_view what) const;
  // Pin for a peer's request: also kInvalidArgument if the region is not
  // exported (registered for local use only).
  StatusOr<RegionPin> PinExported(uint64_t addr, uint64_t length, std::string_view what) const;

  // Every region (exported_only: only those peers may see), in registration
  // order (callers such as Mooncake's get_first_buffer_address mean "the
  // first one registered").
  std::vector<wire::RegionEntry> Snapshot(bool exported_only = false) const;
  size_t size() const;
  // Whether a region of a kind other than cpu was ever registered (lets the
  // local transport skip looking up the kind of its own buffers).
  bool ever_non_cpu() const { return ever_non_cpu_.load(std::memory_order_acquire); }
  // How many regions were unregistered so far (prepared lists check their
  // regions again only when it changed).
  uint64_t unregistrations() const { return unregistrations_.load(std::memory_order_acquire); }

 private:
  // REQUIRES: mu_ held. The region containing the range, or nullptr.
  const std::shared_ptr<Region>* FindLocked(uint64_t addr, uint64_t length) const;
  StatusOr<RegionPin> PinImpl(uint64_t addr, uint64_t length, std::string_view what,
                              bool exported) const;

  mutable std::shared_mutex mu_;
  std::map<uint64_t, std::shared_ptr<Region>> regions_;  // by start address
  uint64_t next_order_ = 0;                              // guarded by mu_
  std::atomic<uint64_t> unregistrations_{0};
  // One descriptor per shared file, however many regions map it (a pool's
  // arena is one memfd carved into many registered buffers).
  std::mutex files_mu_;
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<const UniqueFd>> files_;  // (dev, ino)
  std::atomic<bool> ever_non_cpu_{false};
};

std::string FormatRange(uint64_t addr, uint64_t length);
std::string FormatAddr(uint64_t addr);

}  // namespace ferry::internal
