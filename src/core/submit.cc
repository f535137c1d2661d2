#include "core/submit.h"

#include <algorithm>

namespace ferry::internal {

Status Submission::Validate() {
  segs_.resize(requests_.size());
  MemoryRegistry::Found local_region;  // the last local region found; most requests share it
  local_region.length = 0;
  for (size_t i = 0; i < requests_.size(); ++i) {
    Status s = ValidateOne(i, local_region);
    if (!s.ok()) return s.WithPrefix("request " + std::to_string(i));
  }
  return OkStatus();
}

Status Submission::ValidateOne(size_t i, MemoryRegistry::Found& local_region) {
  const TransferRequest& r = requests_[i];
  if (r.opcode != Opcode::kRead && r.opcode != Opcode::kWrite) {
    return InvalidArgumentError("unknown opcode " + std::to_string(static_cast<int>(r.opcode)));
  }
  if (r.local == nullptr) return InvalidArgumentError("local address is null");
  if (r.length == 0) return InvalidArgumentError("length is zero");
  const uint64_t local = reinterpret_cast<uint64_t>(r.local);
  if (!(local >= local_region.addr && r.length <= local_region.length &&
        local - local_region.addr <= local_region.length - r.length)) {
    FERRY_RETURN_IF_ERROR(registry_.Check(local, r.length, "local buffer", &local_region));
    if (!local_region.kind.cpu_accessible() && !mixed_kinds_) {
      mixed_kinds_ = true;
      local_kinds_.assign(i, MemoryKind::Cpu());
    }
  }
  if (mixed_kinds_) local_kinds_.push_back(local_region.kind);
  if (r.remote_addr + r.length < r.remote_addr) {
    return InvalidArgumentError("remote range " + FormatRange(r.remote_addr, r.length) +
                                " wraps around the address space");
  }
  auto seg = distinct_.find(r.segment.value);
  if (seg == distinct_.end()) {
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Segment> got, segments_.Get(r.segment));
    seg = distinct_.emplace(r.segment.value, std::move(got)).first;
  }
  segs_[i] = seg->second.get();
  return OkStatus();
}

Status Submission::ResolveRoutes() {
  post_of_.resize(requests_.size());
  region_of_.resize(requests_.size());
  for (int attempt = 0;; ++attempt) {
    FERRY_RETURN_IF_ERROR(AssignRoutes());
    FERRY_ASSIGN_OR_RETURN(const bool changed, ConnectRoutes());
    // A transport with per-region keys cannot post a range outside the
    // descriptor it has (the peer may have registered it since), and shm
    // maps it only with its key: fetch the descriptor again, once. Ranges
    // still outside it fail in the transport (or its target validates them).
    const bool missing_keys = attempt == 0 && !changed && MissingRegionKeys();
    // A second restart within one submit: its target validates.
    if (!(changed || missing_keys) || attempt == 1) return OkStatus();
  }
}

// Each request's peer region (requests mostly share one) and route
// (requests mostly repeat one: one lookup per run of them).
Status Submission::AssignRoutes() {
  std::map<Segment*, std::shared_ptr<const PeerInfo>> infos;
  for (auto& [h, seg] : distinct_) {
    FERRY_ASSIGN_OR_RETURN(infos[seg.get()], segments_.Current(*seg));
  }
  posts_.clear();
  const Segment* last_seg = nullptr;
  const std::shared_ptr<const PeerInfo>* info = nullptr;
  uint32_t last_region = kNoRegion;
  size_t last_post = 0;
  for (size_t i = 0; i < requests_.size(); ++i) {
    const TransferRequest& r = requests_[i];
    if (segs_[i] != last_seg) {
      last_seg = segs_[i];
      info = &infos[segs_[i]];
      last_region = kNoRegion;
    }
    const auto& regions = (*info)->desc().regions;
    uint32_t region = last_region;
    if (region == kNoRegion ||
        !(r.remote_addr >= regions[region].addr && r.length <= regions[region].length &&
          r.remote_addr - regions[region].addr <= regions[region].length - r.length)) {
      region = (*info)->FindRegion(r.remote_addr, r.length);
      if (region != kNoRegion) last_region = region;
    }
    region_of_[i] = region;
    const MemoryKind local = mixed_kinds_ ? local_kinds_[i] : MemoryKind::Cpu();
    const MemoryKind remote = (*info)->KindOf(region);
    if (posts_.empty() || !posts_[last_post].Is(segs_[i], local, remote)) {
      FERRY_ASSIGN_OR_RETURN(last_post, PostIndex(segs_[i], local, remote, *info));
    }
    post_of_[i] = static_cast<uint8_t>(last_post);
  }
  return OkStatus();
}

StatusOr<size_t> Submission::PostIndex(Segment* seg, MemoryKind local, MemoryKind remote,
                                       const std::shared_ptr<const PeerInfo>& peer) {
  auto it = std::find_if(posts_.begin(), posts_.end(),
                         [&](const PeerPost& p) { return p.Is(seg, local, remote); });
  if (it != posts_.end()) return static_cast<size_t>(it - posts_.begin());
  if (posts_.size() == 255) {
    return InvalidArgumentError("requests of one submit use more than 255 routes");
  }
  posts_.push_back({seg, local, remote, {}, {}});
  posts_.back().post.peer = peer;
  return posts_.size() - 1;
}

// Connects every route; whether some peer's descriptor changed meanwhile.
StatusOr<bool> Submission::ConnectRoutes() {
  bool changed = false;
  for (PeerPost& p : posts_) {
    auto routed = segments_.Route(*p.seg, p.local, p.remote);
    if (!routed.ok()) return routed.status().WithPrefix("peer " + p.seg->name());
    p.post.SetRoute(*routed);
    p.routed = *std::move(routed);
    changed = changed || p.routed.peer != p.post.peer;
  }
  return changed;
}

// Marks stale the peers of requests outside every region the peer
// published whose transport needs region keys (or is helped by them:
// TransportCaps::refresh_for_keys); whether there were any.
bool Submission::MissingRegionKeys() {
  bool missing = false;
  for (size_t i = 0; i < requests_.size(); ++i) {
    const TransportCaps& caps = posts_[post_of_[i]].routed.transport->caps();
    if (region_of_[i] == kNoRegion && (caps.needs_region_keys || caps.refresh_for_keys)) {
      segments_.MarkStale(*segs_[i]);
      missing = true;
    }
  }
  return missing;
}

Status Submission::Post(const std::shared_ptr<BatchState>& batch, BatchId id,
                        Clock::time_point deadline) {
  FERRY_ASSIGN_OR_RETURN(size_t base, batch->Reserve(requests_.size()));
  std::vector<RoutePost> routes;
  routes.reserve(posts_.size());
  for (PeerPost& p : posts_) {
    routes.push_back(std::move(p.post));
    routes.back().Tag(*batch, p.routed);
  }
  const bool posted = SliceAndPost(batch, base, requests_.size(), routes, deadline, [&](size_t i) {
    const TransferRequest& r = requests_[i];
    return PostEntry{
        r.opcode, static_cast<char*>(r.local), r.remote_addr, r.length, region_of_[i], post_of_[i]};
  });
  if (!posted) {
    return CancelledError("batch " + std::to_string(id.value) +
                          " was cancelled; nothing was submitted");
  }
  return OkStatus();
}

}  // namespace ferry::internal
