#include "bench_baselines.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <memory>
#include <new>

#include "ferry/ferry.h"

namespace ferry::bench {
namespace {

// memcpy of thread 0's entries, one thread, over a working set of at least
// kMemcpyWorkingSet on each side (larger than any L3 cache): the entries'
// pattern (source offsets as the local buffer's, destination offsets as the
// target's) is repeated, shifted by its span, until it covers that much, so
// a 4 MiB block walks 256 MiB instead of rewriting one cached buffer, and a
// scattered KV layout is copied page by page as it is. The destination is
// fresh, the source too unless the initiator's buffer already spans it;
// at least 3 rounds and 0.3 s.
void MemcpyBaseline(Session& s, const Workload& w, Baseline& b) {
  const auto& entries = w.batches[0];
  uint64_t src_span = 0, dst_span = 0;
  for (const Entry& e : entries) {
    src_span = std::max(src_span, e.local_off + e.length);
    dst_span = std::max(dst_span, e.remote_off + e.length);
  }
  if (src_span == 0 || dst_span == 0) return;
  const uint64_t tiles =
      (kMemcpyWorkingSet + std::min(src_span, dst_span) - 1) / std::min(src_span, dst_span);
  // The source: the initiator's own buffer when it is that large already
  // (no second copy of a big workload's memory), else a fresh one.
  std::unique_ptr<Buffer> fresh;
  const uint8_t* src = s.local->data();
  uint64_t src_bytes = s.local->length();
  if (tiles > 1 || src_bytes < src_span) {
    fresh = std::make_unique<Buffer>(src_span * tiles, true, s.hugepages);
    std::memset(fresh->data(), 0x5a, fresh->length());  // real pages, not the zero page
    src = fresh->data();
    src_bytes = fresh->length();
  }
  Buffer dst(dst_span * tiles, true, s.hugepages);
  auto round = [&] {
    for (uint64_t k = 0; k < tiles; ++k) {
      uint8_t* d = dst.data() + k * dst_span;
      const uint8_t* from = src + k * src_span;
      for (const Entry& e : entries) std::memcpy(d + e.remote_off, from + e.local_off, e.length);
    }
  };
  round();
  uint64_t bytes = 0;
  auto t0 = Clock::now();
  int rounds = 0;
  while (rounds < 3 || Seconds(Clock::now() - t0) < 0.3) {
    round();
    bytes += w.batch_bytes(0) * tiles;
    ++rounds;
  }
  b.memcpy_gbps = bytes / Seconds(Clock::now() - t0) / 1e9;
  b.memcpy_src_bytes = src_bytes;
  b.memcpy_dst_bytes = dst.length();
  b.memcpy_copied_bytes = w.batch_bytes(0) * tiles;
}

// ---------------------------------------------------------------------------
// The same-host shared-memory ping-pong: this process and a child (fork) spin
// on two counters in a shared anonymous mapping; each round trip copies the
// payload from a private buffer into the mapping, the child copies it out
// into its private buffer and back into the mapping's other half, and this
// process copies the answer out. What a copy through shared memory costs
// with both sides polling, the floor of a synchronous same-host transfer.

struct alignas(64) PingPongShared {
  std::atomic<uint64_t> ping{0};              // the round this process asked for
  alignas(64) std::atomic<uint64_t> pong{0};  // the round the child answered
  alignas(64) std::atomic<uint64_t> size{0};  // payload bytes of the next round
  std::atomic<uint32_t> stop{0};
  alignas(64) uint8_t to_child[kPingPongMaxPayload];
  alignas(64) uint8_t to_parent[kPingPongMaxPayload];
};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The child: answers rounds until told to stop, its parent is gone, or
// `limit` seconds have passed (a bound of its own). Only async-signal-safe
// work (atomics, memcpy, clock_gettime): it was forked from a process with
// threads.
[[noreturn]] void PingPongChild(PingPongShared* sh, uint8_t* scratch, pid_t parent, double limit) {
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
  };
  const double end = now() + limit;
  uint64_t seen = 0;
  for (uint64_t spins = 0;; ++spins) {
    const uint64_t want = sh->ping.load(std::memory_order_acquire);
    if (want != seen) {
      const uint64_t n = sh->size.load(std::memory_order_relaxed);
      std::memcpy(scratch, sh->to_child, n);
      std::memcpy(sh->to_parent, scratch, n);
      seen = want;
      sh->pong.store(want, std::memory_order_release);
      continue;
    }
    if (sh->stop.load(std::memory_order_relaxed) != 0) _exit(0);
    if ((spins & 0xffff) == 0 && (getppid() != parent || now() > end)) _exit(0);
    CpuRelax();
  }
}

// Round trips of `size` bytes for `seconds` (at most max_round_trips, after
// 200 to warm up); empty when the child stopped answering (it is gone).
std::vector<double> PingPongRounds(PingPongShared* sh, uint64_t size, double seconds,
                                   size_t max_round_trips, pid_t child) {
  std::vector<uint8_t> src(size, 0xa5), dst(size);
  uint64_t round = sh->ping.load(std::memory_order_relaxed);
  auto trip = [&]() -> bool {
    std::memcpy(sh->to_child, src.data(), size);
    sh->size.store(size, std::memory_order_relaxed);
    sh->ping.store(++round, std::memory_order_release);
    for (uint64_t spins = 0; sh->pong.load(std::memory_order_acquire) != round; ++spins) {
      // Every 2^20 polls: is the child still there?
      if ((spins & 0xfffff) == 0xfffff && waitpid(child, nullptr, WNOHANG) != 0) return false;
      CpuRelax();
    }
    std::memcpy(dst.data(), sh->to_parent, size);
    return true;
  };
  std::vector<double> rtts;
  for (int i = 0; i < 200; ++i) {
    if (!trip()) return {};
  }
  rtts.reserve(std::min<size_t>(max_round_trips, 1 << 20));
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(seconds));
  while (rtts.size() < max_round_trips) {
    auto t0 = Clock::now();
    if (t0 >= deadline) break;
    if (!trip()) return {};
    rtts.push_back(Micros(Clock::now() - t0));
  }
  return rtts;
}

