// What `ferry bench` prints: the table (Ferry next to its baselines), or one
// line of JSON (--json). The docs' benchmark figures are read from these, so
// their format is kept as it is.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>

#include "bench_baselines.h"
#include "bench_phase.h"
#include "fabric_baseline.h"
#include "stats.h"

namespace ferry::bench {

using Json = nlohmann::ordered_json;  // --json keeps the fields in the order written

struct Report {
  PhaseResult ferry;
  Percentiles batch_lat, request_lat;
  std::optional<Baseline> base;
  Percentiles rtt;
  Percentiles pingpong_8, pingpong_4k;  // the shm ping-pong (count 0: not run)
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

// The report of a measurement: its latencies summarized.
Report MakeReport(PhaseResult r, std::optional<Baseline> base, int streams, bool in_process);

// The table.
void PrintTable(const Report& rep, std::ostream& os);

// A measured figure in --json: six significant digits, null when there is
// none (NaN: not measured).
Json Figure(double v);
// The fields of one measurement, added to `j` (an object).
void AddJsonBody(Json& j, const Report& rep);
// One line of JSON on stdout.
void PrintJson(const Json& j);

}  // namespace ferry::bench
