#include "bench_sweep.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "bench_baselines.h"
#include "bench_phase.h"
#include "bench_report.h"
#include "cli.h"
#include "ferry/ferry.h"
#include "workload.h"

#ifndef FERRY_TOOLS_SOURCE_DIR
#define FERRY_TOOLS_SOURCE_DIR "."
#endif

namespace ferry::bench {
namespace {

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

struct Point {
  uint64_t threads, block, batch;
  Report rep;
};

// What the sweep measured: its points and (unless --no-baseline) the
// baselines on the biggest batch.
struct Sweep {
  std::vector<Point> points;
  int streams = 0;
  std::optional<Baseline> base;
  Percentiles rtt;
  std::string transport() const { return points.empty() ? "" : points[0].rep.ferry.transport; }
};

// One Ferry phase per (threads, block); returns the biggest batch's workload.
Workload MeasurePoints(Session& s, const BenchOptions& o, Sweep& sw) {
  Workload biggest;
  for (uint64_t threads : o.sweep_threads) {
    for (uint64_t block : o.sweep_blocks) {
      uint64_t batch = SweepBatch(o, block);
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
      sw.points.push_back(
          {threads, block, batch,
           MakeReport(std::move(r), std::nullopt, sw.streams, s.target_in_process)});
      if (w.batch_bytes(0) > (biggest.batches.empty() ? 0 : biggest.batch_bytes(0))) biggest = w;
    }
  }
  return biggest;
}

void WriteCsv(const Sweep& sw, const std::string& csv) {
  std::ofstream out(csv);
  if (!out) throw cli::RunError("cannot write " + csv);
  out << "threads,block_size,batch_size,throughput_gbps,requests_per_s,batch_p50_us,batch_p99_us,"
         "request_p50_us,request_p99_us,cpu_s_per_gb,socket_gbps,socket_single_gbps,"
         "socket_rtt_us,memcpy_gbps,transport\n";
  const std::optional<Baseline>& base = sw.base;
  for (const Point& p : sw.points) {
    const PhaseResult& f = p.rep.ferry;
    out << p.threads << "," << p.block << "," << p.batch << "," << f.gbps() << "," << f.rps() << ","
        << p.rep.batch_lat.p50 << "," << p.rep.batch_lat.p99 << "," << p.rep.request_lat.p50 << ","
        << p.rep.request_lat.p99 << "," << f.cpu_per_gb(Sum(f.cpu_initiator, f.cpu_target)) << ","
        << (base ? base->multi.gbps() : kNaN) << "," << (base ? base->single.gbps() : kNaN) << ","
        << sw.rtt.p50 << "," << (base ? base->memcpy_gbps : kNaN) << "," << f.transport << "\n";
  }
}

void PrintSweepJson(const BenchOptions& o, const Sweep& sw, const std::string& csv,
                    const std::string& chart) {
  Json j;
  j["ferry_version"] = Version();
  j["operation"] = OperationName(o.op);
  j["streams"] = sw.streams;
  j["transport"] = sw.transport();
  j["points"] = Json::array();
  for (const Point& p : sw.points) {
    Json point;
    point["batch_size"] = p.batch;
    AddJsonBody(point, p.rep);
    j["points"].push_back(std::move(point));
  }
  if (sw.base) {
    j["baseline"] = {{"socket_gbps", Figure(sw.base->multi.gbps())},
                     {"socket_streams", sw.base->multi.streams},
                     {"socket_single_gbps", Figure(sw.base->single.gbps())},
                     {"socket_rtt_us", Figure(sw.rtt.p50)},
                     {"memcpy_gbps", Figure(sw.base->memcpy_gbps)}};
  } else {
    j["baseline"] = nullptr;
  }
  j["csv"] = csv;
  j["chart"] = chart;
  PrintJson(j);
}

// chart: the PNG's path, "" when none was drawn.
void PrintSweepTable(const BenchOptions& o, const Sweep& sw, const std::string& csv,
                     const std::string& chart) {
  std::cout << "ferry bench --sweep: " << OperationName(o.op) << ", " << sw.streams
            << " streams, transport " << sw.transport() << "\n\n";
  std::cout << Pad("threads", 8) << Pad("block", 10) << Pad("batch", 7) << Pad("GB/s", 9)
            << Pad("req/s", 11) << Pad("batch p50", 12) << Pad("batch p99", 12)
            << Pad("req p50", 11) << Pad("req p99", 11) << Pad("vs plain", 10) << "\n";
  for (const Point& p : sw.points) {
    const PhaseResult& f = p.rep.ferry;
    std::cout << Pad(std::to_string(p.threads), 8) << Pad(cli::FormatSize(p.block), 10)
              << Pad(std::to_string(p.batch), 7) << Pad(Fixed(f.gbps(), 3), 9)
              << Pad(Fixed(f.rps(), 0), 11) << Pad(Fixed(p.rep.batch_lat.p50, 1), 12)
              << Pad(Fixed(p.rep.batch_lat.p99, 1), 12) << Pad(Fixed(p.rep.request_lat.p50, 1), 11)
              << Pad(Fixed(p.rep.request_lat.p99, 1), 11)
              << Pad(sw.base ? Fixed(Ratio(f.gbps(), sw.base->multi.gbps()), 2) + "x" : "-", 10)
              << "\n";
  }
  if (sw.base) {
    std::cout << "\nplain TCP: 1 stream " << Fixed(sw.base->single.gbps(), 3) << " GB/s, "
              << sw.base->multi.streams << " streams " << Fixed(sw.base->multi.gbps(), 3)
              << " GB/s; busy-poll RTT p50 " << Fixed(sw.rtt.p50, 1) << " µs; memcpy "
              << Fixed(sw.base->memcpy_gbps, 2) << " GB/s\n";
  }
  std::cout << "latencies in µs; wrote " << csv;
  if (!chart.empty()) std::cout << " and " << chart;
  std::cout << "\n";
}

}  // namespace

uint64_t SweepBatch(const BenchOptions& o, uint64_t block) {
  return std::min<uint64_t>(o.batch, std::max<uint64_t>(1, kSweepBatchBytes / block));
}

int RunSweep(Session& s, const BenchOptions& o) {
  Sweep sw;
  sw.streams = s.engine->options().tcp_streams;
  const Workload biggest = MeasurePoints(s, o, sw);
  if (!o.no_baseline && s.have_control) {
    sw.base = RunBaselines(s, o, biggest, std::clamp(o.duration, 0.5, 1.0), sw.streams, false);
    sw.rtt = Summarize(sw.base->rtt_us);
  }
  const std::string csv = o.output + ".csv", png = o.output + ".png";
  WriteCsv(sw, csv);
  const std::string plot_error = Plot(o, csv, png);
  const std::string chart = plot_error.empty() ? png : "";
  if (o.json) {
    PrintSweepJson(o, sw, csv, chart);
  } else {
    PrintSweepTable(o, sw, csv, chart);
  }
  if (!plot_error.empty())
    std::fprintf(stderr, "ferry bench: chart not written: %s\n", plot_error.c_str());
  return 0;
}

}  // namespace ferry::bench
