// Checks the test helpers themselves: a checker that cannot fail proves nothing.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/status_matchers.h"

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(PatternTest, WindowsOfOneStreamAgree) {
  std::vector<unsigned char> whole(1000);
  FillPattern(whole.data(), whole.size(), 42, 0);
  for (size_t start : {0, 1, 7, 8, 9, 500, 999}) {
    for (size_t len : {0, 1, 3, 8, 17}) {
      if (start + len > whole.size()) continue;
      std::vector<unsigned char> part(len + 1);
      FillPattern(part.data(), len, 42, start);
      EXPECT_EQ(std::memcmp(part.data(), whole.data() + start, len), 0) << start << "+" << len;
      EXPECT_FALSE(CheckPattern(whole.data() + start, len, 42, start).has_value());
    }
  }
}

TEST(PatternTest, DetectsEveryKindOfError) {
  std::vector<unsigned char> buf(4096);
  FillPattern(buf.data(), buf.size(), 1, 0);
  // Another seed, a shift by one byte or one word, a single flipped bit.
  EXPECT_TRUE(CheckPattern(buf.data(), buf.size(), 2, 0).has_value());
  EXPECT_TRUE(CheckPattern(buf.data() + 1, 100, 1, 0).has_value());
  EXPECT_TRUE(CheckPattern(buf.data() + 8, 100, 1, 0).has_value());
  for (size_t at : {0, 5, 8, 4095}) {
    std::vector<unsigned char> copy = buf;
    copy[at] ^= 0x10;
    ASSERT_EQ(CheckPattern(copy.data(), copy.size(), 1, 0), std::optional<size_t>(at));
    EXPECT_THAT(DescribePatternMismatch(copy.data(), copy.size(), 1, 0),
                HasSubstr("offset " + std::to_string(at)));
  }
  EXPECT_NE(RequestSeed(7, 0), RequestSeed(7, 1));
  EXPECT_NE(RequestSeed(7, 0), RequestSeed(8, 0));
}

TEST(PatternTest, CheckLayoutFindsChangesInRangesAndGaps) {
  std::vector<unsigned char> buf(10000);
  const std::vector<PatternRange> ranges = {{100, 50, 5, 0}, {3000, 1, 6, 0}, {9000, 1000, 7, 9}};
  FillLayout(buf.data(), buf.size(), ranges, 99);
  EXPECT_TRUE(CheckLayout(buf.data(), buf.size(), ranges, 99));
  for (size_t at : {0, 99, 100, 149, 150, 2999, 3000, 3001, 8999, 9999}) {
    std::vector<unsigned char> copy = buf;
    copy[at] ^= 1;
    EXPECT_FALSE(CheckLayout(copy.data(), copy.size(), ranges, 99)) << "flip at " << at;
  }
  // A range the data does not hold.
  EXPECT_FALSE(CheckLayout(buf.data(), buf.size(), {{5000, 10, 5, 0}}, 99));
}

TEST(StatusMatchersTest, MatchAndExplain) {
  EXPECT_THAT(Status(), IsOk());
  EXPECT_THAT(StatusOr<int>(3), IsOk());
  const Status bad = InvalidArgumentError("address 0x1000 is not registered");
  EXPECT_THAT(bad, Not(IsOk()));
  EXPECT_THAT(StatusOr<int>(bad), Not(IsOk()));
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(bad, Not(StatusIs(StatusCode::kNotFound)));
  EXPECT_THAT(bad, StatusIs(StatusCode::kInvalidArgument, HasSubstr("0x1000")));
  EXPECT_THAT(bad, Not(StatusIs(StatusCode::kInvalidArgument, HasSubstr("0x2000"))));
  EXPECT_THAT(StatusOr<int>(bad), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(bad, IsError());
  EXPECT_THAT(Status(), Not(IsError()));
  EXPECT_THAT(bad, IsError(MentionsNumber(0x1000)));
  EXPECT_THAT(bad, IsError(MentionsNumber(4096)));  // 4096 == 0x1000
  EXPECT_THAT(bad, Not(IsError(MentionsNumber(0x1001))));
  EXPECT_THAT(std::string("range [8192, +16)"), MentionsNumber(8192));
  EXPECT_THAT(std::string("range 0X2000"), Not(MentionsNumber(0x2001)));
}

}  // namespace
}  // namespace ferry::test
