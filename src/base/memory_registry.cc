#include "base/memory_registry.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

namespace ferry::internal {

std::string FormatRange(uint64_t addr, uint64_t length) {
  char buf[128];
  if (addr + length < addr) {
    std::snprintf(buf, sizeof(buf), "at 0x%llx of %llu bytes (wraps around the address space)",
                  static_cast<unsigned long long>(addr), static_cast<unsigned long long>(length));
    return buf;
  }
  std::snprintf(
      buf, sizeof(buf), "[0x%llx, 0x%llx) (%llu bytes)", static_cast<unsigned long long>(addr),
      static_cast<unsigned long long>(addr + length), static_cast<unsigned long long>(length));
  return buf;
}

std::string FormatAddr(uint64_t addr) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(addr));
  return buf;
}

namespace {

using Range = std::pair<uint64_t, uint64_t>;  // (addr, length)

// The list's ranges, each well-formed and none overlapping another.
StatusOr<std::vector<Range>> CheckList(std::span<const MemoryRegion> regions) {
  std::vector<Range> ranges;
  ranges.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    const auto& r = regions[i];
    uint64_t a = reinterpret_cast<uint64_t>(r.addr);
    std::string where = regions.size() > 1 ? " (region " + std::to_string(i) + " of the list)" : "";
    if (r.addr == nullptr) return InvalidArgumentError("cannot register a null address" + where);
    if (r.length == 0) {
      return InvalidArgumentError("cannot register a zero-length region at " + FormatRange(a, 0) +
                                  where);
    }
    if (a + r.length < a) {
      return InvalidArgumentError("region " + FormatRange(a, r.length) +
                                  " wraps around the address space" + where);
    }
    ranges.emplace_back(a, r.length);
  }
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return ranges[x].first < ranges[y].first; });
  for (size_t k = 1; k < order.size(); ++k) {
    auto [pa, pl] = ranges[order[k - 1]];
    auto [ca, cl] = ranges[order[k]];
    if (pa + pl > ca) {
      return AlreadyExistsError("regions " + std::to_string(order[k - 1]) + " " +
                                FormatRange(pa, pl) + " and " + std::to_string(order[k]) + " " +
                                FormatRange(ca, cl) + " of the list overlap");
    }
  }
  return ranges;
}

}  // namespace

Status MemoryRegistry::Register(
    std::span<const MemoryRegion> regions, std::span<const MemoryKind> kinds, RegionHooks* hooks,
    std::span<const std::shared_ptr<const storage::FileSegment>> files) {
  if ((!kinds.empty() && kinds.size() != regions.size()) ||
      (!files.empty() && files.size() != regions.size())) {
    return InternalError("a memory kind (and file, if any) for every region is required");
  }
  // Validate the whole list first (against itself and what is registered),
  // then insert: all or nothing.
  FERRY_ASSIGN_OR_RETURN(std::vector<Range> ranges, CheckList(regions));
  std::vector<std::shared_ptr<const SharedBacking>> shared(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    if (regions[i].fd < 0) continue;
    const bool host = kinds.empty() || kinds[i].type() == MemoryKind::Type::kCpu;
    std::string where = regions.size() > 1 ? " (region " + std::to_string(i) + " of the list)" : "";
    if (!host) {
      return InvalidArgumentError("region " + FormatRange(ranges[i].first, ranges[i].second) +
                                  " of kind " + kinds[i].Name() +
                                  " names a shared-memory descriptor: only host memory can be "
                                  "shared" +
                                  where);
    }
    auto backing =
        VerifySharedMapping(regions[i].addr, ranges[i].second, regions[i].fd, regions[i].fd_offset);
    if (!backing.ok()) return Status(backing.status().code(), backing.status().message() + where);
    auto b = std::const_pointer_cast<SharedBacking>(*std::move(backing));
    {
      std::lock_guard<std::mutex> lock(files_mu_);
      for (auto it = files_.begin(); it != files_.end();) {  // drop the dead ones
        it = it->second.expired() ? files_.erase(it) : std::next(it);
      }
      std::weak_ptr<const UniqueFd>& known = files_[{b->dev, b->ino}];
      if (std::shared_ptr<const UniqueFd> same = known.lock()) {
        b->file = std::move(same);  // our duplicate closes here
      } else {
        known = b->file;
      }
    }
    shared[i] = std::move(b);
  }
  std::unique_lock lock(mu_);
  for (auto [a, len] : ranges) {
    auto it = regions_.upper_bound(a + len - 1);  // first region starting after our end
    if (it != regions_.begin()) {
      auto prev = std::prev(it);
      if (prev->second->end() > a) {
        return AlreadyExistsError("region " + FormatRange(a, len) + " overlaps registered region " +
                                  FormatRange(prev->second->addr, prev->second->length));
      }
    }
  }
  std::vector<std::shared_ptr<Region>> made;
  made.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    auto reg = std::make_shared<Region>();
    reg->addr = ranges[i].first;
    reg->length = ranges[i].second;
    reg->location = regions[i].location;
    reg->exported = regions[i].exported;
    reg->kind = kinds.empty() ? MemoryKind::Cpu() : kinds[i];
    if (!files.empty()) reg->file = files[i];
    reg->shared = shared[i];
    if (hooks != nullptr) {
      Status s = hooks->OnRegister(*reg);
      if (!s.ok()) {
        for (const auto& done : made) hooks->OnUnregister(*done);
        return s.WithPrefix("registering " + FormatRange(reg->addr, reg->length));
      }
    }
    made.push_back(std::move(reg));
  }
  for (auto& reg : made) {
    // Pairs with the acquire load in ever_non_cpu().
    if (!reg->kind.cpu_accessible()) ever_non_cpu_.store(true, std::memory_order_release);
    reg->order = next_order_++;
    regions_.emplace(reg->addr, std::move(reg));
  }
  return OkStatus();
}

