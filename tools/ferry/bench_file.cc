#include "bench_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_report.h"
#include "bench_util.h"
#include "cli.h"
#include "ferry/ferry.h"
#include "workload.h"

namespace ferry::bench {
namespace {

// Ferry's ring depth and fio's iodepth for --workload (KV pages).
constexpr uint64_t kKvQueueDepth = 64;

// The file a run uses: blocks: at least 256 MiB, and twice one batch; KV
// pages: the preset's pages (its target side).
uint64_t FileSize(const BenchOptions& o, const Workload* kv) {
  if (kv != nullptr) return RoundUp(kv->remote_bytes, 1ull << 20);
  return RoundUp(std::max<uint64_t>(256ull << 20, 2 * o.block * o.batch), 1ull << 20);
}

// What one request of a run looks like: its size, how many the ring holds,
// random or sequential offsets.
struct Shape {
  uint64_t block = 0;
  uint64_t depth = 0;
  bool random = false;
};

// Creates or extends the file to `size` bytes; for reads, writes every byte
// once (reads of a hole would measure nothing).
void PrepareFile(const std::string& path, uint64_t size, bool fill) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw cli::RunError("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
  const bool grow = static_cast<uint64_t>(st.st_size) < size;
  if (grow && ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    ::close(fd);
    throw cli::RunError("cannot extend " + path + ": " + std::strerror(errno));
  }
  if (fill && grow) {
    std::vector<char> chunk(8ull << 20, 'f');
    for (uint64_t at = 0; at < size; at += chunk.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk.size(), size - at));
      if (::pwrite(fd, chunk.data(), n, static_cast<off_t>(at)) != static_cast<ssize_t>(n)) {
        ::close(fd);
        throw cli::RunError("cannot fill " + path + ": " + std::strerror(errno));
      }
    }
    ::fsync(fd);
  }
  ::close(fd);
}

struct Figures {
  double seconds = 0;
  uint64_t bytes = 0;
  uint64_t ops = 0;
  void Add(const Figures& f) {
    seconds += f.seconds;
    bytes += f.bytes;
    ops += f.ops;
  }
  double GBps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : kNaN; }
  double Iops() const { return seconds > 0 ? static_cast<double>(ops) / seconds : kNaN; }
};

// Ferry: batches of `batch` requests of `block` bytes at consecutive offsets
// of the file (wrapping; --random: block-aligned offsets drawn by `rng`), two
// in flight (each on its half of `buf`): the ring (file_queue_depth = batch)
// stays as full as fio's queue, for `seconds` (or, given `stop`, until it
// is set).
Figures RunFerry(Engine& e, SegmentHandle self, uint8_t* buf, uint64_t base, const BenchOptions& o,
                 uint64_t file_size, double seconds, uint64_t* cursor, std::mt19937_64* rng,
                 const std::atomic<bool>* stop) {
  const Opcode op = o.op == Operation::kRead ? Opcode::kRead : Opcode::kWrite;
  std::vector<TransferRequest> reqs(o.batch);
  std::uniform_int_distribution<uint64_t> slot(0, file_size / o.block - 1);
  auto submit = [&](int half) {
    for (uint64_t k = 0; k < o.batch; ++k) {
      if (o.random) {
        *cursor = slot(*rng) * o.block;
      } else if (*cursor + o.block > file_size) {
        *cursor = 0;
      }
      reqs[k] = {op, buf + (half * o.batch + k) * o.block, self, base + *cursor, o.block};
      if (!o.random) *cursor += o.block;
    }
    auto id = e.AllocateBatch(o.batch);
    if (!id.ok()) Fail("cannot allocate a batch", id.status());
    Status s = e.Submit(*id, reqs);
    if (!s.ok()) Fail("the Ferry phase failed", s);
    return *id;
  };
  auto finish = [&](BatchId id) {
    Status s = e.WaitBatch(id, std::chrono::minutes(10));
    if (!s.ok()) Fail("the Ferry phase failed", s);
    s = e.FreeBatch(id);
    if (!s.ok()) Fail("cannot free a batch", s);
  };
  Figures f;
  const auto start = Clock::now();
  BatchId in_flight[2] = {submit(0), submit(1)};
  for (int half = 0;; half ^= 1) {
    finish(in_flight[half]);
    f.bytes += o.block * o.batch;
    f.ops += o.batch;
    if (stop != nullptr ? stop->load() : Seconds(Clock::now() - start) >= seconds) {
      finish(in_flight[half ^ 1]);
      f.bytes += o.block * o.batch;
      f.ops += o.batch;
      break;
    }
    in_flight[half] = submit(half);
  }
  f.seconds = Seconds(Clock::now() - start);
  return f;
}

