#include "base/transport.h"

#include <algorithm>

namespace ferry::internal {

PeerInfo::PeerInfo(wire::PeerDescriptor d) : desc_(std::move(d)) {
  by_addr_.resize(desc_.regions.size());
  kinds_.reserve(desc_.regions.size());
  for (uint32_t i = 0; i < by_addr_.size(); ++i) {
    by_addr_[i] = i;
    kinds_.push_back(MemoryKind::FromName(desc_.regions[i].kind));
  }
  std::sort(by_addr_.begin(), by_addr_.end(),
            [&](uint32_t a, uint32_t b) { return desc_.regions[a].addr < desc_.regions[b].addr; });
}

uint32_t PeerInfo::FindRegion(uint64_t addr, uint64_t length) const {
  auto it = std::upper_bound(by_addr_.begin(), by_addr_.end(), addr,
                             [&](uint64_t a, uint32_t i) { return a < desc_.regions[i].addr; });
  if (it == by_addr_.begin()) return kNoRegion;
  const uint32_t i = *std::prev(it);
  const wire::RegionEntry& r = desc_.regions[i];
  if (addr >= r.addr && length <= r.length && addr - r.addr <= r.length - length) return i;
  return kNoRegion;
}

MemoryKind PeerInfo::KindOf(uint32_t region) const {
  return region == kNoRegion || region >= kinds_.size() ? MemoryKind::Cpu() : kinds_[region];
}

std::optional<uint64_t> PeerInfo::KeyOf(uint32_t region, std::string_view transport) const {
  if (region == kNoRegion || region >= desc_.regions.size()) return std::nullopt;
  for (const auto& k : desc_.regions[region].keys) {
    if (k.transport == transport) return k.key;
  }
  return std::nullopt;
}

std::string PeerInfo::Label() const {
  return desc_.peer_id + " (segment '" + desc_.engine_name + "', instance " +
         std::to_string(desc_.instance_id) + ")";
}

std::string_view ReachName(Reach r) {
  switch (r) {
    case Reach::kSameProcess:
      return "same process";
    case Reach::kSameHost:
      return "same host";
    case Reach::kNetwork:
      return "network";
  }
  return "?";
}

bool Transport::Handles(MemoryKind local, MemoryKind remote) const {
  auto in = [](const std::vector<MemoryKind::Type>& kinds, MemoryKind k) {
    return std::find(kinds.begin(), kinds.end(), k.type()) != kinds.end();
  };
  return in(caps_.memory_kinds, local) &&
         in(caps_.remote_kinds.empty() ? caps_.memory_kinds : caps_.remote_kinds, remote);
}

}  // namespace ferry::internal
