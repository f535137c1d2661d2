// MemoryRegistry: the regions an engine registered, looked up by address.
//
// Thread-safe. Lookups take a shared lock; (un)registration an exclusive one.
// A transfer that touches a region holds a RegionPin; UnregisterMemory waits
// until no pin is left, so a peer's write never lands in memory the owner
// already considers freed.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::internal {

struct Region {
  uint64_t addr = 0;
  uint64_t length = 0;
  std::string location;
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

class MemoryRegistry {
 public:
  Status Register(std::span<const MemoryRegion> regions);
  Status Unregister(uint64_t addr);

  // OK iff [addr, addr+length) lies inside one registered region.
  // kInvalidArgument otherwise, naming the range and `what` ("local buffer").
  Status Check(uint64_t addr, uint64_t length, std::string_view what) const;
  // Like Check; on success also returns the containing region's bounds so a
  // caller checking many ranges can skip the lookup for ranges inside it.
  Status Check(uint64_t addr, uint64_t length, std::string_view what, RemoteRegion* found) const;
  // Like Check, and pins the region for the caller.
  StatusOr<RegionPin> Pin(uint64_t addr, uint64_t length, std::string_view what) const;

  // Every region, in registration order (callers such as Mooncake's
  // get_first_buffer_address mean "the first one registered").
  std::vector<RemoteRegion> Snapshot() const;
  size_t size() const;

 private:
  // REQUIRES: mu_ held. The region containing the range, or nullptr.
  const std::shared_ptr<Region>* FindLocked(uint64_t addr, uint64_t length) const;

  mutable std::shared_mutex mu_;
  std::map<uint64_t, std::shared_ptr<Region>> regions_;  // by start address
  uint64_t next_order_ = 0;                                 // guarded by mu_
};

std::string FormatRange(uint64_t addr, uint64_t length);
std::string FormatAddr(uint64_t addr);

}  // namespace ferry::internal
