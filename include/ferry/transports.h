// The transports built into this Ferry, as the registry lists them.
#pragma once

#include <string>
#include <vector>

namespace ferry {

struct TransportInfo {
  std::string name;                       // "local", "shm", "tcp"
  std::string reach;                      // "same process", "same host", "network"
  std::vector<std::string> memory_kinds;  // kinds it reads and writes: "cpu", ...
  bool needs_region_keys = false;         // peers need a per-region key from it
  std::string unavailable;                // "" if it can work on this machine, else why not
};

// Every transport built in, by preference (the one `auto` tries first comes
// first). Probes this machine (shm: whether one process may copy another's
// memory), so it may take a few milliseconds.
std::vector<TransportInfo> ListTransports();

}  // namespace ferry
