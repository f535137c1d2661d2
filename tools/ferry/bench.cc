// `ferry bench`: which role runs, and the initiator's run from the
// measurements to the report.
//
// How the processes meet is kept apart from what is measured: the launcher
// (no --role) starts a target child (bench_roles.h) and then acts as the
// initiator; the measurement code only sees a Session (bench_session.h).
// The parts: bench_options (flags), bench_roles (target, target child),
// bench_session (opening the target), bench_phase (the Ferry phase; with
// bench_prepared and bench_verify), bench_baselines, bench_report (table and
// JSON), bench_sweep.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>

#include "bench_baselines.h"
#include "bench_file.h"
#include "bench_options.h"
#include "bench_phase.h"
#include "bench_report.h"
#include "bench_roles.h"
#include "bench_session.h"
#include "bench_sweep.h"
#include "bench_util.h"
#include "cli.h"
#include "commands.h"
#include "control.h"
#include "ferry/ferry.h"
#include "workload.h"

namespace ferry::bench {
namespace {

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
      most = std::max(most, block * SweepBatch(o, block) * threads);
    }
  }
  return most;
}

// The Ferry phase and, with --prepared, the plain batches of the same
// requests (into *plain) and the 1 M-row figure (into *micro).
PhaseResult MeasureFerry(Session& s, const BenchOptions& o, const Workload& w,
                         std::optional<PhaseResult>* plain, PrepareMicro* micro) {
  if (!o.prepared) return Phase(s, o, w).Run(!o.json);
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
  PhaseResult r = Phase(s, half, w, true).Run(!o.json);
  *plain = Phase(s, half, w).Run(!o.json);
  MergePhase(**plain, Phase(s, again, w).Run(!o.json));
  MergePhase(r, Phase(s, again, w, true).Run(!o.json));
  *micro = RunPrepareMicro(s);
  return r;
}

// The baselines for the measurement `r` of w (none with --no-baseline).
std::optional<Baseline> MeasureBaselines(Session& s, const BenchOptions& o, const Workload& w,
                                         const PhaseResult& r, int streams) {
  if (o.no_baseline) return std::nullopt;
  // The scatter baseline only differs from the plain streams for small entries.
  bool small_entries = false;
  for (const auto& batch : w.batches) {
    for (const Entry& e : batch) small_entries |= e.length < (1u << 20);
  }
  // --sync on shm: also the shared-memory ping-pong its latency is held to.
  return RunBaselines(s, o, w, std::clamp(r.seconds, 0.5, 1.0), streams, small_entries,
                      o.sync && r.transport == "shm");
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
  std::optional<PhaseResult> plain;
  PrepareMicro micro;
  PhaseResult r = MeasureFerry(s, o, w, &plain, &micro);
  if (!o.kv) r.block = o.block;
  const int streams = s.engine->options().tcp_streams;
  std::optional<Baseline> base = MeasureBaselines(s, o, w, r, streams);
  std::optional<FabricBaselineResult> fabric;
  if (!o.no_baseline && s.engine->options().transport == "fabric") {
    fabric = RunFabricBaselineOf(s, w, std::clamp(r.seconds, 0.5, 1.5));
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

// The buffer each side registers: what the workload needs (at least
// kMinBuffer, rounded to 2 MiB), or --buffer-size.
uint64_t LocalBytes(const BenchOptions& o) {
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
  return local_bytes;
}

// --role initiator: the target was started by hand.
int RunAgainstTarget(const BenchOptions& o, uint64_t local_bytes) {
  Session s;
  OpenSession(s, o, o.target, o.control, local_bytes);
  if (!s.have_control && !o.no_baseline) {
    std::fprintf(stderr,
                 "ferry bench: the target's control port is unknown (pass --control "
                 "HOST:PORT): no baselines and no target CPU figures\n");
  }
  return RunInitiator(o, s);
}

// The launcher with --transport local: the target's engine, buffer and
// control port in this process.
int RunInProcess(const BenchOptions& o, uint64_t local_bytes) {
  Session s;
  s.target_in_process = true;
  s.target_buffer = std::make_unique<Buffer>(local_bytes, true, o.hugepages);
  s.target_control = std::make_unique<ControlServer>(o.listen, s.target_buffer->data(), local_bytes,
                                                     o.ByName() ? o.name : "");
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

// The launcher: a target child process, then the initiator here.
int RunWithChild(const BenchOptions& o, uint64_t local_bytes) {
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

int Run(const BenchOptions& o) {
  if (o.target_kind == "file") return RunFileBench(o);
  if (o.role == Role::kTarget) return RunTarget(o);
  const uint64_t local_bytes = LocalBytes(o);
  if (o.role == Role::kInitiator) return RunAgainstTarget(o, local_bytes);
  if (o.transport == "local") return RunInProcess(o, local_bytes);
  return RunWithChild(o, local_bytes);
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
