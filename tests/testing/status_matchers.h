// gMock matchers and assertion macros for ferry::Status and ferry::StatusOr<T>.
//
//   EXPECT_THAT(engine->FreeBatch(id), IsOk());
//   EXPECT_THAT(engine->AllocateBatch(0), StatusIs(StatusCode::kInvalidArgument));
//   EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("wire")));
//   ASSERT_OK(engine->RegisterMemory(p, n));
//   ASSERT_OK_AND_ASSIGN(BatchId id, engine->AllocateBatch(8));
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::test {

inline const Status& GetStatus(const Status& s) { return s; }
template <typename T>
const Status& GetStatus(const StatusOr<T>& s) {
  return s.status();
}

class StatusIsMatcherImpl {
 public:
  StatusIsMatcherImpl(std::optional<StatusCode> code,
                      ::testing::Matcher<const std::string&> message)
      : code_(code), message_(std::move(message)) {}

  template <typename T>
  bool MatchAndExplain(const T& value, ::testing::MatchResultListener* listener) const {
    const Status& s = GetStatus(value);
    *listener << "which is " << s.ToString();
    if (code_.has_value() && s.code() != *code_) return false;
    if (!code_.has_value() && s.ok()) return false;
    ::testing::StringMatchResultListener inner;
    if (!message_.MatchAndExplain(s.message(), &inner)) {
      const std::string why = inner.str();
      if (!why.empty()) *listener << ", whose message " << why;
      return false;
    }
    return true;
  }

  void DescribeTo(std::ostream* os) const {
    if (code_.has_value()) {
      *os << "has status code " << StatusCodeName(*code_);
    } else {
      *os << "is an error";
    }
    *os << " and a message that ";
    message_.DescribeTo(os);
  }
  void DescribeNegationTo(std::ostream* os) const {
    *os << "does not (";
    DescribeTo(os);
    *os << ")";
  }

 private:
  std::optional<StatusCode> code_;
  ::testing::Matcher<const std::string&> message_;
};

class IsOkMatcherImpl {
 public:
  template <typename T>
  bool MatchAndExplain(const T& value, ::testing::MatchResultListener* listener) const {
    const Status& s = GetStatus(value);
    if (!s.ok()) *listener << "which is " << s.ToString();
    return s.ok();
  }
  void DescribeTo(std::ostream* os) const { *os << "is OK"; }
  void DescribeNegationTo(std::ostream* os) const { *os << "is not OK"; }
};

// Matches an OK Status, or a StatusOr holding a value.
inline ::testing::PolymorphicMatcher<IsOkMatcherImpl> IsOk() {
  return ::testing::MakePolymorphicMatcher(IsOkMatcherImpl());
}

// Matches a Status (or StatusOr) with this code and, optionally, a message
// matching `message` (e.g. HasSubstr("0x1000")).
inline ::testing::PolymorphicMatcher<StatusIsMatcherImpl> StatusIs(
    StatusCode code, ::testing::Matcher<const std::string&> message = ::testing::_) {
  return ::testing::MakePolymorphicMatcher(StatusIsMatcherImpl(code, std::move(message)));
}

// Matches any non-OK Status whose message matches `message`.
inline ::testing::PolymorphicMatcher<StatusIsMatcherImpl> IsError(
    ::testing::Matcher<const std::string&> message = ::testing::_) {
  return ::testing::MakePolymorphicMatcher(StatusIsMatcherImpl(std::nullopt, std::move(message)));
}

// Matches a string that mentions `value`, written either as 0x-prefixed
// lowercase or uppercase hex or as decimal: how a message may "name" an
// address or a length.
inline ::testing::Matcher<const std::string&> MentionsNumber(uint64_t value) {
  char hex_lower[32], hex_upper[32], dec[32];
  std::snprintf(hex_lower, sizeof(hex_lower), "0x%llx", static_cast<unsigned long long>(value));
  std::snprintf(hex_upper, sizeof(hex_upper), "0x%llX", static_cast<unsigned long long>(value));
  std::snprintf(dec, sizeof(dec), "%llu", static_cast<unsigned long long>(value));
  return ::testing::AnyOf(::testing::HasSubstr(hex_lower), ::testing::HasSubstr(hex_upper),
                          ::testing::HasSubstr(dec));
}

inline ::testing::Matcher<const std::string&> MentionsAddress(const void* p) {
  return MentionsNumber(reinterpret_cast<uintptr_t>(p));
}

}  // namespace ferry::test

#define FERRY_TEST_CONCAT_INNER_(a, b) a##b
#define FERRY_TEST_CONCAT_(a, b) FERRY_TEST_CONCAT_INNER_(a, b)

#define EXPECT_OK(expr) EXPECT_THAT(::ferry::test::GetStatus(expr), ::ferry::test::IsOk())
#define ASSERT_OK(expr) ASSERT_THAT(::ferry::test::GetStatus(expr), ::ferry::test::IsOk())

// `lhs = value of expr`; fails the test (fatally) if expr is not OK.
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL_(FERRY_TEST_CONCAT_(ferry_test_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)                   \
  auto tmp = (expr);                                                 \
  ASSERT_THAT(::ferry::test::GetStatus(tmp), ::ferry::test::IsOk()); \
  lhs = std::move(tmp).value()
