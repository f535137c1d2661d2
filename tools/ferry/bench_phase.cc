// The Ferry phase: worker threads, plain and --sync batches, the counts.
// --prepared is in bench_prepared.cc, --verify in bench_verify.cc.
#include "bench_phase.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "cli.h"
#include "pattern.h"

namespace ferry::bench {

PhaseResult Phase::Run(bool progress) {
  const int threads = static_cast<int>(w_.batches.size());
  Describe(threads);
  if (o_.verify) {
    if (!s_.have_control) {
      throw cli::RunError("--verify needs the target's control port (--control HOST:PORT)");
    }
    if (o_.op != Operation::kWrite) s_.control->Fill(kReadSeed);
  }
  std::latch warmed(threads + 1), go(1);
  std::atomic<int> finished{0};
  std::vector<std::thread> workers;
  std::vector<Clock::time_point> ends(threads);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      Worker(t, warmed, go, ends[t]);
      finished.fetch_add(1);
    });
  }
  warmed.arrive_and_wait();
  const double target_cpu0 = TargetCpuBefore(go, workers);
  const double cpu0 = ProcessCpuSeconds();
  start_ = Clock::now();
  deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(o_.duration));
  go.count_down();
  const bool tty = progress && isatty(STDERR_FILENO);
  ShowProgress(finished, threads, tty);
  for (auto& t : workers) t.join();
  const double cpu1 = ProcessCpuSeconds();
  if (tty) std::fprintf(stderr, "\r%80s\r", "");
  if (!error_.empty()) throw cli::RunError(error_);
  Collect(ends, cpu0, cpu1, target_cpu0);
  return std::move(r_);
}

// What the result describes: the workload and the options.
void Phase::Describe(int threads) {
  r_.workload = w_.description;
  r_.op = o_.op;
  r_.threads = threads;
  r_.entries_per_batch = w_.batches[0].size();
  r_.sync = o_.sync;
  r_.verify = o_.verify;
  r_.prepared = prepared_;
}

// The target's CPU seconds before the start (NaN when they cannot be asked
// for). If asking fails, releases the warmed-up workers before throwing.
double Phase::TargetCpuBefore(std::latch& go, std::vector<std::thread>& workers) {
  try {
    if (s_.have_control && !s_.target_in_process) return s_.control->TargetCpuSeconds();
    return kNaN;
  } catch (...) {
    stop_.store(true);  // release the workers before giving up
    go.count_down();
    for (auto& t : workers) t.join();
    throw;
  }
}

// Waits until every worker finished; on a terminal, shows the throughput so
// far.
void Phase::ShowProgress(const std::atomic<int>& finished, int threads, bool tty) {
  while (finished.load() < threads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 200 : 20));
    if (tty) {
      double el = Seconds(Clock::now() - start_);
      std::fprintf(stderr, "\r  %s %s: %.2f GB/s after %.1f s   ",
                   std::string(OperationName(o_.op)).c_str(), w_.description.c_str(),
                   el > 0 ? done_bytes_.load() / el / 1e9 : 0.0, el);
      std::fflush(stderr);
    }
  }
}

// The phase's time (to the last thread's end), CPU and transport.
void Phase::Collect(const std::vector<Clock::time_point>& ends, double cpu0, double cpu1,
                    double target_cpu0) {
  Clock::time_point last = start_;
  for (auto& e : ends) last = std::max(last, e);
  r_.seconds = Seconds(last - start_);
  if (s_.target_in_process) {
    r_.cpu_initiator = cpu1 - cpu0;  // both sides
  } else {
    r_.cpu_initiator = cpu1 - cpu0;
    if (s_.have_control) r_.cpu_target = s_.control->TargetCpuSeconds() - target_cpu0;
  }
  auto info = s_.engine->QuerySegment(s_.segment);
  r_.transport = info.ok() ? info->transport : s_.info.transport;
}

void Phase::SetError(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = e;
  stop_.store(true);
}

// ---------------------------------------------------------------------------
// Batches

bool Phase::RunBatch(int t, Local& L, bool record) {
  if (prepared_) return RunPrepared(t, L, record);
  if (o_.sync) return RunSync(t, L, record);
  return RunPlain(t, L, record);
}

