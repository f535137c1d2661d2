// ferry_soak: a bounded soak of the socket transports. Several engines in
// separate processes (default 4), all-to-all, over tcp and over shm at once
// (each process runs one engine per transport), several threads per engine
// doing random reads and writes of random sizes; every byte is verified.
//
//   ferry_soak [--seconds N] [--processes P] [--threads T] [--min-size B]
//              [--max-size B] [--seed S] [--rss-bound-mib M] [--transports tcp,shm]
//
// The parent spawns P copies of itself (--child I, same options) and drives
// them over their stdin/stdout, one line per step:
//   child  -> READY <i> {<transport> <peer_id> <region_addr>}...
//   parent -> PEERS {<i> <transport> <peer_id> <region_addr>}...   (everyone's)
//   child  -> OPENED        (it opened every other process's segments)
//   parent -> GO            (the timed run starts in every process)
//   child  -> FINISHED      (its threads stopped and verified their last windows)
//   parent -> EXIT          (everyone finished: nothing writes into anyone any more)
//   child  -> SUMMARY {json}, then exits 0 (clean) or 1 (errors or memory growth)
//
// Verification. Each engine registers one region: a target area of
// P x T slots of --max-size bytes (slot (w, t) is written and read only by
// thread t of process w, so no two threads ever touch the same remote byte),
// then each thread's local staging buffers. Per peer a thread keeps one
// "window" of its slot: [off, off + len) holding the pattern stream
// seed(w, transport, t, peer, sequence) at position = offset in the window.
// Per peer a thread writes a new window, then reads random sub-ranges of it
// (checked against the pattern), then reads the whole window back (checked)
// before it writes the next one. So every byte written is read back and
// checked, every byte read is checked, and windows still open at the end are
// read back in full before the thread stops. A batch holds one request per
// chosen peer (1..P-1 peers), so its requests never overlap.
//
// Memory: VmHWM and VmRSS (/proc/self/status) at 25%, 50% and 100% of the
// run; the run fails if the peak (VmHWM) grew by more than --rss-bound-mib
// between 25% and 100%. Every buffer is allocated and touched before the run.
//
// Exit status: 0 iff every process reported 0 errors and flat memory.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/testing/pattern.h"
#include "transport/shm/same_host_probe.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using ferry::test::CheckPattern;
using ferry::test::FillPattern;
using ferry::test::Mix64;

constexpr uint64_t kMiB = 1u << 20;
constexpr size_t kLocalSlack = 64;  // local staging buffers start at a random offset < this

struct Options {
  int seconds = 60;
  int processes = 4;
  int threads = 3;
  uint64_t min_size = 64;
  uint64_t max_size = 4 * kMiB;
  uint64_t seed = 1;
  uint64_t rss_bound_mib = 64;
  std::vector<std::string> transports = {"tcp", "shm"};
  int child = -1;  // >= 0: this process is child number `child`
  // Self-checks of the soak itself (ctest soak_selfcheck): damage every
  // Nth read's bytes before they are checked, and allocate and touch this
  // many MiB halfway through; the run must then fail.
  uint64_t self_check_corrupt = 0;
  uint64_t self_check_leak_mib = 0;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(
      stderr,
      "ferry_soak: %s\n"
      "usage: ferry_soak [--seconds N] [--processes P] [--threads T] [--min-size B]\n"
      "                  [--max-size B] [--seed S] [--rss-bound-mib M] [--transports tcp,shm]\n",
      why.c_str());
  std::exit(2);
}

