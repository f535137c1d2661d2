#include "bench_baselines.h"

#include <algorithm>
#include <cstring>

#include "ferry/ferry.h"

namespace ferry::bench {
namespace {

// memcpy of thread 0's entries from the local buffer into a scratch buffer
// laid out like the target's, for at least 3 rounds and 0.3 s.
double MemcpyGbps(Session& s, const Workload& w) {
  const auto& entries = w.batches[0];
  uint64_t span = 0;
  for (const Entry& e : entries) span = std::max(span, e.remote_off + e.length);
  Buffer scratch(span, true, s.hugepages);
  const uint8_t* src = s.local->data();
  auto round = [&] {
    for (const Entry& e : entries)
      std::memcpy(scratch.data() + e.remote_off, src + e.local_off, e.length);
  };
  round();
  uint64_t bytes = 0;
  auto t0 = Clock::now();
  int rounds = 0;
  while (rounds < 3 || Seconds(Clock::now() - t0) < 0.3) {
    round();
    bytes += w.batch_bytes(0);
    ++rounds;
  }
  return bytes / Seconds(Clock::now() - t0) / 1e9;
}

// Which way each of n streams carries data: initiator -> target for
// writes; for mixed, even streams write.
std::vector<bool> Directions(Operation op, int n) {
  std::vector<bool> d;
  for (int i = 0; i < n; ++i) {
    d.push_back(op == Operation::kWrite || (op == Operation::kMixed && i % 2 == 0));
  }
  return d;
}

// The plain TCP streams: one, then `streams` (or the one again).
void RunPlainBaselines(Session& s, const BenchOptions& o, double seconds, int streams,
                       Baseline& b) {
  auto measure = [&](int n, StreamResult* r, double* cpu_i, double* cpu_t) {
    double t0 = s.target_in_process ? kNaN : s.control->TargetCpuSeconds();
    double c0 = ProcessCpuSeconds();
    *r = RunPlainStreams(s.control_host, s.control_port, Directions(o.op, n), s.local->data(),
                         s.local->length(), s.remote_length, seconds);
    *cpu_i = ProcessCpuSeconds() - c0;
    if (!s.target_in_process) *cpu_t = s.control->TargetCpuSeconds() - t0;
  };
  measure(1, &b.single, &b.cpu_single_initiator, &b.cpu_single_target);
  if (streams > 1) {
    measure(streams, &b.multi, &b.cpu_multi_initiator, &b.cpu_multi_target);
  } else {
    b.multi = b.single;
    b.cpu_multi_initiator = b.cpu_single_initiator;
    b.cpu_multi_target = b.cpu_single_target;
  }
}

// The workload's own entries (every thread's), split into `streams`
// contiguous runs, one per stream.
void RunScatterBaseline(Session& s, const BenchOptions& o, const Workload& w, double seconds,
                        int streams, Baseline& b) {
  std::vector<Entry> all;
  for (const auto& batch : w.batches) all.insert(all.end(), batch.begin(), batch.end());
  const int n = static_cast<int>(std::min<size_t>(static_cast<size_t>(streams), all.size()));
  std::vector<std::vector<Range>> local(n), remote(n);
  for (size_t i = 0; i < all.size(); ++i) {
    size_t k = i * n / all.size();
    local[k].push_back({all[i].local_off, all[i].length});
    remote[k].push_back({all[i].remote_off, all[i].length});
  }
  double t0 = s.target_in_process ? kNaN : s.control->TargetCpuSeconds();
  double c0 = ProcessCpuSeconds();
  b.scatter = RunScatterStreams(s.control_host, s.control_port, Directions(o.op, n),
                                s.local->data(), local, remote, seconds);
  b.cpu_scatter_initiator = ProcessCpuSeconds() - c0;
  if (!s.target_in_process) b.cpu_scatter_target = s.control->TargetCpuSeconds() - t0;
}

}  // namespace

Baseline RunBaselines(Session& s, const BenchOptions& o, const Workload& w, double seconds,
                      int streams, bool scatter) {
  Baseline b;
  b.stream_seconds = seconds;
  if (!s.have_control) return b;
  RunPlainBaselines(s, o, seconds, streams, b);
  if (scatter && !o.sync) RunScatterBaseline(s, o, w, seconds, streams, b);
  b.rtt_us = RunPingPong(s.control_host, s.control_port, 0.3, 200000);
  b.memcpy_gbps = MemcpyGbps(s, w);
  return b;
}

FabricBaselineResult RunFabricBaselineOf(Session& s, const Workload& w, double seconds) {
  const EngineOptions& eo = s.engine->options();
  const FabricInfo fi = DescribeFabric(eo.fabric_provider, eo.listen_host);
  std::vector<Entry> all;
  for (const auto& batch : w.batches) all.insert(all.end(), batch.begin(), batch.end());
  if (fi.chosen.empty()) {
    FabricBaselineResult r;
    r.provider = eo.fabric_provider;
    r.error = fi.why_none.empty() ? fi.error : fi.why_none;
    return r;
  }
  // As many in flight as the bench's batches hold, at most Ferry's 256.
  const uint32_t depth = static_cast<uint32_t>(std::min<size_t>(all.size(), 256));
  return RunFabricBaseline(fi.chosen, eo.listen_host, all, w.local_bytes, w.remote_bytes, depth,
                           seconds);
}

}  // namespace ferry::bench
