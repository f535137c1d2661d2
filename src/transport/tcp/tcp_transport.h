// The TCP transport: persistent connections (streams) per peer, driven by a
// few event-loop threads; large requests are sliced and striped across the
// streams, small ones coalesced into frames of many entries.
#pragma once

#include <memory>

#include "ferry/options.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/stream_link.h"
#include "transport/transport.h"

namespace ferry::internal {

struct TcpTransportConfig : tcp::StreamTransportConfig {
  UniqueFd listener;  // bound and listening (the rpc port)
  // Bytes a stream may have unanswered before the link holds further write
  // frames back for whichever stream has room first (see tcp::StreamLink).
  uint64_t stream_window = 2u << 20;
  // SO_SNDBUF of accepted connections (they carry read replies); 0: the
  // kernel's autotuning. See EngineOptions::tcp_send_buffer.
  uint32_t served_send_buffer = 0;
};

// Serves the rpc port (handshakes and data streams) from the loops.
StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(TcpTransportConfig config,
                                                      std::shared_ptr<const tcp::ServerContext> server,
                                                      std::shared_ptr<tcp::LoopPool> loops);

}  // namespace ferry::internal
