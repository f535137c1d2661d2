// Hard limits of the public API (what a call refuses with kInvalidArgument).
#pragma once

#include <cstddef>

namespace ferry {

// Most requests one batch can hold (AllocateBatch's capacity).
inline constexpr size_t kMaxBatchCapacity = size_t{1} << 24;
// SendNotification: most bytes in a notification's name and message. Peers
// of builds before the feature "notify-1m" take messages of at most
// kMaxNotificationMessageV1 bytes (a larger one is refused before sending).
inline constexpr size_t kMaxNotificationName = 4096;
inline constexpr size_t kMaxNotificationMessage = size_t{1} << 20;
inline constexpr size_t kMaxNotificationMessageV1 = 60000;
// Prepared descriptor lists: most entries (rows after expanding strides).
inline constexpr size_t kMaxDescListEntries = (size_t{1} << 32) - 1;  // indices are u32
// Registered memory: the local, shm and tcp transports do not pin it, so
// the only limit is the address space; a request may be any length (it is
// sliced). The fabric transport registers every region with each rail's
// domain (fi_mr_reg); providers that pin what they register (the RDMA
// hardware ones) are bound by RLIMIT_MEMLOCK, which `ferry info` prints.

}  // namespace ferry
