// `ferry bench --target-kind file`: Ferry's file regions (Engine::RegisterFile,
// io_uring) against fio (ioengine=io_uring) on the same file, block size and
// queue depth, alternately in one run.
#pragma once

#include "bench_options.h"

namespace ferry::bench {

// Exit status: 0 ok, 1 the run failed.
int RunFileBench(const BenchOptions& o);

}  // namespace ferry::bench
