#include "common/handle_table.h"

#include <gtest/gtest.h>

namespace ferry::internal {
namespace {

TEST(HandleTable, InsertGetErase) {
  HandleTable<int> t;
  uint64_t a = t.Insert(std::make_shared<int>(1));
  uint64_t b = t.Insert(std::make_shared<int>(2));
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(*t.Get(a), 1);
  EXPECT_EQ(*t.Get(b), 2);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(*t.Erase(a), 1);
  EXPECT_EQ(t.Get(a), nullptr);
  EXPECT_EQ(t.Erase(a), nullptr);
  EXPECT_EQ(t.size(), 1u);
}

TEST(HandleTable, StaleHandleDoesNotReachReusedSlot) {
  HandleTable<int> t;
  uint64_t a = t.Insert(std::make_shared<int>(1));
  ASSERT_NE(t.Erase(a), nullptr);
  uint64_t b = t.Insert(std::make_shared<int>(2));
  EXPECT_EQ(a & 0xffffffffu, b & 0xffffffffu);  // same slot reused
  EXPECT_NE(a, b);
  EXPECT_EQ(t.Get(a), nullptr);
  EXPECT_EQ(*t.Get(b), 2);
}

TEST(HandleTable, ForgedHandlesRejected) {
  HandleTable<int> t;
  uint64_t a = t.Insert(std::make_shared<int>(1));
  EXPECT_EQ(t.Get(0), nullptr);
  EXPECT_EQ(t.Get(a & 0xffffffffu), nullptr);   // generation 0
  EXPECT_EQ(t.Get(a + 1), nullptr);             // slot never issued
  EXPECT_EQ(t.Get(a + (1ull << 32)), nullptr);  // wrong generation
  EXPECT_EQ(t.Get(~0ull), nullptr);
}

}  // namespace
}  // namespace ferry::internal
