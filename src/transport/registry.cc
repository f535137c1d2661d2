#include "transport/registry.h"

#include <algorithm>

#include "common/log.h"
#include "cuda/staging.h"
#include "ferry/transports.h"
#include "storage/file_staging.h"
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/fabric/fabric_transport.h"
#include "transport/fault/fault_transport.h"
#include "transport/local/local_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace ferry::internal {
namespace {

std::string AlwaysAvailable() { return ""; }

// One line per transport, in preference order.
constexpr TransportEntry kBuiltin[] = {
    {LocalCaps, AlwaysAvailable, MakeLocalTransport},
    {CudaIpcCaps, CudaIpcAvailability, MakeCudaIpcTransport},
    {ShmCaps, ShmAvailability, MakeShmTransport},
    {FabricCaps, FabricAvailability, MakeFabricTransport, FabricEnabled},
    {TcpCaps, AlwaysAvailable, MakeTcpTransport},
};

}  // namespace

std::span<const TransportEntry> BuiltinTransports() { return kBuiltin; }

const TransportEntry* FindTransport(std::string_view name) {
  for (const auto& e : kBuiltin) {
    if (e.caps().name == name) return &e;
  }
  return nullptr;
}

std::string TransportNames() {
  std::string out;
  for (const auto& e : kBuiltin) out += (out.empty() ? "" : ", ") + std::string(e.caps().name);
  return out;
}

StatusOr<std::unique_ptr<TransportSet>> TransportSet::Create(
    const EngineOptions& options, std::span<const TransportEntry> entries) {
  auto set = std::make_unique<TransportSet>();
  set->entries_.assign(entries.begin(), entries.end());
  stream::StreamHostOptions so;
  so.listen_host = options.listen_host;
  so.listen_port = options.listen_port;
  so.io_threads = options.io_threads;
  so.spin = options.spin;
  so.hello_timeout = options.handshake_timeout;
  so.max_handshakes_per_source = options.max_handshakes_per_source;
  so.max_connections_per_source = options.max_connections_per_source;
  FERRY_ASSIGN_OR_RETURN(set->streams_, stream::StreamHost::Create(so));
  return set;
}

Status TransportSet::Start(const TransportContext& given) {
  TransportContext ctx = given;
  ctx.streams = streams_.get();
  streams_->SetSecret(ctx.secret);  // every listener of this engine checks it
  for (const auto& e : entries_) {
    const bool forced = ctx.options->transport == e.caps().name;
    if (e.enabled != nullptr && !forced && !e.enabled(*ctx.options)) continue;
    auto t = e.make(ctx);
    if (t.ok()) {
      std::unique_ptr<Transport> made = std::move(*t);
      const auto& faults = ctx.options->testing.link_faults;
      if (faults.seed != 0 && faults.under_staging) made = WithFaults(std::move(made), faults);
      // Transports of other processes' host memory move this engine's GPU
      // memory too, staged through page-locked host buffers.
      const auto& kinds = made->caps().memory_kinds;
      if (made->caps().reach != Reach::kSameProcess &&
          std::find(kinds.begin(), kinds.end(), MemoryKind::Type::kCuda) == kinds.end()) {
        made = WithStaging(std::move(made), ctx.target, ctx.options->testing.cuda_driver);
      }
      // Transports that move host memory of this process to a peer's host
      // memory (tcp, shm, fabric) take this engine's file regions as a
      // slice's local side too, through staging buffers of their own.
      const auto& local_kinds = made->caps().memory_kinds;
      const auto& remote_kinds =
          made->caps().remote_kinds.empty() ? local_kinds : made->caps().remote_kinds;
      auto has = [](const std::vector<MemoryKind::Type>& kinds, MemoryKind::Type t) {
        return std::find(kinds.begin(), kinds.end(), t) != kinds.end();
      };
      if (made->caps().reach != Reach::kSameProcess && has(local_kinds, MemoryKind::Type::kCpu) &&
          has(remote_kinds, MemoryKind::Type::kCpu) && !has(local_kinds, MemoryKind::Type::kFile)) {
        made = storage::WithFileStaging(std::move(made), ctx.target);
      }
      transports_.push_back(faults.seed != 0 && !faults.under_staging
                                ? WithFaults(std::move(made), faults)
                                : std::move(made));
      continue;
    }
    const std::string_view name = e.caps().name;
    if (ctx.options->transport == name) return t.status();
    FERRY_LOG(kWarning,
              "transport " << name << " unavailable, peers use the next one: " << t.status());
  }
  return OkStatus();
}

void TransportSet::Describe(wire::PeerDescriptor* self) const {
  for (const auto& t : transports_) t->Describe(self);
}

namespace {
bool HearsRegistrations(const Transport& t) {
  return t.caps().needs_region_keys || t.caps().sees_registrations;
}
}  // namespace

Status TransportSet::OnRegister(Region& region) {
  for (size_t i = 0; i < transports_.size(); ++i) {
    Transport& t = *transports_[i];
    if (!HearsRegistrations(t)) continue;
    auto keys = t.RegisterRegion(region);
    if (!keys.ok()) {
      for (size_t k = 0; k < i; ++k) {
        if (HearsRegistrations(*transports_[k])) transports_[k]->UnregisterRegion(region);
      }
      region.keys.clear();
      return keys.status().WithPrefix("transport " + std::string(t.Name()));
    }
    region.keys.insert(region.keys.end(), keys->begin(), keys->end());
  }
  return OkStatus();
}

Status TransportSet::BeforeUnregister(const Region& region, Clock::time_point deadline) {
  for (const auto& t : transports_) {
    FERRY_RETURN_IF_ERROR(
        t->QuiesceRegion(region, deadline).WithPrefix("transport " + std::string(t->Name())));
  }
  return OkStatus();
}

void TransportSet::OnUnregister(const Region& region) {
  for (const auto& t : transports_) {
    if (HearsRegistrations(*t)) t->UnregisterRegion(region);
  }
}

void TransportSet::Shutdown() {
  for (auto& t : transports_) t->Shutdown();
  if (streams_) streams_->Stop();
}

}  // namespace ferry::internal

namespace ferry {

std::vector<TransportInfo> ListTransports() {
  std::vector<TransportInfo> out;
  for (const auto& e : internal::BuiltinTransports()) {
    const internal::TransportCaps caps = e.caps();
    TransportInfo t;
    t.name = std::string(caps.name);
    t.reach = std::string(internal::ReachName(caps.reach));
    for (auto k : caps.memory_kinds) t.memory_kinds.emplace_back(internal::MemoryKind::TypeName(k));
    t.needs_region_keys = caps.needs_region_keys;
    t.unavailable = e.availability();
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace ferry
