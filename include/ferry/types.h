// Plain value types of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry {

enum class Opcode : uint8_t {
  kRead = 0,   // copy remote bytes into local memory
  kWrite = 1,  // copy local bytes into the remote segment
};

// A checked handle to an opened peer segment. Slot + generation: a handle to
// a closed segment, or a made-up value, is rejected with kInvalidArgument.
struct SegmentHandle {
  uint64_t value = 0;
  friend bool operator==(SegmentHandle a, SegmentHandle b) { return a.value == b.value; }
};

// A checked handle to a batch (slot + generation). Never 0 when valid, so 0
// can mean "no batch" at the Mooncake shim.
struct BatchId {
  uint64_t value = 0;
  friend bool operator==(BatchId a, BatchId b) { return a.value == b.value; }
};

// One one-sided operation. `local` must lie inside memory registered with the
// local engine; [remote_addr, remote_addr + length) must lie inside a region
// the peer registered (the peer checks, and refuses otherwise).
struct TransferRequest {
  Opcode opcode = Opcode::kWrite;
  void* local = nullptr;
  SegmentHandle segment;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
};

enum class TransferState : uint8_t {
  kPending = 0,    // submitted, not finished
  kCompleted = 1,  // write: bytes are in the target's memory (acknowledged);
                   // read: bytes are in local memory
  kFailed = 2,     // see the accompanying Status
};

std::string_view TransferStateName(TransferState s);

struct TransferStatus {
  TransferState state = TransferState::kPending;
  Status status;  // non-OK iff state == kFailed
};

struct BatchStatus {
  TransferState state = TransferState::kPending;  // kFailed if any request failed
  size_t submitted = 0;
  size_t completed = 0;
  size_t failed = 0;
  Status first_error;  // the first failure, naming its request index
};

struct MemoryRegion {
  void* addr = nullptr;
  size_t length = 0;
  // Names the memory kind: "cpu", "cpu:N" or "*" (Mooncake's "anywhere"):
  // host memory. "cuda:N" (GPU memory) is refused with kUnimplemented by this
  // build. Transfers are routed by the kinds of both sides (see
  // docs/architecture.md, "Memory kinds").
  std::string location = "*";
  // true (the default): peers may read and write it — it is in this engine's
  // descriptor and its requests are served. false: for this engine's own
  // transfers only (a source or destination of its requests); peers never
  // see it, and a peer's request naming it is refused like one outside every
  // region.
  bool exported = true;
};

// A region as advertised by a peer.
struct RemoteRegion {
  uint64_t addr = 0;
  uint64_t length = 0;
  std::string location;
  std::string kind = "cpu";  // its memory kind ("cpu"; peers of descriptor format 1: "cpu")
};

// A small named message, delivered after every write the sender submitted to
// this engine before sending it.
struct Notification {
  std::string sender;  // the sender's peer id ("host:port")
  std::string name;
  std::string message;
};

// What an engine (or a peer) can do.
struct Capabilities {
  std::string version;                  // ferry::Version() of that engine
  uint16_t wire_version_min = 0;        // wire protocol versions spoken
  uint16_t wire_version_max = 0;
  std::vector<std::string> transports;  // e.g. {"local", "tcp"}
  std::vector<std::string> features;    // e.g. {"read", "write", "notify"}
};

// What is known about an opened peer segment.
struct SegmentInfo {
  std::string peer_id;      // "host:port"
  std::string engine_name;  // the peer's local segment name
  uint64_t instance_id = 0;  // new on every start of the peer
  uint16_t wire_version = 0;  // negotiated
  std::string transport;    // transport used for cpu-to-cpu data: "local", "shm" or "tcp"
  Capabilities capabilities;
  std::vector<RemoteRegion> regions;  // as of the last handshake, in registration order
};

}  // namespace ferry
