#include "core/prepared.h"

#include <gtest/gtest.h>

#include <vector>

namespace ferry::internal {
namespace {

// A peer with two regions: [0x10000, +64 KiB) and [0x40000, +64 KiB).
std::shared_ptr<const PeerInfo> TwoRegionPeer() {
  wire::PeerDescriptor d;
  d.peer_id = "127.0.0.1:9";
  d.instance_id = 7;
  d.regions = {{0x10000, 0x10000, "cpu", "cpu", {}}, {0x40000, 0x10000, "cpu", "cpu", {}}};
  return std::make_shared<const PeerInfo>(std::move(d));
}

TEST(DescList, AStridedRowStaysOneRowAndIndexesLikeItsEntries) {
  std::vector<DescRow> rows = {{0x10000, 256, 0, 1}, {0x10100, 128, 1024, 16}, {0x40000, 64, 0, 1}};
  auto list = DescList::Remote(rows, TwoRegionPeer());
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ((*list)->entries(), 18u);
  EXPECT_EQ((*list)->At(0).addr, 0x10000u);
  EXPECT_EQ((*list)->At(1).addr, 0x10100u);
  EXPECT_EQ((*list)->At(5).addr, 0x10100u + 4 * 1024);
  EXPECT_EQ((*list)->At(5).length, 128u);
  EXPECT_EQ((*list)->At(16).addr, 0x10100u + 15 * 1024);
  EXPECT_EQ((*list)->At(17).addr, 0x40000u);
  EXPECT_EQ((*list)->At(17).tag, 1u);  // the second region
}

TEST(DescList, AStridedRowAcrossRegionsIsCheckedEntryByEntry) {
  // Entries at 0x10000 + k * 0x30000: k = 0 in region 0, k = 1 in region 1.
  std::vector<DescRow> rows = {{0x10000, 4096, 0x30000, 2}};
  auto list = DescList::Remote(rows, TwoRegionPeer());
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ((*list)->entries(), 2u);
  EXPECT_EQ((*list)->At(0).tag, 0u);
  EXPECT_EQ((*list)->At(1).tag, 1u);
  // A third entry at 0x70000 lies in neither.
  rows[0].count = 3;
  auto bad = DescList::Remote(rows, TwoRegionPeer());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kNotFound);
  EXPECT_NE(bad.status().message().find("entry 2 of its 3"), std::string::npos) << bad.status();
}

TEST(DescList, LocalListsFollowTheRegistry) {
  std::vector<char> a(65536), b(65536);
  MemoryRegistry reg;
  MemoryRegion ra{a.data(), a.size(), "cpu"}, rb{b.data(), b.size(), "cpu"};
  ASSERT_TRUE(reg.Register(std::span(&ra, 1)).ok());
  ASSERT_TRUE(reg.Register(std::span(&rb, 1)).ok());
  const auto addr = [](const std::vector<char>& v) { return reinterpret_cast<uint64_t>(v.data()); };
  std::vector<DescRow> rows = {{addr(a), 4096, 4096, 16}, {addr(b), 100, 0, 1}};
  auto list = DescList::Local(rows, reg);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ((*list)->entries(), 17u);
  EXPECT_TRUE((*list)->StillRegistered(reg).ok());
  ASSERT_TRUE(reg.Unregister(addr(b)).ok());
  EXPECT_EQ((*list)->StillRegistered(reg).code(), StatusCode::kFailedPrecondition);
  std::vector<DescRow> outside = {{addr(b), 100, 0, 1}};
  EXPECT_EQ(DescList::Local(outside, reg).status().code(), StatusCode::kNotFound);
}

TEST(PairEntries, MergesPairsContiguousOnBothSidesOnly) {
  std::vector<char> a(65536);
  MemoryRegistry reg;
  MemoryRegion ra{a.data(), a.size(), "cpu"};
  ASSERT_TRUE(reg.Register(std::span(&ra, 1)).ok());
  const uint64_t base = reinterpret_cast<uint64_t>(a.data());
  std::vector<DescRow> lrows = {{base, 1024, 1024, 32}};
  std::vector<DescRow> rrows = {{0x10000, 1024, 1024, 32}, {0x40000, 1024, 1024, 16}};
  auto local = DescList::Local(lrows, reg);
  auto remote = DescList::Remote(rrows, TwoRegionPeer());
  ASSERT_TRUE(local.ok() && remote.ok());
  // 0,1,2 -> 0,1,2 merge; 3 -> 5 does not; 4 -> 6 continues 3 -> 5;
  // 15 -> 31 then 16 -> 32 (region 0 end, region 1 start): not merged.
  std::vector<uint32_t> li = {0, 1, 2, 3, 4, 15, 16}, ri = {0, 1, 2, 5, 6, 31, 32};
  auto pairs = PairEntries(**local, li, **remote, ri);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->entries.size(), 4u);
  EXPECT_EQ(pairs->entries[0].length, 3072u);
  EXPECT_EQ(pairs->entries[1].remote, 0x10000u + 5 * 1024);
  EXPECT_EQ(pairs->entries[1].length, 2048u);
  EXPECT_EQ(pairs->entries[3].region, 1u);
  EXPECT_EQ(pairs->bytes, 7u * 1024);
  std::vector<uint32_t> bad = {40};
  std::vector<uint32_t> zero = {0};
  EXPECT_EQ(PairEntries(**local, bad, **remote, zero).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PairEntries(**remote, zero, **local, zero).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::internal
