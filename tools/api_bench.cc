// ferry_api_bench: what the C API costs over the C++ API (issue 29's speed
// goal: "the C API adds no measurable cost").
//
// One process, one target engine (C++), two initiators: one made with
// Engine::Create and driven through the C++ API, one made with
// ferry_engine_new and driven through include/ferry/ferry_c.h. Both run the
// same loops against the same target buffer, in alternating rounds (C++, C,
// C, C++, C++, C, ...: neither always goes first) so drift in the machine's
// load hits both alike:
//   - sync-4k: one synchronous 4 KiB write at a time (Engine::TransferSync /
//     ferry_transfer_sync); p50 and p99 latency;
//   - kv-page16: the KV preset of `ferry bench --workload
//     kv:llama3-8b:tokens=4096:page=16` in its shape, 16,384 scattered
//     32 KiB writes in one batch (allocate, submit, wait, free); GB/s.
// Prints, per transport and workload, the median of each API's rounds and
// C / C++. Asserts nothing about time: a figure, for docs/benchmarks.md.
//
// Usage: ferry_api_bench [--transports tcp,shm] [--rounds N] [--sync-ops N]
//                        [--kv-pages N (default 16384; the smoke test: fewer)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ferry/engine.h"
#include "ferry/ferry_c.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kSyncBytes = 4096;
constexpr size_t kPage = 32 * 1024;
constexpr size_t kKvPages = 16384;  // 64 layer buffers x 256 pages

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ferry_api_bench: %s\n", what.c_str());
  std::exit(1);
}

void Check(const ferry::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + s.ToString());
}

void CheckC(ferry_status_t s, const char* what) {
  if (s != FERRY_OK) Die(std::string(what) + ": " + ferry_last_error());
}

// Page-aligned, touched memory (first touch outside the measured loops).
std::unique_ptr<char, decltype(&std::free)> Buffer(size_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, n) != 0) Die("out of memory");
  std::memset(p, 1, n);
  return {static_cast<char*>(p), &std::free};
}