// --sync: one TransferSync per request (the warm-up: the first 16).
bool Phase::RunSync(int t, Local& L, bool record) {
  const auto& entries = w_.batches[t];
  const uint64_t seed = Mix64((static_cast<uint64_t>(t) + 1) << 40 | L.iteration);
  size_t n = record ? entries.size() : std::min<size_t>(entries.size(), 16);
  for (size_t i = 0; i < n; ++i) {
    if (stop_.load(std::memory_order_relaxed)) return true;
    if (o_.verify) Prepare(t, L, i, i + 1, seed + i);
    auto t0 = Clock::now();
    Status st = s_.engine->TransferSync(L.reqs[i]);
    double us = Micros(Clock::now() - t0);
    if (!st.ok()) {
      SetError("request failed: " + st.ToString());
      return false;
    }
    if (o_.verify) Check(t, L, i, i + 1, seed + i);
    if (record) {
      L.batch_lat.push_back(us);
      L.request_lat.push_back(us);
      L.bytes += entries[i].length;
      ++L.requests;
      ++L.batches;
      done_bytes_.fetch_add(entries[i].length, std::memory_order_relaxed);
      if (o_.total_bytes > 0 &&
          claimed_.fetch_add(entries[i].length) + entries[i].length >= o_.total_bytes) {
        stop_.store(true);
      }
      if (o_.total_bytes == 0 && Clock::now() >= deadline_) return true;
    }
  }
  ++L.iteration;
  return true;
}