// Ferry, KV pages (--workload): every page of the preset, at its scattered
// offsets in the buffer and in the file (the page write-back of an offload;
// reads: the cache hit that loads them back), as one batch, again and again
// for `seconds` (or, given `stop`, until it is set). The ring
// (file_queue_depth) keeps kKvQueueDepth in flight.
Figures RunFerryPages(Engine& e, SegmentHandle seg, uint8_t* buf, uint64_t base,
                      const std::vector<Entry>& entries, double seconds,
                      const std::atomic<bool>* stop) {
  std::vector<TransferRequest> reqs;
  reqs.reserve(entries.size());
  uint64_t batch_bytes = 0;
  for (const Entry& x : entries) {
    reqs.push_back({x.opcode, buf + x.local_off, seg, base + x.remote_off, x.length});
    batch_bytes += x.length;
  }
  Figures f;
  const auto start = Clock::now();
  do {
    Status s = e.TransferSync(std::span<const TransferRequest>(reqs));
    if (!s.ok()) Fail("the Ferry phase failed", s);
    f.bytes += batch_bytes;
    f.ops += reqs.size();
  } while (stop != nullptr ? !stop->load() : Seconds(Clock::now() - start) < seconds);
  f.seconds = Seconds(Clock::now() - start);
  return f;
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// fio's job of the same shape, as a command line. KV pages: random offsets
// in page steps over the same file, each page once per pass (fio's random
// map), at the same depth: the same pages, in fio's order.
std::string FioCommand(const BenchOptions& o, const Shape& shape, uint64_t file_size,
                       double seconds) {
  const bool read = o.op == Operation::kRead;
  char runtime[32];
  std::snprintf(runtime, sizeof(runtime), "%.0fms", seconds * 1000);
  std::string cmd = "fio --name=ferry-bench-baseline --filename=" + Quote(o.file) +
                    " --ioengine=io_uring --rw=" + (shape.random ? "rand" : "") +
                    (read ? "read" : "write") + " --bs=" + std::to_string(shape.block) +
                    " --iodepth=" + std::to_string(shape.depth) +
                    " --direct=" + (o.direct ? "1" : "0") + " --size=" + std::to_string(file_size) +
                    " --time_based --runtime=" + runtime + " --output-format=json";
  if (o.durable && !read) cmd += " --sync=dsync";
  return cmd;
}

// Runs fio; its figures, or an error.
StatusOr<Figures> RunFio(const std::string& cmd, bool read) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return InternalError("cannot start fio: " + std::string(std::strerror(errno)));
  std::string out;
  char chunk[4096];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof(chunk), p)) > 0) out.append(chunk, n);
  const int rc = ::pclose(p);
  if (rc != 0) return UnavailableError("fio failed (status " + std::to_string(rc) + "): " + out);
  // fio may print notes before its JSON.
  const size_t brace = out.find('{');
  if (brace == std::string::npos) return InternalError("fio printed no JSON: " + out);
  Json j = Json::parse(out.substr(brace), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("jobs") || j["jobs"].empty()) {
    return InternalError("cannot read fio's JSON: " + out.substr(0, 400));
  }
  const Json& side = j["jobs"][0][read ? "read" : "write"];
  Figures f;
  f.bytes = side.value("io_bytes", uint64_t{0});
  f.ops = side.value("total_ios", uint64_t{0});
  f.seconds = side.value("runtime", 0.0) / 1000.0;  // ms
  return f;
}

