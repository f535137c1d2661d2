// Posting: how the requests of a submit or a prepared transfer become
// slices on their routes' links. The core slices once here, for every
// transport: a request longer than its transport's MaxSlice() becomes
// several slices, ordered as the transport prefers (slice_order.h), and
// posted chunk by chunk.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/batch.h"
#include "base/transport.h"
#include "core/segment_table.h"
#include "core/slice_order.h"

namespace ferry::internal {

// Where the slices of one route go, and its metrics tag per opcode.
struct RoutePost {
  std::shared_ptr<PeerLink> link;
  std::shared_ptr<const PeerInfo> peer;  // the descriptor the slices' region indexes belong to
  uint32_t max_slice = 0;
  SliceOrder order = SliceOrder::kByDestination;
  uint8_t tags[2] = {0, 0};   // by Opcode
  std::vector<Slice> slices;  // of the chunk being prepared

  void SetRoute(const Routed& routed) {
    link = routed.link;
    max_slice = routed.transport->MaxSlice();
    order = routed.transport->PreferredOrder();
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
// transport starts sending the first chunk while the next ones are prepared
// (for batches of hundreds of thousands of requests, preparing them all first
// left the streams idle). False if the batch was cancelled (its
// requests failed at once; nothing was posted).
template <class EntryAt>
bool SliceAndPost(const std::shared_ptr<BatchState>& batch, size_t base, size_t n,
                  std::vector<RoutePost>& routes, Clock::time_point deadline, EntryAt entry_at) {
  // Requests sliced, ordered and posted at a time.
  constexpr size_t kPostChunk = 8192;
  // Every request is pending before the first slice moves, so no observer
  // sees the batch idle between chunks.
  const bool begun = batch->BeginRange(base, n, [&](size_t index) {
    const PostEntry e = entry_at(index - base);
    const RoutePost& r = routes[e.route];
    batch->Describe(index, e.length, r.tags[static_cast<int>(e.opcode)]);
    return e.length <= r.max_slice
               ? 1u
               : static_cast<uint32_t>((e.length + r.max_slice - 1) / r.max_slice);
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
      OrderForSending(p.slices, p.order);
      p.link->Post({batch, deadline, p.peer}, std::move(p.slices));
      p.slices.clear();  // moved-from: empty and ready for the next chunk
    }
  }
  return true;
}

}  // namespace ferry::internal
