// EngineOptions: every setting of an engine, with its default. OptionTable()
// lists each of them (but `testing`) with its range, its FERRY_* variable and
// what it belongs to: one table, in src/common/option_table.cc, that
// SetOption(), ValidateOptions(), the environment overlay, the Python
// package, `ferry info` and docs/configuration.md use.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ferry/export.h"
#include "ferry/status.h"
#include "ferry/testing_options.h"

namespace ferry {

struct FERRY_API EngineOptions {
  // Name of the local segment, advertised to peers. Default: the peer id.
  std::string local_name;

  // Address to bind the rpc port to and to advertise to peers. Use a
  // concrete address (not 0.0.0.0) so peers can reach it. IPv6 without brackets.
  std::string listen_host = "127.0.0.1";
  // 0 = pick a free port. See Engine::RpcPort().
  uint16_t listen_port = 0;

  // Where engines publish their descriptors and find each other by name:
  // "P2PHANDSHAKE" (no server: peers are named HOST:PORT and exchange
  // descriptors on the rpc port), "etcd://H:P[,H:P...]" or a bare "H:P"
  // (etcd), "redis://[USER:PASS@]H:P[/DB]", "http://H:P[/PATH]" (`ferry
  // metadata-server`), "memory://NAME" (engines of one process).
  // ferry::ListMetadataBackends() says which this build has.
  std::string metadata = "P2PHANDSHAKE";
  // etcd and Redis: this engine's entries live this long unless refreshed
  // (every third of it), so a crashed engine's name frees itself.
  std::chrono::milliseconds metadata_ttl{10000};
  // Keys live under "<metadata_cluster>/segments/<name>": clusters sharing
  // one service keep apart by this prefix. Letters, digits, '.', '_', '-'.
  std::string metadata_cluster = "ferry";

  // "auto" picks, per peer, the first transport in the order of
  // ListTransports() (ferry/transports.h; `ferry info` prints it) that can
  // reach the peer and move bytes between the two memory kinds: local, then
  // cuda_ipc, then shm, then fabric, then tcp. One that says it reaches the
  // peer but cannot connect (shm without ptrace access to the peer) gives
  // way to the next. A transport's name forces it (opening a segment fails,
  // with the reason, if the forced transport cannot reach the peer).
  std::string transport = "auto";

  // The libfabric provider of the `fabric` transport (RDMA-class networks:
  // verbs, efa, cxi, ...; here also "tcp" = tcp;ofi_rxm and "shm"). Empty
  // (the default): the best hardware provider found, or none, in which case
  // the fabric transport is not started and `auto` keeps using shm and tcp.
  // Its endpoints bind to listen_host (so 127.0.0.1 pins them to loopback).
  std::string fabric_provider;

  // The fabric transport's NICs, for striping: addresses (one per NIC,
  // comma-separated, e.g. "10.0.1.5,10.0.2.5"), each opening its own
  // domain and endpoint (a rail). Requests larger than a stripe are sliced
  // and spread over the rails; rail i of this engine talks to rail i of the
  // peer (modulo the peer's count). Empty (the default): one rail, bound to
  // listen_host.
  std::string fabric_nics;

  // A file holding the cluster secret (at least 16 bytes; trailing newlines
  // are not part of it), read by Engine::Create; empty = no secret. With
  // it, every connection to or from a peer (handshake, tcp and same-host
  // streams) authenticates with HMAC-SHA256 challenge-response first, and
  // peers without the same secret are refused (kUnauthenticated). It does
  // not encrypt: the bytes on the wire stay readable (docs/reliability.md).
  std::string secret_file;

  // "HOST:PORT" of a Prometheus text endpoint (GET /metrics) serving
  // Engine::MetricsText(); port 0 picks a free one (Engine::MetricsAddress
  // says which). Empty (the default): off.
  std::string metrics_address;

  // Connect + handshake with a peer.
  std::chrono::milliseconds connect_timeout{5000};
  // Deadline of each submitted request, from submission.
  std::chrono::milliseconds transfer_timeout{30000};
  // How long an accepted connection may take to say hello.
  std::chrono::milliseconds handshake_timeout{5000};

