// `ferry info`.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli.h"
#include "commands.h"
#include "ferry/ferry.h"

namespace ferry::cli {
namespace {

using Json = nlohmann::ordered_json;  // --json keeps the fields in the order written

std::string MemlockSoft() {
  rlimit r{};
  if (getrlimit(RLIMIT_MEMLOCK, &r) != 0) return "unknown";
  if (r.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(static_cast<unsigned long long>(r.rlim_cur)) + " B";
}

// RLIMIT_NOFILE as the process started (before the probe engine raised
// it) and now.
struct FdLimits {
  uint64_t soft_at_start = 0, soft = 0, hard = 0;
};

uint64_t FdSoftNow(uint64_t* hard) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  *hard = r.rlim_max;
  return r.rlim_cur;
}

std::string FdCount(uint64_t v) {
  return v == RLIM_INFINITY ? "unlimited" : std::to_string(static_cast<unsigned long long>(v));
}

// Descriptors one peer link holds on this side: a socket per stream (the
// peer holds as many); a same-host link also follows the peer's process
// with a pidfd.
int FdsPerLink(const EngineOptions& o) { return o.tcp_streams; }

// About how many peer links fit under `limit` descriptors: what the engine
// holds itself (its loops, listeners, eventfds; the application's own
// files) is taken as 64.
uint64_t LinksUnder(uint64_t limit, const EngineOptions& o) {
  constexpr uint64_t kEngineOwn = 64;
  if (limit == RLIM_INFINITY) return limit;
  return limit > kEngineOwn ? (limit - kEngineOwn) / static_cast<uint64_t>(FdsPerLink(o)) : 0;
}

std::string FdLimitLines(const FdLimits& l, const EngineOptions& o) {
  std::ostringstream out;
  out << "  RLIMIT_NOFILE       soft " << FdCount(l.soft_at_start) << ", hard " << FdCount(l.hard);
  if (l.soft != l.soft_at_start) {
    out << "; engines raise the soft limit to " << FdCount(l.soft) << " (raise_fd_limit = 1)";
  } else if (!o.raise_fd_limit) {
    out << "; engines leave it (raise_fd_limit = 0)";
  }
  out << "\n  peer links          about " << LinksUnder(l.soft, o) << " under the soft limit";
  if (l.soft != l.soft_at_start) {
    out << " (" << LinksUnder(l.soft_at_start, o) << " before raising it)";
  }
  out << ", at " << FdsPerLink(o) << " descriptors each (tcp_streams = " << o.tcp_streams
      << "; same-host links one more); idle links close after " << o.idle_link_timeout.count()
      << " ms (idle_link_timeout), max_peer_links = " << o.max_peer_links << "\n";
  return out.str();
}

// Yama's ptrace_scope, which decides whether peers on this host may copy to
// and from this process (shm): -1 when the kernel has no Yama.
int YamaPtraceScope() {
  std::ifstream in("/proc/sys/kernel/yama/ptrace_scope");
  int v = -1;
  if (!(in >> v)) return -1;
  return v;
}

// "ok", or why the shm transport cannot copy between processes here.
std::string SameHostCopyProbe(const std::vector<TransportInfo>& registry) {
  for (const auto& t : registry) {
    if (t.name == "shm") return t.unavailable.empty() ? "ok" : t.unavailable;
  }
  return "not built in";
}

std::string SameHostAccess() {
  const int scope = YamaPtraceScope();
  const std::string same_user = "engines of one user reach each other (with CAP_SYS_PTRACE, any)";
  switch (scope) {
    case -1:
      return "no Yama: " + same_user;
    case 0:
      return "Yama ptrace_scope 0: " + same_user;
    case 1:
      return "Yama ptrace_scope 1: only engines with CAP_SYS_PTRACE; others fall back to tcp";
    default:
      return "Yama ptrace_scope " + std::to_string(scope) + ": peers fall back to tcp";
  }
}

constexpr const char* kInfoHelp = R"(Usage: ferry info [--json] [--version]

Starts an engine on 127.0.0.1 (any free port) with the settings from the
environment (FERRY_*), prints what it reports, and stops it:
version, transports, features, wire versions, every effective option (grouped
by what reads it: the engine, the metadata store, transports), and
what libfabric offers the fabric transport at listen_host, and the CUDA
driver found (last).