uint64_t Number(const std::string& flag, const char* v, uint64_t lo, uint64_t hi) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 0);
  if (errno != 0 || end == v || *end != '\0' || n < lo || n > hi) {
    Usage(flag + " must be a number in [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "], got '" + v + "'");
  }
  return n;
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") Usage("help");
    if (i + 1 >= argc) Usage("missing value for " + flag);
    const char* v = argv[++i];
    if (flag == "--seconds") {
      o.seconds = static_cast<int>(Number(flag, v, 1, 7 * 24 * 3600));
    } else if (flag == "--processes") {
      o.processes = static_cast<int>(Number(flag, v, 2, 16));
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(Number(flag, v, 1, 32));
    } else if (flag == "--min-size") {
      o.min_size = Number(flag, v, 1, 64 * kMiB);
    } else if (flag == "--max-size") {
      o.max_size = Number(flag, v, 1, 64 * kMiB);
    } else if (flag == "--seed") {
      o.seed = Number(flag, v, 0, UINT64_MAX);
    } else if (flag == "--rss-bound-mib") {
      o.rss_bound_mib = Number(flag, v, 1, 1u << 20);
    } else if (flag == "--transports") {
      o.transports.clear();
      std::stringstream in(v);
      std::string t;
      while (std::getline(in, t, ',')) {
        if (t != "tcp" && t != "shm") Usage("--transports takes tcp and/or shm, got '" + t + "'");
        if (std::find(o.transports.begin(), o.transports.end(), t) == o.transports.end()) {
          o.transports.push_back(t);
        }
      }
    } else if (flag == "--self-check-corrupt") {
      o.self_check_corrupt = Number(flag, v, 1, UINT64_MAX);
    } else if (flag == "--self-check-leak-mib") {
      o.self_check_leak_mib = Number(flag, v, 1, 1u << 16);
    } else if (flag == "--child") {
      o.child = static_cast<int>(Number(flag, v, 0, 15));
    } else {
      Usage("unknown flag " + flag);
    }
  }
  if (o.min_size > o.max_size) Usage("--min-size must not exceed --max-size");
  if (o.transports.empty()) Usage("--transports names no transport");
  return o;
}

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// ---- /proc/self/status ------------------------------------------------------

struct MemSample {
  uint64_t hwm_kib = 0;
  uint64_t rss_kib = 0;
};

MemSample ReadMemory() {
  MemSample m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) m.hwm_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
    if (line.rfind("VmRSS:", 0) == 0) m.rss_kib = std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return m;
}

// ---- line I/O on pipes --------------------------------------------------------

// Reads one line from `fd` (buffered in *pending), waiting at most until
// `deadline`; false on EOF, error or timeout.
bool ReadLine(int fd, std::string* pending, std::string* line, Clock::time_point deadline) {
  for (;;) {
    const size_t nl = pending->find('\n');
    if (nl != std::string::npos) {
      *line = pending->substr(0, nl);
      pending->erase(0, nl + 1);
      return true;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) return false;
    if (n <= 0) continue;
    char buf[4096];
    const ssize_t got = read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    pending->append(buf, static_cast<size_t>(got));
  }
}

