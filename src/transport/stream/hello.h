// Opening a stream: the initiator's blocking hello, and the target's check of
// a hello (instance and wire version), alike for every stream transport.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "base/target.h"
#include "base/transport.h"
#include "ferry/status.h"
#include "transport/stream/auth.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

// Authenticates (with a secret: auth.h), then sends a stream's first frame
// (kStreamHello or a transport's own hello) on a blocking socket and returns
// the peer's answer (kStreamHelloAck): OK, the refusal it sent, or why no
// answer came. `peer` names the peer in messages. `flags`: the hello's
// (wire::kHelloFlag*); every stream this build opens handles kGoAway.
Status SayHello(int fd, const Credentials& cred, std::string_view peer, wire::FrameType type,
                const std::string& body, Clock::time_point deadline,
                uint16_t flags = wire::kHelloFlagGoAway);

class Connection;

// What a target accepts in a hello, and how it serves the stream.
struct HelloPolicy {
  std::shared_ptr<EngineTarget> target;
  uint16_t wire_min = 1;
  uint16_t wire_max = 1;
  // EngineOptions::idle_link_timeout (0: never): a served stream with no
  // request for this long asks its initiator to close it (kGoAway), if the
  // initiator's hello said it can (wire::kHelloFlagGoAway).
  std::chrono::milliseconds idle_timeout{0};
};

// Serves an accepted stream whose hello `h` was accepted under `policy`:
// arranges the idle close above.
void ArrangeIdleClose(const HelloPolicy& policy, const wire::FrameHeader& h, Connection& stream);

// Whether `hello` may open a stream to this engine: it names this instance
// (not one before a restart) and a wire version this engine speaks.
Status CheckHello(const HelloPolicy& policy, const wire::StreamHello& hello);

}  // namespace ferry::internal::stream
