// The one seam between the core and the transports.
//
// The core validates requests, slices them (at most Transport::MaxSlice()
// bytes per slice), counts completions and enforces nothing else; a
// transport moves slices to one peer and completes each slice exactly once
// through BatchState (CompleteSlice, or a Completer for a whole frame) —
// success, or a Status that names the reason — before the deadline it was
// given (or shortly after, with kDeadlineExceeded).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/batch.h"
#include "ferry/status.h"
#include "ferry/types.h"
#include "wire/descriptor.h"
#include "wire/frame.h"

namespace ferry::internal {

using Clock = std::chrono::steady_clock;

// One contiguous piece of a request.
struct Slice {
  Opcode opcode = Opcode::kWrite;
  char* local = nullptr;
  uint64_t remote = 0;
  uint32_t length = 0;
  uint32_t request = 0;  // index of the request in its batch
};

// The route to one peer instance through one transport. Thread-safe.
class PeerLink {
 public:
  virtual ~PeerLink() = default;
  // Moves the slices; completes each through the batch (CompleteSlice or a
  // BatchState::Completer), possibly before returning. All slices go to the
  // same peer.
  virtual void Post(const std::shared_ptr<BatchState>& batch, std::vector<Slice> slices,
                    Clock::time_point deadline) = 0;
  // Delivers a notification after every write posted to this link before it
  // has completed; returns once the peer has it.
  virtual Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) = 0;
  // False once the link lost its peer; the core then builds a new one.
  virtual bool Healthy() const = 0;
  // Lets in-flight work finish, then releases the link's resources.
  virtual void Retire() = 0;
};

// The order the core sorts a peer's slices in before posting them (writes
// always before reads). kByDestination: the address the bytes land at, so
// the receiver's stores run forward (tcp, local). kByLocal: this engine's
// own addresses (shm: the kernel pins the initiator's pages per range, so
// adjacent initiator ranges are what it needs; the target's side may scatter).
enum class SliceOrder { kByDestination, kByLocal };

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string_view Name() const = 0;
  // Largest slice this transport accepts.
  virtual uint32_t MaxSlice() const = 0;
  virtual SliceOrder PreferredOrder() const { return SliceOrder::kByDestination; }
  // Adds this transport's endpoint to the engine's own descriptor.
  virtual void Describe(wire::PeerDescriptor* self) const = 0;
  // Whether this transport can reach the peer (locality, endpoints).
  virtual bool CanReach(const wire::PeerDescriptor& peer) const = 0;
  virtual StatusOr<std::shared_ptr<PeerLink>> Connect(const wire::PeerDescriptor& peer,
                                                      uint16_t wire_version,
                                                      Clock::time_point deadline) = 0;
  // Stops threads; fails everything in flight with kCancelled.
  virtual void Shutdown() = 0;
};

}  // namespace ferry::internal
