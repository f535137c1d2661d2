// Request rings: the frames of a same-host stream through shared memory
// instead of its unix socket (docs/architecture.md, "Request rings";
// layout: docs/wire-format.md, "Request rings").
//
// One memfd per stream, made by the initiator: a header page, then two
// single-producer single-consumer byte rings of `capacity` bytes each, ring 0
// carrying the initiator's frames to the target and ring 1 the target's
// replies. The bytes are the stream's frames, exactly as they would travel
// over the socket, so the frame format and its (fuzzed) decoders are
// unchanged. Each side has an eventfd it sleeps on; a producer signals the
// consumer's only when the consumer said it is about to sleep, and a consumer
// the producer's only when the producer found the ring full: while both
// sides poll, a frame costs no system call. The target takes the memfd and
// both eventfds out of the initiator with pidfd_getfd (the ptrace access
// cross-memory attach needs anyway) when the stream's hello names them.
//
// Trust: both processes can write the whole mapping. Each side keeps its own
// position privately and only publishes it; the peer's position is read,
// checked against the capacity (a ring that claims more bytes than it holds
// is an error naming the peer's state), and the bytes are copied out before
// the frame reader parses them. So garbage in the mapping can break the
// stream, never make this process read or write outside the mapping and
// the destinations it chose (tests/fuzz: fuzz_request_ring).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/shared_mapping.h"
#include "ferry/status.h"
#include "transport/shm/copy_frames.h"
#include "transport/stream/channel.h"

namespace ferry::internal::shm {

inline constexpr uint32_t kRingMagic = 0x474e5246;  // "FRNG", little-endian
inline constexpr uint32_t kRingVersion = 1;
inline constexpr uint64_t kRingHeaderBytes = 4096;
inline constexpr uint32_t kRingMinCapacity = 4096;
inline constexpr uint32_t kRingMaxCapacity = 16u << 20;
inline constexpr uint32_t kRingDefaultCapacity = 64u << 10;

// The shared state of one ring: the producer's line (its position, and
// whether it waits for room) and the consumer's line (its position, and
// whether it is about to sleep).
struct RingControl {
  alignas(64) uint64_t tail;   // bytes produced, ever (producer)
  uint32_t producer_waiting;   // 1: signal the producer once there is room
  alignas(64) uint64_t head;   // bytes consumed, ever (consumer)
  uint32_t consumer_sleeping;  // 1: signal the consumer after writing
};
struct RingHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t capacity;  // bytes of each ring, a power of two
  uint32_t attached;  // set to 1 by the target once it serves the stream through the rings
  alignas(64) RingControl ring[2];  // [0]: initiator -> target, [1]: target -> initiator
};
static_assert(sizeof(RingHeader) <= kRingHeaderBytes);
// The offsets docs/wire-format.md gives.
static_assert(offsetof(RingHeader, ring) == 64 && sizeof(RingControl) == 128);
static_assert(offsetof(RingControl, producer_waiting) == 8 && offsetof(RingControl, head) == 64 &&
              offsetof(RingControl, consumer_sleeping) == 72);

inline uint64_t RingMappingBytes(uint32_t capacity) {
  return kRingHeaderBytes + 2 * uint64_t{capacity};
}

// One side's view of a stream's rings (a stream::Channel). Not thread-safe:
// its connection calls it under its lock.
class RequestRing : public stream::Channel {
 public:
  // The initiator's side: a new memfd (sealed against shrinking and growing)
  // and two eventfds. `capacity`: a power of two in [kRingMinCapacity,
  // kRingMaxCapacity].
  static StatusOr<std::unique_ptr<RequestRing>> Create(uint32_t capacity = kRingDefaultCapacity);
  // The target's side: takes the initiator's descriptors `fds` through
  // `pidfd` (pidfd_getfd), checks them (a memfd sealed against shrinking, of
  // exactly the rings' size, with a valid header of `fds.capacity`; two
  // eventfds) and maps the rings. `peer` names the initiator in errors.
  static StatusOr<std::unique_ptr<RequestRing>> Take(int pidfd, const HelloRing& fds,
                                                     const std::string& peer);
  // Over a mapping of RingMappingBytes(capacity) made elsewhere (tests, the
  // fuzzer): `side` 0 is the initiator. The memory must outlive the ring;
  // the wake descriptors may be invalid (no signals).
  static std::unique_ptr<RequestRing> OverMemory(void* mapping, uint32_t capacity, int side,
                                                 UniqueFd own_wake, UniqueFd peer_wake);

  ~RequestRing() override;

  // Initiator: what its hello names (valid while this ring lives).
  HelloRing fds() const;
  // Initiator, after the hello was answered: whether the target attached.
  bool Attached() const;
  // Target: says it serves the stream through the rings (before answering
  // the hello).
  void MarkAttached();

  // stream::Channel
  StatusOr<size_t> Write(const iovec* iov, int n) override;
  StatusOr<size_t> Read(const iovec* iov, int n) override;
  bool Readable() const override;
  bool ArmRead() override;
  void DisarmRead() override;
  int wake_fd() const override { return own_wake_.get(); }
  void ClearWake() override;
  void WakeSelf() override;

 private:
  RequestRing(char* base, uint32_t capacity, int side, UniqueFd own_wake, UniqueFd peer_wake);
  RingControl& tx() const { return header_->ring[side_]; }
  RingControl& rx() const { return header_->ring[1 - side_]; }
  char* tx_data() const { return data_ + uint64_t{capacity_} * side_; }
  char* rx_data() const { return data_ + uint64_t{capacity_} * (1 - side_); }
  void Signal();

  SharedMemory owned_;                  // initiator: the memfd and its mapping
  std::unique_ptr<PeerMapping> taken_;  // target: its mapping of the memfd
  RingHeader* header_;
  char* data_;
  uint32_t capacity_;
  int side_;
  UniqueFd own_wake_;
  UniqueFd peer_wake_;
  // This side's own positions: the shared copies are only published, never
  // read back (the peer can write them).
  uint64_t tail_ = 0;      // of tx
  uint64_t head_ = 0;      // of rx
  uint64_t sync_key_ = 0;  // for ThreadSanitizer only (request_ring.cc)
};

}  // namespace ferry::internal::shm
