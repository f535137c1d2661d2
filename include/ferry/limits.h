// Hard limits of the public API (what a call refuses with kInvalidArgument).
#pragma once

#include <cstddef>

namespace ferry {

// Most requests one batch can hold (AllocateBatch's capacity).
inline constexpr size_t kMaxBatchCapacity = size_t{1} << 24;
// SendNotification: most bytes in a notification's name and message.
inline constexpr size_t kMaxNotificationName = 4096;
inline constexpr size_t kMaxNotificationMessage = 60000;
// Registered memory: the local and tcp transports do not pin pages, so the
// only limit is the address space; a request may be any length (it is
// sliced). Transports that pin (RDMA-class, later) are bound by
// RLIMIT_MEMLOCK, which `ferry info` prints.

}  // namespace ferry
