// `ferry bench`: roles, phases, baselines and the report.
//
// How the processes meet is kept apart from what is measured: the launcher
// (no --role) starts a target child and then acts as the initiator; the
// measurement code only sees a Session (an engine, an opened segment, a local
// buffer and, when the target can be reached, its control channel).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <latch>
#include <limits>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "bench_options.h"
#include "cli.h"
#include "commands.h"
#include "control.h"
#include "fabric_baseline.h"
#include "ferry/ferry.h"
#include "pattern.h"
#include "stats.h"
#include "workload.h"

#ifndef FERRY_TOOLS_SOURCE_DIR
#define FERRY_TOOLS_SOURCE_DIR "."
#endif

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;  // --json keeps the fields in the order written
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr uint64_t kMinBuffer = 64ull << 20;
constexpr uint64_t kReadSeed = 0x7265616473656564ull;
// Every kSampleEvery-th batch of each thread is waited for by polling, to
// time each request's completion (see docs/benchmarks.md).
constexpr uint64_t kSampleEvery = 16;
// --sweep caps one batch at this many bytes (bigger blocks: fewer of them).
constexpr uint64_t kSweepBatchBytes = 32ull << 20;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

std::string Fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Pad(const std::string& s, size_t width, bool left = false) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

[[noreturn]] void Fail(const std::string& what, const Status& s) {
  throw cli::RunError(what + ": " + s.ToString());
}

// Anonymous, page-aligned memory. populate: fault every page in now, so the
// first transfer does not pay for it.
class Buffer {
 public:
  Buffer(uint64_t length, bool populate, bool huge = false) : length_(length) {
    void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (populate && !huge ? MAP_POPULATE : 0), -1, 0);
    if (p == MAP_FAILED) {
      throw cli::RunError("cannot allocate a " + cli::FormatSize(length) +
                          " buffer: " + std::strerror(errno));
    }
    data_ = static_cast<uint8_t*>(p);
    if (huge) {
      if (madvise(p, length, MADV_HUGEPAGE) != 0) {
        std::fprintf(stderr, "ferry bench: madvise(MADV_HUGEPAGE): %s (continuing)\n",
                     std::strerror(errno));
      }
      if (populate) std::memset(p, 0, length);
    }
  }
  ~Buffer() { munmap(data_, length_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t length() const { return length_; }

 private:
  uint8_t* data_;
  uint64_t length_;
};

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// ---------------------------------------------------------------------------
// Target role

int RunTarget(const BenchOptions& o) {
  // Signals are taken by sigwait() below; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const uint64_t size = o.buffer_size > 0 ? o.buffer_size : (1ull << 30);
  Buffer buffer(size, o.buffer_size > 0, o.hugepages);
  ControlServer control(o.listen, buffer.data(), size);
  const std::string control_addr = JoinHostPort(o.listen, control.port());

  EngineOptions eo = o.MakeEngineOptions();
  // With a metadata service the initiator looks the target up by its name;
  // else the name lets an initiator started by hand find the control port
  // (see OpenSession).
  eo.local_name =
      o.ByName() ? o.name : std::string(kDefaultTargetName) + ",control=" + control_addr;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) Fail("cannot start the engine", engine.status());
  Status s = (*engine)->RegisterMemory(buffer.data(), size, "cpu:0");
  if (!s.ok()) Fail("cannot register the target buffer", s);

  std::printf("peer_id %s\ncontrol %s\n", (*engine)->PeerId().c_str(), control_addr.c_str());
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&sigs, &sig) != 0) {
  }
  control.Stop();
  (*engine)->UnregisterMemory(buffer.data()).IgnoreError();
  engine->reset();
  return 0;
}

// ---------------------------------------------------------------------------
// Launcher: a target child process

class TargetChild {
 public:
  TargetChild(const BenchOptions& o, uint64_t buffer_size) {
    std::vector<std::string> args = o.TargetArgs(buffer_size);
    args.insert(args.begin(), "ferry");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) throw cli::RunError(std::string("pipe: ") + std::strerror(errno));
    std::fflush(stdout);
    std::fflush(stderr);
    // Exec the real path (not /proc/self/exe) so the target is called "ferry" in ps.
    char exe[4096];
    ssize_t exe_len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (exe_len <= 0)
      throw cli::RunError(std::string("readlink /proc/self/exe: ") + std::strerror(errno));
    exe[exe_len] = 0;
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) throw cli::RunError(std::string("fork: ") + std::strerror(errno));
    if (pid_ == 0) {
      dup2(p[1], STDOUT_FILENO);
      setpgid(0, 0);  // a terminal's Ctrl-C goes to the launcher only
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(1);
      execv(exe, argv.data());
      std::fprintf(stderr, "ferry bench: cannot start the target: %s\n", std::strerror(errno));
      _exit(127);
    }
    close(p[1]);
    out_.reset(p[0]);
    ReadAddresses();
  }

  ~TargetChild() {
    if (pid_ > 0) Stop().IgnoreError();
  }

  const std::string& peer_id() const { return peer_id_; }
  const std::string& control() const { return control_; }

  // SIGTERM, then waits (10 s) for a clean exit.
  Status Stop() {
    pid_t pid = pid_;
    pid_ = -1;
    kill(pid, SIGTERM);
    int status = 0;
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (true) {
      pid_t r = waitpid(pid, &status, WNOHANG);
      if (r == pid) break;
      if (r < 0) return InternalError(std::string("waitpid: ") + std::strerror(errno));
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return DeadlineExceededError("the bench target did not exit within 10 s of SIGTERM");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return OkStatus();
    if (WIFSIGNALED(status)) {
      return InternalError("the bench target died of signal " + std::to_string(WTERMSIG(status)) +
                           " (" + strsignal(WTERMSIG(status)) + ") at shutdown");
    }
    return InternalError("the bench target exited with status " +
                         std::to_string(WEXITSTATUS(status)));
  }

 private:
  void ReadAddresses() {
    std::string text;
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (std::count(text.begin(), text.end(), '\n') < 2) {
      int left = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
      pollfd pfd{out_.get(), POLLIN, 0};
      if (left <= 0 || poll(&pfd, 1, left) == 0) {
        throw cli::RunError("the bench target did not report its address within 30 s");
      }
      char buf[512];
      ssize_t n = read(out_.get(), buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw cli::RunError("the bench target exited before it was ready (see its message above)");
      }
      text.append(buf, static_cast<size_t>(n));
    }
    std::istringstream lines(text);
    std::string key, value;
    while (lines >> key >> value) {
      if (key == "peer_id") peer_id_ = value;
      if (key == "control") control_ = value;
    }
    if (peer_id_.empty() || control_.empty()) {
      throw cli::RunError("the bench target printed something unexpected: " + text);
    }
  }

  pid_t pid_ = -1;
  Fd out_;
  std::string peer_id_, control_;
};

// ---------------------------------------------------------------------------
// Session: what a measurement needs, however the processes met.

struct Session {
  // --transport local: the target lives here too (destroyed last).
  std::unique_ptr<Buffer> target_buffer;
  std::unique_ptr<ControlServer> target_control;
  std::unique_ptr<Engine> target_engine;

  std::unique_ptr<Engine> engine;
  SegmentHandle segment;
  SegmentInfo info;
  uint64_t remote_base = 0;
  uint64_t remote_length = 0;
  std::unique_ptr<Buffer> local;

