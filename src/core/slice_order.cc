#include "core/slice_order.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

namespace ferry::internal {
namespace {

bool SendsBefore(const Slice& a, const Slice& b) {
  if (a.opcode != b.opcode) return a.opcode == Opcode::kWrite;  // writes first
  return DestinationAddress(a) < DestinationAddress(b);
}

// Sorts `group` (one opcode) by destination address, stably (requests with
// the same destination keep their order). Above 64 slices: an LSD radix sort
// of (address - lowest, position) pairs, 11 bits a pass, as many passes as
// the span of the addresses needs, then one permutation of the slices.
void RadixByDestination(Slice* group, size_t n) {
  if (n <= 64) {
    std::stable_sort(group, group + n, SendsBefore);
    return;
  }
  uint64_t lo = UINT64_MAX, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t a = DestinationAddress(group[i]);
    lo = std::min(lo, a);
    hi = std::max(hi, a);
  }
  using Key = std::pair<uint64_t, uint32_t>;
  std::vector<Key> keys(n), spare(n);
  uint64_t any_bits = 0;  // low bits that every key has zero (aligned pages) need no pass
  for (size_t i = 0; i < n; ++i) {
    keys[i] = {DestinationAddress(group[i]) - lo, static_cast<uint32_t>(i)};
    any_bits |= keys[i].first;
  }
  if (any_bits == 0) return;  // one destination for all: stable order is the order given
  constexpr int kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  const int span_bits = std::bit_width(hi - lo);
  for (int shift = std::countr_zero(any_bits); shift < span_bits; shift += kBits) {
    std::array<uint32_t, kBuckets> count{};
    for (const Key& k : keys) ++count[(k.first >> shift) & (kBuckets - 1)];
    if (count[(keys[0].first >> shift) & (kBuckets - 1)] == n)
      continue;  // one bucket: nothing moves
    uint32_t sum = 0;
    for (uint32_t& c : count) sum += std::exchange(c, sum);
    for (const Key& k : keys) spare[count[(k.first >> shift) & (kBuckets - 1)]++] = k;
    keys.swap(spare);
  }
  std::vector<Slice> sorted(n);
  for (size_t i = 0; i < n; ++i) sorted[i] = group[keys[i].second];
  std::copy(sorted.begin(), sorted.end(), group);
}

}  // namespace

void OrderForSending(std::vector<Slice>& slices) {
  if (std::is_sorted(slices.begin(), slices.end(), SendsBefore)) return;
  auto reads = std::stable_partition(slices.begin(), slices.end(),
                                     [](const Slice& s) { return s.opcode == Opcode::kWrite; });
  const size_t writes = static_cast<size_t>(reads - slices.begin());
  RadixByDestination(slices.data(), writes);
  RadixByDestination(slices.data() + writes, slices.size() - writes);
}

}  // namespace ferry::internal
