// Status and StatusOr<T>: how every Ferry call reports success or failure.
//
// Codes are chosen by what the caller should do next:
//   kInvalidArgument    fix the call (bad address, length, handle, list sizes)
//   kNotFound           the named object does not exist (region, segment, batch)
//   kAlreadyExists      the object exists already (overlapping registration)
//   kFailedPrecondition the system is not in a state that allows the call
//                       (no common wire version, batch still in flight)
//   kUnavailable        transient: the peer is down or unreachable; retry later
//   kDeadlineExceeded   the operation did not finish before its deadline
//   kResourceExhausted  a limit was hit (batch capacity, memory); back off
//   kDataLoss           bytes were lost or corrupted
//   kCancelled          the operation was cancelled (engine shut down)
//   kUnimplemented      the feature is not available in this build or peer
//   kInternal           a bug in Ferry; please report it
//   kUnauthenticated    the peer and this engine do not share a cluster secret
//                       (one has none, or they differ): fix the configuration
// Every non-OK status carries a message that names the object at fault.
#pragma once

#include <cassert>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/export.h"

namespace ferry {

enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "OK", "INVALID_ARGUMENT", ... (stable; used in logs, JSON and Python).
FERRY_API std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] FERRY_API Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message)
      : code_(code), message_(code == StatusCode::kOk ? std::string() : std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: <message>" or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "<prefix>: <message>" (code unchanged).
  Status WithPrefix(std::string_view prefix) const;
  // Marks a status as deliberately ignored.
  void IgnoreError() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

FERRY_API std::ostream& operator<<(std::ostream& os, const Status& s);

inline Status OkStatus() { return Status(); }
inline Status InvalidArgumentError(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) {
  return {StatusCode::kAlreadyExists, std::move(m)};
}
inline Status FailedPreconditionError(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status ResourceExhaustedError(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status UnimplementedError(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status CancelledError(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status UnauthenticatedError(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : status_(status) {  // NOLINT: implicit by design
    if (status_.ok())
      status_ = InternalError("StatusOr constructed from an OK status without a value");
  }
  StatusOr(Status&& status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok())
      status_ = InternalError("StatusOr constructed from an OK status without a value");
  }
  StatusOr(const T& value) : value_(value) {}        // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT
  template <typename U, typename = std::enable_if_t<std::is_convertible_v<U&&, T> &&
                                                    !std::is_same_v<std::decay_t<U>, Status> &&
                                                    !std::is_same_v<std::decay_t<U>, T>>>
  StatusOr(U&& value) : value_(T(std::forward<U>(value))) {}  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;  // OK iff value_ has a value
  std::optional<T> value_;
};

}  // namespace ferry

#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b
#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` is a non-OK Status.
#define FERRY_RETURN_IF_ERROR(expr)                        \
  do {                                                     \
    ::ferry::Status ferry_status_tmp_ = (expr);            \
    if (!ferry_status_tmp_.ok()) return ferry_status_tmp_; \
  } while (0)

// `lhs = value of expr`, or returns its Status if it failed.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_STATUS_CONCAT_(ferry_statusor_, __LINE__), lhs, expr)
#define FERRY_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
