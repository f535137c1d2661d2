// The order in which the core hands a batch's slices to a transport.
#pragma once

#include <cstdint>
#include <vector>

#include "base/transport.h"

namespace ferry::internal {

// Address the slice's bytes land at: the peer's memory for a write, the
// local buffer for a read.
inline uint64_t DestinationAddress(const Slice& s) {
  return s.opcode == Opcode::kWrite ? s.remote : reinterpret_cast<uintptr_t>(s.local);
}

// The sort key of `s` under `order`.
inline uint64_t OrderAddress(const Slice& s, SliceOrder order) {
  return order == SliceOrder::kByLocal ? reinterpret_cast<uintptr_t>(s.local)
                                       : DestinationAddress(s);
}

// Puts writes before reads (a transport coalesces consecutive slices of one
// opcode into a frame) and orders each group by destination address, so the
// receiving side's copy stores forward through memory instead of jumping
// between pages. Scattered stores cost more than scattered loads: for KV
// pages shuffled on both sides, ordering by destination saved more CPU than
// ordering by source (docs/benchmarks-history.md).
// Requests complete by their index, so the order inside a batch is free.
// One pass when the slices are already in order; otherwise a radix sort
// (an order of magnitude faster than std::sort there). A transport may
// ask for its own key instead (Transport::PreferredOrder).
void OrderForSending(std::vector<Slice>& slices, SliceOrder order = SliceOrder::kByDestination);

}  // namespace ferry::internal