  // TCP and shm: parallel connections (streams) per peer, 1..64.
  int tcp_streams = 2;
  // Event-loop threads of the socket transports (tcp and shm share them),
  // 0..64 (0 = one per stream, at most 4). On shm they also do the copies
  // of the streams this engine serves.
  int io_threads = 0;
  // shm, fabric and tcp: a request larger than this is cut into slices,
  // striped across streams (fabric: across its rails). 4 KiB <= slice_size
  // <= max_frame_bytes.
  uint32_t slice_size = 1u << 20;
  // TCP and shm: most bytes (<= 64 MiB) and entries (1..1024) coalesced into
  // one frame.
  uint32_t max_frame_bytes = 1u << 20;
  uint32_t max_frame_entries = 512;
  // TCP: send buffer (SO_SNDBUF, bytes) of the streams this engine serves as
  // a target, which carry its read replies; 0 = the kernel's autotuning.
  // A small buffer keeps the bytes the reader copies still in its cache.
  // Raise it (or 0) for long paths: a stream carries at most about twice
  // this per round trip. 0 or 64 KiB..256 MiB.
  uint32_t tcp_send_buffer = 512u << 10;

  // Limits (docs/reliability.md, "Limits"). Per peer (and route), the slices
  // (a request longer than slice_size counts as several) and bytes this
  // engine has posted and not yet seen answered: past either, Submit waits
  // for room (back-pressure) until the requests' deadline, then fails the
  // rest with kResourceExhausted naming the limit. 1..2^30 slices;
  // 1 MiB..1 TiB.
  uint32_t peer_max_requests = 1u << 20;
  uint64_t peer_max_bytes = uint64_t{16} << 30;
  // Accepted connections from one source (an IP address; on this host's
  // same-host socket, a user id) that have not yet finished their hello or
  // authentication (1..65536), and all connections open from one source
  // (1..1048576). Past either, new connections from that source are closed
  // at once (logged once per source); other sources are not affected.
  uint32_t max_handshakes_per_source = 64;
  uint32_t max_connections_per_source = 4096;
  // Notifications received and not yet fetched (GetNotifications): past this
  // many bytes (64 KiB..4 GiB), a peer's next notification is refused with
  // kResourceExhausted, which its SendNotification returns.
  uint64_t notify_inbox_bytes = uint64_t{64} << 20;
  // How long an event loop spins after activity before it blocks. Spinning
  // trades CPU for latency; an idle engine never spins.
  std::chrono::microseconds spin{50};
  // How long a caller waiting for its transfers (WaitBatch, TransferSync)
  // spins before it blocks. Longer than `spin`: a blocked caller costs a
  // wake-up on every small batch, while a spinning one takes CPU only from
  // its own thread.
  std::chrono::microseconds wait_spin{200};
  // How long an awaited transfer (Python's ferry.aio, Engine::SpinBatch)
  // polls in the awaiting thread before it waits on the completion
  // descriptor, when that event loop awaits nothing else of this engine. A
  // small transfer ends within it and costs no wake-up (what the synchronous
  // call costs); the loop is held that long at most. 0: always wait on the
  // descriptor.
  std::chrono::microseconds await_spin{50};
  // Entries of the io_uring ring of file regions (Engine::RegisterFile):
  // at most this many file reads and writes in the kernel at once
  // (1..4096); the others wait in order.
  uint32_t file_queue_depth = 64;
  // Same-host peers' shared memory (Engine::AllocateShared, MemoryRegion::fd)
  // is mapped into this process and copied with plain loads and stores, no
  // request to the peer (docs/architecture.md, "Mapped segments"); false:
  // every same-host copy goes through the peer (cross-memory attach).
  bool map_shared_memory = true;
  // Same-host streams carry their frames through request rings in shared
  // memory instead of their unix sockets (docs/architecture.md, "Request
  // rings"): no system call per request while both sides poll. Both engines
  // must allow it; false: frames go through the sockets.
  bool shm_rings = true;

