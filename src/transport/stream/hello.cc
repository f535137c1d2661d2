#include "transport/stream/hello.h"

#include "transport/stream/connection.h"
#include "wire/exchange.h"

namespace ferry::internal::stream {

Status SayHello(int fd, const Credentials& cred, std::string_view peer, wire::FrameType type,
                const std::string& body, Clock::time_point deadline, uint16_t flags) {
  FERRY_ASSIGN_OR_RETURN(std::string ack,
                         AuthenticatedExchange(fd, cred, peer, type, body,
                                               wire::FrameType::kStreamHelloAck, deadline, flags));
  Status remote;
  FERRY_RETURN_IF_ERROR(wire::DecodeStatus(ack, &remote));
  return ExplainRefusal(remote, cred, peer);
}

Status CheckHello(const HelloPolicy& policy, const wire::StreamHello& hello) {
  const EngineTarget& t = *policy.target;
  if (hello.target_instance != t.instance_id()) {
    return FailedPreconditionError(
        "engine " + t.peer_id() + " is instance " + std::to_string(t.instance_id()) + ", not " +
        std::to_string(hello.target_instance) + " (it restarted): handshake again");
  }
  if (hello.wire_version < policy.wire_min || hello.wire_version > policy.wire_max) {
    return FailedPreconditionError("wire version " + std::to_string(hello.wire_version) +
                                   " is not spoken by " + t.peer_id() + " (speaks " +
                                   std::to_string(policy.wire_min) + ".." +
                                   std::to_string(policy.wire_max) + ")");
  }
  return OkStatus();
}

void ArrangeIdleClose(const HelloPolicy& policy, const wire::FrameHeader& h, Connection& stream) {
  if (policy.idle_timeout.count() > 0 && (h.flags & wire::kHelloFlagGoAway) != 0) {
    stream.AskToCloseWhenIdle(policy.idle_timeout);
  }
}

}  // namespace ferry::internal::stream
