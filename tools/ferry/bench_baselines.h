// The baselines `ferry bench` measures Ferry against, on the same buffers:
// plain TCP streams through the target's control port (one, and as many as
// Ferry's streams), the workload's own entries gathered and scattered over
// plain streams, an 8-byte busy-poll ping-pong, memcpy, and (--transport
// fabric) a plain libfabric RMA loop.
#pragma once

#include <vector>

#include "bench_options.h"
#include "bench_session.h"
#include "bench_util.h"
#include "control.h"
#include "fabric_baseline.h"
#include "workload.h"

namespace ferry::bench {

struct Baseline {
  StreamResult single, multi, scatter;
  double cpu_scatter_initiator = kNaN, cpu_scatter_target = kNaN;
  double cpu_single_initiator = kNaN, cpu_single_target = kNaN;
  double cpu_multi_initiator = kNaN, cpu_multi_target = kNaN;
  std::vector<double> rtt_us;
  double memcpy_gbps = kNaN;
  double stream_seconds = 0;
};

// Each stream baseline runs `seconds`, the multi-stream one with `streams`
// streams; scatter: also the scatter baseline on w's entries (not with
// --sync). Without the target's control port only stream_seconds is set.
Baseline RunBaselines(Session& s, const BenchOptions& o, const Workload& w, double seconds,
                      int streams, bool scatter);

// --transport fabric: the plain libfabric RMA loop on w's entries, between
// two endpoints of this process on the engine's provider, for `seconds`.
FabricBaselineResult RunFabricBaselineOf(Session& s, const Workload& w, double seconds);

}  // namespace ferry::bench