bool WriteAll(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// ============================================================================
// Child: the engines and the workload.
// ============================================================================

struct PeerEntry {
  int index = 0;
  std::string transport;
  std::string peer_id;
  uint64_t region = 0;
};

struct Counters {
  // written_bytes: bytes of completed writes; read_back_bytes: of those, the
  // bytes read back in full and found intact (the two must be equal).
  std::atomic<uint64_t> written_bytes{0}, read_back_bytes{0};
  std::atomic<uint64_t> requests{0}, reads{0}, writes{0}, bytes{0}, verified_bytes{0}, batches{0},
      errors{0};
};

class Child {
 public:
  explicit Child(const Options& o) : o_(o), slot_(o.max_size) {}

  int Run() {
    const size_t n_peers = static_cast<size_t>(o_.processes);
    const size_t threads = static_cast<size_t>(o_.threads);
    target_area_ = n_peers * threads * slot_;
    per_thread_local_ = n_peers * 2 * (slot_ + kLocalSlack);
    region_size_ = target_area_ + threads * per_thread_local_;

    std::string ready = "READY " + std::to_string(o_.child);
    for (const std::string& t : o_.transports) {
      auto e = std::make_unique<EngineSet>();
      e->transport = t;
      // Allocated and touched here, so the run itself allocates nothing big.
      e->region.reset(static_cast<unsigned char*>(std::aligned_alloc(4096, Round(region_size_))));
      if (!e->region)
        return Fatal("out of memory for a " + std::to_string(region_size_) + "-byte region");
      std::memset(e->region.get(), 0, Round(region_size_));
      ferry::EngineOptions eo;
      eo.transport = t;
      eo.listen_host = "127.0.0.1";
      eo.transfer_timeout = std::chrono::seconds(60);
      eo.connect_timeout = std::chrono::seconds(20);
      auto engine = ferry::Engine::Create(eo);
      if (!engine.ok()) return Fatal("Engine::Create (" + t + "): " + engine.status().ToString());
      e->engine = std::move(engine).value();
      const ferry::Status s = e->engine->RegisterMemory(e->region.get(), region_size_);
      if (!s.ok()) return Fatal("RegisterMemory (" + t + "): " + s.ToString());
      char addr[32];
      std::snprintf(addr, sizeof(addr), "0x%" PRIx64, reinterpret_cast<uint64_t>(e->region.get()));
      ready += " " + t + " " + e->engine->PeerId() + " " + addr;
      engines_.push_back(std::move(e));
    }
    Say(ready);

    std::string line, pending;
    const auto setup_deadline = Clock::now() + std::chrono::seconds(120);
    if (!ReadLine(STDIN_FILENO, &pending, &line, setup_deadline) || line.rfind("PEERS ", 0) != 0) {
      return Fatal("no PEERS line from the parent");
    }
    {
      std::istringstream in(line.substr(6));
      PeerEntry p;
      std::string addr;
      while (in >> p.index >> p.transport >> p.peer_id >> addr) {
        p.region = std::strtoull(addr.c_str(), nullptr, 0);
        if (p.index == o_.child) continue;
        for (auto& e : engines_) {
          if (e->transport == p.transport) e->peers.push_back(p);
        }
      }
    }
    for (auto& e : engines_) {
      if (e->peers.size() != n_peers - 1)
        return Fatal("PEERS names the wrong number of " + e->transport + " peers");
      for (const PeerEntry& p : e->peers) {
        auto seg = e->engine->OpenSegment(p.peer_id);
        if (!seg.ok()) {
          return Fatal("OpenSegment " + p.peer_id + " (" + e->transport +
                       "): " + seg.status().ToString());
        }
        auto info = e->engine->QuerySegment(*seg);
        if (!info.ok()) return Fatal("QuerySegment " + p.peer_id + ": " + info.status().ToString());
        if (info->transport != e->transport) {
          return Fatal("segment " + p.peer_id + " uses " + info->transport + ", not " +
                       e->transport);
        }
        e->segments.push_back(*seg);
      }
    }
    Say("OPENED");
    if (!ReadLine(STDIN_FILENO, &pending, &line, setup_deadline) || line != "GO") {
      return Fatal("no GO line from the parent");
    }

    // The timed run.
    const auto start = Clock::now();
    const auto duration = std::chrono::seconds(o_.seconds);
    stop_at_ = start + duration;
    std::vector<std::thread> workers;
    for (auto& e : engines_) {
      for (size_t t = 0; t < threads; ++t) {
        workers.emplace_back([this, es = e.get(), t] { Worker(*es, t); });
      }
    }
    MemSample samples[3];
    const double marks[3] = {0.25, 0.50, 1.00};
    for (int i = 0; i < 2; ++i) {
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<Clock::duration>(duration * marks[i]));
      if (i == 1 && o_.self_check_leak_mib > 0) {
        leak_.assign(o_.self_check_leak_mib * kMiB, 1);
      }
      samples[i] = ReadMemory();
    }
    for (std::thread& w : workers) w.join();
    samples[2] = ReadMemory();  // at the end of the run, before any teardown
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    Say("FINISHED");
    // Others may still be reading and writing our region: wait for everyone.
    const bool exit_ok =
        ReadLine(STDIN_FILENO, &pending, &line, Clock::now() + std::chrono::seconds(300)) &&
        line == "EXIT";
    if (!exit_ok) Error("no EXIT line from the parent");

    const uint64_t growth =
        samples[2].hwm_kib > samples[0].hwm_kib ? samples[2].hwm_kib - samples[0].hwm_kib : 0;
    const uint64_t bound = o_.rss_bound_mib * 1024;
    const bool flat = growth <= bound;
    std::ostringstream js;
    js << "{\"process\":" << o_.child << ",\"pid\":" << getpid() << ",\"transports\":{";
    uint64_t requests = 0, bytes = 0, errors = 0, verified = 0;
    for (size_t i = 0; i < engines_.size(); ++i) {
      const Counters& c = engines_[i]->counters;
      js << (i ? "," : "") << "\"" << engines_[i]->transport << "\":{\"requests\":" << c.requests
         << ",\"reads\":" << c.reads << ",\"writes\":" << c.writes << ",\"batches\":" << c.batches
         << ",\"bytes\":" << c.bytes << ",\"verified_bytes\":" << c.verified_bytes
         << ",\"written_bytes\":" << c.written_bytes << ",\"read_back_bytes\":" << c.read_back_bytes
         << ",\"errors\":" << c.errors << "}";
      requests += c.requests;
      bytes += c.bytes;
      verified += c.verified_bytes;
      if (c.written_bytes != c.read_back_bytes) {
        Error(engines_[i]->transport + ": " + std::to_string(c.written_bytes - c.read_back_bytes) +
              " written bytes were not read back intact");
      }
      errors += c.errors;
    }
    errors += misc_errors_;
    js << "},\"requests\":" << requests << ",\"bytes\":" << bytes
       << ",\"verified_bytes\":" << verified << ",\"errors\":" << errors
       << ",\"seconds\":" << elapsed << ",\"vmhwm_kib\":[" << samples[0].hwm_kib << ","
       << samples[1].hwm_kib << "," << samples[2].hwm_kib << "],\"vmrss_kib\":["
       << samples[0].rss_kib << "," << samples[1].rss_kib << "," << samples[2].rss_kib
       << "],\"hwm_growth_kib\":" << growth << ",\"bound_kib\":" << bound
       << ",\"flat\":" << (flat ? "true" : "false") << "}";
    Say("SUMMARY " + js.str());

    for (auto& e : engines_) {
      const ferry::Status s = e->engine->UnregisterMemory(e->region.get());
      if (!s.ok())
        std::fprintf(stderr, "ferry_soak[%d]: UnregisterMemory: %s\n", o_.child,
                     s.ToString().c_str());
      e->engine.reset();
    }
    return errors == 0 && flat ? 0 : 1;
  }

 private:
  struct FreeDeleter {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  struct EngineSet {
    std::string transport;
    std::unique_ptr<unsigned char, FreeDeleter>
        region;  // declared before the engine: freed after it
    std::unique_ptr<ferry::Engine> engine;
    std::vector<PeerEntry> peers;
    std::vector<ferry::SegmentHandle> segments;
    Counters counters;
  };

  // What a thread knows of its slot in one peer.
  struct Window {
    bool valid = false;
    uint64_t off = 0;  // in the slot
    uint64_t len = 0;
    uint64_t seed = 0;
  };

  static size_t Round(size_t n) { return (n + 4095) / 4096 * 4096; }

  void Say(const std::string& line) {
    std::lock_guard<std::mutex> lock(out_mu_);
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }

  int Fatal(const std::string& why) {
    std::fprintf(stderr, "ferry_soak[%d]: %s\n", o_.child, why.c_str());
    Say("ERROR " + why);
    return 1;
  }

  void Error(const std::string& why) {
    ++misc_errors_;
    std::fprintf(stderr, "ferry_soak[%d]: %s\n", o_.child, why.c_str());
  }

  // Logs the first few errors of an engine; counts all.
  void Report(EngineSet& e, const std::string& why) {
    const uint64_t n = ++e.counters.errors;
    if (n <= 10) {
      std::fprintf(stderr, "ferry_soak[%d] %s: %s\n", o_.child, e.transport.c_str(), why.c_str());
    }
  }

  uint64_t LogUniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
    if (lo >= hi) return hi;
    std::uniform_real_distribution<double> d(std::log(static_cast<double>(lo)),
                                             std::log(static_cast<double>(hi) + 1.0));
    const uint64_t v = static_cast<uint64_t>(std::exp(d(rng)));
    return std::clamp(v, lo, hi);
  }

  uint64_t Uniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  }

  void Worker(EngineSet& e, size_t t) {
    const size_t n_peers = e.peers.size();
    const uint64_t transport_tag = e.transport == "tcp" ? 1 : 2;
    std::mt19937_64 rng(Mix64(
        o_.seed ^ Mix64((static_cast<uint64_t>(o_.child) << 32) ^ (transport_tag << 16) ^ t)));
    unsigned char* local_base = e.region.get() + target_area_ + t * per_thread_local_;
    std::vector<Window> windows(n_peers);
    uint64_t sequence = 0;
    ferry::BatchId batch{};
    {
      auto b = e.engine->AllocateBatch(n_peers);
      if (!b.ok()) {
        Report(e, "AllocateBatch: " + b.status().ToString());
        return;
      }
      batch = *b;
    }

    struct Op {
      size_t peer = 0;
      ferry::Opcode opcode = ferry::Opcode::kWrite;
      unsigned char* local = nullptr;
      uint64_t slot_off = 0;  // in the peer's slot
      uint64_t len = 0;
      uint64_t window_pos = 0;  // pattern position of the first byte (reads)
      bool full = false;        // reads the whole window (then it is closed)
    };
    std::vector<Op> ops;
    std::vector<ferry::TransferRequest> reqs;
    std::vector<size_t> order(n_peers);
    bool draining = false;  // past the end: read every open window back in full
    for (;;) {
      if (!draining && Clock::now() >= stop_at_) draining = true;
      ops.clear();
      reqs.clear();
      for (size_t i = 0; i < n_peers; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      const size_t chosen = draining ? n_peers : Uniform(rng, 1, n_peers);
      for (size_t k = 0; k < chosen; ++k) {
        const size_t p = order[k];
        Window& w = windows[p];
        Op op;
        op.peer = p;
        op.local = local_base + p * 2 * (slot_ + kLocalSlack);
        if (draining) {
          if (!w.valid) continue;
          op.opcode = ferry::Opcode::kRead;
          op.full = true;
        } else if (!w.valid) {
          op.opcode = ferry::Opcode::kWrite;
        } else {
          op.opcode = ferry::Opcode::kRead;
          op.full = Uniform(rng, 0, 2) == 0;  // else a random part of it
        }
        if (op.opcode == ferry::Opcode::kWrite) {
          w.len = LogUniform(rng, o_.min_size, o_.max_size);
          w.off = Uniform(rng, 0, slot_ - w.len);
          w.seed =
              Mix64(o_.seed ^ Mix64(Mix64(static_cast<uint64_t>(o_.child) * 131 + transport_tag) ^
                                    (t << 40) ^ (p << 32) ^ ++sequence));
          w.valid = true;
          op.local += Uniform(rng, 0, kLocalSlack - 1);
          op.slot_off = w.off;
          op.len = w.len;
          FillPattern(op.local, op.len, w.seed, 0);
        } else {
          op.local += slot_ + kLocalSlack + Uniform(rng, 0, kLocalSlack - 1);
          if (op.full) {
            op.window_pos = 0;
            op.len = w.len;
          } else {
            op.window_pos = Uniform(rng, 0, w.len - 1);
            op.len = LogUniform(rng, std::min<uint64_t>(o_.min_size, w.len - op.window_pos),
                                w.len - op.window_pos);
          }
          op.slot_off = w.off + op.window_pos;
          // Poison: the complement of what must arrive, so no byte of a read
          // that did not land (or landed in part) can pass for one that did.
          FillPattern(op.local, op.len, w.seed, op.window_pos);
          for (uint64_t b = 0; b < op.len; ++b)
            op.local[b] = static_cast<unsigned char>(~op.local[b]);
        }
        const PeerEntry& peer = e.peers[p];
        const uint64_t remote =
            peer.region + (static_cast<uint64_t>(o_.child) * o_.threads + t) * slot_ + op.slot_off;
        ops.push_back(op);
        reqs.push_back({op.opcode, op.local, e.segments[p], remote, op.len});
      }
      if (ops.empty()) break;  // draining, and nothing is open any more

      ferry::Status s = e.engine->Submit(batch, reqs);
      if (s.ok()) s = e.engine->WaitBatch(batch, std::chrono::seconds(120));
      ++e.counters.batches;
      if (!s.ok()) Report(e, "batch of " + std::to_string(reqs.size()) + ": " + s.ToString());
      for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        Window& w = windows[op.peer];
        auto ts = e.engine->GetTransferStatus(batch, i);
        const bool done = ts.ok() && ts->state == ferry::TransferState::kCompleted;
        ++e.counters.requests;
        if (!done) {
          Report(e, "request to " + e.peers[op.peer].peer_id + " (" + std::to_string(op.len) +
                        " B): " + (ts.ok() ? ts->status.ToString() : ts.status().ToString()));
          w.valid = false;  // its bytes are unknown now
          continue;
        }
        e.counters.bytes += op.len;
        if (op.opcode == ferry::Opcode::kWrite) {
          ++e.counters.writes;
          e.counters.written_bytes += op.len;
          continue;
        }
        ++e.counters.reads;
        if (o_.self_check_corrupt > 0 && e.counters.reads % o_.self_check_corrupt == 0) {
          op.local[op.len / 2] ^= 0x01;
        }
        const auto bad = CheckPattern(op.local, op.len, w.seed, op.window_pos);
        if (bad) {
          char msg[256];
          std::snprintf(msg, sizeof(msg),
                        "read of %" PRIu64 " B at window offset %" PRIu64
                        " from %s: byte %zu differs "
                        "(got 0x%02x, want 0x%02x)",
                        op.len, op.window_pos, e.peers[op.peer].peer_id.c_str(), *bad,
                        op.local[*bad], ferry::test::PatternByte(w.seed, op.window_pos + *bad));
          Report(e, msg);
          w.valid = false;
        } else {
          e.counters.verified_bytes += op.len;
          if (op.full) e.counters.read_back_bytes += op.len;
        }
        if (op.full) w.valid = false;
      }
      // Every request has ended (WaitBatch returned, or failed at a deadline
      // that ended them); reuse the batch.
      s = e.engine->FreeBatch(batch);
      if (!s.ok()) {
        Report(e, "FreeBatch: " + s.ToString());
        return;
      }
      auto b = e.engine->AllocateBatch(n_peers);
      if (!b.ok()) {
        Report(e, "AllocateBatch: " + b.status().ToString());
        return;
      }
      batch = *b;
    }
    const ferry::Status s = e.engine->FreeBatch(batch);
    if (!s.ok()) Report(e, "FreeBatch: " + s.ToString());
  }

  const Options o_;
  const uint64_t slot_;
  size_t target_area_ = 0, per_thread_local_ = 0, region_size_ = 0;
  std::vector<std::unique_ptr<EngineSet>> engines_;
  Clock::time_point stop_at_;
  std::mutex out_mu_;
  std::atomic<uint64_t> misc_errors_{0};
  std::vector<unsigned char> leak_;  // --self-check-leak-mib
};