// The KV shape: page k of the local buffer goes to a fixed-seed random page
// slot of the remote one (scattered on both sides, as the bench's preset).
std::vector<size_t> Permutation(size_t pages) {
  std::vector<size_t> v(pages);
  std::iota(v.begin(), v.end(), size_t{0});
  std::shuffle(v.begin(), v.end(), std::mt19937_64(42));
  return v;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Percentile(std::vector<double>& v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

struct Figures {
  std::vector<double> p50_us, p99_us, gbps;
};

// One initiator behind one API.
class Api {
 public:
  virtual ~Api() = default;
  // `n` synchronous 4 KiB writes; their latencies in microseconds.
  virtual std::vector<double> SyncWrites(size_t n) = 0;
  // The KV batch once; seconds.
  virtual double KvBatch() = 0;
};

class CxxApi final : public Api {
 public:
  CxxApi(ferry::EngineOptions o, const std::string& target, uint64_t remote, size_t pages)
      : local_(Buffer(pages * kPage)), remote_(remote) {
    auto e = ferry::Engine::Create(std::move(o));
    Check(e.status(), "Engine::Create");
    engine_ = std::move(*e);
    Check(engine_->RegisterMemory(local_.get(), pages * kPage, "cpu"), "RegisterMemory");
    auto seg = engine_->OpenSegment(target);
    Check(seg.status(), "OpenSegment");
    segment_ = *seg;
    const auto perm = Permutation(pages);
    for (size_t k = 0; k < pages; ++k) {
      kv_.push_back({ferry::Opcode::kWrite, local_.get() + k * kPage, segment_,
                     remote_ + perm[k] * kPage, kPage});
    }
  }
  std::vector<double> SyncWrites(size_t n) override {
    std::vector<double> us;
    us.reserve(n);
    const ferry::TransferRequest r{ferry::Opcode::kWrite, local_.get(), segment_, remote_,
                                   kSyncBytes};
    for (size_t i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      Check(engine_->TransferSync(r), "TransferSync");
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return us;
  }
  double KvBatch() override {
    const auto t0 = Clock::now();
    auto b = engine_->AllocateBatch(kv_.size());
    Check(b.status(), "AllocateBatch");
    Check(engine_->Submit(*b, kv_), "Submit");
    Check(engine_->WaitBatch(*b, std::chrono::minutes(2)), "WaitBatch");
    Check(engine_->FreeBatch(*b), "FreeBatch");
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  std::unique_ptr<char, decltype(&std::free)> local_;
  uint64_t remote_;
  std::unique_ptr<ferry::Engine> engine_;
  ferry::SegmentHandle segment_;
  std::vector<ferry::TransferRequest> kv_;
};

class CApi final : public Api {
 public:
  CApi(const char* transport, const std::string& target, uint64_t remote, size_t pages)
      : local_(Buffer(pages * kPage)), remote_(remote) {
    ferry_options_t* o = nullptr;
    CheckC(ferry_options_new(&o), "ferry_options_new");
    CheckC(ferry_options_set(o, "transport", transport), "ferry_options_set");
    CheckC(ferry_engine_new(o, &engine_), "ferry_engine_new");
    ferry_options_free(o);
    CheckC(ferry_memory_register(engine_, local_.get(), pages * kPage, "cpu"),
           "ferry_memory_register");
    CheckC(ferry_segment_open(engine_, target.c_str(), &segment_), "ferry_segment_open");
    const auto perm = Permutation(pages);
    for (size_t k = 0; k < pages; ++k) {
      kv_.push_back(
          {FERRY_OP_WRITE, local_.get() + k * kPage, segment_, remote_ + perm[k] * kPage, kPage});
    }
  }
  ~CApi() override { ferry_engine_destroy(engine_); }
  std::vector<double> SyncWrites(size_t n) override {
    std::vector<double> us;
    us.reserve(n);
    const ferry_request_t r{FERRY_OP_WRITE, local_.get(), segment_, remote_, kSyncBytes};
    for (size_t i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      CheckC(ferry_transfer_sync(engine_, &r, 1), "ferry_transfer_sync");
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    return us;
  }
  double KvBatch() override {
    const auto t0 = Clock::now();
    ferry_batch_t b = 0;
    CheckC(ferry_batch_allocate(engine_, kv_.size(), &b), "ferry_batch_allocate");
    CheckC(ferry_batch_submit(engine_, b, kv_.data(), kv_.size()), "ferry_batch_submit");
    CheckC(ferry_batch_wait(engine_, b, -1), "ferry_batch_wait");
    CheckC(ferry_batch_free(engine_, b), "ferry_batch_free");
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  std::unique_ptr<char, decltype(&std::free)> local_;
  uint64_t remote_;
  ferry_engine_t* engine_ = nullptr;
  ferry_segment_t segment_ = 0;
  std::vector<ferry_request_t> kv_;
};

void Round(Api& api, size_t sync_ops, size_t pages, Figures& f) {
  std::vector<double> us = api.SyncWrites(sync_ops);
  f.p50_us.push_back(Percentile(us, 0.50));
  f.p99_us.push_back(Percentile(us, 0.99));
  f.gbps.push_back(static_cast<double>(pages * kPage) / api.KvBatch() / 1e9);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

size_t Count(const char* flag, const char* v) {
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*v == '\0' || *end != '\0' || n == 0) {
    Die(std::string("bad value '") + v + "' for " + flag + ": expected a positive count");
  }
  return static_cast<size_t>(n);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> transports = {"tcp", "shm"};
  size_t rounds = 5, sync_ops = 2000, pages = kKvPages;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc)
      Die("missing a value after " + a +
          " (flags: --transports, --rounds, --sync-ops, --kv-pages)");
    if (a == "--transports") {
      transports = Split(argv[++i]);
    } else if (a == "--rounds") {
      rounds = Count("--rounds", argv[++i]);
    } else if (a == "--kv-pages") {
      pages = Count("--kv-pages", argv[++i]);
    } else if (a == "--sync-ops") {
      sync_ops = Count("--sync-ops", argv[++i]);
    } else {
      Die("unknown flag '" + a + "' (flags: --transports, --rounds, --sync-ops, --kv-pages)");
    }
  }
  std::printf("%-10s %-12s %15s %15s %8s\n", "transport", "workload", "C++", "C", "C/C++");
  for (const std::string& t : transports) {
    ferry::EngineOptions o;
    o.transport = t;
    auto target = ferry::Engine::Create(o);
    Check(target.status(), "Engine::Create (target)");
    auto remote = Buffer(pages * kPage);
    Check((*target)->RegisterMemory(remote.get(), pages * kPage, "cpu"), "RegisterMemory (target)");
    const auto addr = reinterpret_cast<uint64_t>(remote.get());
    CxxApi cxx(o, (*target)->PeerId(), addr, pages);
    CApi c(t.c_str(), (*target)->PeerId(), addr, pages);
    Figures warm;  // a first round of each, not counted
    Round(cxx, std::max<size_t>(1, sync_ops / 4), pages, warm);
    Round(c, std::max<size_t>(1, sync_ops / 4), pages, warm);
    Figures fc, fcc;
    for (size_t r = 0; r < rounds; ++r) {  // C++ then C, C then C++, ...
      if (r % 2 == 0) Round(cxx, sync_ops, pages, fcc);
      Round(c, sync_ops, pages, fc);
      if (r % 2 == 1) Round(cxx, sync_ops, pages, fcc);
    }
    auto row = [&](const char* what, const std::vector<double>& a, const std::vector<double>& b,
                   const char* unit) {
      const double x = Median(a), y = Median(b);
      std::printf("%-10s %-12s %10.2f %-4s %10.2f %-4s %8.3f\n", t.c_str(), what, x, unit, y, unit,
                  y / x);
    };
    row("sync-4k p50", fcc.p50_us, fc.p50_us, "us");
    row("sync-4k p99", fcc.p99_us, fc.p99_us, "us");
    row("kv-page16", fcc.gbps, fc.gbps, "GB/s");
    std::fflush(stdout);
  }
  return 0;
}
