// The option table: every EngineOptions setting but `testing`, each written
// once. SetOption (the Python package's keyword options), ValidateOptions
// (Engine::Create), the environment overlay (env.cc), `ferry info` and
// docs/configuration.md (checked by option_table_test.cc) all read it.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "common/env.h"
#include "ferry/metadata.h"
#include "ferry/options.h"

namespace ferry {
namespace {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
// The largest payload of one frame (wire::kMaxPayload; frame_test.cc
// checks they agree).
constexpr int64_t kMaxPayload = 64 * kMiB;
constexpr int64_t kDayMs = 86400000;
constexpr int64_t kSecondUs = 1000000;

struct Row {
  std::string_view name = {};
  std::string_view variable = {};  // "" if none
  std::string_view unit = {};      // "ms", "us", "B" or ""
  std::string_view meaning = {};
  std::string_view belongs_to = {};  // OptionSpec::belongs_to
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

// Accessors of a std::string field.
template <auto kField>
const std::string& GetText(const EngineOptions& o) {
  return o.*kField;
}

template <auto kField>
void SetText(EngineOptions& o, std::string_view x) {
  o.*kField = x;
}

template <auto kField>
constexpr Row Integer(std::string_view name, std::string_view variable, std::string_view belongs_to,
                      std::string_view unit, int64_t min, int64_t max, std::string_view meaning) {
  return Row{.name = name,
             .variable = variable,
             .unit = unit,
             .meaning = meaning,
             .belongs_to = belongs_to,
             .min = min,
             .max = max,
             .get = Get<kField>,
             .set = Set<kField>};
}

template <auto kField>
constexpr Row Text(std::string_view name, std::string_view variable, std::string_view belongs_to,
                   std::string_view values, std::string_view meaning) {
  return Row{.name = name,
             .variable = variable,
             .meaning = meaning,
             .belongs_to = belongs_to,
             .values = values,
             .get_string = GetText<kField>,
             .set_string = SetText<kField>};
}

constexpr Row OrZero(Row r, std::string_view zero_means) {
  r.zero_means = zero_means;
  return r;
}

constexpr Row AtLeastOption(Row r, std::string_view option) {
  r.min_option = option;
  return r;
}

// What OptionSpec::belongs_to names besides transports.
constexpr std::string_view kEngine = "engine";
constexpr std::string_view kMetadata = "metadata";
// The transports that read a setting, in the order of the registry.
constexpr std::string_view kStreams = "shm, tcp";

// In the order of the fields of EngineOptions.
constexpr Row kRows[] = {
    Text<&EngineOptions::local_name>(
        "local_name", "", kEngine, "a name, or empty",
        "name of this engine's segment, advertised to peers; empty = the peer id (HOST:PORT)"),
    Text<&EngineOptions::listen_host>(
        "listen_host", "", kEngine, "an address (IPv6 without brackets)",
        "address the rpc port binds to and advertises to peers (the fabric transport binds there "
        "too); a concrete one, not 0.0.0.0, so peers can reach it"),
    OrZero(Integer<&EngineOptions::listen_port>(
               "listen_port", "", kEngine, "", 1, 65535,
               "the rpc port peers connect to; 0 = any free port (Engine::RpcPort says which)"),
           "any free port"),
    Text<&EngineOptions::metadata>(
        "metadata", "FERRY_METADATA", kMetadata,
        "P2PHANDSHAKE, etcd://H:P[,H:P...] (or H:P), redis://[USER:PASS@]H:P[/DB], "
        "http://H:P[/PATH], memory://NAME",
        "where engines publish descriptors and find each other by name"),
    Integer<&EngineOptions::metadata_ttl>("metadata_ttl", "FERRY_METADATA_TTL_MS", kMetadata, "ms",
                                          1000, kDayMs,
                                          "etcd and Redis: entries expire this long after their "
                                          "last refresh (refreshed every third of it)"),
    Text<&EngineOptions::metadata_cluster>(
        "metadata_cluster", "FERRY_METADATA_CLUSTER", kMetadata, "letters, digits, '.', '_', '-'",
        "keys live under <metadata_cluster>/segments/<name> in the metadata service"),
    Text<&EngineOptions::transport>(
        "transport", "FERRY_TRANSPORT", kEngine, "auto or a transport name (see ferry info)",
        "auto picks, per peer, the first transport in ferry info's order that reaches the peer and "
        "both memory kinds (one that cannot connect gives way to the next); a transport's name "
        "forces it"),
    Text<&EngineOptions::fabric_provider>(
        "fabric_provider", "FERRY_FABRIC_PROVIDER", "fabric",
        "a provider name (see ferry info: verbs, efa, tcp, shm, ...), or empty",
        "libfabric provider of the fabric transport (bound to listen_host); empty = the best "
        "hardware provider found, else the fabric transport is off"),
    Text<&EngineOptions::fabric_nics>(
        "fabric_nics", "FERRY_FABRIC_NICS", "fabric", "comma-separated addresses, or empty",
        "addresses of the NICs the fabric transport stripes requests across, one domain and "
        "endpoint each (rail i talks to the peer's rail i); empty = one, at listen_host"),
    Text<&EngineOptions::secret_file>(
        "secret_file", "FERRY_SECRET_FILE", kEngine, "a path, or empty",
        "a file holding the cluster secret (at least 16 bytes): peers must prove they share it "
        "(HMAC-SHA256 challenge-response on every connection); empty = no secret"),
    Text<&EngineOptions::metrics_address>(
        "metrics_address", "FERRY_METRICS_ADDRESS", kEngine, "HOST:PORT, or empty",
        "HOST:PORT of a Prometheus text endpoint (GET /metrics) with the engine's counters; "
        "port 0 = any free port; empty = off"),
    Integer<&EngineOptions::connect_timeout>("connect_timeout", "", kEngine, "ms", 1, kDayMs,
                                             "connect + handshake with a peer"),
    Integer<&EngineOptions::transfer_timeout>(
        "transfer_timeout", "FERRY_TRANSFER_TIMEOUT_MS", kEngine, "ms", 1, kDayMs,
        "deadline of each submitted request, from submission"),
    Integer<&EngineOptions::handshake_timeout>(
        "handshake_timeout", "", kEngine, "ms", 1, kDayMs,
        "how long an accepted connection may take to say hello"),
    Integer<&EngineOptions::tcp_streams>("tcp_streams", "FERRY_TCP_STREAMS", kStreams, "", 1, 64,
                                         "streams per peer of the socket transports (tcp and shm)"),
    Integer<&EngineOptions::io_threads>(
        "io_threads", "FERRY_IO_THREADS", kStreams, "", 0, 64,
        "event-loop threads of the socket transports (tcp and shm share them; on shm they also "
        "copy for the streams this engine serves); 0 = one per stream, at most 4"),
    Integer<&EngineOptions::slice_size>(
        "slice_size", "", "shm, fabric, tcp", "B", 4096, kMaxPayload,
        "shm, fabric and tcp: a request larger than this is cut into slices, striped across "
        "streams (fabric: across its rails)"),
    AtLeastOption(Integer<&EngineOptions::max_frame_bytes>(
                      "max_frame_bytes", "", kStreams, "B", 4096, kMaxPayload,
                      "tcp and shm: most bytes coalesced into one frame"),
                  "slice_size"),
    Integer<&EngineOptions::max_frame_entries>(
        "max_frame_entries", "", kStreams, "", 1, 1024,
        "tcp and shm: most entries coalesced into one frame"),
    OrZero(Integer<&EngineOptions::tcp_send_buffer>(
               "tcp_send_buffer", "FERRY_TCP_SEND_BUFFER", "tcp", "B", 64 * kKiB, 256 * kMiB,
               "tcp: send buffer (SO_SNDBUF) of the streams this engine serves as a target, which "
               "carry its read replies; 0 = the kernel's autotuning"),
           "kernel autotuning"),
    Integer<&EngineOptions::peer_max_requests>(
        "peer_max_requests", "FERRY_PEER_MAX_REQUESTS", kStreams, "", 1, int64_t{1} << 30,
        "slices posted to one peer and not yet answered; past it, Submit waits for room until the "
        "deadline, then fails the rest with RESOURCE_EXHAUSTED"),
    Integer<&EngineOptions::peer_max_bytes>(
        "peer_max_bytes", "FERRY_PEER_MAX_BYTES", kStreams, "B", kMiB, int64_t{1} << 40,
        "bytes posted to one peer and not yet answered; past it, Submit waits for room until the "
        "deadline, then fails the rest with RESOURCE_EXHAUSTED"),
    Integer<&EngineOptions::max_handshakes_per_source>(
        "max_handshakes_per_source", "", kEngine, "", 1, 65536,
        "accepted connections from one source address (or user, same-host) still in their hello; "
        "more are closed at once"),
    Integer<&EngineOptions::max_connections_per_source>(
        "max_connections_per_source", "", kEngine, "", 1, 1048576,
        "connections open from one source address (or user, same-host); more are closed at once"),
    Integer<&EngineOptions::notify_inbox_bytes>(
        "notify_inbox_bytes", "", kEngine, "B", 64 * kKiB, int64_t{4} << 30,
        "notifications received and not yet fetched; past it, peers' notifications are refused "
        "with RESOURCE_EXHAUSTED"),
    Integer<&EngineOptions::spin>(
        "spin", "FERRY_SPIN_US", kEngine, "us", 0, kSecondUs,
        "how long an event loop (and the fabric transport's progress thread) spins after activity "
        "before it blocks"),
    Integer<&EngineOptions::wait_spin>(
        "wait_spin", "FERRY_WAIT_SPIN_US", kEngine, "us", 0, kSecondUs,
        "how long a caller waiting for its transfers (WaitBatch, TransferSync) spins before it "
        "blocks; a caller polling them (PollBatch, PollTransfer: the Python status calls) yields "
        "instead of blocking for as long after they began"),
    Integer<&EngineOptions::await_spin>(
        "await_spin", "FERRY_AWAIT_SPIN_US", kEngine, "us", 0, kSecondUs,
        "how long an awaited transfer (ferry.aio) polls in the awaiting thread before it waits on "
        "the completion descriptor, when its event loop awaits nothing else of the engine; 0 = "
        "always wait on the descriptor"),
    Integer<&EngineOptions::raise_fd_limit>(
        "raise_fd_limit", "FERRY_RAISE_FD_LIMIT", kEngine, "", 0, 1,
        "1 = Engine::Create raises the soft RLIMIT_NOFILE (open files) to the hard limit; 0 = "
        "leave it"),
    OrZero(Integer<&EngineOptions::idle_link_timeout>(
               "idle_link_timeout", "FERRY_IDLE_LINK_TIMEOUT_MS", kEngine, "ms", 1, kDayMs,
               "a link to a peer with no request for this long is closed (by this engine if it "
               "opened it, else at this engine's request by the peer), and opened again by the "
               "next request (which does not notice)"),
           "never"),
    OrZero(Integer<&EngineOptions::max_peer_links>(
               "max_peer_links", "FERRY_MAX_PEER_LINKS", kEngine, "", 1, 1048576,
               "most links to peers kept open; past it the least recently used idle one is "
               "closed, and when all are in use a new peer waits for room until connect_timeout, "
               "then fails with RESOURCE_EXHAUSTED"),
           "no limit"),
    Integer<&EngineOptions::file_queue_depth>(
        "file_queue_depth", "", kEngine, "", 1, 4096,
        "file reads and writes in the kernel at once (the io_uring ring of file regions); "
        "the others wait in order"),
    Integer<&EngineOptions::map_shared_memory>(
        "map_shared_memory", "FERRY_MAP_SHARED_MEMORY", kEngine, "", 0, 1,
        "1 = same-host peers' shared memory (AllocateShared) is mapped and copied with loads and "
        "stores; 0 = every same-host copy goes through the peer"),
    Integer<&EngineOptions::shm_rings>(
        "shm_rings", "FERRY_SHM_RINGS", kEngine, "", 0, 1,
        "1 = same-host streams carry their frames through request rings in shared memory (when "
        "both engines allow it); 0 = through their unix sockets"),
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

// What an integer option's value must be: "0 (kernel autotuning) or in [64
// KiB, 256 MiB]", "in [1, 86400000] ms".
std::string Bounds(const Row& r) {
  std::string out;
  if (!r.zero_means.empty()) out.append("0 (").append(r.zero_means).append(") or ");
  out.append("in ").append(Interval(r));
  if (IsDuration(r)) out.append(" ").append(r.unit);
  return out;
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

// Levenshtein distance: the fewest one-character edits from `a` to `b`.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({above + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "unknown option "x"", with the names it is likely a typo or a part of,
// else every name.
std::string UnknownOption(std::string_view name) {
  constexpr size_t kMaxEdits = 3;
  std::string near;
  std::string all;
  for (const Row& r : kRows) {
    const bool part = name.size() >= 3 && r.name.find(name) != std::string_view::npos;
    if (part || EditDistance(name, r.name) <= kMaxEdits) {
      near += (near.empty() ? "" : ", ") + std::string(r.name);
    }
    all += (all.empty() ? "" : ", ") + std::string(r.name);
  }
  const std::string head = "unknown option \"" + std::string(name) + "\"";
  if (!near.empty()) return head + " (did you mean " + near + "?)";
  return head + "; the options are " + all;
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
                            .belongs_to = r.belongs_to,
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

const Table& TheTable() {
  static const Table* const table = new Table();
  return *table;
}

}  // namespace

std::string OptionSpec::Value(const EngineOptions& o) const {
  if (integer_value != nullptr) return std::to_string(integer_value(o));
  // A metadata URL may carry a password: shown redacted.
  if (string_value != nullptr && name == "metadata") return RedactMetadataUrl(string_value(o));
  if (string_value != nullptr) return string_value(o);
  return "";
}

std::span<const OptionSpec> OptionTable() { return TheTable().specs; }

const OptionSpec* FindOption(std::string_view name) {
  const Row* r = FindRow(name);
  return r == nullptr ? nullptr : &TheTable().specs[r - kRows];
}

Status SetOption(EngineOptions& o, std::string_view name, std::string_view value) {
  const Row* r = FindRow(name);
  if (r == nullptr) return InvalidArgumentError(UnknownOption(name));
  if (r->get == nullptr) {
    r->set_string(o, value);
    return OkStatus();
  }
  int64_t x = 0;
  const char* end = value.data() + value.size();
  const auto [parsed, error] = std::from_chars(value.data(), end, x);
  if (value.empty() || error != std::errc() || parsed != end) {
    return InvalidArgumentError(std::string(name) + " must be an integer " + Bounds(*r) +
                                ", got \"" + std::string(value) + "\"");
  }
  if (!InRange(*r, x, r->min)) {
    return InvalidArgumentError(std::string(name) + " must be " + Bounds(*r) + ", got " +
                                std::to_string(x));
  }
  r->set(o, x);
  return OkStatus();
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
    return InvalidArgumentError(std::string(r.name) + " must be " + Bounds(r) + ", got " +
                                std::to_string(v));
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
