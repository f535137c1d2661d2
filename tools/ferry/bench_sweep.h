// `ferry bench --sweep`: Ferry over block sizes (and thread counts), then a
// table (or JSON), a CSV and, when matplotlib is there, a PNG chart.
#pragma once

#include "bench_options.h"
#include "bench_session.h"

namespace ferry::bench {

// Returns the exit status. Throws cli::RunError.
int RunSweep(Session& s, const BenchOptions& o);

// The sweep's batch size for `block`: --batch-size, fewer where a batch
// would exceed kSweepBatchBytes.
uint64_t SweepBatch(const BenchOptions& o, uint64_t block);

}  // namespace ferry::bench
