#include "bench_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

namespace ferry::bench {

Report MakeReport(PhaseResult r, std::optional<Baseline> base, int streams, bool in_process) {
  Report rep;
  rep.ferry = std::move(r);
  rep.batch_lat = Summarize(rep.ferry.batch_lat_us);
  rep.request_lat = Summarize(rep.ferry.request_lat_us);
  if (base) {
    rep.rtt = Summarize(base->rtt_us);
    rep.pingpong_8 = Summarize(base->pingpong_8_us);
    rep.pingpong_4k = Summarize(base->pingpong_4k_us);
  }
  rep.base = std::move(base);
  rep.streams = streams;
  rep.in_process = in_process;
  return rep;
}

// ---------------------------------------------------------------------------
// The table

namespace {

constexpr size_t W = 12;  // a column of figures

// Whether the table has the baseline columns (the plain streams ran), and
// the scatter column.
bool HasBaseline(const Report& rep) { return rep.base.has_value() && rep.base->single.seconds > 0; }
bool HasScatter(const Report& rep) { return HasBaseline(rep) && rep.base->scatter.seconds > 0; }
bool HasPingPong(const Report& rep) { return HasBaseline(rep) && rep.pingpong_4k.count > 0; }

void PrintHeadline(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  os << "ferry bench: " << OperationName(f.op) << ", " << f.workload
     << (f.sync ? " (synchronous, one request at a time)" : "")
     << (f.prepared ? " (prepared transfers)" : "") << ", " << f.threads
     << (f.threads == 1 ? " thread" : " threads") << ", " << rep.streams << " streams, transport "
     << f.transport << ", " << Fixed(f.seconds, 2) << " s\n\n";
}

// The column heads, throughput, Ferry / baseline and requests/s.
void PrintThroughput(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  const bool b = HasBaseline(rep), sc = HasScatter(rep);
  os << Pad("", 24, true) << Pad("Ferry", W);
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
}

// CPU seconds of one side (or both) in each column; a baseline's NaN where
// there is none.
struct CpuColumns {
  double ferry, single, multi, scatter;
};

void PrintCpuRow(const Report& rep, std::ostream& os, const char* name, const CpuColumns& c) {
  auto per_gb = [](double cpu, uint64_t bytes) { return bytes ? cpu / (bytes / 1e9) : kNaN; };
  os << Pad(name, 24, true) << Pad(Fixed(rep.ferry.cpu_per_gb(c.ferry), 3), W);
  if (HasBaseline(rep)) {
    const Baseline& b = *rep.base;
    os << Pad(Fixed(per_gb(c.single, b.single.bytes), 3), W)
       << Pad(Fixed(per_gb(c.multi, b.multi.bytes), 3), W);
    if (HasScatter(rep)) os << Pad(Fixed(per_gb(c.scatter, b.scatter.bytes), 3), W);
  }
  os << "\n";
}

void PrintCpu(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  const Baseline none{};  // every figure NaN
  const Baseline& b = HasBaseline(rep) ? *rep.base : none;
  const CpuColumns initiator{f.cpu_initiator, b.cpu_single_initiator, b.cpu_multi_initiator,
                             b.cpu_scatter_initiator};
  if (rep.in_process) {
    PrintCpuRow(rep, os, "CPU s/GB (one process)", initiator);
    return;
  }
  PrintCpuRow(rep, os, "CPU s/GB initiator", initiator);
  PrintCpuRow(rep, os, "CPU s/GB target",
              {f.cpu_target, b.cpu_single_target, b.cpu_multi_target, b.cpu_scatter_target});
  PrintCpuRow(rep, os, "CPU s/GB both sides",
              {Sum(f.cpu_initiator, f.cpu_target),
               HasBaseline(rep) ? Sum(b.cpu_single_initiator, b.cpu_single_target) : kNaN,
               HasBaseline(rep) ? Sum(b.cpu_multi_initiator, b.cpu_multi_target) : kNaN,
               HasBaseline(rep) ? Sum(b.cpu_scatter_initiator, b.cpu_scatter_target) : kNaN});
}

void PrintLatency(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
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
  if (HasBaseline(rep)) lat_row("plain busy-poll RTT 8 B", rep.rtt);
  if (HasPingPong(rep)) {
    lat_row("shm ping-pong 8 B", rep.pingpong_8);
    lat_row("shm ping-pong 4 KiB", rep.pingpong_4k);
  }
}

// What the memcpy column copied: one thread, its working set on each side.
void PrintMemcpyNote(const Report& rep, std::ostream& os) {
  if (!HasBaseline(rep) || rep.base->memcpy_copied_bytes == 0) return;
  const Baseline& b = *rep.base;
  os << "memcpy: one thread over " << (b.memcpy_src_bytes >> 20) << " MiB -> "
     << (b.memcpy_dst_bytes >> 20) << " MiB, " << (b.memcpy_copied_bytes >> 20)
     << " MiB a round (thread 0's entries, repeated to span at least " << (kMemcpyWorkingSet >> 20)
     << " MiB a side: larger than L3)\n";
}

// The ratios' line (or why there are no baselines) and --verify's count.
void PrintSummary(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  if (HasBaseline(rep)) {
    const Baseline& b = *rep.base;
    os << "\nFerry / plain " << b.multi.streams
       << " streams: " << Fixed(Ratio(f.gbps(), b.multi.gbps()), 2)
       << "x   Ferry / plain 1 stream: " << Fixed(Ratio(f.gbps(), b.single.gbps()), 2) << "x";
    if (f.sync) {
      os << "   Ferry p50 / busy-poll RTT: " << Fixed(Ratio(rep.request_lat.p50, rep.rtt.p50), 2)
         << "x";
    }
    if (HasPingPong(rep)) {
      os << "   Ferry p50 / shm ping-pong 4 KiB: "
         << Fixed(Ratio(rep.request_lat.p50, rep.pingpong_4k.p50), 2) << "x";
    }
    double fc = f.cpu_per_gb(Sum(f.cpu_initiator, f.cpu_target));
    double bc = b.multi.bytes
                    ? Sum(b.cpu_multi_initiator, b.cpu_multi_target) / (b.multi.bytes / 1e9)
                    : kNaN;
    os << "   CPU / plain: " << Fixed(Ratio(fc, bc), 2) << "x\n";
    PrintMemcpyNote(rep, os);
    if (!b.pingpong_error.empty()) os << "shm ping-pong not measured: " << b.pingpong_error << "\n";
  } else if (rep.base) {
    os << "\n(baselines skipped: the target's control port is unknown; pass --control)\n";
  }
  if (f.verify) {
    os << "verified " << f.verified_bytes << " bytes: " << f.mismatches << " bytes differ in "
       << f.mismatched_blocks << " blocks" << (f.mismatches == 0 ? " (all good)" : " (FAILED)")
       << "\n";
  }
}

void PrintFabric(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  const FabricBaselineResult& fb = *rep.fabric;
  if (!fb.error.empty()) {
    os << "\nfabric baseline (plain libfabric RMA, " << fb.provider << "): not run: " << fb.error
       << "\n";
    return;
  }
  os << "\nfabric baseline: plain libfabric RMA loop, " << fb.provider
     << ", two endpoints in this process, " << fb.depth << " ops in flight, one entry per op"
     << (f.op == Operation::kRead ? "" : ", writes FI_DELIVERY_COMPLETE") << "\n"
     << Pad("throughput GB/s", 24, true) << Pad(Fixed(fb.gbps(), 3), W) << "   ("
     << Fixed(fb.ops / std::max(fb.seconds, 1e-9), 0) << " ops/s, CPU "
     << Fixed(fb.bytes ? fb.cpu_seconds / (fb.bytes / 1e9) : kNaN, 3) << " s/GB)\n"
     << "Ferry fabric / libfabric baseline: " << Fixed(Ratio(f.gbps(), fb.gbps()), 2) << "x\n";
}

// --prepared: the prepared phase next to the plain batches, the set-up and
// the 1 M-row figure.
void PrintPrepared(const Report& rep, std::ostream& os) {
  const PhaseResult& f = rep.ferry;
  const PhaseResult& p = *rep.plain;
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
     << Fixed(f.make_ms, 3) << " (" << f.transfers
     << (f.transfers == 1 ? " transfer, " : " transfers, ") << f.pairs << " pairs, "
     << f.merged_entries << " entries after merging); last post " << Fixed(f.post_us, 1) << " µs\n";
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

}  // namespace

void PrintTable(const Report& rep, std::ostream& os) {
  PrintHeadline(rep, os);
  PrintThroughput(rep, os);
  PrintCpu(rep, os);
  PrintLatency(rep, os);
  PrintSummary(rep, os);
  if (rep.fabric) PrintFabric(rep, os);
  if (rep.plain) PrintPrepared(rep, os);
}

// ---------------------------------------------------------------------------
// --json

Json Figure(double v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return std::strtod(buf, nullptr);
}

namespace {

Json LatencyJson(const Percentiles& p) {
  return {{"p50", Figure(p.p50)},
          {"p99", Figure(p.p99)},
          {"p999", Figure(p.p999)},
          {"max", Figure(p.max)},
          {"samples", static_cast<uint64_t>(p.count)}};
}

// "prepared": --prepared's set-up, the plain batches and the 1 M rows; null
// without --prepared.
Json PreparedJson(const Report& rep) {
  if (!rep.plain) return nullptr;
  const PhaseResult& f = rep.ferry;
  const PhaseResult& p = *rep.plain;
  const PrepareMicro& m = rep.micro;
  return {{"rows_ms", Figure(f.rows_ms)},
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
}

// "fabric_baseline": null unless --transport fabric.
Json FabricJson(const Report& rep) {
  if (!rep.fabric) return nullptr;
  const FabricBaselineResult& fb = *rep.fabric;
  return {{"provider", fb.provider},
          {"error", fb.error},
          {"in_process", true},
          {"ops_in_flight", fb.depth},
          {"throughput_gbps", Figure(fb.error.empty() ? fb.gbps() : kNaN)},
          {"ops", fb.ops},
          {"seconds", Figure(fb.seconds)},
          {"cpu_s_per_gb", Figure(fb.bytes ? fb.cpu_seconds / (fb.bytes / 1e9) : kNaN)},
          {"ratio", Figure(fb.error.empty() ? Ratio(rep.ferry.gbps(), fb.gbps()) : kNaN)}};
}

// "baseline": the plain streams, scatter, RTT and memcpy, and Ferry's ratios
// to them; null when they did not run.
Json BaselineJson(const Report& rep, double ferry_cpu) {
  if (!HasBaseline(rep)) return nullptr;
  const PhaseResult& f = rep.ferry;
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
  base["memcpy_working_set_bytes"] = {{"source", b.memcpy_src_bytes},
                                      {"destination", b.memcpy_dst_bytes},
                                      {"copied_per_round", b.memcpy_copied_bytes}};
  base["shm_pingpong_8_us"] = HasPingPong(rep) ? LatencyJson(rep.pingpong_8) : Json(nullptr);
  base["shm_pingpong_4k_us"] = HasPingPong(rep) ? LatencyJson(rep.pingpong_4k) : Json(nullptr);
  if (!b.pingpong_error.empty()) base["shm_pingpong_error"] = b.pingpong_error;
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
      {"p50_vs_shm_pingpong_4k",
       Figure(HasPingPong(rep) ? Ratio(request_p50, rep.pingpong_4k.p50) : kNaN)},
      {"cpu_vs_socket", Figure(Ratio(ferry_cpu, multi_cpu))}};
  return base;
}

}  // namespace

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
  j["prepared"] = PreparedJson(rep);
  j["fabric_baseline"] = FabricJson(rep);
  j["baseline"] = BaselineJson(rep, ferry_cpu);
}

void PrintJson(const Json& j) {
  std::cout << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
}

}  // namespace ferry::bench
