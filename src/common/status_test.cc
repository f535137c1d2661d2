#include "ferry/status.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd value " + std::to_string(x));
  return x / 2;
}

Status UseHalf(int x, int* out) {
  FERRY_ASSIGN_OR_RETURN(*out, Half(x));
  FERRY_RETURN_IF_ERROR(*out > 100 ? ResourceExhaustedError("too big") : OkStatus());
  return OkStatus();
}

TEST(Status, CodesAndMessages) {
  EXPECT_TRUE(OkStatus().ok());
  EXPECT_EQ(OkStatus().ToString(), "OK");
  Status s = NotFoundError("region 0x10");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_EQ(s.ToString(), "NOT_FOUND: region 0x10");
  EXPECT_EQ(s.WithPrefix("unregister").message(), "unregister: region 0x10");
  EXPECT_EQ(Status(StatusCode::kOk, "ignored").message(), "");
}

TEST(StatusOr, ValueOrError) {
  int out = 0;
  EXPECT_TRUE(UseHalf(8, &out).ok());
  EXPECT_EQ(out, 4);
  Status s = UseHalf(3, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd value 3");
  EXPECT_EQ(UseHalf(400, &out).code(), StatusCode::kResourceExhausted);
  StatusOr<int> bad{OkStatus()};
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace ferry