// --fio-alongside: fio runs while `ferry` moves bytes of the file held by
// `holder` (the engine doing the file I/O), until fio exits. Ferry's figure
// is what the holder's ring took in fio's own window (its runtime, ending
// when it exited; sampled from the holder's file counters every 2 ms), so
// both are measured over the same moments of the same disk.
StatusOr<std::pair<Figures, Figures>> RunAlongside(
    Engine& holder, const std::string& fio, bool read,
    const std::function<void(const std::atomic<bool>*)>& ferry) {
  struct Sample {
    Clock::time_point at;
    uint64_t bytes, ops;
  };
  auto sample = [&holder] {
    const EngineMetrics m = holder.GetMetrics();
    return Sample{Clock::now(), m.file_direct_bytes + m.file_buffered_bytes,
                  m.file_direct_ops + m.file_buffered_ops};
  };
  std::atomic<bool> fio_done{false};
  std::optional<StatusOr<Figures>> fio_result;
  Clock::time_point fio_end;
  std::vector<Sample> samples{sample()};
  std::thread fio_thread([&] {
    fio_result = RunFio(fio, read);
    fio_end = Clock::now();
    fio_done = true;
  });
  std::thread sampler([&] {
    while (!fio_done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      samples.push_back(sample());
    }
  });
  ferry(&fio_done);
  fio_thread.join();
  sampler.join();
  samples.push_back(sample());
  if (!fio_result->ok()) return fio_result->status();
  const Figures fio_figures = **fio_result;
  // The counters at a moment, between the samples around it.
  auto at = [&samples](Clock::time_point t, uint64_t Sample::*field) {
    if (t <= samples.front().at) return static_cast<double>(samples.front().*field);
    for (size_t k = 1; k < samples.size(); ++k) {
      if (samples[k].at >= t) {
        const Sample& a = samples[k - 1];
        const Sample& b = samples[k];
        const double span = Seconds(b.at - a.at);
        const double w = span > 0 ? Seconds(t - a.at) / span : 1.0;
        return static_cast<double>(a.*field) +
               w * (static_cast<double>(b.*field) - static_cast<double>(a.*field));
      }
    }
    return static_cast<double>(samples.back().*field);
  };
  const auto begin = fio_end - std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(fio_figures.seconds));
  Figures ferry_figures;
  ferry_figures.seconds = fio_figures.seconds;
  ferry_figures.bytes =
      static_cast<uint64_t>(at(fio_end, &Sample::bytes) - at(begin, &Sample::bytes));
  ferry_figures.ops = static_cast<uint64_t>(at(fio_end, &Sample::ops) - at(begin, &Sample::ops));
  return std::make_pair(ferry_figures, fio_figures);
}

}  // namespace

