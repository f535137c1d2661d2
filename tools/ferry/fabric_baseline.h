// The `fabric` transport's baseline in `ferry bench`: a plain libfabric RMA
// loop between two endpoints of this process (no Ferry), on the same
// provider, node and entries as the Ferry phase, so the bench can print
// fabric / baseline. FI_EP_RDM, registered buffers, fi_writemsg with
// FI_DELIVERY_COMPLETE or fi_readmsg, one entry per operation, `depth`
// operations kept in flight; a second thread drives the target endpoint's
// progress (as Ferry's target does with its progress thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.h"

namespace ferry::bench {

struct FabricBaselineResult {
  std::string error;     // "" on success, else why it could not run
  std::string provider;  // as libfabric names it
  uint32_t depth = 0;    // operations in flight
  uint64_t bytes = 0, ops = 0;
  double seconds = 0;
  double cpu_seconds = 0;  // this process (both endpoints)
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

// `provider`: the libfabric name ("tcp;ofi_rxm"); `node`: the address both
// endpoints bind to (127.0.0.1). `entries`: offsets into a local buffer of
// `local_bytes` and a target buffer of `remote_bytes` (both allocated here).
// Runs `seconds` after a short warm-up; every wait is bounded (5 s without
// a completion fails).
FabricBaselineResult RunFabricBaseline(const std::string& provider, const std::string& node,
                                       const std::vector<Entry>& entries, uint64_t local_bytes,
                                       uint64_t remote_bytes, uint32_t depth, double seconds);

}  // namespace ferry::bench
