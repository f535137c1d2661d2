// File-descriptor limits: reading and raising RLIMIT_NOFILE, and the one
// place that turns the errno of a call that creates a descriptor (socket,
// accept, eventfd, epoll, pidfd, open, memfd) into a Status. Running out of
// descriptors (EMFILE, ENFILE) is kResourceExhausted naming the limit, the
// count in use and what to raise — never kUnavailable: trying again does
// not help until something is raised or closed.
// Thread-safe; no state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal {

struct FdLimits {
  uint64_t soft = 0;  // RLIMIT_NOFILE's soft limit (what EMFILE is about)
  uint64_t hard = 0;  // the most the soft limit can be raised to without privileges
};

// The process's current limits (0, 0 if getrlimit fails).
FdLimits GetFdLimits();

// Raises the soft limit to the hard one (as the Go runtime does at start).
// Returns the limits after the call; a failure leaves the limit as it was
// (logged once at debug level: the engine works within the soft limit).
FdLimits RaiseFdLimit();

// Descriptors open in this process, counted without opening one (poll() on
// the numbers below the soft limit, at most the first 1,048,576). -1 if it
// cannot tell.
int64_t OpenFdCount();

// Whether every descriptor the soft limit allows is in use now: for calls
// inside other libraries (the metadata stores' HTTP and Redis clients) that
// report a failed connect without the errno, asked right after the failure.
bool OutOfDescriptors();

// The Status of a call that failed to create a descriptor with `err`:
// EMFILE and ENFILE are kResourceExhausted ("<what>: out of file
// descriptors: 1024 of the soft limit RLIMIT_NOFILE = 1024 in use (hard
// limit 524288); raise the soft limit (ulimit -n, or the engine option
// raise_fd_limit) or ..."); any other errno is `otherwise` with
// "<what>: <strerror>".
Status DescriptorError(StatusCode otherwise, std::string_view what, int err);

}  // namespace ferry::internal