int RunFileBench(const BenchOptions& o) {
  std::optional<Workload> kv;
  if (o.kv) kv = MakeKvWorkload(o.op, *o.kv, 1);
  const uint64_t file_size = FileSize(o, kv ? &*kv : nullptr);
  const bool read = o.op == Operation::kRead;
  Shape shape{o.block, o.batch, o.random};
  if (kv) shape = {o.kv->page * o.kv->bytes_per_token, kKvQueueDepth, true};
  PrepareFile(o.file, file_size, read);
  // Local: this engine's own file region through its own segment. Remote
  // (--transport tcp|shm): a second engine of this process holds the file
  // and does its I/O; this one moves the bytes to or from it.
  const bool remote = o.transport == "tcp" || o.transport == "shm";
  EngineOptions eo = o.MakeEngineOptions();
  if (!remote) eo.transport = "local";
  eo.file_queue_depth = static_cast<uint32_t>(std::min<uint64_t>(shape.depth, 4096));
  auto engine = Engine::Create(eo);
  if (!engine.ok()) Fail("cannot start the engine", engine.status());
  Engine& e = **engine;  // holds the file
  std::unique_ptr<Engine> initiator_engine;
  if (remote) {
    auto i = Engine::Create(eo);
    if (!i.ok()) Fail("cannot start the initiator engine", i.status());
    initiator_engine = std::move(i).value();
  }
  Engine& init = remote ? *initiator_engine : e;
  FileRegion region;
  region.path = o.file;
  region.length = file_size;
  region.durable = o.durable;
  region.direct = o.direct;
  auto base = e.RegisterFile(region);
  if (!base.ok()) Fail("cannot register " + o.file, base.status());
  // The memory baseline of a remote run: the same transfers to memory of
  // the target as large as the file.
  std::unique_ptr<Buffer> target_memory;
  if (remote && !o.no_baseline) {
    target_memory = std::make_unique<Buffer>(file_size, true, o.hugepages);
    Status st = e.RegisterMemory(target_memory->data(), target_memory->length(), "cpu");
    if (!st.ok()) Fail("cannot register the target's memory", st);
  }
  auto seg = init.OpenSegment(e.PeerId());
  if (!seg.ok()) Fail("cannot open the segment of " + e.PeerId(), seg.status());
  // Blocks: two batches in flight; KV pages: the preset's pages.
  Buffer buf(kv ? kv->local_bytes : 2 * o.block * o.batch, true, o.hugepages);
  Status st = init.RegisterMemory(buf.data(), buf.length(), "cpu");
  if (!st.ok()) Fail("cannot register the buffer", st);

  // Rounds of Ferry, fio(, Ferry to memory): the duration shared out
  // among the rounds, so drift in the machine's load and in the disk weighs
  // on all alike.
  const int rounds = static_cast<int>(o.rounds != 0 ? o.rounds : 2);
  const double half = (o.duration > 0 ? o.duration : 1.5) / rounds;
  const std::string fio = FioCommand(o, shape, file_size, half);
  Figures ferry_figures, fio_figures, memory_figures;
  std::string fio_error;
  uint64_t cursor = 0, memory_cursor = 0;
  std::mt19937_64 rng(42), memory_rng(42);
  // One phase of Ferry's transfers to `target` (the file region or memory).
  auto run_ferry = [&](uint64_t target, uint64_t* at, std::mt19937_64* r, double seconds,
                       const std::atomic<bool>* stop = nullptr) {
    if (kv) return RunFerryPages(init, *seg, buf.data(), target, kv->batches[0], seconds, stop);
    return RunFerry(init, *seg, buf.data(), target, o, file_size, seconds, at, r, stop);
  };
  // One untimed pass (KV pages) or pair of batches to each target first:
  // the streams' set-up and the first touch of staging and buffers are
  // not what the rounds compare (fio's set-up is outside its runtime too).
  {
    uint64_t warm_cursor = 0;
    std::mt19937_64 warm_rng(7);
    run_ferry(reinterpret_cast<uint64_t>(*base), &warm_cursor, &warm_rng, 0);
    if (target_memory) {
      run_ferry(reinterpret_cast<uint64_t>(target_memory->data()), &warm_cursor, &warm_rng, 0);
    }
  }
  struct Round {
    Figures ferry, fio, memory;
  };
  std::vector<Round> per_round(rounds);
  for (Round& r : per_round) {
    bool measured = false;  // Ferry's phase, alongside fio
    if (o.fio_alongside && fio_error.empty()) {
      auto f = RunAlongside(e, fio, read, [&](const std::atomic<bool>* stop) {
        run_ferry(reinterpret_cast<uint64_t>(*base), &cursor, &rng, half, stop);
      });
      if (f.ok()) {
        std::tie(r.ferry, r.fio) = *f;
        measured = true;
      } else {
        fio_error = f.status().ToString();  // the rest run without fio
      }
    }
    if (!measured) r.ferry = run_ferry(reinterpret_cast<uint64_t>(*base), &cursor, &rng, half);
    ferry_figures.Add(r.ferry);
    if (o.no_baseline) continue;
    if (!o.fio_alongside && fio_error.empty()) {
      auto f = RunFio(fio, read);
      if (f.ok()) {
        r.fio = *f;
      } else {
        fio_error = f.status().ToString();
      }
    }
    fio_figures.Add(r.fio);
    if (target_memory) {
      r.memory = run_ferry(reinterpret_cast<uint64_t>(target_memory->data()), &memory_cursor,
                           &memory_rng, half);
      memory_figures.Add(r.memory);
    }
  }
  // Each round's Ferry against its own fio (and memory): the spread says
  // how much the disk drifted.
  std::vector<double> round_ratios;
  if (!o.no_baseline && fio_error.empty()) {
    for (const Round& r : per_round) {
      const double floor = target_memory ? std::min(r.fio.GBps(), r.memory.GBps()) : r.fio.GBps();
      round_ratios.push_back(Ratio(r.ferry.GBps(), floor));
    }
  }
  const EngineMetrics m = e.GetMetrics();
  const double ratio_bw = Ratio(ferry_figures.GBps(), fio_figures.GBps());
  const double ratio_iops = Ratio(ferry_figures.Iops(), fio_figures.Iops());
  // Remote: against the slower of the two things a remote file transfer
  // does, the target's file I/O (fio) and the transport (memory).
  const double floor_bw = std::min(fio_figures.GBps(), memory_figures.GBps());
  const double ratio_floor = Ratio(ferry_figures.GBps(), floor_bw);
  if (o.json) {
    Json j;
    j["ferry_version"] = Version();
    j["target_kind"] = "file";
    j["transport"] = remote ? o.transport : "local";
    j["file"] = o.file;
    j["file_bytes"] = file_size;
    j["operation"] = std::string(OperationName(o.op));
    j["workload"] = kv ? Json(kv->description) : Json(nullptr);
    j["requests_per_batch"] = kv ? kv->batches[0].size() : o.batch;
    j["block"] = shape.block;
    j["queue_depth"] = shape.depth;
    j["direct"] = o.direct;
    j["durable"] = o.durable;
    j["random"] = shape.random;
    j["ferry"] = {{"gbps", Figure(ferry_figures.GBps())},
                  {"iops", Figure(ferry_figures.Iops())},
                  {"direct_ops", m.file_direct_ops},
                  {"buffered_ops", m.file_buffered_ops},
                  {"target_staging_bytes_peak", m.target_staging_bytes_peak}};
    if (o.no_baseline) {
      j["fio"] = nullptr;
    } else {
      j["fio"] = {{"job", fio},
                  {"gbps", Figure(fio_figures.GBps())},
                  {"iops", Figure(fio_figures.Iops())},
                  {"error", fio_error}};
    }
    j["ratio"] = {{"gbps", Figure(ratio_bw)}, {"iops", Figure(ratio_iops)}};
    if (target_memory) {
      j["memory"] = {{"gbps", Figure(memory_figures.GBps())},
                     {"iops", Figure(memory_figures.Iops())}};
      j["ratio"]["gbps_vs_min_fio_memory"] = Figure(ratio_floor);
    }
    j["rounds"] = rounds;
    j["fio_alongside"] = o.fio_alongside;
    Json each = Json::array();
    for (size_t k = 0; k < per_round.size(); ++k) {
      Json r = {{"ferry_gbps", Figure(per_round[k].ferry.GBps())}};
      if (!o.no_baseline) r["fio_gbps"] = Figure(per_round[k].fio.GBps());
      if (target_memory) r["memory_gbps"] = Figure(per_round[k].memory.GBps());
      if (k < round_ratios.size()) r["ratio_gbps"] = Figure(round_ratios[k]);
      each.push_back(r);
    }
    j["per_round"] = each;
    PrintJson(j);
    return 0;
  }
  std::cout << "ferry bench --target-kind file: " << OperationName(o.op) << " ";
  if (kv) {
    std::cout << "of KV pages " << kv->description << " (" << kv->batches[0].size() << " x "
              << shape.block << " B, scattered in buffer and file)";
  } else {
    std::cout << o.block << " B blocks";
  }
  std::cout << ", queue depth " << shape.depth << ", file " << o.file << " (" << (file_size >> 20)
            << " MiB), " << (o.direct ? "O_DIRECT" : "page cache") << (o.durable ? ", durable" : "")
            << (o.random ? ", random offsets" : "")
            << (remote ? ", held by a second engine of this process over " + o.transport
                       : std::string(", this engine's own region (local)"))
            << "; rounds Ferry"
            << (o.no_baseline     ? ""
                : o.fio_alongside ? " alongside fio"
                                  : ", fio")
            << (target_memory ? ", Ferry to memory" : "") << " ×" << rounds << " of "
            << Fixed(half, 2) << " s, after one untimed pass\n";
  std::cout << Pad("", 10, true) << Pad("GB/s", 10) << Pad("IOPS", 12) << "\n";
  std::cout << Pad("ferry", 10, true) << Pad(Fixed(ferry_figures.GBps(), 3), 10)
            << Pad(Fixed(ferry_figures.Iops(), 0), 12) << "   (ops: " << m.file_direct_ops
            << " O_DIRECT, " << m.file_buffered_ops << " page cache)\n";
  if (remote) {
    std::cout << "target staging: at most " << Fixed(m.target_staging_bytes_peak / 1048576.0, 1)
              << " MiB of host buffers at once\n";
  }
  if (!o.no_baseline) {
    std::cout << Pad("fio", 10, true) << Pad(Fixed(fio_figures.GBps(), 3), 10)
              << Pad(Fixed(fio_figures.Iops(), 0), 12) << "\n";
    if (target_memory) {
      std::cout << Pad("memory", 10, true) << Pad(Fixed(memory_figures.GBps(), 3), 10)
                << Pad(Fixed(memory_figures.Iops(), 0), 12)
                << "   (Ferry, the same transfers to the target's memory)\n";
    }
    std::cout << Pad("ferry/fio", 10, true) << Pad(Fixed(ratio_bw, 2), 10)
              << Pad(Fixed(ratio_iops, 2), 12) << "\n";
    if (target_memory) {
      std::cout << Pad("ferry/min", 10, true) << Pad(Fixed(ratio_floor, 2), 10)
                << "              (GB/s against the slower of fio and memory)\n";
    }
    if (!round_ratios.empty()) {
      std::cout << "per round ferry/" << (target_memory ? "min" : "fio") << " (GB/s):";
      for (double r : round_ratios) std::cout << " " << Fixed(r, 2);
      std::cout << "\n";
    }
    std::cout << "fio job: " << fio << "\n";
    if (!fio_error.empty()) std::cout << "fio baseline not measured: " << fio_error << "\n";
  }
  return 0;
}

}  // namespace ferry::bench
