#include "core/slice_order.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry::internal {
namespace {

Slice W(uintptr_t local, uint64_t remote, uint32_t request) {
  return {.opcode = Opcode::kWrite,
          .local = reinterpret_cast<char*>(local),
          .remote = remote,
          .length = 16,
          .request = request};
}
Slice R(uintptr_t local, uint64_t remote, uint32_t request) {
  return {.opcode = Opcode::kRead,
          .local = reinterpret_cast<char*>(local),
          .remote = remote,
          .length = 16,
          .request = request};
}

std::vector<uint32_t> Requests(const std::vector<Slice>& v) {
  std::vector<uint32_t> out;
  for (const Slice& s : v) out.push_back(s.request);
  return out;
}

TEST(SliceOrderTest, WritesByRemoteAddressReadsByLocalAddress) {
  // Writes land in the peer's memory, reads in local memory: each sorts by that.
  std::vector<Slice> v = {W(1, 300, 0), R(900, 1, 1), W(3, 100, 2), R(100, 2, 3), W(2, 200, 4)};
  OrderForSending(v);
  EXPECT_EQ(Requests(v), (std::vector<uint32_t>{2, 4, 0, 3, 1}));
}

TEST(SliceOrderTest, AlternatingOpcodesAreGrouped) {
  std::vector<Slice> v;
  for (uint32_t i = 0; i < 8; ++i) v.push_back(i % 2 ? R(i * 10, i * 10, i) : W(i * 10, i * 10, i));
  OrderForSending(v);
  EXPECT_EQ(Requests(v), (std::vector<uint32_t>{0, 2, 4, 6, 1, 3, 5, 7}));
}

TEST(SliceOrderTest, OrderedInputIsLeftAlone) {
  std::vector<Slice> v = {W(9, 100, 0), W(8, 100, 1), W(7, 200, 2), R(50, 0, 3), R(50, 0, 4)};
  OrderForSending(v);
  EXPECT_EQ(Requests(v), (std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

// Large groups take the radix path: check it against std::sort on addresses
// spread over 40 bits, with duplicates and both opcodes.
TEST(SliceOrderTest, RadixPathMatchesAComparisonSort) {
  std::vector<Slice> v;
  uint64_t x = 88172645463325252ull;
  for (uint32_t i = 0; i < 5000; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const uint64_t addr = (x % 4000) * (uint64_t{1} << 28) / 4000 * 4096 + 0x7f0000000000ull;
    v.push_back(x % 3 ? W(i, addr, i) : R(addr, i, i));
  }
  std::vector<Slice> want = v;
  std::stable_sort(want.begin(), want.end(), [](const Slice& a, const Slice& b) {
    if (a.opcode != b.opcode) return a.opcode == Opcode::kWrite;
    return DestinationAddress(a) < DestinationAddress(b);
  });
  OrderForSending(v);
  ASSERT_EQ(v.size(), want.size());
  for (size_t k = 0; k < v.size(); ++k) {
    EXPECT_EQ(v[k].opcode, want[k].opcode) << k;
    EXPECT_EQ(DestinationAddress(v[k]), DestinationAddress(want[k])) << k;
  }
  // Radix passes are stable: equal addresses keep their submission order.
  EXPECT_EQ(Requests(v), Requests(want));
}

TEST(SliceOrderTest, SmallGroupsAreStableToo) {
  std::vector<Slice> v = {W(0, 500, 0), W(0, 100, 1), W(0, 500, 2), W(0, 100, 3), W(0, 500, 4)};
  OrderForSending(v);
  EXPECT_EQ(Requests(v), (std::vector<uint32_t>{1, 3, 0, 2, 4}));
}

TEST(SliceOrderTest, EveryRequestKeepsItsSlices) {
  std::vector<Slice> v;
  for (uint32_t i = 0; i < 1000; ++i) v.push_back(W(i, (i * 7919u) % 1000 * 64, i));
  OrderForSending(v);
  std::vector<bool> seen(1000, false);
  for (size_t k = 0; k < v.size(); ++k) {
    EXPECT_EQ(v[k].remote, k * 64);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v[k].local), v[k].request);  // the slice moved whole
    seen[v[k].request] = true;
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), 1000);
}

// Radix passes start at the lowest bit that differs and skip passes where
// every key falls in one bucket: addresses that differ only above bit 30, and
// a run of one shared address, must still come out sorted and stable.
TEST(SliceOrderTest, RadixSkipsBitsNoKeyUses) {
  std::vector<Slice> v;
  const uint64_t base = 0x7f0000000000ull;
  for (uint32_t i = 0; i < 300; ++i) v.push_back(W(i, base + (uint64_t{(i * 37u) % 300} << 30), i));
  OrderForSending(v);
  for (size_t k = 0; k < v.size(); ++k) EXPECT_EQ(v[k].remote, base + (uint64_t{k} << 30)) << k;

  std::vector<Slice> same;
  for (uint32_t i = 0; i < 100; ++i) same.push_back(W(100 - i, base, i));
  OrderForSending(same);
  for (uint32_t k = 0; k < 100; ++k) EXPECT_EQ(same[k].request, k);
}

}  // namespace
}  // namespace ferry::internal
