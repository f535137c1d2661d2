// The `fabric` transport: RDMA-class networks (InfiniBand/RoCE through
// verbs, AWS EFA, HPE Slingshot's cxi, ...) through libfabric, one transport
// for every provider. On machines without such hardware it runs on
// libfabric's own `tcp` (tcp;ofi_rxm) and `shm` providers, which is how it is
// tested here.
//
// Requests are one-sided RMA straight between registered memory: the
// target's CPU does not touch them, its provider checks the key and range of
// every access (a range outside what the target registered fails at the
// fabric). Per-region keys travel in the segment descriptor; the endpoint's
// address in its "fabric" entry ("PROVIDER/ADDR_FORMAT/HEX").
// Files: fabric_transport.cc (the transport and its links), fabric_endpoint.*
// (the data path, one endpoint per rail; its parts are listed in
// fabric_endpoint.h: memory, posting, progress, notifications, peers),
// fabric_messages.* (notification frames), fabric_info.* (providers),
// fabric_tuning.h (operation sizes).
#pragma once

#include <memory>
#include <string>

#include "base/transport.h"
#include "ferry/options.h"
#include "transport/context.h"

namespace ferry::internal {

// What the transport is, with libfabric or without (fabric_missing.cc).
inline TransportCaps FabricCaps() {
  TransportCaps c;
  c.name = "fabric";
  c.reach = Reach::kNetwork;
  c.needs_region_keys = true;
  return c;
}
// "" if libfabric offers a provider Ferry could use here, else why not.
std::string FabricAvailability();
// Whether the engine's options turn the transport on: a provider is named,
// or a hardware one exists (cached per process).
bool FabricEnabled(const EngineOptions& options);
StatusOr<std::unique_ptr<Transport>> MakeFabricTransport(const TransportContext& ctx);

}  // namespace ferry::internal
