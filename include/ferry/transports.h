// The transports built into this Ferry, as the registry lists them.
#pragma once

#include <string>
#include <vector>

#include "ferry/export.h"

namespace ferry {

struct TransportInfo {
  std::string name;                       // "local", "cuda_ipc", "shm", ...
  std::string reach;                      // "same process", "same host", "network"
  std::vector<std::string> memory_kinds;  // kinds it reads and writes: "cpu", ...
  bool needs_region_keys = false;         // peers need a per-region key from it
  std::string unavailable;                // "" if it can work on this machine, else why not
};

// Every transport built in, by preference (the one `auto` tries first comes
// first). Probes this machine (shm: whether one process may copy another's
// memory), so it may take a few milliseconds.
FERRY_API std::vector<TransportInfo> ListTransports();

// What the `fabric` transport finds through libfabric on this machine.
struct FabricDomainInfo {
  std::string provider;   // "verbs;ofi_rxm", "efa", "tcp;ofi_rxm", "shm"
  std::string fabric;     // the provider's fabric name ("127.0.0.1/32", "IB-0xfe80...")
  std::string domain;     // the domain (NIC) name: "lo", "mlx5_0", "rdmap0s6-rdm"
  bool hardware = false;  // a hardware provider (not tcp, udp, sockets or shm)
};
struct FabricInfo {
  std::string library;  // "libfabric 1.17.0", or "" if this build has none
  std::string error;    // why nothing could be listed, or ""
  // Reliable-datagram endpoints with RMA and messages, as libfabric lists
  // them for `node`.
  std::vector<FabricDomainInfo> domains;
  // The provider the fabric transport would use for `provider`
  // (EngineOptions::fabric_provider), or "" with `why_none`.
  std::string chosen;
  std::string why_none;
};
// `provider` as EngineOptions::fabric_provider ("" = the best hardware one);
// `node`: the address endpoints bind to ("" = any: libfabric then lists
// every interface).
FERRY_API FabricInfo DescribeFabric(const std::string& provider, const std::string& node);

}  // namespace ferry