  --json      one JSON object
  --version   print only the version
)";

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// `s` padded with spaces to `width` columns (at least one space after it).
std::string Pad(std::string s, size_t width) {
  s.resize(std::max(width, s.size() + 1), ' ');
  return s;
}

// The key of an option in --json's "options": durations carry their unit
// ("spin_us", "transfer_timeout_ms").
std::string JsonKey(const OptionSpec& s) {
  std::string key(s.name);
  if (s.unit == "ms" || s.unit == "us") key += "_" + std::string(s.unit);
  return key;
}

// The option's value in `o`: a number for integer options, else a string.
Json OptionJsonValue(const OptionSpec& s, const EngineOptions& o) {
  if (s.integer_value == nullptr) return s.Value(o);
  return s.integer_value(o);
}

// One line per transport of the registry: reach, memory kinds, availability.
std::string RegistryLines(const std::vector<TransportInfo>& registry) {
  std::string out;
  for (const auto& t : registry) {
    out += "  " + Pad(t.name, 8) + Pad(t.reach, 14) + "memory " + Join(t.memory_kinds) +
           (t.needs_region_keys ? ", per-region keys" : "") + "; " +
           (t.unavailable.empty() ? "available" : "unavailable here: " + t.unavailable) + "\n";
  }
  return out;
}

// Two lines per metadata backend: name, whether this build has it, the form
// of its connection strings; what it is.
std::string MetadataLines(const std::vector<MetadataBackendInfo>& backends) {
  std::string out;
  for (const auto& b : backends) {
    out += "  " + Pad(b.name, 8) + Pad(b.built ? "built in" : "not built", 11) + b.form + "\n" +
           std::string(21, ' ') + b.description +
           (b.built ? "" : " (install " + b.missing + " and rebuild)") + "\n";
  }
  return out;
}

// What the settings of OptionTable() belong to, in the order each first
// appears: "engine", "metadata", then transports ("fabric", "shm, tcp", ...).
std::vector<std::string_view> OptionGroups() {
  std::vector<std::string_view> groups;
  for (const OptionSpec& s : OptionTable()) {
    if (std::find(groups.begin(), groups.end(), s.belongs_to) == groups.end()) {
      groups.push_back(s.belongs_to);
    }
  }
  return groups;
}

// The heading of a group of options: "engine", "metadata store", "transport
// fabric", "transports shm, tcp".
std::string GroupHeading(std::string_view group) {
  if (group == "engine") return "engine";
  if (group == "metadata") return "metadata store";
  const bool several = group.find(',') != std::string_view::npos;
  return (several ? "transports " : "transport ") + std::string(group);
}

// One line of the text output per row of OptionTable(), grouped by what the
// setting belongs to: name, effective value, variable, range.
std::string OptionLines(const EngineOptions& o) {
  std::string out = "  " + Pad("option", 30) + Pad("value", 16) + Pad("variable", 28) + "range\n";
  for (std::string_view group : OptionGroups()) {
    out += "  " + GroupHeading(group) + ":\n";
    for (const OptionSpec& s : OptionTable()) {
      if (s.belongs_to != group) continue;
      std::string value = s.Value(o);
      if (value.empty()) value = "(empty)";
      if (!s.unit.empty()) value += " " + std::string(s.unit);
      out += "    " + Pad(std::string(s.name), 28) + Pad(value, 16) +
             Pad(s.variable.empty() ? "-" : std::string(s.variable), 28) + std::string(s.range) +
             "\n";
    }
  }
  return out;
}

// What libfabric lists for the fabric transport at the options' listen_host,
// and which provider the transport would use with these options.
std::string FabricLines(const FabricInfo& f, const EngineOptions& o) {
  std::string out = "fabric (libfabric)  " + (f.library.empty() ? "not in this build" : f.library) +
                    "; node " + o.listen_host + "\n";
  if (!f.error.empty()) out += "  " + f.error + "\n";
  for (const auto& d : f.domains) {
    out += "  " + Pad(d.provider, 16) + Pad("domain " + d.domain, 16) +
           Pad("fabric " + d.fabric, 24) + (d.hardware ? "hardware" : "emulated (no hardware)") +
           "\n";
  }
  if (f.domains.empty() && f.error.empty() && !f.library.empty()) out += "  (no provider listed)\n";
  out += "  fabric_provider " +
         (o.fabric_provider.empty() ? std::string("(unset: best hardware)") : o.fabric_provider) +
         " -> " + (f.chosen.empty() ? "none: " + f.why_none : f.chosen) + "\n";
  out += "  fabric_nics " +
         (o.fabric_nics.empty() ? "(unset: one rail at listen_host " + o.listen_host + ")"
                                : o.fabric_nics + " (one rail each, striped)") +
         "\n";
  return out;
}

// The CUDA driver this process finds (loaded at run time) and what that
// means for the cuda memory kind.
std::string CudaLines(const CudaInfo& c) {
  std::string out = "cuda (driver API)   ";
  if (!c.loaded) {
    out += "no driver: " + c.why_unavailable + "\n";
  } else {
    out += c.library + ", CUDA " + std::to_string(c.driver_version / 1000) + "." +
           std::to_string(c.driver_version % 1000 / 10) + " (" + std::to_string(c.driver_version) +
           ")" + (c.available ? "" : "; unusable: " + c.why_unavailable) + "\n";
  }
  if (!c.error.empty()) out += "  " + c.error + "\n";
  for (const auto& d : c.devices)
    out += "  cuda:" + std::to_string(d.ordinal) + "  " + d.name + "\n";
  if (c.available && c.devices.empty() && c.error.empty()) out += "  (no device)\n";
  out += std::string("  memory kind cuda:N  ") +
         (c.data_path
              ? "registered; same-host peers through cuda_ipc, others staged through host memory"
          : c.available ? "refused: the driver cannot move GPU memory: " + c.why_no_data_path
                        : std::string("refused: no usable CUDA driver")) +
         "\n";
  return out;
}

}  // namespace

