// The baselines `ferry bench` measures Ferry against, on the same buffers:
// plain TCP streams through the target's control port (one, and as many as
// Ferry's streams), the workload's own entries gathered and scattered over
// plain streams, an 8-byte busy-poll ping-pong, a single-thread memcpy over
// a working set larger than L3, on shm with --sync a shared-memory
// ping-pong between two processes, and (--transport fabric) a plain
// libfabric RMA loop.
#pragma once

#include <string>
#include <vector>

#include "bench_options.h"
#include "bench_session.h"
#include "bench_util.h"
#include "control.h"
#include "fabric_baseline.h"
#include "workload.h"

namespace ferry::bench {

// The memcpy baseline's least working set on each side (source and
// destination): larger than any L3 cache, so it measures memory, not cache.
inline constexpr uint64_t kMemcpyWorkingSet = 256ull << 20;
// The shared-memory ping-pong's larger payload (the smaller is 8 bytes).
inline constexpr uint64_t kPingPongMaxPayload = 4096;

struct Baseline {
  StreamResult single, multi, scatter;
  double cpu_scatter_initiator = kNaN, cpu_scatter_target = kNaN;
  double cpu_single_initiator = kNaN, cpu_single_target = kNaN;
  double cpu_multi_initiator = kNaN, cpu_multi_target = kNaN;
  std::vector<double> rtt_us;
  double memcpy_gbps = kNaN;
  // The memcpy's buffers and the bytes one round copies (0: not run).
  uint64_t memcpy_src_bytes = 0, memcpy_dst_bytes = 0, memcpy_copied_bytes = 0;
  // The shared-memory ping-pong's round trips (µs) of 8 B and 4 KiB; empty
  // when it did not run (pingpong_error: why, when it failed).
  std::vector<double> pingpong_8_us, pingpong_4k_us;
  std::string pingpong_error;
  double stream_seconds = 0;
};

// Each stream baseline runs `seconds`, the multi-stream one with `streams`
// streams; scatter: also the scatter baseline on w's entries (not with
// --sync); shm_pingpong: also the shared-memory ping-pong. Without the
// target's control port only stream_seconds is set.
Baseline RunBaselines(Session& s, const BenchOptions& o, const Workload& w, double seconds,
                      int streams, bool scatter, bool shm_pingpong = false);

// --transport fabric: the plain libfabric RMA loop on w's entries, between
// two endpoints of this process on the engine's provider, for `seconds`.
FabricBaselineResult RunFabricBaselineOf(Session& s, const Workload& w, double seconds);

}  // namespace ferry::bench
