// `ferry info` and `ferry metadata-server`.
#include <sys/resource.h>

#include <fstream>
#include <iostream>
#include <string>

#include "cli.h"
#include "commands.h"
#include "ferry/ferry.h"
#include "json.h"
#include "same_host_probe.h"

namespace ferry::cli {
namespace {

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
std::string SameHostCopyProbe() {
  const std::string why = probe::SameHostCopyRefusal();
  return why.empty() ? "ok" : why;
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
version, transports, features, wire versions, and every effective option.

  --json      one JSON object
  --version   print only the version
)";

constexpr const char* kMetadataHelp = R"(Usage: ferry metadata-server

A metadata service that lets many engines find each other by name. Not
available yet: engines meet with the embedded peer-to-peer handshake
(EngineOptions.metadata = "P2PHANDSHAKE"), which needs no server.
)";

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

long long Ms(std::chrono::milliseconds d) { return static_cast<long long>(d.count()); }

}  // namespace

int InfoMain(const std::vector<std::string>& args) {
  bool json = false, version_only = false;
  FlagParser p("info");
  p.Switch("--json", [&] { json = true; });
  p.Switch("--version", [&] { version_only = true; });
  if (p.Parse(args)) {
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
  const EngineOptions& o = (*engine)->options();
  if (json) {
    bench::JsonWriter j;
    j.BeginObject().Field("version", Version());
    j.Key("wire_versions").BeginObject().Field("min", static_cast<int>(caps.wire_version_min));
    j.Field("max", static_cast<int>(caps.wire_version_max)).EndObject();
    j.Key("transports").BeginArray();
    for (const auto& t : caps.transports) j.Value(t);
    j.EndArray();
    j.Key("features").BeginArray();
    for (const auto& f : caps.features) j.Value(f);
    j.EndArray();
    j.Key("options").BeginObject();
    j.Field("local_name", o.local_name).Field("listen_host", o.listen_host);
    j.Field("listen_port", static_cast<int>(o.listen_port)).Field("metadata", o.metadata);
    j.Field("transport", o.transport);
    j.Field("connect_timeout_ms", static_cast<uint64_t>(Ms(o.connect_timeout)));
    j.Field("transfer_timeout_ms", static_cast<uint64_t>(Ms(o.transfer_timeout)));
    j.Field("handshake_timeout_ms", static_cast<uint64_t>(Ms(o.handshake_timeout)));
    j.Field("tcp_streams", o.tcp_streams).Field("io_threads", o.io_threads);
    j.Field("slice_size", static_cast<uint64_t>(o.slice_size));
    j.Field("max_frame_bytes", static_cast<uint64_t>(o.max_frame_bytes));
    j.Field("max_frame_entries", static_cast<uint64_t>(o.max_frame_entries));
    j.Field("tcp_send_buffer", static_cast<uint64_t>(o.tcp_send_buffer));
    j.Field("spin_us", static_cast<uint64_t>(o.spin.count()));
    j.Field("wait_spin_us", static_cast<uint64_t>(o.wait_spin.count()));
    j.EndObject();
    j.Key("limits").BeginObject();
    j.Field("max_batch_capacity", static_cast<uint64_t>(kMaxBatchCapacity));
    j.Field("max_notification_name", static_cast<uint64_t>(kMaxNotificationName));
    j.Field("max_notification_message", static_cast<uint64_t>(kMaxNotificationMessage));
    j.Field("registered_memory", "address space (local, shm and tcp do not pin pages)");
    j.Field("memlock_soft", MemlockSoft());
    j.Field("yama_ptrace_scope", YamaPtraceScope());
    j.Field("same_host_access", SameHostAccess());
    j.Field("same_host_copy", SameHostCopyProbe());
    j.EndObject();
    j.Field("peer_id_of_this_probe", (*engine)->PeerId());
    j.EndObject();
    std::cout << j.str() << std::endl;
    return 0;
  }
  std::cout << "ferry " << Version() << "\n"
            << "wire versions      " << caps.wire_version_min << ".." << caps.wire_version_max
            << " (this build: " << kWireVersionMin << ".." << kWireVersionMax << ")\n"
            << "transports         " << Join(caps.transports) << "   (preferred first)\n"
            << "features           " << Join(caps.features) << "\n"
            << "metadata           " << o.metadata << " (metadata server: not available yet)\n"
            << "\neffective options (defaults overlaid with FERRY_* from the environment):\n"
            << "  local_name          " << (o.local_name.empty() ? "(the peer id)" : o.local_name)
            << "   [this probe: " << (*engine)->LocalName() << "]\n"
            << "  listen_host         " << o.listen_host << "\n"
            << "  listen_port         " << o.listen_port
            << (o.listen_port == 0 ? " (any free)" : "")
            << "   [this probe: " << (*engine)->RpcPort() << "]\n"
            << "  transport           " << o.transport << "\n"
            << "  connect_timeout     " << Ms(o.connect_timeout) << " ms\n"
            << "  transfer_timeout    " << Ms(o.transfer_timeout) << " ms\n"
            << "  handshake_timeout   " << Ms(o.handshake_timeout) << " ms\n"
            << "  tcp_streams         " << o.tcp_streams << "\n"
            << "  io_threads          " << o.io_threads << "\n"
            << "  slice_size          " << o.slice_size << " B\n"
            << "  max_frame_bytes     " << o.max_frame_bytes << " B\n"
            << "  max_frame_entries   " << o.max_frame_entries << "\n"
            << "  tcp_send_buffer     " << o.tcp_send_buffer << " B"
            << (o.tcp_send_buffer == 0 ? " (kernel autotuning)" : "") << "\n"
            << "  spin                " << o.spin.count() << " µs\n"
            << "  wait_spin           " << o.wait_spin.count() << " µs\n"
            << "\nlimits:\n"
            << "  batch capacity      " << kMaxBatchCapacity << " requests\n"
            << "  notification        name " << kMaxNotificationName << " B, message "
            << kMaxNotificationMessage << " B\n"
            << "  registered memory   any amount: local, shm and tcp do not pin pages\n"
            << "  same-host (shm)     " << SameHostAccess() << "; probe of a child: "
            << SameHostCopyProbe() << "\n"
            << "  RLIMIT_MEMLOCK      " << MemlockSoft() << " (for pinning transports, later)\n";
  return 0;
}

int MetadataServerMain(const std::vector<std::string>& args) {
  FlagParser p("metadata-server");
  if (p.Parse(args)) {
    std::cout << kMetadataHelp;
    return 0;
  }
  std::cerr << "ferry metadata-server: not available yet. Engines meet with the embedded "
               "peer-to-peer handshake (EngineOptions.metadata = \"P2PHANDSHAKE\"); no server "
               "is needed.\n";
  return 1;
}

}  // namespace ferry::cli