void ShmPingPongBaseline(Baseline& b) {
  const double seconds = 0.3;
  void* mem = mmap(nullptr, sizeof(PingPongShared), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    b.pingpong_error = std::string("mmap of the ping-pong's shared page: ") + std::strerror(errno);
    return;
  }
  auto* sh = new (mem) PingPongShared();
  std::vector<uint8_t> scratch(kPingPongMaxPayload);  // the child's private buffer
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) {
    b.pingpong_error = std::string("fork: ") + std::strerror(errno);
    munmap(mem, sizeof(PingPongShared));
    return;
  }
  if (child == 0) PingPongChild(sh, scratch.data(), parent, 4 * seconds + 5);
  b.pingpong_8_us = PingPongRounds(sh, 8, seconds, 200000, child);
  if (!b.pingpong_8_us.empty()) {
    b.pingpong_4k_us = PingPongRounds(sh, kPingPongMaxPayload, seconds, 200000, child);
  }
  if (b.pingpong_8_us.empty() || b.pingpong_4k_us.empty()) {
    b.pingpong_error = "the ping-pong's child process stopped answering";
  }
  sh->stop.store(1, std::memory_order_relaxed);
  while (waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
  }
  munmap(mem, sizeof(PingPongShared));
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
                      int streams, bool scatter, bool shm_pingpong) {
  Baseline b;
  b.stream_seconds = seconds;
  if (!s.have_control) return b;
  RunPlainBaselines(s, o, seconds, streams, b);
  if (scatter && !o.sync) RunScatterBaseline(s, o, w, seconds, streams, b);
  b.rtt_us = RunPingPong(s.control_host, s.control_port, 0.3, 200000);
  MemcpyBaseline(s, w, b);
  if (shm_pingpong) ShmPingPongBaseline(b);
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
