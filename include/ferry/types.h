// Plain value types of the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ferry/export.h"
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

// A checked handle to a prepared descriptor list (Engine::PrepareLocalList,
// PrepareRemoteList).
struct DescListHandle {
  uint64_t value = 0;
  friend bool operator==(DescListHandle a, DescListHandle b) { return a.value == b.value; }
};

// A checked handle to a prepared transfer (Engine::MakeTransfer).
struct TransferHandle {
  uint64_t value = 0;
  friend bool operator==(TransferHandle a, TransferHandle b) { return a.value == b.value; }
};

// What finished since the previous Engine::TakeFinished: the batches and
// prepared transfers' posts whose finish wrote the completion descriptor,
// in the order they finished (an id again for each later finish of it).
// `overflowed`: more finished than the engine keeps unread
// (kMaxFinishedRecords in core/completion_signal.h, 65,536); check
// everything waited for.
struct FinishedWork {
  std::vector<BatchId> batches;
  std::vector<TransferHandle> transfers;
  bool overflowed = false;
};

// One row of a descriptor list: the entry [addr, addr + length), or with
// count > 1 the `count` entries addr + k * stride (k = 0 .. count - 1), each
// `length` bytes long. A strided row is kept as one row, not expanded.
struct DescRow {
  uint64_t addr = 0;
  uint64_t length = 0;
  uint64_t stride = 0;
  uint64_t count = 1;
};

// What one post of a prepared transfer took. Times in microseconds of
// std::chrono::steady_clock (start_us: since its epoch).
struct TransferTelemetry {
  uint64_t start_us = 0;     // when the post began
  uint64_t post_us = 0;      // how long the post call took
  uint64_t transfer_us = 0;  // from the start until the transfer finished; 0 while pending
  uint64_t bytes = 0;        // bytes moved (requested) by the transfer
  uint64_t entries = 0;      // requests after merging adjacent entries
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

FERRY_API std::string_view TransferStateName(TransferState s);

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
  // host memory. "cuda:N" (GPU memory) is refused by this build: with
  // kFailedPrecondition without a CUDA driver, kInvalidArgument for a device
  // that does not exist, else kUnimplemented (see Engine::RegisterMemory).
  // Transfers are routed by the kinds of both sides (see
  // docs/architecture.md, "Memory kinds").
  std::string location = "*";
  // true (the default): peers may read and write it — it is in this engine's
  // descriptor and its requests are served. false: for this engine's own
  // transfers only (a source or destination of its requests); peers never
  // see it, and a peer's request naming it is refused like one outside every
  // region.
  bool exported = true;
  // Optional (host memory only): the descriptor this range is a MAP_SHARED
  // mapping of, and the file offset of its first byte. Same-host peers then
  // map the same pages and copy with plain loads and stores instead of
  // asking this engine (docs/architecture.md, "Mapped segments"). The
  // descriptor must be a memfd sealed against shrinking (F_SEAL_SHRINK),
  // and the range must really map it there; the engine keeps a duplicate,
  // so the caller may close its own. -1: not shared (peers' copies go
  // through this engine). Engine::AllocateShared makes such memory.
  int fd = -1;
  uint64_t fd_offset = 0;
};

// A region as advertised by a peer.
struct RemoteRegion {
  uint64_t addr = 0;
  uint64_t length = 0;
  std::string location;
  std::string kind = "cpu";  // its memory kind ("cpu"; peers of descriptor format 1: "cpu")
};

// A named message, delivered after every write the sender submitted to this
// engine before sending it (and, for a prepared transfer's notification,
// after that transfer's data is complete here). At most
// kMaxNotificationName + kMaxNotificationMessage bytes (ferry/limits.h).
struct Notification {
  std::string sender;  // the sender's peer id ("host:port")
  std::string name;
  std::string message;
};

// What an engine (or a peer) can do.
struct Capabilities {
  std::string version;            // ferry::Version() of that engine
  uint16_t wire_version_min = 0;  // wire protocol versions spoken
  uint16_t wire_version_max = 0;
  std::vector<std::string> transports;  // e.g. {"local", "tcp"}
  std::vector<std::string> features;    // e.g. {"read", "write", "notify"}
};

// What is known about an opened peer segment.
struct SegmentInfo {
  std::string peer_id;        // "host:port"
  std::string engine_name;    // the peer's local segment name
  uint64_t instance_id = 0;   // new on every start of the peer
  uint16_t wire_version = 0;  // negotiated
  std::string transport;      // transport used for cpu-to-cpu data: "shm", "tcp", ...
  Capabilities capabilities;
  std::vector<RemoteRegion> regions;  // as of the last handshake, in registration order
};

// Counters of one (peer, transport, opcode): requests and bytes by outcome.
// A request is counted once it finished; cancelled requests count as failed.
struct RouteMetrics {
  std::string peer;       // the peer's "host:port"
  std::string transport;  // "local", "shm", "tcp", ...
  Opcode opcode = Opcode::kWrite;
  uint64_t requests_completed = 0;
  uint64_t requests_failed = 0;
  uint64_t bytes_completed = 0;
  uint64_t bytes_failed = 0;
};

// A latency histogram (cumulative buckets, as Prometheus counts them).
struct LatencyHistogram {
  std::vector<double> bounds_us;  // upper bounds of the buckets; a last +Inf bucket is implied
  std::vector<uint64_t> counts;   // bounds_us.size() + 1 counts, not cumulative
  uint64_t count = 0;
  double sum_us = 0;
};

struct EngineMetrics {
  std::vector<RouteMetrics> routes;
  // Submit (or post) to the last request finished, per batch / prepared
  // transfer post.
  LatencyHistogram transfer_latency;
  uint64_t batches_finished = 0;
  // Batches allocated and not yet freed (AllocateBatch, FreeBatch; TransferSync's
  // own included while it runs). One that only grows is a caller that leaks them.
  uint64_t batches_open = 0;
  uint64_t notifications_sent = 0;
  uint64_t notifications_received = 0;
  uint64_t cancelled_requests = 0;
  // Links to peers (docs/architecture.md, "Peer links"): open now, opened
  // so far, closed after idle_link_timeout, closed to make room under
  // max_peer_links.
  uint64_t peer_links_open = 0;
  uint64_t links_opened = 0;
  uint64_t links_closed_idle = 0;
  uint64_t links_evicted = 0;
  // File regions (Engine::RegisterFile): reads and writes this engine handed
  // to the kernel, with O_DIRECT (aligned) and through the page cache.
  uint64_t file_direct_ops = 0;
  uint64_t file_direct_bytes = 0;
  uint64_t file_buffered_ops = 0;
  uint64_t file_buffered_bytes = 0;
  // Host buffers this engine holds for peers' requests that it stages (a
  // peer's reads and writes of this engine's file regions, and over tcp of
  // its GPU memory): bytes in use now, and the most at once since Create.
  // Bounded per served stream (docs/reliability.md).
  uint64_t target_staging_bytes = 0;
  uint64_t target_staging_bytes_peak = 0;
};

}  // namespace ferry
