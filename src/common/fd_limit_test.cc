#include "common/fd_limit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace ferry::internal {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(DescriptorError, OutOfDescriptorsIsResourceExhaustedNamingTheLimit) {
  const FdLimits l = GetFdLimits();
  const Status s =
      DescriptorError(StatusCode::kUnavailable, "cannot create a socket for x", EMFILE);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot create a socket for x"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("soft limit RLIMIT_NOFILE = " + std::to_string(l.soft)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("hard limit " + std::to_string(l.hard)));
  EXPECT_THAT(std::string(s.message()), HasSubstr(" in use"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("raise_fd_limit"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("retry")));

  const Status system = DescriptorError(StatusCode::kUnavailable, "accept", ENFILE);
  EXPECT_EQ(system.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(system.message()), HasSubstr("fs.file-max"));
}

TEST(DescriptorError, OtherErrorsKeepTheirCode) {
  const Status s = DescriptorError(StatusCode::kUnavailable, "connect", ECONNREFUSED);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("connect: Connection refused"));
}

TEST(FdLimits, CountsOpenDescriptorsAndRaisesToTheHardLimit) {
  const int64_t before = OpenFdCount();
  ASSERT_GT(before, 0);
  const int fd = ::dup(0);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(OpenFdCount(), before + 1);
  ::close(fd);
  const FdLimits raised = RaiseFdLimit();
  EXPECT_EQ(raised.soft, raised.hard);
}

}  // namespace
}  // namespace ferry::internal
