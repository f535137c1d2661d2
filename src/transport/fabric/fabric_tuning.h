// How the fabric transport sizes its operations: per provider, and which
// slices one operation carries (the gathering rule of the endpoint's posting
// loop, fabric_posting.cc). Without libfabric, so it is tested on its own
// (fabric_tuning_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "base/transport.h"

namespace ferry::internal::fabric {

// What measurement chose per provider (docs/benchmarks-history.md, "fabric"):
// the largest slice (one operation's bytes), the bytes of one operation
// gathered from several slices, and the operations in flight.
struct Tuning {
  uint32_t max_op_bytes;
  uint32_t max_gather_bytes;
  uint32_t max_ops;
};
inline Tuning TuningFor(std::string_view provider) {
  const std::string_view core = provider.substr(0, provider.find(';'));
  // tcp;ofi_rxm (docs/benchmarks-history.md, 2026-12-03, session 15):
  // - 512 KiB slices: 1 MiB reads and writes ran fastest with them, against
  //   96 KiB, 256 KiB and 1 MiB (interleaved rounds through Ferry).
  // - Gathers of small slices stop at 96 KiB: on this provider an operation
  //   of 64 or 128 KiB often runs several times slower than one of 96 KiB
  //   (the llama3-8b KV preset, 32 KiB pages, by pages per operation). In
  //   the plain libfabric loop (tools/fabric_probe) the slow sizes depend on
  //   what the connection carried before, so this is a measured choice, not
  //   a law: other sizes are not known to be safe.
  if (core == "tcp") return {512u << 10, 96u << 10, 256};
  if (core == "shm") return {1u << 20, 1u << 20, 64};
  return {1u << 20, 1u << 20, 256};
}

// How many slices from `first` one operation takes: consecutive slices of
// one opcode, at most `iov_limit` of them and, once it has one, no more
// than `max_bytes` in all. A single slice always fits (the core cut it to
// the transport's max_slice). 0 only when `first` is past the end.
inline size_t GatherCount(const std::vector<Slice>& slices, size_t first, uint32_t iov_limit,
                          uint64_t max_bytes) {
  if (first >= slices.size()) return 0;
  const Opcode opcode = slices[first].opcode;
  uint64_t bytes = slices[first].length;
  size_t n = 1;
  while (first + n < slices.size() && n < iov_limit) {
    const Slice& s = slices[first + n];
    if (s.opcode != opcode || bytes + s.length > max_bytes) break;
    bytes += s.length;
    ++n;
  }
  return n;
}

}  // namespace ferry::internal::fabric
