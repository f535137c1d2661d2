#include "core/slice_order.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>

namespace ferry::internal {
namespace {

bool SendsBefore(const Slice& a, const Slice& b, SliceOrder order) {
  if (a.opcode != b.opcode) return a.opcode == Opcode::kWrite;  // writes first
  return OrderAddress(a, order) < OrderAddress(b, order);
}

// Sorts `group` (one opcode) by its OrderAddress, stably (requests with
// the same destination keep their order). Above 64 slices: an LSD radix sort
// of (address - lowest, position) pairs, 11 bits a pass, as many passes as
// the span of the addresses needs, then one permutation of the slices.
void RadixSort(Slice* group, size_t n, SliceOrder order) {
  if (n <= 64) {
    std::stable_sort(group, group + n,
                     [order](const Slice& a, const Slice& b) { return SendsBefore(a, b, order); });
    return;
  }
  uint64_t lo = UINT64_MAX, hi = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t a = OrderAddress(group[i], order);
    lo = std::min(lo, a);
    hi = std::max(hi, a);
  }
  using Key = std::pair<uint64_t, uint32_t>;
  std::vector<Key> keys(n), spare(n);
  uint64_t any_bits = 0;  // low bits that every key has zero (aligned pages) need no pass
  for (size_t i = 0; i < n; ++i) {
    keys[i] = {OrderAddress(group[i], order) - lo, static_cast<uint32_t>(i)};
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

void OrderForSending(std::vector<Slice>& slices, SliceOrder order) {
  auto before = [order](const Slice& a, const Slice& b) { return SendsBefore(a, b, order); };
  if (std::is_sorted(slices.begin(), slices.end(), before)) return;
  auto reads = std::stable_partition(slices.begin(), slices.end(),
                                     [](const Slice& s) { return s.opcode == Opcode::kWrite; });
  const size_t writes = static_cast<size_t>(reads - slices.begin());
  RadixSort(slices.data(), writes, order);
  RadixSort(slices.data() + writes, slices.size() - writes, order);
}

}  // namespace ferry::internal