// The whole batch: AllocateBatch, Submit, WaitBatch (every kSampleEvery-th
// measured batch: polled, timing each request), FreeBatch.
bool Phase::RunPlain(int t, Local& L, bool record) {
  const auto& entries = w_.batches[t];
  Engine& engine = *s_.engine;
  const uint64_t seed = Mix64((static_cast<uint64_t>(t) + 1) << 40 | L.iteration);
  if (o_.verify) Prepare(t, L, 0, entries.size(), seed);
  const bool sampled = record && entries.size() > 1 && L.batches % kSampleEvery == 1;
  const size_t n = entries.size();
  auto t0 = Clock::now();
  auto batch = engine.AllocateBatch(n);
  if (!batch.ok()) {
    SetError("AllocateBatch(" + std::to_string(n) + ") failed: " + batch.status().ToString());
    return false;
  }
  Status st = engine.Submit(*batch, L.reqs);
  if (st.ok()) {
    const auto timeout = s_.engine->options().transfer_timeout + std::chrono::seconds(10);
    st = sampled ? WaitSampled(*batch, n, t0, L)
                 : engine.WaitBatch(*batch,
                                    std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
  }
  double us = Micros(Clock::now() - t0);
  if (!sampled) L.last_batch_us = us;
  if (!st.ok()) {
    SetError("batch of " + std::to_string(n) + " requests failed: " + st.ToString());
    return false;
  }
  st = engine.FreeBatch(*batch);
  if (!st.ok()) {
    SetError("FreeBatch failed after the batch completed: " + st.ToString());
    return false;
  }
  if (o_.verify) Check(t, L, 0, n, seed);
  ++L.iteration;
  if (record) Record(t, L, n, us, sampled);
  return true;
}

Status Phase::WaitSampled(BatchId batch, size_t n, Clock::time_point t0, Local& L) {
  Engine& engine = *s_.engine;
  const auto timeout = engine.options().transfer_timeout + std::chrono::seconds(10);
  const auto give_up = t0 + timeout;
  size_t seen = 0;
  while (true) {
    auto bs = engine.GetBatchStatus(batch);
    if (!bs.ok()) return bs.status();
    size_t done = bs->completed + bs->failed;
    if (done > seen) {
      double us = Micros(Clock::now() - t0);
      for (; seen < done; ++seen) L.request_lat.push_back(us);
    }
    if (bs->failed > 0) return bs->first_error;
    if (done >= n) return OkStatus();
    if (Clock::now() > give_up) {
      return DeadlineExceededError("batch still pending after the transfer timeout");
    }
    // Poll ~256 times per batch (5 µs .. 1 ms apart), so watching costs little.
    std::this_thread::sleep_for(std::chrono::microseconds(
        std::clamp<int64_t>(static_cast<int64_t>(L.last_batch_us / 256), 5, 1000)));
  }
}

void Phase::Record(int t, Local& L, size_t n, double us, bool sampled) {
  if (!sampled) L.batch_lat.push_back(us);
  if (sampled) ++L.sampled;
  if (n == 1) L.request_lat.push_back(us);
  uint64_t bytes = w_.batch_bytes(t);
  L.bytes += bytes;
  L.requests += n;
  ++L.batches;
  done_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------
// Worker threads

void Phase::Worker(int t, std::latch& warmed, std::latch& go, Clock::time_point& end) {
  prctl(PR_SET_TIMERSLACK, 1000);  // 1 µs: the sampled batches poll with short sleeps
  Local L;
  const bool ok = WarmUp(t, L);
  warmed.count_down();
  go.wait();
  Measure(t, L, ok);
  end = Clock::now();
  Merge(t, L);
}

// The thread's requests, control connection and (--prepared) transfers,
// then one unmeasured batch: connections, page faults.
bool Phase::WarmUp(int t, Local& L) {
  try {
    for (const Entry& e : w_.batches[t]) {
      L.reqs.push_back({e.opcode, s_.local->data() + e.local_off, s_.segment,
                        s_.remote_base + e.remote_off, e.length});
    }
    if (o_.verify) L.control = std::make_unique<ControlClient>(s_.control_host, s_.control_port);
    if (prepared_) SetUpPrepared(t, L);
    return RunBatch(t, L, false);
  } catch (const std::exception& e) {
    SetError(e.what());
    return false;
  }
}

// The measured batches, until the deadline, the byte count, or an error.
void Phase::Measure(int t, Local& L, bool ok) {
  try {
    const uint64_t batch_bytes = w_.batch_bytes(t);
    while (ok && !stop_.load(std::memory_order_relaxed)) {
      if (o_.total_bytes > 0 && !o_.sync && claimed_.fetch_add(batch_bytes) >= o_.total_bytes) {
        break;
      }
      ok = RunBatch(t, L, true);
      if (o_.total_bytes == 0 && Clock::now() >= deadline_) break;
    }
  } catch (const std::exception& e) {
    SetError(e.what());
  }
}

// Adds the thread's counts (and --prepared's set-up and telemetry) to r_.
void Phase::Merge(int t, Local& L) {
  uint64_t merged = 0;
  double post_us = 0;
  for (TransferHandle h : L.transfers) {
    auto tel = s_.engine->GetTransferTelemetry(h);
    if (!tel.ok()) continue;
    merged += tel->entries;
    post_us += static_cast<double>(tel->post_us);
  }
  if (prepared_) TearDownPrepared(L);
  std::lock_guard<std::mutex> lock(mu_);
  if (prepared_) {
    r_.rows_ms = std::max(r_.rows_ms, L.rows_ms);
    r_.local_list_ms = std::max(r_.local_list_ms, L.local_list_ms);
    r_.remote_list_ms = std::max(r_.remote_list_ms, L.remote_list_ms);
    r_.make_ms = std::max(r_.make_ms, L.make_ms);
    r_.local_rows += L.local_rows;
    r_.remote_rows += L.remote_rows;
    r_.transfers += L.transfers.size();
    r_.pairs += w_.batches[t].size();
    r_.merged_entries += merged;
    r_.post_us = std::max(r_.post_us, post_us);
  }
  r_.bytes += L.bytes;
  r_.requests += L.requests;
  r_.batches += L.batches;
  r_.sampled_batches += L.sampled;
  r_.verified_bytes += L.verified;
  r_.mismatches += L.mismatches;
  r_.mismatched_blocks += L.bad_blocks;
  r_.batch_lat_us.insert(r_.batch_lat_us.end(), L.batch_lat.begin(), L.batch_lat.end());
  r_.request_lat_us.insert(r_.request_lat_us.end(), L.request_lat.begin(), L.request_lat.end());
}

void MergePhase(PhaseResult& a, const PhaseResult& b) {
  a.bytes += b.bytes;
  a.requests += b.requests;
  a.batches += b.batches;
  a.seconds += b.seconds;
  a.batch_lat_us.insert(a.batch_lat_us.end(), b.batch_lat_us.begin(), b.batch_lat_us.end());
  a.request_lat_us.insert(a.request_lat_us.end(), b.request_lat_us.begin(), b.request_lat_us.end());
  a.sampled_batches += b.sampled_batches;
  a.verified_bytes += b.verified_bytes;
  a.mismatches += b.mismatches;
  a.mismatched_blocks += b.mismatched_blocks;
  a.cpu_initiator += b.cpu_initiator;  // NaN stays NaN
  a.cpu_target += b.cpu_target;
  a.post_us = std::max(a.post_us, b.post_us);
}

}  // namespace ferry::bench