  bool have_control = false;
  std::string control_host;
  uint16_t control_port = 0;
  std::unique_ptr<ControlClient> control;  // the main thread's
  bool target_in_process = false;          // its CPU time is ours
  bool hugepages = false;

  ~Session() {
    if (engine && local) engine->UnregisterMemory(local->data()).IgnoreError();
    engine.reset();
    control.reset();
    if (target_control) target_control->Stop();
    target_engine.reset();
  }
};

void OpenSession(Session& s, const BenchOptions& o, const std::string& peer_id,
                 const std::string& control_addr, uint64_t local_bytes) {
  auto engine = Engine::Create(o.MakeEngineOptions());
  if (!engine.ok()) Fail("cannot start the engine", engine.status());
  s.engine = std::move(*engine);
  auto seg = s.engine->OpenSegment(peer_id);
  if (!seg.ok()) Fail("cannot open the target's segment " + peer_id, seg.status());
  s.segment = *seg;
  auto info = s.engine->QuerySegment(s.segment);
  if (!info.ok()) Fail("cannot query the target's segment " + peer_id, info.status());
  s.info = *info;
  if (s.info.regions.empty()) {
    throw cli::RunError("the target " + peer_id + " has registered no memory");
  }
  // The bench target registers one buffer; with several, use the largest.
  const RemoteRegion* best = &s.info.regions[0];
  for (const RemoteRegion& r : s.info.regions) {
    if (r.length > best->length) best = &r;
  }
  s.remote_base = best->addr;
  s.remote_length = best->length;

  std::string control = control_addr;
  if (control.empty()) {
    auto pos = s.info.engine_name.find("control=");
    if (pos != std::string::npos) control = s.info.engine_name.substr(pos + 8);
  }
  if (!control.empty()) {
    SplitHostPort("--control", control, &s.control_host, &s.control_port);
    s.control = std::make_unique<ControlClient>(s.control_host, s.control_port);
    s.have_control = true;
  }

  s.hugepages = o.hugepages;
  s.local = std::make_unique<Buffer>(local_bytes, true, o.hugepages);
  Status st = s.engine->RegisterMemory(s.local->data(), s.local->length(), "cpu:0");
  if (!st.ok()) Fail("cannot register the local buffer", st);
}

// ---------------------------------------------------------------------------
// Ferry phase

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

class Phase {
 public:
  // prepared: move each batch as prepared transfers (--prepared) rather than
  // as a plain batch.
  Phase(Session& s, const BenchOptions& o, const Workload& w, bool prepared = false)
      : s_(s), o_(o), w_(w), prepared_(prepared) {}