Status MemoryRegistry::Unregister(uint64_t addr, RegionHooks* hooks,
                                  std::chrono::steady_clock::time_point quiesce_deadline) {
  auto not_found = [addr] {
    return NotFoundError("no registered region starts at " + FormatAddr(addr));
  };
  std::shared_ptr<Region> reg;
  if (hooks != nullptr) {  // the hooks may refuse while the region is still visible
    {
      std::shared_lock lock(mu_);
      auto it = regions_.find(addr);
      if (it == regions_.end()) return not_found();
      reg = it->second;
    }
    FERRY_RETURN_IF_ERROR(hooks->BeforeUnregister(*reg, quiesce_deadline)
                              .WithPrefix("unregistering " + FormatRange(reg->addr, reg->length)));
    reg.reset();
  }
  {
    std::unique_lock lock(mu_);
    auto it = regions_.find(addr);
    if (it == regions_.end()) return not_found();
    reg = std::move(it->second);
    regions_.erase(it);
    unregistrations_.fetch_add(1, std::memory_order_acq_rel);
  }
  // No new pin can be taken now; wait for transfers still using the region.
  // Pairs with the release in RegionPin::Release.
  while (reg->pins.load(std::memory_order_acquire) > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (hooks != nullptr) hooks->OnUnregister(*reg);
  return OkStatus();
}

const std::shared_ptr<Region>* MemoryRegistry::FindLocked(uint64_t addr, uint64_t length) const {
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return nullptr;
  --it;
  const Region& r = *it->second;
  if (addr >= r.addr && length <= r.length && addr - r.addr <= r.length - length)
    return &it->second;
  return nullptr;
}

Status MemoryRegistry::Check(uint64_t addr, uint64_t length, std::string_view what) const {
  Found ignored;
  return Check(addr, length, what, &ignored);
}

Status MemoryRegistry::Check(uint64_t addr, uint64_t length, std::string_view what,
                             Found* found) const {
  std::shared_lock lock(mu_);
  if (const std::shared_ptr<Region>* r = FindLocked(addr, length)) {
    found->addr = (*r)->addr;
    found->length = (*r)->length;
    found->kind = (*r)->kind;
    return OkStatus();
  }
  return InvalidArgumentError(std::string(what) + " " + FormatRange(addr, length) +
                              " is not inside a registered memory region (register it first)");
}

StatusOr<RegionPin> MemoryRegistry::Pin(uint64_t addr, uint64_t length,
                                        std::string_view what) const {
  return PinImpl(addr, length, what, false);
}

StatusOr<RegionPin> MemoryRegistry::PinExported(uint64_t addr, uint64_t length,
                                                std::string_view what) const {
  return PinImpl(addr, length, what, true);
}

StatusOr<RegionPin> MemoryRegistry::PinImpl(uint64_t addr, uint64_t length, std::string_view what,
                                            bool exported) const {
  std::shared_lock lock(mu_);
  const std::shared_ptr<Region>* r = FindLocked(addr, length);
  if (r == nullptr) {
    return InvalidArgumentError(std::string(what) + " " + FormatRange(addr, length) +
                                " is not inside a registered memory region");
  }
  if (exported && !(*r)->exported) {
    return InvalidArgumentError(
        std::string(what) + " " + FormatRange(addr, length) +
        " is in a region registered for local use only (not exported to peers)");
  }
  (*r)->pins.fetch_add(1, std::memory_order_relaxed);  // under the lock: Unregister cannot miss it
  return RegionPin(*r);
}

std::vector<wire::RegionEntry> MemoryRegistry::Snapshot(bool exported_only) const {
  std::shared_lock lock(mu_);
  std::vector<const Region*> by_order;
  by_order.reserve(regions_.size());
  for (const auto& [a, r] : regions_) {
    if (!exported_only || r->exported) by_order.push_back(r.get());
  }
  std::sort(by_order.begin(), by_order.end(),
            [](const Region* x, const Region* y) { return x->order < y->order; });
  std::vector<wire::RegionEntry> out;
  out.reserve(by_order.size());
  for (const Region* r : by_order)
    out.push_back({r->addr, r->length, r->location, r->kind.Name(), r->keys});
  return out;
}

size_t MemoryRegistry::size() const {
  std::shared_lock lock(mu_);
  return regions_.size();
}

}  // namespace ferry::internal
