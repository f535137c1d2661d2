// Channel: a byte stream to a same-host peer that does not go through the
// connection's socket (the same-host transport's request rings,
// src/transport/shm/request_ring.h). A Connection with a channel sends and
// reads its frames through it; its socket stays open as the liveness signal
// (the peer's death closes it). Thread contract: the connection calls it
// under its lock only.
#pragma once

#include <sys/uio.h>

#include <cstddef>

#include "ferry/status.h"

namespace ferry::internal::stream {

class Channel {
 public:
  virtual ~Channel() = default;
  // Copies as many bytes of `iov` (n entries) in as there is room for and
  // returns how many; fewer than asked (0 included) means full, and the
  // channel then makes wake_fd() readable once the peer has made room. An
  // error means the peer broke the channel (its shared state is garbage).
  virtual StatusOr<size_t> Write(const iovec* iov, int n) = 0;
  // Copies up to the bytes `iov` holds out of the channel; 0: nothing there.
  virtual StatusOr<size_t> Read(const iovec* iov, int n) = 0;
  // Bytes are waiting to be read (cheap: for polling while the loop spins).
  virtual bool Readable() const = 0;
  // The reader is about to sleep: asks the peer to make wake_fd() readable
  // with its next write. False if bytes are waiting already (do not sleep).
  virtual bool ArmRead() = 0;
  // The reader polls again: the peer need not signal.
  virtual void DisarmRead() = 0;
  // Readable when the peer wrote while this side was armed, or made room
  // after a short Write. ClearWake takes the readiness back.
  virtual int wake_fd() const = 0;
  virtual void ClearWake() = 0;
  // Makes wake_fd() readable (this side's loop runs a round).
  virtual void WakeSelf() = 0;
};

}  // namespace ferry::internal::stream