  PhaseResult Run(bool progress) {
    const int threads = static_cast<int>(w_.batches.size());
    r_.workload = w_.description;
    r_.op = o_.op;
    r_.threads = threads;
    r_.entries_per_batch = w_.batches[0].size();
    r_.sync = o_.sync;
    r_.verify = o_.verify;
    r_.prepared = prepared_;
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
    double target_cpu0 = kNaN;
    try {
      if (s_.have_control && !s_.target_in_process) target_cpu0 = s_.control->TargetCpuSeconds();
    } catch (...) {
      stop_.store(true);  // release the workers before giving up
      go.count_down();
      for (auto& t : workers) t.join();
      throw;
    }
    const double cpu0 = ProcessCpuSeconds();
    start_ = Clock::now();
    deadline_ = start_ + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(o_.duration));
    go.count_down();
    const bool tty = progress && isatty(STDERR_FILENO);
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
    for (auto& t : workers) t.join();
    const double cpu1 = ProcessCpuSeconds();
    if (tty) std::fprintf(stderr, "\r%80s\r", "");
    if (!error_.empty()) throw cli::RunError(error_);
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
    return std::move(r_);
  }

 private:
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

  static double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

  // --prepared: thread t's rows (from its slot layout), its local and remote
  // list, and one transfer per opcode whose index pairs are the batch's
  // entries. Throws cli::RunError.
  void SetUpPrepared(int t, Local& L) {
    Engine& engine = *s_.engine;
    const Layout& layout = w_.layouts[t];
    const auto& entries = w_.batches[t];
    auto t0 = Clock::now();
    std::vector<DescRow> local_rows =
        SlotRows(layout.local, reinterpret_cast<uintptr_t>(s_.local->data()));
    std::vector<DescRow> remote_rows = SlotRows(layout.remote, s_.remote_base);
    // [0]: writes, [1]: reads, in the batch's order.
    std::vector<uint32_t> local_index[2], remote_index[2];
    for (size_t i = 0; i < entries.size(); ++i) {
      const int k = entries[i].opcode == Opcode::kWrite ? 0 : 1;
      local_index[k].push_back(layout.local_index[i]);
      remote_index[k].push_back(layout.remote_index[i]);
    }
    auto t1 = Clock::now();
    auto local = engine.PrepareLocalList(local_rows);
    auto t2 = Clock::now();
    if (!local.ok()) Fail("PrepareLocalList (" + std::to_string(local_rows.size()) + " rows)", local.status());
    L.local_list = *local;
    auto remote = engine.PrepareRemoteList(s_.segment, remote_rows);
    auto t3 = Clock::now();
    if (!remote.ok()) {
      Fail("PrepareRemoteList (" + std::to_string(remote_rows.size()) + " rows)", remote.status());
    }
    L.remote_list = *remote;
    for (int k = 0; k < 2; ++k) {
      if (local_index[k].empty()) continue;
      auto tr = engine.MakeTransfer(k == 0 ? Opcode::kWrite : Opcode::kRead, *local, local_index[k],
                                    *remote, remote_index[k]);
      if (!tr.ok()) {
        Fail("MakeTransfer (" + std::to_string(local_index[k].size()) + " pairs)", tr.status());
      }
      L.transfers.push_back(*tr);
    }
    auto t4 = Clock::now();
    L.rows_ms = Millis(t1 - t0);
    L.local_list_ms = Millis(t2 - t1);
    L.remote_list_ms = Millis(t3 - t2);
    L.make_ms = Millis(t4 - t3);
    L.local_rows = local_rows.size();
    L.remote_rows = remote_rows.size();
  }

  void TearDownPrepared(Local& L) {
    Engine& engine = *s_.engine;
    for (TransferHandle h : L.transfers) engine.ReleaseTransfer(h).IgnoreError();
    if (L.local_list) engine.ReleaseDescList(*L.local_list).IgnoreError();
    if (L.remote_list) engine.ReleaseDescList(*L.remote_list).IgnoreError();
  }

  // --prepared: one iteration, every transfer posted, then each waited for.
  bool RunPrepared(int t, Local& L, bool record) {
    const auto& entries = w_.batches[t];
    Engine& engine = *s_.engine;
    const uint64_t seed = Mix64((static_cast<uint64_t>(t) + 1) << 40 | L.iteration);
    const size_t n = entries.size();
    if (o_.verify) Prepare(t, L, 0, n, seed);
    auto t0 = Clock::now();
    Status st;
    size_t posted = 0;
    for (; posted < L.transfers.size() && st.ok(); ++posted) st = engine.PostTransfer(L.transfers[posted]);
    if (!st.ok()) --posted;
    const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
        s_.engine->options().transfer_timeout + std::chrono::seconds(10));
    for (size_t i = 0; i < posted; ++i) {
      Status w = engine.WaitTransfer(L.transfers[i], timeout);
      if (st.ok()) st = w;
    }
    double us = Micros(Clock::now() - t0);
    if (!st.ok()) {
      SetError("prepared transfer of " + std::to_string(n) + " requests failed: " + st.ToString());
      return false;
    }
    if (o_.verify) Check(t, L, 0, n, seed);
    ++L.iteration;
    if (!record) return true;
    L.batch_lat.push_back(us);
    if (n == 1) L.request_lat.push_back(us);
    uint64_t bytes = w_.batch_bytes(t);
    L.bytes += bytes;
    L.requests += n;
    ++L.batches;
    done_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }

  void SetError(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = e;
    stop_.store(true);
  }

  // Verification around entries [i0, i1) of thread t's batch.
  void Prepare(int t, Local& L, size_t i0, size_t i1, uint64_t seed) {
    const auto& entries = w_.batches[t];
    std::vector<Range> remote_writes;
    for (size_t i = i0; i < i1; ++i) {
      const Entry& e = entries[i];
      uint8_t* p = s_.local->data() + e.local_off;
      if (e.opcode == Opcode::kWrite) {
        FillPattern(p, e.remote_off, e.length, seed);
        remote_writes.push_back({e.remote_off, e.length});
      } else {
        FillPattern(p, e.remote_off, e.length, kReadSeed, /*complement=*/true);
      }
    }
    if (!remote_writes.empty()) L.control->Poison(seed, remote_writes);
  }

  void Check(int t, Local& L, size_t i0, size_t i1, uint64_t seed) {
    const auto& entries = w_.batches[t];
    if (o_.inject_mismatch && t == 0 && L.iteration == 1 && i0 == 0) {
      // Damage 16 bytes of entry 0 where it landed (or 1 byte of a read).
      const Entry& e = entries[0];
      if (e.opcode == Opcode::kWrite) {
        L.control->Poison(seed, {{e.remote_off, std::min<uint64_t>(16, e.length)}});
      } else {
        s_.local->data()[e.local_off] ^= 0x5a;
      }
    }
    std::vector<Range> remote_writes;
    for (size_t i = i0; i < i1; ++i) {
      const Entry& e = entries[i];
      L.verified += e.length;
      if (e.opcode == Opcode::kWrite) {
        remote_writes.push_back({e.remote_off, e.length});
        continue;
      }
      uint64_t first = 0;
      uint64_t bad =
          CheckPattern(s_.local->data() + e.local_off, e.remote_off, e.length, kReadSeed, &first);
      if (bad > 0) {
        Report(t, L, "read", i, bad, first);
        L.mismatches += bad;
        ++L.bad_blocks;
      }
    }
    if (remote_writes.empty()) return;
    uint64_t first = 0;
    uint64_t bad = L.control->Check(seed, remote_writes, &first);
    if (bad > 0) {
      // Find which blocks, for the count and the message.
      uint64_t blocks = 0;
      for (const Range& r : remote_writes) {
        uint64_t f = 0;
        if (L.control->Check(seed, {r}, &f) > 0) ++blocks;
      }
      Report(t, L, "write", i0, bad, first);
      L.mismatches += bad;
      L.bad_blocks += blocks;
    }
  }

  void Report(int t, const Local& L, const char* dir, size_t index, uint64_t bad, uint64_t first) {
    std::lock_guard<std::mutex> lock(mu_);
    if (++reports_ > 10) return;
    std::fprintf(stderr,
                 "ferry bench: verify: thread %d batch %llu: %llu bytes differ (%s, from entry "
                 "%zu); first bad byte at target offset %llu\n",
                 t, static_cast<unsigned long long>(L.iteration),
                 static_cast<unsigned long long>(bad), dir, index,
                 static_cast<unsigned long long>(first));
  }

  // One batch (or, with --sync, one pass of single requests). Returns false on error.
  bool RunBatch(int t, Local& L, bool record) {
    if (prepared_) return RunPrepared(t, L, record);
    const auto& entries = w_.batches[t];
    Engine& engine = *s_.engine;
    const uint64_t seed = Mix64((static_cast<uint64_t>(t) + 1) << 40 | L.iteration);
    if (o_.sync) {
      size_t n = record ? entries.size() : std::min<size_t>(entries.size(), 16);
      for (size_t i = 0; i < n; ++i) {
        if (stop_.load(std::memory_order_relaxed)) return true;
        if (o_.verify) Prepare(t, L, i, i + 1, seed + i);
        auto t0 = Clock::now();
        Status st = engine.TransferSync(L.reqs[i]);
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
      if (!sampled) {
        st = engine.WaitBatch(*batch,
                              std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      } else {
        size_t seen = 0;
        const auto give_up = t0 + timeout;
        while (true) {
          auto bs = engine.GetBatchStatus(*batch);
          if (!bs.ok()) {
            st = bs.status();
            break;
          }
          size_t done = bs->completed + bs->failed;
          if (done > seen) {
            double us = Micros(Clock::now() - t0);
            for (; seen < done; ++seen) L.request_lat.push_back(us);
          }
          if (bs->failed > 0) {
            st = bs->first_error;
            break;
          }
          if (done >= n) break;
          if (Clock::now() > give_up) {
            st = DeadlineExceededError("batch still pending after the transfer timeout");
            break;
          }
          // Poll ~256 times per batch (5 µs .. 1 ms apart), so watching costs little.
          std::this_thread::sleep_for(std::chrono::microseconds(
              std::clamp<int64_t>(static_cast<int64_t>(L.last_batch_us / 256), 5, 1000)));
        }
      }
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
    if (!record) return true;
    if (!sampled) L.batch_lat.push_back(us);
    if (sampled) ++L.sampled;
    if (n == 1) L.request_lat.push_back(us);
    uint64_t bytes = w_.batch_bytes(t);
    L.bytes += bytes;
    L.requests += n;
    ++L.batches;
    done_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }

  void Worker(int t, std::latch& warmed, std::latch& go, Clock::time_point& end) {
    prctl(PR_SET_TIMERSLACK, 1000);  // 1 µs: the sampled batches poll with short sleeps
    Local L;
    bool ok = true;
    try {
      for (const Entry& e : w_.batches[t]) {
        L.reqs.push_back({e.opcode, s_.local->data() + e.local_off, s_.segment,
                          s_.remote_base + e.remote_off, e.length});
      }
      if (o_.verify) L.control = std::make_unique<ControlClient>(s_.control_host, s_.control_port);
      if (prepared_) SetUpPrepared(t, L);
      ok = RunBatch(t, L, false);  // warm-up: connections, page faults
    } catch (const std::exception& e) {
      SetError(e.what());
      ok = false;
    }
    warmed.count_down();
    go.wait();
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
    end = Clock::now();
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

// ---------------------------------------------------------------------------
// Baselines

struct Baseline {
  StreamResult single, multi, scatter;
  double cpu_scatter_initiator = kNaN, cpu_scatter_target = kNaN;
  double cpu_single_initiator = kNaN, cpu_single_target = kNaN;
  double cpu_multi_initiator = kNaN, cpu_multi_target = kNaN;
  std::vector<double> rtt_us;
  double memcpy_gbps = kNaN;
  double stream_seconds = 0;
};

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

// scatter: also run the scatter baseline on w's entries.
Baseline RunBaselines(Session& s, const BenchOptions& o, const Workload& w, double seconds,
                      int streams, bool scatter) {
  Baseline b;
  b.stream_seconds = seconds;
  if (!s.have_control) return b;
  auto dirs = [&](int n) {
    std::vector<bool> d;
    for (int i = 0; i < n; ++i) {
      d.push_back(o.op == Operation::kWrite || (o.op == Operation::kMixed && i % 2 == 0));
    }
    return d;
  };
  auto measure = [&](int n, StreamResult* r, double* cpu_i, double* cpu_t) {
    double t0 = s.target_in_process ? kNaN : s.control->TargetCpuSeconds();
    double c0 = ProcessCpuSeconds();
    *r = RunPlainStreams(s.control_host, s.control_port, dirs(n), s.local->data(),
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
  if (scatter && !o.sync) {
    // The workload's own entries (every thread's), split into `streams`
    // contiguous runs, one per stream.
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
    b.scatter = RunScatterStreams(s.control_host, s.control_port, dirs(n), s.local->data(), local,
                                  remote, seconds);
    b.cpu_scatter_initiator = ProcessCpuSeconds() - c0;
    if (!s.target_in_process) b.cpu_scatter_target = s.control->TargetCpuSeconds() - t0;
  }
  b.rtt_us = RunPingPong(s.control_host, s.control_port, 0.3, 200000);
  b.memcpy_gbps = MemcpyGbps(s, w);
  return b;
}

double Sum(double a, double b) {
  if (std::isnan(b)) return a;
  return a + b;
}

// ---------------------------------------------------------------------------
// --prepared: preparing 1 M rows

constexpr uint64_t kMicroRows = 1ull << 20;
constexpr uint64_t kMicroRowBytes = 256;
// What the buffers need for kMicroRows rows of kMicroRowBytes.
constexpr uint64_t kMicroBytes = kMicroRows * kMicroRowBytes;

struct PrepareMicro {
  uint64_t rows = 0;  // 0: not run (a buffer too small for a row per byte)
  uint64_t local_row_bytes = 0, remote_row_bytes = 0;
  // Medians of 3 rounds, ms: building the local list's rows (a vector of
  // DescRow), PrepareLocalList, PrepareRemoteList.
  double build_ms = kNaN, local_ms = kNaN, remote_ms = kNaN;
};

double Median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One row per kMicroRowBytes (less where a buffer is smaller than
// kMicroBytes) of each side's buffer, prepared as one list of 1 M rows.
PrepareMicro RunPrepareMicro(Session& s) {
  PrepareMicro m;
  m.local_row_bytes = std::min(kMicroRowBytes, s.local->length() / kMicroRows);
  m.remote_row_bytes = std::min(kMicroRowBytes, s.remote_length / kMicroRows);
  if (m.local_row_bytes == 0 || m.remote_row_bytes == 0) return m;
  m.rows = kMicroRows;
  auto rows_of = [](uint64_t base, uint64_t len) {
    std::vector<DescRow> rows(kMicroRows);
    for (uint64_t i = 0; i < kMicroRows; ++i) rows[i] = {base + i * len, len, 0, 1};
    return rows;
  };
  std::vector<double> build, local, remote;
  for (int round = 0; round < 3; ++round) {
    auto t0 = Clock::now();
    std::vector<DescRow> lrows =
        rows_of(reinterpret_cast<uintptr_t>(s.local->data()), m.local_row_bytes);
    auto t1 = Clock::now();
    std::vector<DescRow> rrows = rows_of(s.remote_base, m.remote_row_bytes);
    auto t2 = Clock::now();
    auto l = s.engine->PrepareLocalList(lrows);
    auto t3 = Clock::now();
    if (!l.ok()) Fail("PrepareLocalList of 1 M rows", l.status());
    auto r = s.engine->PrepareRemoteList(s.segment, rrows);
    auto t4 = Clock::now();
    if (!r.ok()) Fail("PrepareRemoteList of 1 M rows", r.status());
    s.engine->ReleaseDescList(*l).IgnoreError();
    s.engine->ReleaseDescList(*r).IgnoreError();
    build.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    local.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
    remote.push_back(std::chrono::duration<double, std::milli>(t4 - t3).count());
  }
  m.build_ms = Median(build);
  m.local_ms = Median(local);
  m.remote_ms = Median(remote);
  return m;
}

// ---------------------------------------------------------------------------
// Report

struct Report {
  PhaseResult ferry;
  Percentiles batch_lat, request_lat;
  std::optional<Baseline> base;
  Percentiles rtt;
  int streams = 0;
  bool in_process = false;
  // --prepared: `ferry` is the prepared phase; `plain` the plain batches of
  // the same requests.
  std::optional<PhaseResult> plain;
  Percentiles plain_batch_lat;
  PrepareMicro micro;
  // --transport fabric: the plain libfabric RMA loop on the same entries.
  std::optional<FabricBaselineResult> fabric;
};

Report MakeReport(PhaseResult r, std::optional<Baseline> base, int streams, bool in_process) {
  Report rep;
  rep.ferry = std::move(r);
  rep.batch_lat = Summarize(rep.ferry.batch_lat_us);
  rep.request_lat = Summarize(rep.ferry.request_lat_us);
  if (base) rep.rtt = Summarize(base->rtt_us);
  rep.base = std::move(base);
  rep.streams = streams;
  rep.in_process = in_process;
  return rep;
}

double Ratio(double a, double b) {
  return (b > 0 && std::isfinite(a) && std::isfinite(b)) ? a / b : kNaN;
}

// --prepared: the prepared phase next to the plain batches, the set-up and
// the 1 M-row figure.
void PrintPrepared(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  const PhaseResult& p = *rep.plain;
  const size_t W = 12;
  os << "\nprepared transfers vs plain batches of the same requests\n"
     << Pad("", 24, true) << Pad("prepared", W) << Pad("plain", W) << Pad("ratio", W) << "\n"
     << Pad("throughput GB/s", 24, true) << Pad(Fixed(f.gbps(), 3), W) << Pad(Fixed(p.gbps(), 3), W)
     << Pad(Fixed(Ratio(f.gbps(), p.gbps()), 2) + "x", W) << "\n"
     << Pad("batch p50 µs", 24, true) << Pad(Fixed(rep.batch_lat.p50, 1), W)
     << Pad(Fixed(rep.plain_batch_lat.p50, 1), W)
     << Pad(Fixed(Ratio(rep.batch_lat.p50, rep.plain_batch_lat.p50), 2) + "x", W) << "\n"
     << Pad("batch p99 µs", 24, true) << Pad(Fixed(rep.batch_lat.p99, 1), W)
     << Pad(Fixed(rep.plain_batch_lat.p99, 1), W) << "\n";
  os << "set-up (ms, slowest thread): rows " << Fixed(f.rows_ms, 3) << " (" << f.local_rows
     << " local, " << f.remote_rows << " remote), PrepareLocalList " << Fixed(f.local_list_ms, 3)
     << ", PrepareRemoteList " << Fixed(f.remote_list_ms, 3) << ", MakeTransfer "
     << Fixed(f.make_ms, 3) << " (" << f.transfers << (f.transfers == 1 ? " transfer, " : " transfers, ")
     << f.pairs << " pairs, " << f.merged_entries << " entries after merging); last post "
     << Fixed(f.post_us, 1) << " µs\n";
  if (p.verify) {
    os << "plain batches verified " << p.verified_bytes << " bytes: " << p.mismatches
       << " bytes differ" << (p.mismatches == 0 ? " (all good)" : " (FAILED)") << "\n";
  }
  const PrepareMicro& m = rep.micro;
  if (m.rows > 0) {
    os << "1 M rows (" << m.rows << " of " << m.local_row_bytes << " B local, "
       << m.remote_row_bytes << " B remote), median of 3: building " << Fixed(m.build_ms, 2)
       << " ms, PrepareLocalList " << Fixed(m.local_ms, 2) << " ms, PrepareRemoteList "
       << Fixed(m.remote_ms, 2) << " ms\n";
  } else {
    os << "1 M rows: not run (a buffer is smaller than 1 MiB)\n";
  }
}

void PrintTable(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  os << "ferry bench: " << OperationName(f.op) << ", " << f.workload
     << (f.sync ? " (synchronous, one request at a time)" : "")
     << (f.prepared ? " (prepared transfers)" : "") << ", " << f.threads
     << (f.threads == 1 ? " thread" : " threads") << ", " << rep.streams << " streams, transport "
     << f.transport << ", " << Fixed(f.seconds, 2) << " s\n\n";
  const bool b = rep.base.has_value() && rep.base->single.seconds > 0;
  const size_t W = 12;
  os << Pad("", 24, true) << Pad("Ferry", W);
  const bool sc = b && rep.base->scatter.seconds > 0;
  if (b) {
    os << Pad("plain x1", W) << Pad("plain x" + std::to_string(rep.base->multi.streams), W);
    if (sc) os << Pad("scatter x" + std::to_string(rep.base->scatter.streams), W);
    os << Pad("memcpy", W);
  }
  os << "\n" << Pad("throughput GB/s", 24, true) << Pad(Fixed(f.gbps(), 3), W);
  if (b) {
    os << Pad(Fixed(rep.base->single.gbps(), 3), W) << Pad(Fixed(rep.base->multi.gbps(), 3), W);
    if (sc) os << Pad(Fixed(rep.base->scatter.gbps(), 3), W);
    os << Pad(Fixed(rep.base->memcpy_gbps, 3), W);
    os << "\n"
       << Pad("Ferry / baseline", 24, true) << Pad("", W)
       << Pad(Fixed(Ratio(f.gbps(), rep.base->single.gbps()), 2) + "x", W)
       << Pad(Fixed(Ratio(f.gbps(), rep.base->multi.gbps()), 2) + "x", W);
    if (sc) os << Pad(Fixed(Ratio(f.gbps(), rep.base->scatter.gbps()), 2) + "x", W);
    os << Pad(Fixed(Ratio(f.gbps(), rep.base->memcpy_gbps), 2) + "x", W);
  }
  os << "\n" << Pad("requests/s", 24, true) << Pad(Fixed(f.rps(), 0), W) << "\n";
  auto per_gb = [](double cpu, uint64_t bytes) { return bytes ? cpu / (bytes / 1e9) : kNaN; };
  auto cpu_row = [&](const char* name, double ferry, double single, double multi, uint64_t sbytes,
                     uint64_t mbytes, double scatter) {
    os << Pad(name, 24, true) << Pad(Fixed(f.cpu_per_gb(ferry), 3), W);
    if (b) {
      os << Pad(Fixed(per_gb(single, sbytes), 3), W) << Pad(Fixed(per_gb(multi, mbytes), 3), W);
      if (sc) os << Pad(Fixed(per_gb(scatter, rep.base->scatter.bytes), 3), W);
    }
    os << "\n";
  };
  if (rep.in_process) {
    cpu_row("CPU s/GB (one process)", f.cpu_initiator, b ? rep.base->cpu_single_initiator : kNaN,
            b ? rep.base->cpu_multi_initiator : kNaN, b ? rep.base->single.bytes : 0,
            b ? rep.base->multi.bytes : 0, b ? rep.base->cpu_scatter_initiator : kNaN);
  } else {
    cpu_row("CPU s/GB initiator", f.cpu_initiator, b ? rep.base->cpu_single_initiator : kNaN,
            b ? rep.base->cpu_multi_initiator : kNaN, b ? rep.base->single.bytes : 0,
            b ? rep.base->multi.bytes : 0, b ? rep.base->cpu_scatter_initiator : kNaN);
    cpu_row("CPU s/GB target", f.cpu_target, b ? rep.base->cpu_single_target : kNaN,
            b ? rep.base->cpu_multi_target : kNaN, b ? rep.base->single.bytes : 0,
            b ? rep.base->multi.bytes : 0, b ? rep.base->cpu_scatter_target : kNaN);
    cpu_row("CPU s/GB both sides", Sum(f.cpu_initiator, f.cpu_target),
            b ? Sum(rep.base->cpu_single_initiator, rep.base->cpu_single_target) : kNaN,
            b ? Sum(rep.base->cpu_multi_initiator, rep.base->cpu_multi_target) : kNaN,
            b ? rep.base->single.bytes : 0, b ? rep.base->multi.bytes : 0,
            b ? Sum(rep.base->cpu_scatter_initiator, rep.base->cpu_scatter_target) : kNaN);
  }
  os << "\n"
     << Pad("latency (µs)", 26, true) << Pad("p50", W) << Pad("p99", W) << Pad("p99.9", W)
     << Pad("samples", W) << "\n";
  auto lat_row = [&](const std::string& name, const Percentiles& p) {
    os << Pad(name, 24, true) << Pad(Fixed(p.p50, 1), W) << Pad(Fixed(p.p99, 1), W)
       << Pad(Fixed(p.p999, 1), W) << Pad(std::to_string(p.count), W) << "\n";
  };
  lat_row(f.sync ? "per request (sync)" : "per batch", rep.batch_lat);
  // A prepared transfer reports no per-request completions.
  if (!f.sync && !(f.prepared && f.entries_per_batch > 1)) {
    lat_row(f.entries_per_batch > 1 ? "per request (sampled)" : "per request", rep.request_lat);
  }
  if (b) lat_row("plain busy-poll RTT 8 B", rep.rtt);
  if (b) {
    os << "\nFerry / plain " << rep.base->multi.streams
       << " streams: " << Fixed(Ratio(f.gbps(), rep.base->multi.gbps()), 2)
       << "x   Ferry / plain 1 stream: " << Fixed(Ratio(f.gbps(), rep.base->single.gbps()), 2)
       << "x";
    if (f.sync) {
      os << "   Ferry p50 / busy-poll RTT: " << Fixed(Ratio(rep.request_lat.p50, rep.rtt.p50), 2)
         << "x";
    }
    double fc = f.cpu_per_gb(Sum(f.cpu_initiator, f.cpu_target));
    double bc = rep.base->multi.bytes
                    ? Sum(rep.base->cpu_multi_initiator, rep.base->cpu_multi_target) /
                          (rep.base->multi.bytes / 1e9)
                    : kNaN;
    os << "   CPU / plain: " << Fixed(Ratio(fc, bc), 2) << "x\n";
  } else if (rep.base) {
    os << "\n(baselines skipped: the target's control port is unknown; pass --control)\n";
  }
  if (f.verify) {
    os << "verified " << f.verified_bytes << " bytes: " << f.mismatches << " bytes differ in "
       << f.mismatched_blocks << " blocks" << (f.mismatches == 0 ? " (all good)" : " (FAILED)")
       << "\n";
  }
  if (rep.fabric) {
    const FabricBaselineResult& fb = *rep.fabric;
    if (!fb.error.empty()) {
      os << "\nfabric baseline (plain libfabric RMA, " << fb.provider << "): not run: " << fb.error << "\n";
    } else {
      os << "\nfabric baseline: plain libfabric RMA loop, " << fb.provider
         << ", two endpoints in this process, " << fb.depth << " ops in flight, one entry per op"
         << (f.op == Operation::kRead ? "" : ", writes FI_DELIVERY_COMPLETE") << "\n"
         << Pad("throughput GB/s", 24, true) << Pad(Fixed(fb.gbps(), 3), W) << "   ("
         << Fixed(fb.ops / std::max(fb.seconds, 1e-9), 0) << " ops/s, CPU "
         << Fixed(fb.bytes ? fb.cpu_seconds / (fb.bytes / 1e9) : kNaN, 3) << " s/GB)\n"
         << "Ferry fabric / libfabric baseline: " << Fixed(Ratio(f.gbps(), fb.gbps()), 2) << "x\n";
    }
  }
  if (rep.plain) PrintPrepared(rep, os);
}

// A measured figure in --json: six significant digits, null when there is
// none (NaN: not measured).
Json Figure(double v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return std::strtod(buf, nullptr);
}

Json LatencyJson(const Percentiles& p) {
  return {{"p50", Figure(p.p50)},
          {"p99", Figure(p.p99)},
          {"p999", Figure(p.p999)},
          {"max", Figure(p.max)},
          {"samples", static_cast<uint64_t>(p.count)}};
}

// The fields of one measurement, added to `j` (an object).
void AddJsonBody(Json& j, const Report& rep) {
  const PhaseResult& f = rep.ferry;
  j["operation"] = OperationName(f.op);
  j["workload"] = f.workload;
  if (f.block > 0) j["block_size"] = f.block;
  j["entries_per_batch"] = f.entries_per_batch;
  j["threads"] = f.threads;
  j["streams"] = rep.streams;
  j["sync"] = f.sync;
  j["transport"] = f.transport;
  j["seconds"] = Figure(f.seconds);
  j["bytes"] = f.bytes;
  j["requests"] = f.requests;
  j["batches"] = f.batches;
  j["throughput_gbps"] = Figure(f.gbps());
  j["requests_per_s"] = Figure(f.rps());
  j["latency_us"] =
      LatencyJson(f.sync || f.entries_per_batch == 1 ? rep.batch_lat : rep.request_lat);
  j["batch_latency_us"] = LatencyJson(rep.batch_lat);
  j["request_latency_sampled_batches"] = f.sampled_batches;
  j["verify"] = f.verify;
  j["verified_bytes"] = f.verified_bytes;
  j["mismatches"] = f.mismatches;
  j["mismatched_blocks"] = f.mismatched_blocks;
  const double ferry_cpu = f.cpu_per_gb(Sum(f.cpu_initiator, f.cpu_target));
  j["cpu_s_per_gb"] = {{"initiator", Figure(rep.in_process ? kNaN : f.cpu_per_gb(f.cpu_initiator))},
                       {"target", Figure(rep.in_process ? kNaN : f.cpu_per_gb(f.cpu_target))},
                       {"total", Figure(ferry_cpu)}};
  if (rep.plain) {
    const PhaseResult& p = *rep.plain;
    const PrepareMicro& m = rep.micro;
    j["prepared"] = {
        {"rows_ms", Figure(f.rows_ms)},
        {"local_list_ms", Figure(f.local_list_ms)},
        {"remote_list_ms", Figure(f.remote_list_ms)},
        {"make_transfer_ms", Figure(f.make_ms)},
        {"local_rows", f.local_rows},
        {"remote_rows", f.remote_rows},
        {"transfers", f.transfers},
        {"pairs", f.pairs},
        {"entries_after_merge", f.merged_entries},
        {"last_post_us", Figure(f.post_us)},
        {"plain_throughput_gbps", Figure(p.gbps())},
        {"plain_batch_latency_us", LatencyJson(rep.plain_batch_lat)},
        {"plain_verified_bytes", p.verified_bytes},
        {"plain_mismatches", p.mismatches},
        {"ratio_vs_plain", Figure(Ratio(f.gbps(), p.gbps()))},
        {"million_rows",
         {{"rows", m.rows},
          {"local_row_bytes", m.local_row_bytes},
          {"remote_row_bytes", m.remote_row_bytes},
          {"build_ms", Figure(m.build_ms)},
          {"local_list_ms", Figure(m.local_ms)},
          {"remote_list_ms", Figure(m.remote_ms)}}}};
  } else {
    j["prepared"] = nullptr;
  }
  if (rep.fabric) {
    const FabricBaselineResult& fb = *rep.fabric;
    j["fabric_baseline"] = {
        {"provider", fb.provider},
        {"error", fb.error},
        {"in_process", true},
        {"ops_in_flight", fb.depth},
        {"throughput_gbps", Figure(fb.error.empty() ? fb.gbps() : kNaN)},
        {"ops", fb.ops},
        {"seconds", Figure(fb.seconds)},
        {"cpu_s_per_gb", Figure(fb.bytes ? fb.cpu_seconds / (fb.bytes / 1e9) : kNaN)},
        {"ratio", Figure(fb.error.empty() ? Ratio(f.gbps(), fb.gbps()) : kNaN)}};
  } else {
    j["fabric_baseline"] = nullptr;
  }
  if (!rep.base || rep.base->single.seconds <= 0) {
    j["baseline"] = nullptr;
    return;
  }
  const Baseline& b = *rep.base;
  double multi_cpu =
      b.multi.bytes ? Sum(b.cpu_multi_initiator, b.cpu_multi_target) / (b.multi.bytes / 1e9) : kNaN;
  double request_p50 =
      (f.sync || f.entries_per_batch == 1) ? rep.batch_lat.p50 : rep.request_lat.p50;
  Json base;
  base["socket_gbps"] = Figure(b.multi.gbps());
  base["socket_streams"] = b.multi.streams;
  base["socket_single_gbps"] = Figure(b.single.gbps());
  base["socket_rtt_us"] = Figure(rep.rtt.p50);
  base["socket_rtt_latency_us"] = LatencyJson(rep.rtt);
  base["scatter_gbps"] = Figure(b.scatter.seconds > 0 ? b.scatter.gbps() : kNaN);
  base["scatter_streams"] = b.scatter.streams;
  base["scatter_cpu_s_per_gb"] = Figure(
      b.scatter.bytes ? Sum(b.cpu_scatter_initiator, b.cpu_scatter_target) / (b.scatter.bytes / 1e9)
                      : kNaN);
  base["memcpy_gbps"] = Figure(b.memcpy_gbps);
  base["stream_seconds"] = Figure(b.stream_seconds);
  const bool split = b.multi.bytes && !rep.in_process;
  base["cpu_s_per_gb"] = {
      {"initiator", Figure(split ? b.cpu_multi_initiator / (b.multi.bytes / 1e9) : kNaN)},
      {"target", Figure(split ? b.cpu_multi_target / (b.multi.bytes / 1e9) : kNaN)},
      {"total", Figure(multi_cpu)}};
  base["ratios"] = {
      {"vs_socket", Figure(Ratio(f.gbps(), b.multi.gbps()))},
      {"vs_single_stream", Figure(Ratio(f.gbps(), b.single.gbps()))},
      {"vs_scatter", Figure(b.scatter.seconds > 0 ? Ratio(f.gbps(), b.scatter.gbps()) : kNaN)},
      {"vs_memcpy", Figure(Ratio(f.gbps(), b.memcpy_gbps))},
      {"p50_vs_rtt", Figure(Ratio(request_p50, rep.rtt.p50))},
      {"cpu_vs_socket", Figure(Ratio(ferry_cpu, multi_cpu))}};
  j["baseline"] = std::move(base);
}

// One line of JSON on stdout.
void PrintJson(const Json& j) {
  std::cout << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
}

// ---------------------------------------------------------------------------
// Sweep

std::string FindPlotScript(const BenchOptions& o) {
  if (!o.plot_script.empty()) return o.plot_script;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = 0;
    std::string dir(exe);
    dir = dir.substr(0, dir.rfind('/'));
    for (const std::string& candidate : {dir + "/plot_sweep.py", dir + "/../tools/plot_sweep.py"}) {
      if (access(candidate.c_str(), R_OK) == 0) return candidate;
    }
  }
  return std::string(FERRY_TOOLS_SOURCE_DIR) + "/plot_sweep.py";
}

// Runs python3 SCRIPT CSV PNG. Returns an error message, or "" on success.
std::string Plot(const BenchOptions& o, const std::string& csv, const std::string& png) {
  std::string script = FindPlotScript(o);
  if (access(script.c_str(), R_OK) != 0) return "chart script not found: " + script;
  const char* python = access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execlp(python, python, script.c_str(), csv.c_str(), png.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  return std::string(python) + " " + script + " failed (is python3-matplotlib installed?)";
}

int RunSweep(Session& s, const BenchOptions& o) {
  struct Point {
    uint64_t threads, block, batch;
    Report rep;
  };
  std::vector<Point> points;
  const int streams = s.engine->options().tcp_streams;
  Workload biggest;
  for (uint64_t threads : o.sweep_threads) {
    for (uint64_t block : o.sweep_blocks) {
      uint64_t batch = std::min<uint64_t>(o.batch, std::max<uint64_t>(1, kSweepBatchBytes / block));
      Workload w = MakeBlockWorkload(o.op, block, batch, static_cast<int>(threads));
      BenchOptions po = o;
      po.threads = static_cast<int>(threads);
      po.block = block;
      po.batch = batch;
      if (!o.json) {
        std::fprintf(stderr, "sweep: %llu thread(s), %s x %llu ...\n",
                     static_cast<unsigned long long>(threads), cli::FormatSize(block).c_str(),
                     static_cast<unsigned long long>(batch));
      }
      PhaseResult r = Phase(s, po, w).Run(!o.json);
      r.block = block;
      points.push_back({threads, block, batch,
                        MakeReport(std::move(r), std::nullopt, streams, s.target_in_process)});
      if (w.batch_bytes(0) > (biggest.batches.empty() ? 0 : biggest.batch_bytes(0))) biggest = w;
    }
  }
  std::optional<Baseline> base;
  Percentiles rtt;
  if (!o.no_baseline && s.have_control) {
    base = RunBaselines(s, o, biggest, std::clamp(o.duration, 0.5, 1.0), streams, false);
    rtt = Summarize(base->rtt_us);
  }
  // CSV
  const std::string csv = o.output + ".csv", png = o.output + ".png";
  {
    std::ofstream out(csv);
    if (!out) throw cli::RunError("cannot write " + csv);
    out << "threads,block_size,batch_size,throughput_gbps,requests_per_s,batch_p50_us,batch_p99_us,"
           "request_p50_us,request_p99_us,cpu_s_per_gb,socket_gbps,socket_single_gbps,"
           "socket_rtt_us,memcpy_gbps,transport\n";
    for (const Point& p : points) {
      const PhaseResult& f = p.rep.ferry;
      out << p.threads << "," << p.block << "," << p.batch << "," << f.gbps() << "," << f.rps()
          << "," << p.rep.batch_lat.p50 << "," << p.rep.batch_lat.p99 << ","
          << p.rep.request_lat.p50 << "," << p.rep.request_lat.p99 << ","
          << f.cpu_per_gb(Sum(f.cpu_initiator, f.cpu_target)) << ","
          << (base ? base->multi.gbps() : kNaN) << "," << (base ? base->single.gbps() : kNaN) << ","
          << rtt.p50 << "," << (base ? base->memcpy_gbps : kNaN) << "," << f.transport << "\n";
    }
  }
  std::string plot_error = Plot(o, csv, png);
  if (o.json) {
    Json j;
    j["ferry_version"] = Version();
    j["operation"] = OperationName(o.op);
    j["streams"] = streams;
    j["transport"] = points.empty() ? "" : points[0].rep.ferry.transport;
    j["points"] = Json::array();
    for (const Point& p : points) {
      Json point;
      point["batch_size"] = p.batch;
      AddJsonBody(point, p.rep);
      j["points"].push_back(std::move(point));
    }
    if (base) {
      j["baseline"] = {{"socket_gbps", Figure(base->multi.gbps())},
                       {"socket_streams", base->multi.streams},
                       {"socket_single_gbps", Figure(base->single.gbps())},
                       {"socket_rtt_us", Figure(rtt.p50)},
                       {"memcpy_gbps", Figure(base->memcpy_gbps)}};
    } else {
      j["baseline"] = nullptr;
    }
    j["csv"] = csv;
    j["chart"] = plot_error.empty() ? png : "";
    PrintJson(j);
  } else {
    std::cout << "ferry bench --sweep: " << OperationName(o.op) << ", " << streams
              << " streams, transport " << (points.empty() ? "" : points[0].rep.ferry.transport)
              << "\n\n";
    std::cout << Pad("threads", 8) << Pad("block", 10) << Pad("batch", 7) << Pad("GB/s", 9)
              << Pad("req/s", 11) << Pad("batch p50", 12) << Pad("batch p99", 12)
              << Pad("req p50", 11) << Pad("req p99", 11) << Pad("vs plain", 10) << "\n";
    for (const Point& p : points) {
      const PhaseResult& f = p.rep.ferry;
      std::cout << Pad(std::to_string(p.threads), 8) << Pad(cli::FormatSize(p.block), 10)
                << Pad(std::to_string(p.batch), 7) << Pad(Fixed(f.gbps(), 3), 9)
                << Pad(Fixed(f.rps(), 0), 11) << Pad(Fixed(p.rep.batch_lat.p50, 1), 12)
                << Pad(Fixed(p.rep.batch_lat.p99, 1), 12)
                << Pad(Fixed(p.rep.request_lat.p50, 1), 11)
                << Pad(Fixed(p.rep.request_lat.p99, 1), 11)
                << Pad(base ? Fixed(Ratio(f.gbps(), base->multi.gbps()), 2) + "x" : "-", 10)
                << "\n";
    }
    if (base) {
      std::cout << "\nplain TCP: 1 stream " << Fixed(base->single.gbps(), 3) << " GB/s, "
                << base->multi.streams << " streams " << Fixed(base->multi.gbps(), 3)
                << " GB/s; busy-poll RTT p50 " << Fixed(rtt.p50, 1) << " µs; memcpy "
                << Fixed(base->memcpy_gbps, 2) << " GB/s\n";
    }
    std::cout << "latencies in µs; wrote " << csv;
    if (plot_error.empty()) std::cout << " and " << png;
    std::cout << "\n";
  }
  if (!plot_error.empty())
    std::fprintf(stderr, "ferry bench: chart not written: %s\n", plot_error.c_str());
  return 0;
}

// ---------------------------------------------------------------------------

Workload MakeWorkload(const BenchOptions& o) {
  if (o.kv) return MakeKvWorkload(o.op, *o.kv, o.threads);
  Workload w = MakeBlockWorkload(o.op, o.block, o.batch, o.threads);
  return w;
}

// Buffer bytes the initiator's workload(s) need on each side.
uint64_t NeededBytes(const BenchOptions& o) {
  if (!o.sweep) return MakeWorkload(o).remote_bytes;
  uint64_t most = 0;
  for (uint64_t threads : o.sweep_threads) {
    for (uint64_t block : o.sweep_blocks) {
      uint64_t batch = std::min<uint64_t>(o.batch, std::max<uint64_t>(1, kSweepBatchBytes / block));
      most = std::max(most, block * batch * threads);
    }
  }
  return most;
}

int RunInitiator(const BenchOptions& o, Session& s) {
  if (o.sweep) return RunSweep(s, o);
  Workload w = MakeWorkload(o);
  if (w.remote_bytes > s.remote_length) {
    throw cli::RunError("the target's buffer is " + std::to_string(s.remote_length) +
                        " bytes; this workload needs " + std::to_string(w.remote_bytes) +
                        " (start the target with --buffer-size " + std::to_string(w.remote_bytes) +
                        ")");
  }
  PhaseResult r;
  std::optional<PhaseResult> plain;
  PrepareMicro micro;
  if (o.prepared) {
    // Prepared, plain, plain, prepared, each half the duration (or bytes):
    // neither mode gains from going later, and drift in the machine's load
    // weighs on both alike. The set-up figures are the first (cold) round's.
    BenchOptions half = o;
    if (o.total_bytes > 0) {
      half.total_bytes = std::max<uint64_t>(1, o.total_bytes / 2);
    } else {
      half.duration = o.duration / 2;
    }
    BenchOptions again = half;
    again.inject_mismatch = false;  // damage once per mode
    r = Phase(s, half, w, true).Run(!o.json);
    plain = Phase(s, half, w).Run(!o.json);
    MergePhase(*plain, Phase(s, again, w).Run(!o.json));
    MergePhase(r, Phase(s, again, w, true).Run(!o.json));
    micro = RunPrepareMicro(s);
  } else {
    r = Phase(s, o, w).Run(!o.json);
  }
  if (!o.kv) r.block = o.block;
  const int streams = s.engine->options().tcp_streams;
  std::optional<Baseline> base;
  if (!o.no_baseline) {
    // The scatter baseline only differs from the plain streams for small entries.
    bool small_entries = false;
    for (const auto& batch : w.batches) {
      for (const Entry& e : batch) small_entries |= e.length < (1u << 20);
    }
    base = RunBaselines(s, o, w, std::clamp(r.seconds, 0.5, 1.0), streams, small_entries);
  }
  std::optional<FabricBaselineResult> fabric;
  if (!o.no_baseline && s.engine->options().transport == "fabric") {
    const EngineOptions& eo = s.engine->options();
    const FabricInfo fi = DescribeFabric(eo.fabric_provider, eo.listen_host);
    std::vector<Entry> all;
    for (const auto& batch : w.batches) all.insert(all.end(), batch.begin(), batch.end());
    if (fi.chosen.empty()) {
      fabric = FabricBaselineResult{};
      fabric->provider = eo.fabric_provider;
      fabric->error = fi.why_none.empty() ? fi.error : fi.why_none;
    } else {
      // As many in flight as the bench's batches hold, at most Ferry's 256.
      const uint32_t depth = static_cast<uint32_t>(std::min<size_t>(all.size(), 256));
      fabric = RunFabricBaseline(fi.chosen, eo.listen_host, all, w.local_bytes, w.remote_bytes,
                                 depth, std::clamp(r.seconds, 0.5, 1.5));
    }
  }
  Report rep = MakeReport(std::move(r), std::move(base), streams, s.target_in_process);
  rep.fabric = std::move(fabric);
  bool bad = rep.ferry.mismatches > 0;
  if (plain) {
    bad = bad || plain->mismatches > 0;
    rep.plain_batch_lat = Summarize(plain->batch_lat_us);
    rep.plain = std::move(plain);
    rep.micro = micro;
  }
  if (o.json) {
    Json j;
    j["ferry_version"] = Version();
    AddJsonBody(j, rep);
    PrintJson(j);
  } else {
    PrintTable(rep, std::cout);
  }
  return bad ? 1 : 0;
}

int Run(const BenchOptions& o) {
  if (o.role == Role::kTarget) return RunTarget(o);
  const uint64_t needed = NeededBytes(o);
  // --prepared also prepares 1 M rows of 256 B on each side.
  uint64_t local_bytes =
      RoundUp(std::max({needed, kMinBuffer, o.prepared ? kMicroBytes : 0}), 2ull << 20);
  if (o.buffer_size > 0) {
    if (o.buffer_size < needed) {
      throw cli::UsageError("--buffer-size " + std::to_string(o.buffer_size) +
                            " is smaller than the workload needs (" + std::to_string(needed) + ")");
    }
    local_bytes = o.buffer_size;
  }
  if (o.role == Role::kInitiator) {
    Session s;
    OpenSession(s, o, o.target, o.control, local_bytes);
    if (!s.have_control && !o.no_baseline) {
      std::fprintf(stderr,
                   "ferry bench: the target's control port is unknown (pass --control "
                   "HOST:PORT): no baselines and no target CPU figures\n");
    }
    return RunInitiator(o, s);
  }
  // Launcher.
  if (o.transport == "local") {
    Session s;
    s.target_in_process = true;
    s.target_buffer = std::make_unique<Buffer>(local_bytes, true, o.hugepages);
    s.target_control =
        std::make_unique<ControlServer>(o.listen, s.target_buffer->data(), local_bytes);
    EngineOptions teo = o.MakeEngineOptions();
    if (o.ByName()) teo.local_name = o.name;
    auto te = Engine::Create(teo);
    if (!te.ok()) Fail("cannot start the target engine", te.status());
    s.target_engine = std::move(*te);
    Status st = s.target_engine->RegisterMemory(s.target_buffer->data(), local_bytes, "cpu:0");
    if (!st.ok()) Fail("cannot register the target buffer", st);
    OpenSession(s, o, o.ByName() ? o.name : s.target_engine->PeerId(),
                JoinHostPort(o.listen, s.target_control->port()), local_bytes);
    return RunInitiator(o, s);
  }
  TargetChild child(o, local_bytes);
  int rc = 0;
  {
    Session s;
    OpenSession(s, o, o.ByName() ? o.name : child.peer_id(), child.control(), local_bytes);
    rc = RunInitiator(o, s);
  }
  Status st = child.Stop();
  if (!st.ok()) {
    std::fprintf(stderr, "ferry bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return rc;
}

}  // namespace
}  // namespace ferry::bench

namespace ferry::cli {

int BenchMain(const std::vector<std::string>& args) {
  auto o = bench::BenchOptions::FromCommandLine(args);
  if (!o) return 0;
  return bench::Run(*o);
}

}  // namespace ferry::cli
