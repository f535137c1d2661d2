// EngineOptions: every setting of an engine, with its default.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

struct EngineOptions {
  // Name of the local segment, advertised to peers. Default: the peer id.
  std::string local_name;

  // Address to bind the rpc port to and to advertise to peers. Use a
  // concrete address (not 0.0.0.0) so peers can reach it. IPv6 without brackets.
  std::string listen_host = "127.0.0.1";
  // 0 = pick a free port. See Engine::RpcPort().
  uint16_t listen_port = 0;

  // "P2PHANDSHAKE": no metadata server; peers exchange descriptors directly
  // on the rpc port. Other services come later.
  std::string metadata = "P2PHANDSHAKE";

  // "auto" picks by locality and capability: local within a process, shm
  // for another process on this host (falling back to tcp if it cannot
  // connect, e.g. without ptrace access to the peer), else tcp. "local",
  // "shm" or "tcp" forces one (opening a segment fails, with the reason, if
  // the forced transport cannot reach the peer).
  std::string transport = "auto";

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
  // TCP and shm: a request larger than this is cut into slices striped across
  // streams. 4 KiB <= slice_size <= max_frame_bytes.
  uint32_t slice_size = 1u << 20;
  // TCP and shm: most bytes (<= 64 MiB) and entries (1..1024) coalesced into
  // one frame.
  uint32_t max_frame_bytes = 1u << 20;
  uint32_t max_frame_entries = 512;
  // TCP: send buffer (SO_SNDBUF, bytes) of the streams this engine serves as
  // a target, which carry its read replies; 0 = the kernel's autotuning.
  // A small buffer keeps the bytes the reader copies still in its cache
  // (1 MiB reads on loopback: ~+30%). Raise it (or 0) for long paths: a
  // stream carries at most about twice this per round trip. 0 or
  // 64 KiB..256 MiB.
  uint32_t tcp_send_buffer = 512u << 10;
  // How long an event loop spins after activity before it blocks. Spinning
  // trades CPU for latency; an idle engine never spins.
  std::chrono::microseconds spin{50};
  // How long a caller waiting for its transfers (WaitBatch, TransferSync)
  // spins before it blocks. Longer than `spin`: a blocked caller costs a
  // wake-up (40-50 us on our VMs) on every small batch, while a spinning one
  // takes CPU only from its own thread.
  std::chrono::microseconds wait_spin{200};

  // Test-only: pretend to speak only these wire versions (0 = real range).
  struct Testing {
    uint16_t wire_version_min = 0;
    uint16_t wire_version_max = 0;
    // Refuse peers' same-host (shm) streams as if their memory could not be
    // reached, so they fall back to tcp.
    bool refuse_same_host_copy = false;
  } testing;

  // Overlays FERRY_* environment variables (see docs/architecture.md) onto
  // these options. The only place Ferry reads its environment.
  EngineOptions WithEnvironment() const;
};

}  // namespace ferry
