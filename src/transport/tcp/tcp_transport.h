// The TCP transport: persistent connections (streams) per peer over the rpc
// port, driven by the engine's event loops; large requests are sliced and
// striped across the streams, small ones coalesced into frames of many
// entries. Its frames: tcp_frames.h. Its streams: src/transport/stream/.
#pragma once

#include <memory>

#include "base/transport.h"
#include "transport/context.h"

namespace ferry::internal {

TransportCaps TcpCaps();
// Adds the kStreamHello opener to the rpc port and tunes its accepted sockets.
StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(const TransportContext& ctx);

}  // namespace ferry::internal
