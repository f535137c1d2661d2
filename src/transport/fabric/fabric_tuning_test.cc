#include "transport/fabric/fabric_tuning.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry::internal::fabric {
namespace {

std::vector<Slice> Slices(const std::vector<uint32_t>& lengths, Opcode op = Opcode::kWrite) {
  std::vector<Slice> v;
  for (uint32_t len : lengths) {
    Slice s;
    s.opcode = op;
    s.length = len;
    s.request = static_cast<uint32_t>(v.size());
    v.push_back(s);
  }
  return v;
}

// How GatherCount cuts `slices` into operations, from the first.
std::vector<size_t> Cut(const std::vector<Slice>& slices, uint32_t iov_limit, uint64_t max_bytes) {
  std::vector<size_t> ops;
  for (size_t i = 0; i < slices.size();) {
    const size_t n = GatherCount(slices, i, iov_limit, max_bytes);
    if (n == 0) break;
    ops.push_back(n);
    i += n;
  }
  return ops;
}

TEST(FabricTuningTest, GathersUpToTheIovLimitAndTheByteCap) {
  const auto pages = Slices(std::vector<uint32_t>(10, 32 << 10));
  EXPECT_EQ(Cut(pages, 4, 1u << 20), (std::vector<size_t>{4, 4, 2}));
  EXPECT_EQ(Cut(pages, 4, 96u << 10), (std::vector<size_t>{3, 3, 3, 1}));
  EXPECT_EQ(Cut(pages, 1, 1u << 20), (std::vector<size_t>(10, 1)));
  // Just under three pages: two fit, the third does not.
  EXPECT_EQ(Cut(pages, 4, (96u << 10) - 1), (std::vector<size_t>(5, 2)));
}

TEST(FabricTuningTest, ASliceLargerThanTheCapGoesAlone) {
  const auto s = Slices({4096, 512u << 10, 4096, 4096});
  EXPECT_EQ(Cut(s, 4, 96u << 10), (std::vector<size_t>{1, 1, 2}));
}

TEST(FabricTuningTest, AnOperationCarriesOneOpcode) {
  auto s = Slices({4096, 4096, 4096, 4096});
  s[2].opcode = Opcode::kRead;
  EXPECT_EQ(Cut(s, 4, 1u << 20), (std::vector<size_t>{2, 1, 1}));
  EXPECT_EQ(GatherCount(s, 4, 4, 1u << 20), 0u);
  EXPECT_EQ(GatherCount({}, 0, 4, 1u << 20), 0u);
}

// The measured choices (docs/benchmarks-history.md, 2026-12-03) as the posting loop
// applies them: on tcp;ofi_rxm the llama3-8b KV preset's 32 KiB pages go
// three to an operation (96 KiB, not 64 or 128), and a 1 MiB request is two
// 512 KiB slices. Other providers keep 1 MiB.
TEST(FabricTuningTest, TcpGathersKvPagesThreeToAnOperation) {
  const Tuning tcp = TuningFor("tcp;ofi_rxm");
  EXPECT_EQ(tcp.max_op_bytes, 512u << 10);
  const auto pages = Slices(std::vector<uint32_t>(6, 32 << 10));
  EXPECT_EQ(Cut(pages, 4, tcp.max_gather_bytes), (std::vector<size_t>{3, 3}));
  const Tuning other = TuningFor("verbs;ofi_rxm");
  EXPECT_EQ(other.max_op_bytes, 1u << 20);
  EXPECT_EQ(Cut(pages, 4, other.max_gather_bytes), (std::vector<size_t>{4, 2}));
  EXPECT_EQ(TuningFor("shm").max_ops, 64u);
}

}  // namespace
}  // namespace ferry::internal::fabric