namespace {

// What `ferry info` reports, gathered once from a probe engine.
struct Probe {
  std::unique_ptr<Engine> engine;
  Capabilities caps;
  std::vector<TransportInfo> registry;
  std::vector<MetadataBackendInfo> backends;
  std::string backend;
  FabricInfo fabric;
  CudaInfo cuda;
  FdLimits fds;
};

Probe Gather() {
  Probe p;
  p.fds.soft_at_start = FdSoftNow(&p.fds.hard);
  auto engine = Engine::Create(EngineOptions{}.WithEnvironment());
  if (!engine.ok()) {
    throw RunError("cannot start an engine to ask it: " + engine.status().ToString());
  }
  p.engine = std::move(*engine);
  const EngineOptions& o = p.engine->options();
  p.caps = p.engine->GetCapabilities();
  p.registry = ListTransports();
  p.backends = ListMetadataBackends();
  p.backend = MetadataBackendOf(o.metadata);
  p.fabric = DescribeFabric(o.fabric_provider, o.listen_host);
  p.cuda = DescribeCuda();
  p.fds.soft = FdSoftNow(&p.fds.hard);
  return p;
}

constexpr const char* kPinning =
    "local, shm and tcp do not pin pages; fabric registers regions with its provider, which "
    "may pin them (bound by RLIMIT_MEMLOCK)";

Json RegistryJson(const Probe& p) {
  Json out = Json::array();
  for (const auto& t : p.registry) {
    out.push_back({{"name", t.name},
                   {"reach", t.reach},
                   {"memory_kinds", t.memory_kinds},
                   {"needs_region_keys", t.needs_region_keys},
                   {"unavailable", t.unavailable}});
  }
  return out;
}

Json BackendsJson(const Probe& p) {
  Json out = Json::array();
  for (const auto& b : p.backends) {
    out.push_back({{"name", b.name},
                   {"form", b.form},
                   {"description", b.description},
                   {"built", b.built},
                   {"missing", b.missing}});
  }
  return out;
}

// The table itself, with the effective values.
Json OptionTableJson(const EngineOptions& o) {
  Json out = Json::array();
  for (const OptionSpec& s : OptionTable()) {
    out.push_back({{"name", s.name},
                   {"belongs_to", s.belongs_to},
                   {"variable", s.variable},
                   {"unit", s.unit},
                   {"range", s.range},
                   {"default", s.default_value},
                   {"meaning", s.meaning},
                   {"value", OptionJsonValue(s, o)}});
  }
  return out;
}

Json FabricJson(const FabricInfo& fabric, const EngineOptions& o) {
  Json domains = Json::array();
  for (const auto& d : fabric.domains) {
    domains.push_back({{"provider", d.provider},
                       {"fabric", d.fabric},
                       {"domain", d.domain},
                       {"hardware", d.hardware}});
  }
  return {{"library", fabric.library},
          {"node", o.listen_host},
          {"error", fabric.error},
          {"domains", std::move(domains)},
          {"fabric_provider", o.fabric_provider},
          {"fabric_nics", o.fabric_nics},
          {"chosen", fabric.chosen},
          {"why_none", fabric.why_none}};
}

Json CudaJson(const CudaInfo& cuda) {
  Json devices = Json::array();
  for (const auto& d : cuda.devices) devices.push_back({{"ordinal", d.ordinal}, {"name", d.name}});
  return {{"library", cuda.library},
          {"loaded", cuda.loaded},
          {"available", cuda.available},
          {"why_unavailable", cuda.why_unavailable},
          {"driver_version", cuda.driver_version},
          {"devices", std::move(devices)},
          {"error", cuda.error},
          {"data_path", cuda.data_path},
          {"why_no_data_path", cuda.why_no_data_path}};
}

void PrintJson(const Probe& p) {
  const EngineOptions& o = p.engine->options();
  Json j;
  j["version"] = Version();
  j["wire_versions"] = {{"min", p.caps.wire_version_min}, {"max", p.caps.wire_version_max}};
  j["transports"] = p.caps.transports;
  j["transport_registry"] = RegistryJson(p);
  j["features"] = p.caps.features;
  j["metadata_backend"] = p.backend;
  j["metadata_backends"] = BackendsJson(p);
  Json& options = j["options"];
  for (const OptionSpec& s : OptionTable()) options[JsonKey(s)] = OptionJsonValue(s, o);
  j["option_table"] = OptionTableJson(o);
  j["limits"] = {{"max_batch_capacity", static_cast<uint64_t>(kMaxBatchCapacity)},
                 {"max_notification_name", static_cast<uint64_t>(kMaxNotificationName)},
                 {"max_notification_message", static_cast<uint64_t>(kMaxNotificationMessage)},
                 {"registered_memory", std::string("address space (") + kPinning + ")"},
                 {"memlock_soft", MemlockSoft()},
                 {"nofile_soft_at_start", p.fds.soft_at_start},
                 {"nofile_soft", p.fds.soft},
                 {"nofile_hard", p.fds.hard},
                 {"fds_per_peer_link", FdsPerLink(o)},
                 {"peer_links_under_soft_limit", LinksUnder(p.fds.soft, o)},
                 {"yama_ptrace_scope", YamaPtraceScope()},
                 {"same_host_access", SameHostAccess()},
                 {"same_host_copy", SameHostCopyProbe(p.registry)}};
  j["peer_id_of_this_probe"] = p.engine->PeerId();
  j["fabric"] = FabricJson(p.fabric, o);
  j["cuda"] = CudaJson(p.cuda);
  std::cout << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
}

void PrintText(const Probe& p) {
  const EngineOptions& o = p.engine->options();
  std::string backend_note = p.backend.empty() ? "no backend takes it" : "backend " + p.backend;
  for (const auto& b : p.backends) {
    if (b.name == p.backend && !b.built) backend_note += ", not in this build";
  }
  std::cout << "ferry " << Version() << "\n"
            << "wire versions      " << p.caps.wire_version_min << ".." << p.caps.wire_version_max
            << " (this build: " << kWireVersionMin << ".." << kWireVersionMax << ")\n"
            << "transports         " << Join(p.caps.transports) << "   (preferred first)\n"
            << RegistryLines(p.registry) << "features           " << Join(p.caps.features) << "\n"
            << "metadata           " << RedactMetadataUrl(o.metadata) << "   (" << backend_note
            << "; ferry bench takes --metadata URL)\n"
            << MetadataLines(p.backends)
            << "\neffective options (defaults overlaid with FERRY_* from the environment), by what"
            << " reads them:\n"
            << OptionLines(o) << "  [this probe's rpc port: " << p.engine->RpcPort() << "]\n"
            << "\nlimits:\n"
            << "  batch capacity      " << kMaxBatchCapacity << " requests\n"
            << "  notification        name " << kMaxNotificationName << " B, message "
            << kMaxNotificationMessage << " B\n"
            << "  registered memory   any amount: " << kPinning << "\n"
            << "  same-host (shm)     " << SameHostAccess()
            << "; probe of a child: " << SameHostCopyProbe(p.registry) << "\n"
            << "  RLIMIT_MEMLOCK      " << MemlockSoft() << "\n"
            << FdLimitLines(p.fds, o) << "\n"
            << FabricLines(p.fabric, o) << "\n"
            << CudaLines(p.cuda);
}

}  // namespace

int InfoMain(const std::vector<std::string>& args) {
  bool json = false, version_only = false;
  CLI::App app("ferry info");
  PrepareApp(app);
  app.add_flag("--json", json);
  app.add_flag("--version", version_only);
  if (ParseFlags(app, args)) {
    std::cout << kInfoHelp;
    return 0;
  }
  if (version_only) {
    std::cout << "ferry " << Version() << "\n";
    return 0;
  }
  const Probe probe = Gather();
  if (json) {
    PrintJson(probe);
  } else {
    PrintText(probe);
  }
  return 0;
}

}  // namespace ferry::cli
