// The measured phases of `ferry bench`: Ferry moving the workload's batches
// (plain, --sync or --prepared) for a duration or a byte count, checked with
// --verify; and, for --prepared, the time to prepare 1 M rows.
#pragma once

#include <atomic>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench_options.h"
#include "bench_session.h"
#include "bench_util.h"
#include "control.h"
#include "ferry/ferry.h"
#include "workload.h"

namespace ferry::bench {

struct PhaseResult {
  std::string workload;
  Operation op = Operation::kWrite;
  int threads = 1;
  uint64_t block = 0;  // 0 for KV
  uint64_t entries_per_batch = 0;
  bool sync = false;
  std::string transport;

  uint64_t bytes = 0;
  uint64_t requests = 0;
  uint64_t batches = 0;
  double seconds = 0;
  std::vector<double> batch_lat_us;
  std::vector<double> request_lat_us;
  uint64_t sampled_batches = 0;

  bool verify = false;
  uint64_t verified_bytes = 0;
  uint64_t mismatches = 0;
  uint64_t mismatched_blocks = 0;

  double cpu_initiator = kNaN;  // seconds
  double cpu_target = kNaN;

  // --prepared: the set-up of the lists and transfers (ms; the slowest
  // thread's), their sizes (all threads) and the last post's telemetry.
  bool prepared = false;
  double rows_ms = 0, local_list_ms = 0, remote_list_ms = 0, make_ms = 0;
  uint64_t local_rows = 0, remote_rows = 0, transfers = 0;
  uint64_t pairs = 0, merged_entries = 0;
  double post_us = 0;  // the last post's PostTransfer calls (slowest thread)

  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
  double rps() const { return seconds > 0 ? requests / seconds : 0; }
  double cpu_per_gb(double cpu) const { return bytes > 0 ? cpu / (bytes / 1e9) : kNaN; }
};

// One measurement: a thread per batch of the workload, each repeating its
// batch after one unmeasured warm-up batch; the clock runs from when every
// thread has warmed up until the last one's last batch completed.
class Phase {
 public:
  // prepared: move each batch as prepared transfers (--prepared) rather than
  // as a plain batch.
  Phase(Session& s, const BenchOptions& o, const Workload& w, bool prepared = false)
      : s_(s), o_(o), w_(w), prepared_(prepared) {}

  // progress: show the throughput so far on stderr (when it is a terminal).
  // Throws cli::RunError when a transfer failed.
  PhaseResult Run(bool progress);

 private:
  // One worker thread's state and counts.
  struct Local {
    std::vector<TransferRequest> reqs;
    std::vector<double> batch_lat, request_lat;
    uint64_t bytes = 0, requests = 0, batches = 0, sampled = 0;
    uint64_t verified = 0, mismatches = 0, bad_blocks = 0;
    std::unique_ptr<ControlClient> control;
    uint64_t iteration = 0;
    double last_batch_us = 1000;  // the latest unsampled batch's latency

    // --prepared
    std::optional<DescListHandle> local_list, remote_list;
    std::vector<TransferHandle> transfers;  // one per opcode of the batch
    double rows_ms = 0, local_list_ms = 0, remote_list_ms = 0, make_ms = 0;
    uint64_t local_rows = 0, remote_rows = 0;
  };

  // Run's steps (bench_phase.cc).
  void Describe(int threads);
  double TargetCpuBefore(std::latch& go, std::vector<std::thread>& workers);
  void ShowProgress(const std::atomic<int>& finished, int threads, bool tty);
  void Collect(const std::vector<Clock::time_point>& ends, double cpu0, double cpu1,
               double target_cpu0);

  // A worker thread (bench_phase.cc): warm-up, the measured batches, its
  // counts merged into r_.
  void Worker(int t, std::latch& warmed, std::latch& go, Clock::time_point& end);
  bool WarmUp(int t, Local& L);
  void Measure(int t, Local& L, bool ok);
  void Merge(int t, Local& L);

  // One batch (or, with --sync, one pass of single requests); `record`: count
  // it. Returns false on error (SetError said which).
  bool RunBatch(int t, Local& L, bool record);
  bool RunSync(int t, Local& L, bool record);
  bool RunPlain(int t, Local& L, bool record);
  // Waits for a submitted batch polling its status, timing each request.
  Status WaitSampled(BatchId batch, size_t n, Clock::time_point t0, Local& L);
  // Counts one completed batch of n requests that took `us`.
  void Record(int t, Local& L, size_t n, double us, bool sampled);
  void SetError(const std::string& e);

  // --prepared (bench_prepared.cc): thread t's lists and transfers, and one
  // iteration of posting them.
  void SetUpPrepared(int t, Local& L);
  void TearDownPrepared(Local& L);
  bool RunPrepared(int t, Local& L, bool record);

  // --verify (bench_verify.cc), around entries [i0, i1) of thread t's batch:
  // the pattern before the transfer, the check after it.
  void Prepare(int t, Local& L, size_t i0, size_t i1, uint64_t seed);
  void Check(int t, Local& L, size_t i0, size_t i1, uint64_t seed);
  void CheckWrites(int t, Local& L, size_t i0, const std::vector<Range>& writes, uint64_t seed);
  void InjectMismatch(Local& L, uint64_t seed);
  void ReportMismatch(int t, const Local& L, const char* dir, size_t index, uint64_t bad,
                      uint64_t first);

  Session& s_;
  const BenchOptions& o_;
  const Workload& w_;
  const bool prepared_;
  PhaseResult r_;
  Clock::time_point start_, deadline_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> claimed_{0};
  std::atomic<uint64_t> done_bytes_{0};
  std::mutex mu_;
  std::string error_;
  int reports_ = 0;
};

// Adds round `b` of a measurement to `a` (--prepared runs each mode in two
// rounds). The set-up figures stay a's.
void MergePhase(PhaseResult& a, const PhaseResult& b);

// --prepared: preparing 1 M rows of kMicroRowBytes on each side.
inline constexpr uint64_t kMicroRows = 1ull << 20;
inline constexpr uint64_t kMicroRowBytes = 256;
// What the buffers need for kMicroRows rows of kMicroRowBytes.
inline constexpr uint64_t kMicroBytes = kMicroRows * kMicroRowBytes;

struct PrepareMicro {
  uint64_t rows = 0;  // 0: not run (a buffer too small for a row per byte)
  uint64_t local_row_bytes = 0, remote_row_bytes = 0;
  // Medians of 3 rounds, ms: building the local list's rows (a vector of
  // DescRow), PrepareLocalList, PrepareRemoteList.
  double build_ms = kNaN, local_ms = kNaN, remote_ms = kNaN;
};

// One row per kMicroRowBytes (less where a buffer is smaller than
// kMicroBytes) of each side's buffer, prepared as one list of 1 M rows.
PrepareMicro RunPrepareMicro(Session& s);

}  // namespace ferry::bench
