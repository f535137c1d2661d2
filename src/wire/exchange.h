// One blocking request/response over a socket, used before a connection is
// handed to an event loop (handshakes, stream hellos).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "ferry/status.h"
#include "wire/frame.h"

namespace ferry::wire {

// Sends a frame of `type` with `body` and returns the body of the reply,
// which must be of `reply_type`. Fails on any socket error, on the deadline,
// or on a malformed or unexpected reply. `prefix` (bytes of whole frames,
// e.g. an authentication proof) goes out in the same send, before the frame;
// `flags` go in the frame's header.
StatusOr<std::string> Exchange(int fd, FrameType type, std::string_view body, FrameType reply_type,
                               std::chrono::steady_clock::time_point deadline,
                               std::string_view prefix = {}, uint16_t flags = 0);

// Sends `frame` (header + body) and reads one reply frame of `reply_type`;
// returns its body.
StatusOr<std::string> ExchangeFrame(int fd, std::string_view frame, FrameType reply_type,
                                    std::chrono::steady_clock::time_point deadline);

}  // namespace ferry::wire