  // Many peers (docs/architecture.md, "Peer links"). Engine::Create raises
  // the soft RLIMIT_NOFILE to the hard limit (as the Go runtime does), so
  // thousands of peer links fit under a default soft limit of 1,024; false
  // leaves the limit alone.
  bool raise_fd_limit = true;
  // A link to a peer with no request for this long is closed by this engine
  // (the initiator; the peer then closes its end) and opened again by the
  // next request, which never notices: a request racing the close goes on a
  // new link. As the target of a peer's link, this engine asks the peer to
  // close it after as long without a request there (it keeps serving until
  // the peer does). 0 = never (this engine still closes links its peers ask
  // it to).
  std::chrono::milliseconds idle_link_timeout{300000};
  // Most links to peers this engine keeps open (0 = no limit). Past it the
  // least recently used idle link is closed to make room; when every link
  // is in use, a request to a new peer waits for room until connect_timeout
  // runs out, then fails with kResourceExhausted naming this limit.
  uint32_t max_peer_links = 0;

  // Test-only settings (ferry/testing_options.h); not in OptionTable().
  using Testing = TestingOptions;
  Testing testing;

  // Overlays the FERRY_* variables of OptionTable() (docs/configuration.md)
  // onto these options; an invalid value is reported on stderr and ignored.
  // The environment is read once per process (src/common/env.cc).
  EngineOptions WithEnvironment() const;
};

// One setting of EngineOptions as OptionTable() describes it.
struct FERRY_API OptionSpec {
  std::string_view name;           // the field: "tcp_streams"
  std::string_view variable;       // the FERRY_* variable that overrides it; "" if none
  std::string_view unit;           // of the value, the range and the variable: "ms", "us", "B", ""
  std::string_view range;          // the valid values: "[1, 64]", "0 or [64 KiB, 256 MiB]", ...
  std::string_view default_value;  // that of a default-constructed EngineOptions, in `unit`
  std::string_view meaning;
  // What reads the setting: "engine" (the engine itself, or every
  // transport), "metadata" (the metadata store), or the transports that
  // do, by name in the order of ListTransports(): "fabric", "shm, tcp".
  std::string_view belongs_to;
  // Integer options: the bounds of `range` (which may also allow 0, or raise
  // `min` to another option's value: max_frame_bytes >= slice_size).
  int64_t min = 0;
  int64_t max = 0;
  // Exactly one is set. integer_value: the option's value in `o`, in `unit`;
  // string_value: the option's text in `o`.
  int64_t (*integer_value)(const EngineOptions& o) = nullptr;
  const std::string& (*string_value)(const EngineOptions& o) = nullptr;

  // The value in `o` as text: an integer in decimal (in `unit`), a string as
  // it is (a metadata URL with its password redacted).
  std::string Value(const EngineOptions& o) const;
};

// Every setting of EngineOptions but `testing`, in the order of the fields.
// Static storage; the same on every call.
FERRY_API std::span<const OptionSpec> OptionTable();

// The row of OptionTable() named `name`, or null.
FERRY_API const OptionSpec* FindOption(std::string_view name);

// Sets the option `name` (a row of OptionTable()) in `o` from text: an
// integer option from a decimal integer in the row's unit ("5000" for a
// timeout in ms), a string option from the text as it is. kInvalidArgument,
// leaving `o` as it was, for an unknown name (naming the closest known ones)
// or an integer that does not parse or is outside the row's range (naming
// the option, the range and the value). Bounds set by another option
// (max_frame_bytes >= slice_size) and transport names are checked by
// ValidateOptions and Engine::Create, once every option is set.
FERRY_API Status SetOption(EngineOptions& o, std::string_view name, std::string_view value);

// OK, or kInvalidArgument naming the first option outside its range, the
// range and the value got ("tcp_streams must be in [1, 64], got 0").
// Engine::Create calls it. Does not check `transport` names: which
// transports exist is the engine's to say.
FERRY_API Status ValidateOptions(const EngineOptions& o);

}  // namespace ferry
