// The seam between the stream layer and what it carries: the target-side
// handling of frames. The stream layer (Connection) reads and writes frames;
// what a frame means on the target is supplied by whoever accepted the
// stream — the tcp transport (kWrite/kRead), the same-host transport
// (kCopyWrite/kCopyRead), the peer-to-peer metadata responder
// (kHandshakeRequest).
#pragma once

#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/status.h"
#include "transport/stream/auth.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

class Connection;

// The frames of a served stream (after its hello was accepted). Called on the
// stream's loop thread only, under the connection's lock; one service per
// stream.
class FrameService {
 public:
  virtual ~FrameService() = default;
  // Frame types this stream takes; any other closes it (kDataLoss).
  virtual bool Accepts(wire::FrameType type) const = 0;
  // Header and body arrived. May queue a reply (Connection::QueueReply) or
  // place the payload (Connection::reader().ExpectPayload() ...).
  virtual Status OnFrame(Connection& stream, const wire::FrameHeader& h, std::string_view body) = 0;
  // The payload placed in OnFrame has landed.
  virtual Status OnPayload(Connection& stream, const wire::FrameHeader& h) = 0;
};

// Answers the first frame of an accepted connection. On success it may turn
// the connection into a served stream (Connection::Serve); otherwise the
// connection stays waiting for a first frame (a handshake is answered and the
// peer closes).
using Opener =
    std::function<Status(Connection& stream, const wire::FrameHeader& h, std::string_view body)>;

// The openers of one listening socket, by frame type, and the authentication
// every first frame passes before its opener sees it (auth.h). Filled before
// the listener serves (REQUIRES: no Add or SetAuth after Listener::Serve),
// read-only after.
class FirstFrames {
 public:
  void Add(wire::FrameType type, Opener opener) { openers_.emplace_back(type, std::move(opener)); }
  // Unset: no secret (AuthServer::None()).
  void SetAuth(std::shared_ptr<const AuthServer> auth) { auth_ = std::move(auth); }
  const AuthServer& auth() const { return auth_ ? *auth_ : AuthServer::None(); }
  const std::shared_ptr<const AuthServer>& auth_server() const { return auth_; }
  const Opener* Find(wire::FrameType type) const {
    for (const auto& [t, o] : openers_) {
      if (t == type) return &o;
    }
    return nullptr;
  }

 private:
  std::vector<std::pair<wire::FrameType, Opener>> openers_;
  std::shared_ptr<const AuthServer> auth_;
};

}  // namespace ferry::internal::stream