// ============================================================================
// Parent: spawns the children and adds up their summaries.
// ============================================================================

struct Proc {
  pid_t pid = -1;
  int in = -1;   // its stdin
  int out = -1;  // its stdout
  std::string pending;
  std::string ready;  // its READY line's fields after the index
  std::string summary;
};

bool Spawn(const std::string& self, const std::vector<std::string>& args, Proc* p) {
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) return false;
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    close(in_pipe[0]);
    close(in_pipe[1]);
    return false;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  std::vector<std::string> all{self};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&p->pid, self.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(in_pipe[0]);
  close(out_pipe[1]);
  if (rc != 0) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    std::fprintf(stderr, "ferry_soak: posix_spawn %s: %s\n", self.c_str(), std::strerror(rc));
    p->pid = -1;
    return false;
  }
  p->in = in_pipe[1];
  p->out = out_pipe[0];
  return true;
}

// Picks a number out of a flat JSON object: "key":N.
uint64_t JsonNumber(const std::string& json, const std::string& key, size_t from = 0) {
  const std::string k = "\"" + key + "\":";
  const size_t at = json.find(k, from);
  return at == std::string::npos ? 0 : std::strtoull(json.c_str() + at + k.size(), nullptr, 10);
}

int RunParent(const Options& o, int argc, char** argv) {
  std::vector<std::string> transports = o.transports;
  std::string shm_skipped;
  if (std::find(transports.begin(), transports.end(), "shm") != transports.end()) {
    shm_skipped = ferry::internal::shm::SameHostCopyRefusal();
    if (!shm_skipped.empty()) {
      std::fprintf(stderr, "ferry_soak: shm skipped: same-host copies refused here (%s)\n",
                   shm_skipped.c_str());
      transports.erase(std::find(transports.begin(), transports.end(), "shm"));
      if (transports.empty()) {
        std::printf("{\"soak\":\"total\",\"result\":\"SKIP\",\"why\":\"shm refused: %s\"}\n",
                    shm_skipped.c_str());
        return 0;
      }
    }
  }
  std::vector<std::string> base;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--transports") {
      ++i;
      continue;
    }
    base.push_back(a);
  }
  base.push_back("--transports");
  base.push_back(Join(transports, ","));

  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) {
    std::fprintf(stderr, "ferry_soak: readlink /proc/self/exe: %s\n", std::strerror(errno));
    return 2;
  }
  self[n] = '\0';

  std::printf("ferry_soak: %d processes x {%s} engines, %d threads each, %" PRIu64 " B..%" PRIu64
              " B (log-uniform), %d s, seed %" PRIu64 ", peak-memory growth bound %" PRIu64
              " MiB\n",
              o.processes, Join(transports, ",").c_str(), o.threads, o.min_size, o.max_size,
              o.seconds, o.seed, o.rss_bound_mib);
  std::fflush(stdout);

  std::vector<Proc> procs(static_cast<size_t>(o.processes));
  bool ok = true;
  std::string failure;
  auto fail = [&](const std::string& why) {
    if (ok) failure = why;
    ok = false;
  };
  for (int i = 0; i < o.processes && ok; ++i) {
    std::vector<std::string> args = base;
    args.push_back("--child");
    args.push_back(std::to_string(i));
    if (!Spawn(self, args, &procs[static_cast<size_t>(i)]))
      fail("could not start child " + std::to_string(i));
  }
  // One step: every child says `word` (the line's first word) in time.
  auto expect_all = [&](const std::string& word, Clock::time_point deadline) {
    for (size_t i = 0; i < procs.size() && ok; ++i) {
      std::string line;
      if (!ReadLine(procs[i].out, &procs[i].pending, &line, deadline)) {
        fail("child " + std::to_string(i) + " said nothing (waiting for " + word + ")");
      } else if (line.rfind(word, 0) != 0) {
        fail("child " + std::to_string(i) + " said \"" + line + "\" (waiting for " + word + ")");
      } else if (word == "READY") {
        procs[i].ready = line.substr(6);
      } else if (word == "SUMMARY") {
        procs[i].summary = line.substr(8);
      }
    }
  };
  auto tell_all = [&](const std::string& line) {
    for (Proc& p : procs) {
      if (ok && !WriteAll(p.in, line + "\n")) fail("could not write to a child");
    }
  };
  expect_all("READY", Clock::now() + std::chrono::seconds(60));
  std::string peers = "PEERS";
  for (const Proc& p : procs) {
    std::istringstream in(p.ready);
    std::string index, t, id, addr;
    in >> index;
    while (in >> t >> id >> addr) peers += " " + index + " " + t + " " + id + " " + addr;
  }
  tell_all(peers);
  expect_all("OPENED", Clock::now() + std::chrono::seconds(120));
  tell_all("GO");
  // Each child stops by itself at --seconds, then reads its open windows back
  // (each request bounded by its transfer timeout).
  expect_all("FINISHED",
             Clock::now() + std::chrono::seconds(o.seconds) + std::chrono::seconds(300));
  tell_all("EXIT");
  expect_all("SUMMARY", Clock::now() + std::chrono::seconds(60));

  uint64_t requests = 0, bytes = 0, verified = 0, errors = 0, max_growth = 0;
  bool flat = true;
  for (size_t i = 0; i < procs.size(); ++i) {
    Proc& p = procs[i];
    if (!p.summary.empty()) {
      std::printf("%s\n", p.summary.c_str());
      requests += JsonNumber(p.summary, "requests", p.summary.find("},\"requests\""));
      bytes += JsonNumber(p.summary, "bytes", p.summary.find("},\"requests\""));
      verified += JsonNumber(p.summary, "verified_bytes", p.summary.find("},\"requests\""));
      errors += JsonNumber(p.summary, "errors", p.summary.find("},\"requests\""));
      max_growth = std::max(max_growth, JsonNumber(p.summary, "hwm_growth_kib"));
      flat = flat && p.summary.find("\"flat\":true") != std::string::npos;
    }
    if (p.in >= 0) close(p.in);
    p.in = -1;
  }
  // Reap: each exits once it printed its summary; SIGKILL whatever is stuck.
  for (size_t i = 0; i < procs.size(); ++i) {
    Proc& p = procs[i];
    if (p.pid <= 0) continue;
    int status = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(ok ? 60 : 1);
    pid_t r = 0;
    while ((r = waitpid(p.pid, &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (r == 0) {
      kill(p.pid, SIGKILL);
      waitpid(p.pid, &status, 0);
      fail("child " + std::to_string(i) + " did not exit");
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fail("child " + std::to_string(i) + " exited with " +
           (WIFEXITED(status) ? "status " + std::to_string(WEXITSTATUS(status))
                              : "signal " + std::to_string(WTERMSIG(status))));
    }
    if (p.out >= 0) close(p.out);
  }
  const bool pass = ok && errors == 0 && flat;
  std::printf(
      "{\"soak\":\"total\",\"processes\":%d,\"transports\":\"%s\",\"shm_skipped\":%s,\"threads\":%"
      "d,"
      "\"seconds\":%d,\"requests\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"verified_bytes\":%" PRIu64
      ",\"errors\":%" PRIu64 ",\"max_hwm_growth_kib\":%" PRIu64 ",\"bound_kib\":%" PRIu64
      ",\"result\":\"%s\"%s%s%s}\n",
      o.processes, Join(transports, ",").c_str(),
      shm_skipped.empty() ? "null" : ("\"" + shm_skipped + "\"").c_str(), o.threads, o.seconds,
      requests, bytes, verified, errors, max_growth, o.rss_bound_mib * 1024, pass ? "PASS" : "FAIL",
      failure.empty() ? "" : ",\"failure\":\"", failure.c_str(), failure.empty() ? "" : "\"");
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  const Options o = ParseArgs(argc, argv);
  if (o.child >= 0) {
    if (o.child >= o.processes) Usage("--child must be below --processes");
    Child child(o);
    return child.Run();
  }
  return RunParent(o, argc, argv);
}
