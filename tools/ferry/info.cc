// `ferry info`.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
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
    case -1: return "no Yama: " + same_user;
    case 0: return "Yama ptrace_scope 0: " + same_user;
    case 1: return "Yama ptrace_scope 1: only engines with CAP_SYS_PTRACE; others fall back to tcp";
    default: return "Yama ptrace_scope " + std::to_string(scope) + ": peers fall back to tcp";
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
    out += "  " + Pad(d.provider, 16) + Pad("domain " + d.domain, 16) + Pad("fabric " + d.fabric, 24) +
           (d.hardware ? "hardware" : "emulated (no hardware)") + "\n";
  }
  if (f.domains.empty() && f.error.empty() && !f.library.empty()) out += "  (no provider listed)\n";
  out += "  fabric_provider " + (o.fabric_provider.empty() ? std::string("(unset: best hardware)") : o.fabric_provider) +
         " -> " + (f.chosen.empty() ? "none: " + f.why_none : f.chosen) + "\n";
  out += "  fabric_nics " + (o.fabric_nics.empty() ? "(unset: one rail at listen_host " + o.listen_host + ")"
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
           std::to_string(c.driver_version % 1000 / 10) + " (" + std::to_string(c.driver_version) + ")" +
           (c.available ? "" : "; unusable: " + c.why_unavailable) + "\n";
  }
  if (!c.error.empty()) out += "  " + c.error + "\n";
  for (const auto& d : c.devices) out += "  cuda:" + std::to_string(d.ordinal) + "  " + d.name + "\n";
  if (c.available && c.devices.empty() && c.error.empty()) out += "  (no device)\n";
  out += std::string("  memory kind cuda:N  ") +
         (c.data_path ? "registered; same-host peers through cuda_ipc, others staged through host memory"
          : c.available ? "refused: the driver cannot move GPU memory: " + c.why_no_data_path
                        : std::string("refused: no usable CUDA driver")) +
         "\n";
  return out;
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
  EngineOptions requested = EngineOptions{}.WithEnvironment();
  auto engine = Engine::Create(requested);
  if (!engine.ok()) {
    throw RunError("cannot start an engine to ask it: " + engine.status().ToString());
  }
  const Capabilities caps = (*engine)->GetCapabilities();
  const std::vector<TransportInfo> registry = ListTransports();
  const EngineOptions& o = (*engine)->options();
  const std::vector<MetadataBackendInfo> backends = ListMetadataBackends();
  const std::string backend = MetadataBackendOf(o.metadata);
  const FabricInfo fabric = DescribeFabric(o.fabric_provider, o.listen_host);
  const CudaInfo cuda = DescribeCuda();
  if (json) {
    Json j;
    j["version"] = Version();
    j["wire_versions"] = {{"min", caps.wire_version_min}, {"max", caps.wire_version_max}};
    j["transports"] = caps.transports;
    j["transport_registry"] = Json::array();
    for (const auto& t : registry) {
      j["transport_registry"].push_back({{"name", t.name},
                                         {"reach", t.reach},
                                         {"memory_kinds", t.memory_kinds},
                                         {"needs_region_keys", t.needs_region_keys},
                                         {"unavailable", t.unavailable}});
    }
    j["features"] = caps.features;
    j["metadata_backend"] = backend;
    j["metadata_backends"] = Json::array();
    for (const auto& b : backends) {
      j["metadata_backends"].push_back({{"name", b.name},
                                        {"form", b.form},
                                        {"description", b.description},
                                        {"built", b.built},
                                        {"missing", b.missing}});
    }
    Json& options = j["options"];
    for (const OptionSpec& s : OptionTable()) options[JsonKey(s)] = OptionJsonValue(s, o);
    // The table itself, with the effective values.
    j["option_table"] = Json::array();
    for (const OptionSpec& s : OptionTable()) {
      j["option_table"].push_back({{"name", s.name},
                                   {"belongs_to", s.belongs_to},
                                   {"variable", s.variable},
                                   {"unit", s.unit},
                                   {"range", s.range},
                                   {"default", s.default_value},
                                   {"meaning", s.meaning},
                                   {"value", OptionJsonValue(s, o)}});
    }
    j["limits"] = {{"max_batch_capacity", static_cast<uint64_t>(kMaxBatchCapacity)},
                   {"max_notification_name", static_cast<uint64_t>(kMaxNotificationName)},
                   {"max_notification_message", static_cast<uint64_t>(kMaxNotificationMessage)},
                   {"registered_memory", "address space (local, shm and tcp do not pin pages)"},
                   {"memlock_soft", MemlockSoft()},
                   {"yama_ptrace_scope", YamaPtraceScope()},
                   {"same_host_access", SameHostAccess()},
                   {"same_host_copy", SameHostCopyProbe(registry)}};
    j["peer_id_of_this_probe"] = (*engine)->PeerId();
    Json domains = Json::array();
    for (const auto& d : fabric.domains) {
      domains.push_back(
          {{"provider", d.provider}, {"fabric", d.fabric}, {"domain", d.domain}, {"hardware", d.hardware}});
    }
    j["fabric"] = {{"library", fabric.library},
                   {"node", o.listen_host},
                   {"error", fabric.error},
                   {"domains", std::move(domains)},
                   {"fabric_provider", o.fabric_provider},
                   {"fabric_nics", o.fabric_nics},
                   {"chosen", fabric.chosen},
                   {"why_none", fabric.why_none}};
    Json cuda_devices = Json::array();
    for (const auto& d : cuda.devices) cuda_devices.push_back({{"ordinal", d.ordinal}, {"name", d.name}});
    j["cuda"] = {{"library", cuda.library},
                 {"loaded", cuda.loaded},
                 {"available", cuda.available},
                 {"why_unavailable", cuda.why_unavailable},
                 {"driver_version", cuda.driver_version},
                 {"devices", std::move(cuda_devices)},
                 {"error", cuda.error},
                 {"data_path", cuda.data_path},
                 {"why_no_data_path", cuda.why_no_data_path}};
    std::cout << j.dump(-1, ' ', false, Json::error_handler_t::replace) << std::endl;
    return 0;
  }
  std::string backend_note = backend.empty() ? "no backend takes it" : "backend " + backend;
  for (const auto& b : backends) {
    if (b.name == backend && !b.built) backend_note += ", not in this build";
  }
  std::cout << "ferry " << Version() << "\n"
            << "wire versions      " << caps.wire_version_min << ".." << caps.wire_version_max
            << " (this build: " << kWireVersionMin << ".." << kWireVersionMax << ")\n"
            << "transports         " << Join(caps.transports) << "   (preferred first)\n"
            << RegistryLines(registry) << "features           " << Join(caps.features) << "\n"
            << "metadata           " << RedactMetadataUrl(o.metadata) << "   (" << backend_note
            << "; ferry bench takes --metadata URL)\n"
            << MetadataLines(backends)
            << "\neffective options (defaults overlaid with FERRY_* from the environment), by what"
            << " reads them:\n"
            << OptionLines(o) << "  [this probe's rpc port: " << (*engine)->RpcPort() << "]\n"
            << "\nlimits:\n"
            << "  batch capacity      " << kMaxBatchCapacity << " requests\n"
            << "  notification        name " << kMaxNotificationName << " B, message "
            << kMaxNotificationMessage << " B\n"
            << "  registered memory   any amount: local, shm and tcp do not pin pages\n"
            << "  same-host (shm)     " << SameHostAccess()
            << "; probe of a child: " << SameHostCopyProbe(registry) << "\n"
            << "  RLIMIT_MEMLOCK      " << MemlockSoft() << " (for pinning transports, later)\n"
            << "\n" << FabricLines(fabric, o) << "\n" << CudaLines(cuda);
  return 0;
}

}  // namespace ferry::cli
