// Submission: Engine::Submit's work on one list of requests, in three steps
// — Validate every request before anything moves, ResolveRoutes (each
// request's peer, memory kinds on both sides and peer region; each route
// connected), then Post (reserve the requests in the batch, slice and post).
// One object per Submit call, used by that thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "base/batch.h"
#include "base/memory_registry.h"
#include "core/poster.h"
#include "core/segment_table.h"
#include "ferry/engine.h"

namespace ferry::internal {

class Submission {
 public:
  Submission(SegmentTable& segments, const MemoryRegistry& registry,
             std::span<const TransferRequest> requests)
      : segments_(segments), registry_(registry), requests_(requests) {}

  // Every request well-formed, its local range registered and its segment
  // open; the first bad one's index and reason otherwise.
  Status Validate();
  // Each peer's current descriptor (fetched again if a watch said it
  // changed), the route of every request, each route connected. Connecting
  // may find that a peer restarted: then the routes are worked out again
  // against its new descriptor (once), so every slice's region index belongs
  // to the descriptor it is posted with.
  Status ResolveRoutes();
  // Reserves the requests in `batch` and posts them; kCancelled (nothing
  // posted) if the batch was cancelled.
  Status Post(const std::shared_ptr<BatchState>& batch, BatchId id, Clock::time_point deadline);

 private:
  struct PeerPost {
    Segment* seg = nullptr;
    MemoryKind local, remote;
    RoutePost post;
    Routed routed;
    bool Is(const Segment* s, MemoryKind l, MemoryKind r) const {
      return seg == s && local == l && remote == r;
    }
  };
  Status ValidateOne(size_t i, MemoryRegistry::Found& local_region);
  Status AssignRoutes();
  StatusOr<bool> ConnectRoutes();
  bool MissingRegionKeys();
  StatusOr<size_t> PostIndex(Segment* seg, MemoryKind local, MemoryKind remote,
                             const std::shared_ptr<const PeerInfo>& peer);

  SegmentTable& segments_;
  const MemoryRegistry& registry_;
  const std::span<const TransferRequest> requests_;
  // Validate's findings.
  std::vector<Segment*> segs_;                             // by request; owned by distinct_
  std::map<uint64_t, std::shared_ptr<Segment>> distinct_;  // by segment handle
  std::vector<MemoryKind> local_kinds_;  // by request, once some local memory is not cpu
  bool mixed_kinds_ = false;
  // ResolveRoutes' findings.
  std::vector<PeerPost> posts_;      // a handful: one per route
  std::vector<uint8_t> post_of_;     // by request
  std::vector<uint32_t> region_of_;  // by request
};

}  // namespace ferry::internal
