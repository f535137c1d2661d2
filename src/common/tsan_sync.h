// ThreadSanitizer and the kernel's ordering. What one thread writes into a
// socket (or a shared mapping) and another thread reads from the other end
// is ordered by the kernel, which ThreadSanitizer does not see: it follows
// synchronisation by address, and the two ends of a connection are two
// descriptors (a ring's two sides, two mappings). In the tests both ends live
// in one process, so a chain such as "the target sends a read's bytes on one
// stream; the initiator receives them, its caller writes the same range again
// on another stream; the target receives that" looks like a race on the
// target's memory. Under ThreadSanitizer only, each end releases a cell keyed
// by what both ends can name before it sends and acquires it after it
// receives; elsewhere these are nothing.
#pragma once

#include <sys/uio.h>

#include <cstdint>

namespace ferry::internal {

void TsanRelease(uint64_t key);
void TsanAcquire(uint64_t key);
// Around a send of `iov` on a socket keyed `key`: the reads of the bytes
// are recorded first, then the release, and the call's own reads are
// hidden (ThreadSanitizer would place them after the release, where a peer
// that received them could not be ordered after them). A receiver
// acquires before and after its call.
void TsanBeforeSend(uint64_t key, const iovec* iov, int n);
void TsanAfterSend();
// The key of a connected socket that its peer computes alike: TCP, the two
// endpoints (unordered); a unix socket, the path one of its ends is bound
// to (the listener's). 0 under no ThreadSanitizer, or for anything else.
uint64_t TsanSocketKey(int fd);

}  // namespace ferry::internal
