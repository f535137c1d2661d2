// MappedLink (mapped_segments.h): the initiator's copies through its
// mappings of a peer's shared regions. Apart from the slot table's code
// because it is the only part that needs the core's types (PeerInfo,
// BatchState), which the fuzz targets of the table do not link.
#include <cstring>
#include <optional>

#include "transport/shm/mapped_segments.h"

namespace ferry::internal::shm {

void MappedLink::Post(const PostContext& ctx, std::vector<Slice> slices) {
  // Only the peer's private memory (no region with a map key): straight to
  // the stream link, without looking at the peer process first.
  bool mappable = false;
  for (size_t i = 0; i < slices.size() && !mappable; ++i) {
    const uint32_t region = slices[i].remote_region;
    if (i > 0 && region == slices[i - 1].remote_region) continue;
    mappable = region != kNoRegion && ctx.peer->KeyOf(region, kMapKey).has_value();
  }
  if (!mappable) {
    inner_->Post(ctx, std::move(slices));
    return;
  }
  if (!PeerRuns()) {  // the stream link reports the peer gone
    inner_->Post(ctx, std::move(slices));
    return;
  }
  std::vector<Slice> rest;
  {
    BatchState::Completer done(*ctx.batch);
    const size_t n = slices.size();
    size_t i = 0;
    while (i < n) {
      // A group of slices to one region of the peer (slices come sorted).
      const uint32_t region = slices[i].remote_region;
      size_t end = i + 1;
      while (end < n && slices[end].remote_region == region) ++end;
      std::shared_ptr<const MappedRegion> m;
      std::optional<uint64_t> key;
      if (region != kNoRegion) key = ctx.peer->KeyOf(region, kMapKey);
      if (key) m = maps_->Find(*key);
      if (m && !m->Begin()) {  // revoked since: the peer answers for it
        maps_->Forget(*key);
        m = nullptr;
      }
      if (!m) {
        rest.insert(rest.end(), slices.begin() + static_cast<ptrdiff_t>(i),
                    slices.begin() + static_cast<ptrdiff_t>(end));
        i = end;
        continue;
      }
      for (; i < end; ++i) {
        const Slice& s = slices[i];
        char* there = m->Translate(s.remote, s.length);
        if (there == nullptr) {  // outside the region as mapped: the peer judges it
          rest.push_back(s);
          continue;
        }
        if (s.opcode == Opcode::kWrite) {
          std::memcpy(there, s.local, s.length);
        } else {
          // A read stores into this engine's memory: not once its batch
          // was cancelled (BatchState::BeginLanding).
          if (!ctx.batch->BeginLanding()) {
            done.Complete(s.request, 1, CancelledError("the request's batch was cancelled"));
            continue;
          }
          std::memcpy(s.local, there, s.length);
          ctx.batch->EndLanding();
        }
        done.Complete(s.request, 1, OkStatus());
      }
      m->End();
    }
  }
  if (!rest.empty()) inner_->Post(ctx, std::move(rest));
}

}  // namespace ferry::internal::shm
