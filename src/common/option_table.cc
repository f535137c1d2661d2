// The option table: every EngineOptions setting that has a range or a FERRY_*
// variable, each written once. ValidateOptions (Engine::Create), the
// environment overlay (env.cc), `ferry info` and docs/architecture.md (checked
// by option_table_test.cc) all read it.
#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/env.h"
#include "ferry/metadata.h"
#include "ferry/options.h"

namespace ferry {
namespace {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
// The largest payload of one frame (wire::kMaxPayload; option_table_test
// checks they agree).
constexpr int64_t kMaxPayload = 64 * kMiB;
constexpr int64_t kDayMs = 86400000;
constexpr int64_t kSecondUs = 1000000;

struct Row {
  std::string_view name = {};
  std::string_view variable = {};  // "" if none
  std::string_view unit = {};      // "ms", "us", "B" or ""
  std::string_view meaning = {};
  // Integer options (get != nullptr): valid values are [min, max], and 0 too
  // when zero_means says what 0 means.
  int64_t min = 0;
  int64_t max = 0;
  std::string_view zero_means = {};
  // The lower bound is this option's value (and at least `min`).
  std::string_view min_option = {};
  int64_t (*get)(const EngineOptions&) = nullptr;
  void (*set)(EngineOptions&, int64_t) = nullptr;
  // String options: the valid values, in words. Not checked here.
  std::string_view values = {};
  const std::string& (*get_string)(const EngineOptions&) = nullptr;
  void (*set_string)(EngineOptions&, std::string_view) = nullptr;
};

// Accessors of an integer or std::chrono::duration field, in its unit.
template <auto kField>
int64_t Get(const EngineOptions& o) {
  const auto& v = o.*kField;
  if constexpr (requires { v.count(); }) {
    return static_cast<int64_t>(v.count());
  } else {
    return static_cast<int64_t>(v);
  }
}

template <auto kField>
void Set(EngineOptions& o, int64_t x) {
  auto& v = o.*kField;
  using T = std::remove_cvref_t<decltype(v)>;
  if constexpr (requires { v.count(); }) {
    v = T(static_cast<typename T::rep>(x));
  } else {
    v = static_cast<T>(x);
  }
}

template <auto kField>
constexpr Row Integer(std::string_view name, std::string_view variable, std::string_view unit,
                      int64_t min, int64_t max, std::string_view meaning) {
  return Row{.name = name,
             .variable = variable,
             .unit = unit,
             .meaning = meaning,
             .min = min,
             .max = max,
             .get = Get<kField>,
             .set = Set<kField>};
}

constexpr Row OrZero(Row r, std::string_view zero_means) {
  r.zero_means = zero_means;
  return r;
}

constexpr Row AtLeastOption(Row r, std::string_view option) {
  r.min_option = option;
  return r;
}

// In the order of the fields of EngineOptions.
constexpr Row kRows[] = {
    {.name = "metadata",
     .variable = "FERRY_METADATA",
     .meaning = "where engines publish descriptors and find each other by name",
     .values = "P2PHANDSHAKE, etcd://H:P[,H:P...] (or H:P), redis://[USER:PASS@]H:P[/DB], http://H:P[/PATH], "
               "memory://NAME",
     .get_string = [](const EngineOptions& o) -> const std::string& { return o.metadata; },
     .set_string = [](EngineOptions& o, std::string_view v) { o.metadata = v; }},
    Integer<&EngineOptions::metadata_ttl>(
        "metadata_ttl", "FERRY_METADATA_TTL_MS", "ms", 1000, kDayMs,
        "etcd and Redis: entries expire this long after their last refresh (refreshed every third of it)"),
    {.name = "metadata_cluster",
     .variable = "FERRY_METADATA_CLUSTER",
     .meaning = "keys live under <metadata_cluster>/segments/<name> in the metadata service",
     .values = "letters, digits, '.', '_', '-'",
     .get_string = [](const EngineOptions& o) -> const std::string& { return o.metadata_cluster; },
     .set_string = [](EngineOptions& o, std::string_view v) { o.metadata_cluster = v; }},
    {.name = "transport",
     .variable = "FERRY_TRANSPORT",
     .meaning = "auto picks by locality and capability: local in this process, shm on this host "
                "(falling back to tcp), else tcp; a transport's name forces it",
     .values = "auto or a transport name (see ferry info)",
     .get_string = [](const EngineOptions& o) -> const std::string& { return o.transport; },
     .set_string = [](EngineOptions& o, std::string_view v) { o.transport = v; }},
    {.name = "fabric_provider",
     .variable = "FERRY_FABRIC_PROVIDER",
     .meaning = "libfabric provider of the fabric transport (bound to listen_host); empty = the best "
                "hardware provider found, else the fabric transport is off",
     .values = "a provider name (see ferry info: verbs, efa, tcp, shm, ...), or empty",
     .get_string = [](const EngineOptions& o) -> const std::string& { return o.fabric_provider; },
     .set_string = [](EngineOptions& o, std::string_view v) { o.fabric_provider = v; }},
    {.name = "fabric_nics",
     .variable = "FERRY_FABRIC_NICS",
     .meaning = "addresses of the NICs the fabric transport stripes requests across, one domain and "
                "endpoint each (rail i talks to the peer's rail i); empty = one, at listen_host",
     .values = "comma-separated addresses, or empty",
     .get_string = [](const EngineOptions& o) -> const std::string& { return o.fabric_nics; },
     .set_string = [](EngineOptions& o, std::string_view v) { o.fabric_nics = v; }},
    {.name = "secret_file",
     .variable = "FERRY_SECRET_FILE",
     .meaning = "a file holding the cluster secret (at least 16 bytes): peers must prove they share it "
                "(HMAC-SHA256 challenge-response on every connection); empty = no secret",
     .values = "a path, or empty",
     .get_string = [](const EngineOptions& o) -> const std::string& { return o.secret_file; },
     .set_string = [](EngineOptions& o, std::string_view v) { o.secret_file = v; }},
    {.name = "metrics_address",
     .variable = "FERRY_METRICS_ADDRESS",
     .meaning = "HOST:PORT of a Prometheus text endpoint (GET /metrics) with the engine's counters; "
                "port 0 = any free port; empty = off",
     .values = "HOST:PORT, or empty",
     .get_string = [](const EngineOptions& o) -> const std::string& { return o.metrics_address; },
     .set_string = [](EngineOptions& o, std::string_view v) { o.metrics_address = v; }},
    Integer<&EngineOptions::connect_timeout>("connect_timeout", "", "ms", 1, kDayMs,
                                             "connect + handshake with a peer"),
    Integer<&EngineOptions::transfer_timeout>(
        "transfer_timeout", "FERRY_TRANSFER_TIMEOUT_MS", "ms", 1, kDayMs,
        "deadline of each submitted request, from submission"),
    Integer<&EngineOptions::handshake_timeout>(
        "handshake_timeout", "", "ms", 1, kDayMs,
        "how long an accepted connection may take to say hello"),
    Integer<&EngineOptions::tcp_streams>("tcp_streams", "FERRY_TCP_STREAMS", "", 1, 64,
                                         "streams per peer of the socket transports (tcp and shm)"),
    Integer<&EngineOptions::io_threads>(
        "io_threads", "FERRY_IO_THREADS", "", 0, 64,
        "event-loop threads of the socket transports (tcp and shm share them; on shm they also "
        "copy for the streams this engine serves); 0 = one per stream, at most 4"),
    Integer<&EngineOptions::slice_size>(
        "slice_size", "", "B", 4096, kMaxPayload,
        "tcp and shm: a request larger than this is cut into slices striped across streams"),
    AtLeastOption(Integer<&EngineOptions::max_frame_bytes>(
                      "max_frame_bytes", "", "B", 4096, kMaxPayload,
                      "tcp and shm: most bytes coalesced into one frame"),
                  "slice_size"),
    Integer<&EngineOptions::max_frame_entries>(
        "max_frame_entries", "", "", 1, 1024, "tcp and shm: most entries coalesced into one frame"),
    OrZero(Integer<&EngineOptions::tcp_send_buffer>(
               "tcp_send_buffer", "FERRY_TCP_SEND_BUFFER", "B", 64 * kKiB, 256 * kMiB,
               "tcp: send buffer (SO_SNDBUF) of the streams this engine serves as a target, which "
               "carry its read replies; 0 = the kernel's autotuning"),
           "kernel autotuning"),
    Integer<&EngineOptions::peer_max_requests>(
        "peer_max_requests", "FERRY_PEER_MAX_REQUESTS", "", 1, int64_t{1} << 30,
        "slices posted to one peer and not yet answered; past it, Submit waits for room until the "
        "deadline, then fails the rest with RESOURCE_EXHAUSTED"),
    Integer<&EngineOptions::peer_max_bytes>(
        "peer_max_bytes", "FERRY_PEER_MAX_BYTES", "B", kMiB, int64_t{1} << 40,
        "bytes posted to one peer and not yet answered; past it, Submit waits for room until the "
        "deadline, then fails the rest with RESOURCE_EXHAUSTED"),
    Integer<&EngineOptions::max_handshakes_per_source>(
        "max_handshakes_per_source", "", "", 1, 65536,
        "accepted connections from one source address (or user, same-host) still in their hello; "
        "more are closed at once"),
    Integer<&EngineOptions::max_connections_per_source>(
        "max_connections_per_source", "", "", 1, 1048576,
        "connections open from one source address (or user, same-host); more are closed at once"),
    Integer<&EngineOptions::notify_inbox_bytes>(
        "notify_inbox_bytes", "", "B", 64 * kKiB, int64_t{4} << 30,
        "notifications received and not yet fetched; past it, peers' notifications are refused with "
        "RESOURCE_EXHAUSTED"),
    Integer<&EngineOptions::spin>("spin", "FERRY_SPIN_US", "us", 0, kSecondUs,
                                  "how long an event loop spins after activity before it blocks"),
    Integer<&EngineOptions::wait_spin>(
        "wait_spin", "FERRY_WAIT_SPIN_US", "us", 0, kSecondUs,
        "how long a caller waiting for its transfers (WaitBatch, TransferSync) spins before it "
        "blocks"),
};
constexpr size_t kRowCount = std::size(kRows);

bool IsDuration(const Row& r) { return r.unit == "ms" || r.unit == "us"; }

// Sizes of five digits or more in KiB or MiB where they divide evenly.
std::string Amount(const Row& r, int64_t x) {
  if (r.unit == "B" && x >= 10000) {
    if (x % kMiB == 0) return std::to_string(x / kMiB) + " MiB";
    if (x % kKiB == 0) return std::to_string(x / kKiB) + " KiB";
  }
  return std::to_string(x);
}

std::string Interval(const Row& r) {
  const std::string lo = r.min_option.empty() ? Amount(r, r.min) : std::string(r.min_option);
  return "[" + lo + ", " + Amount(r, r.max) + "]";
}

std::string RangeText(const Row& r) {
  if (r.get == nullptr) return std::string(r.values);
  return (r.zero_means.empty() ? "" : "0 or ") + Interval(r);
}

const Row* FindRow(std::string_view name) {
  for (const Row& r : kRows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

bool InRange(const Row& r, int64_t v, int64_t lo) {
  return (v == 0 && !r.zero_means.empty()) || (v >= lo && v <= r.max);
}

// The public rows, with their texts built once from kRows.
struct Table {
  Table() {
    const EngineOptions defaults{};
    for (size_t i = 0; i < kRowCount; ++i) {
      const Row& r = kRows[i];
      ranges[i] = RangeText(r);
      default_values[i] = r.get ? std::to_string(r.get(defaults)) : r.get_string(defaults);
    }
    for (size_t i = 0; i < kRowCount; ++i) {
      const Row& r = kRows[i];
      specs[i] = OptionSpec{.name = r.name,
                            .variable = r.variable,
                            .unit = r.unit,
                            .range = ranges[i],
                            .default_value = default_values[i],
                            .meaning = r.meaning,
                            .min = r.min,
                            .max = r.max,
                            .integer_value = r.get,
                            .string_value = r.get_string};
    }
  }
  std::string ranges[kRowCount];
  std::string default_values[kRowCount];
  OptionSpec specs[kRowCount];
};

}  // namespace

std::string OptionSpec::Value(const EngineOptions& o) const {
  if (integer_value != nullptr) return std::to_string(integer_value(o));
  // A metadata URL may carry a password: shown redacted.
  if (string_value != nullptr && name == "metadata") return RedactMetadataUrl(string_value(o));
  if (string_value != nullptr) return string_value(o);
  return "";
}

std::span<const OptionSpec> OptionTable() {
  static const Table* const table = new Table();
  return table->specs;
}

Status ValidateOptions(const EngineOptions& o) {
  for (const Row& r : kRows) {
    if (r.get == nullptr) continue;
    int64_t lo = r.min;
    if (const Row* floor = r.min_option.empty() ? nullptr : FindRow(r.min_option)) {
      lo = std::max(lo, floor->get(o));
    }
    const int64_t v = r.get(o);
    if (InRange(r, v, lo)) continue;
    std::string msg = std::string(r.name) + " must be ";
    if (!r.zero_means.empty()) msg += "0 (" + std::string(r.zero_means) + ") or ";
    msg += "in " + Interval(r);
    if (IsDuration(r)) msg += " " + std::string(r.unit);
    return InvalidArgumentError(msg + ", got " + std::to_string(v));
  }
  return OkStatus();
}

namespace internal {

std::vector<OptionOverride> ParseOptionVariables(const EnvLookup& lookup, const EnvWarning& warn) {
  std::vector<OptionOverride> out;
  for (size_t i = 0; i < kRowCount; ++i) {
    const Row& r = kRows[i];
    if (r.variable.empty()) continue;
    const std::string variable(r.variable);
    const char* v = lookup(variable.c_str());
    if (v == nullptr || *v == '\0') continue;
    OptionOverride ov;
    ov.row = i;
    if (r.get == nullptr) {
      ov.text = v;
      out.push_back(std::move(ov));
      continue;
    }
    char* end = nullptr;
    const long long x = std::strtoll(v, &end, 10);
    if (*end != '\0' || !InRange(r, x, r.min)) {
      warn("ferry: ignoring " + variable + "=" + v + " (expected " +
           (r.zero_means.empty() ? "" : "0 or ") + "an integer in [" + std::to_string(r.min) +
           ", " + std::to_string(r.max) + "])");
      continue;
    }
    ov.integer = x;
    out.push_back(std::move(ov));
  }
  return out;
}

EngineOptions ApplyOptionOverrides(EngineOptions o, const std::vector<OptionOverride>& overrides) {
  for (const OptionOverride& ov : overrides) {
    if (ov.row >= kRowCount) continue;
    const Row& r = kRows[ov.row];
    if (r.set != nullptr) {
      r.set(o, ov.integer);
    } else if (r.set_string != nullptr) {
      r.set_string(o, ov.text);
    }
  }
  return o;
}

}  // namespace internal
}  // namespace ferry
