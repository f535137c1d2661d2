#include "transport/stream/auth.h"

#include "common/log.h"
#include "transport/stream/connection.h"
#include "wire/descriptor.h"
#include "wire/exchange.h"

namespace ferry::internal::stream {
namespace {

constexpr std::string_view kServerLabel = "ferry-auth-v1 server";
constexpr std::string_view kClientLabel = "ferry-auth-v1 client";
// Distinct peers whose refusals are logged; past this, one line says so.
constexpr size_t kMaxLogged = 1024;

// A peer-supplied name made safe for one log line.
std::string Printable(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 128)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return out;
}

// "host" of "host:port" (addresses of one peer differ in their ports).
std::string HostOf(const std::string& address) {
  auto hp = ParsePeerId(address);
  return hp.ok() ? hp->host : address;
}

}  // namespace

// ---- client ---------------------------------------------------------------

StatusOr<std::string> Authenticate(int fd, const Credentials& cred, std::string_view peer,
                                   Clock::time_point deadline) {
  if (cred.secret == nullptr) return std::string();
  const std::string who(peer);
  FERRY_ASSIGN_OR_RETURN(AuthNonce nonce_c, NewAuthNonce());
  wire::AuthHello hello{wire::kAuthModeHmacSha256, nonce_c, cred.self_peer_id};
  std::string body;
  wire::EncodeAuthHello(hello, &body);
  auto reply = wire::Exchange(fd, wire::FrameType::kAuthHello, body,
                              wire::FrameType::kAuthChallenge, deadline);
  if (!reply.ok()) {
    return reply.status().WithPrefix(
        "authenticating with peer " + who +
        " (a Ferry build without cluster secrets closes the connection)");
  }
  FERRY_ASSIGN_OR_RETURN(wire::AuthChallenge challenge, wire::DecodeAuthChallenge(*reply));
  if (!challenge.status.ok()) {
    if (challenge.status.code() == StatusCode::kUnauthenticated) {
      return UnauthenticatedError("this engine has a cluster secret but peer " + who +
                                  " has none (FERRY_SECRET_FILE)");
    }
    return challenge.status.WithPrefix("peer " + who + " refused to authenticate");
  }
  if (challenge.mode != wire::kAuthModeHmacSha256) {
    return DataLossError("peer " + who + " answered with authentication mode " +
                         std::to_string(challenge.mode) + ", not the one asked for");
  }
  FERRY_ASSIGN_OR_RETURN(AuthMac expected,
                         cred.secret->Mac(kServerLabel, nonce_c, challenge.nonce));
  wire::AuthProof proof;
  FERRY_ASSIGN_OR_RETURN(proof.mac, cred.secret->Mac(kClientLabel, challenge.nonce, nonce_c));
  std::string proof_body;
  wire::EncodeAuthProof(proof, &proof_body);
  wire::FrameHeader h;
  h.type = wire::FrameType::kAuthProof;
  h.seq = 1;
  std::string frame = wire::BuildFrame(h, proof_body);
  if (!AuthMacEqual(expected, challenge.mac)) {
    // Sent all the same, so the peer finds the mismatch too and says so in
    // its log; a proof over a nonce the peer chose opens nothing elsewhere.
    SendAll(fd, frame.data(), frame.size(), deadline).IgnoreError();
    return UnauthenticatedError("peer " + who +
                                " does not share this engine's cluster secret (FERRY_SECRET_FILE)");
  }
  return frame;
}

Status ExplainRefusal(const Status& remote, const Credentials& cred, std::string_view peer) {
  if (remote.code() == StatusCode::kUnauthenticated && cred.secret == nullptr) {
    return UnauthenticatedError(
        "peer " + std::string(peer) +
        " requires a cluster secret (FERRY_SECRET_FILE) and this engine has none");
  }
  return remote;
}

StatusOr<std::string> AuthenticatedExchange(int fd, const Credentials& cred, std::string_view peer,
                                            wire::FrameType type, std::string_view body,
                                            wire::FrameType reply_type, Clock::time_point deadline,
                                            uint16_t flags) {
  FERRY_ASSIGN_OR_RETURN(std::string proof, Authenticate(fd, cred, peer, deadline));
  return wire::Exchange(fd, type, body, reply_type, deadline, proof, flags);
}

// ---- server ---------------------------------------------------------------

const AuthServer& AuthServer::None() {
  static const AuthServer* const none = new AuthServer(nullptr, "");
  return *none;
}

void AuthServer::LogOnce(const std::string& key, const std::string& message) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (logged_.count(key) != 0) return;
    if (logged_.size() >= kMaxLogged) {
      if (logged_full_) return;
      logged_full_ = true;
      FERRY_LOG(kWarning, "engine " << self_peer_id_ << " refused " << kMaxLogged
                                    << " peers; refusals of further peers are not logged");
      return;
    }
    logged_.insert(key);
  }
  FERRY_LOG(kWarning, message);
}

Status AuthServer::Refuse(Connection& c, const wire::FrameHeader& h, const std::string& claimed,
                          const Status& why, const std::string& log) const {
  const std::string from = c.remote().empty() ? c.peer_name() : c.remote();
  const std::string key = claimed.empty() ? HostOf(from) : claimed;
  const std::string who =
      claimed.empty() ? "a peer at " + from : "peer " + claimed + " (at " + from + ")";
  LogOnce(key,
          "engine " + self_peer_id_ + " refused " + who + ": " + log + " (logged once per peer)");
  // The answer the frame's sender waits for, so it can say why.
  std::string reply;
  switch (h.type) {
    case wire::FrameType::kHandshakeRequest:
      wire::EncodeHandshakeResponse(why, wire::PeerDescriptor{}, &reply,
                                    wire::kDescriptorFormatMin);
      c.QueueReply(wire::FrameType::kHandshakeResponse, h.seq, std::move(reply));
      break;
    case wire::FrameType::kStreamHello:
    case wire::FrameType::kCopyHello:
      wire::EncodeStatus(why, &reply);
      c.QueueReply(wire::FrameType::kStreamHelloAck, h.seq, std::move(reply));
      break;
    case wire::FrameType::kAuthHello: {
      wire::AuthChallenge refusal;
      refusal.status = why;
      wire::EncodeAuthChallenge(refusal, &reply);
      c.QueueReply(wire::FrameType::kAuthChallenge, h.seq, std::move(reply));
      break;
    }
    default:
      break;  // a proof has no answer
  }
  c.Refuse(why);
  return why;
}

StatusOr<bool> AuthServer::OnFirstFrame(AuthSession& s, Connection& c, const wire::FrameHeader& h,
                                        std::string_view body) const {
  using State = AuthSession::State;
  switch (h.type) {
    case wire::FrameType::kAuthHello: {
      FERRY_ASSIGN_OR_RETURN(wire::AuthHello hello, wire::DecodeAuthHello(body));
      if (s.state != State::kNone)
        return DataLossError("second authentication hello from " + c.remote());
      s.claimed_peer = Printable(hello.peer_id);
      if (secret_ == nullptr) {
        return Refuse(c, h, s.claimed_peer,
                      UnauthenticatedError("engine " + self_peer_id_ +
                                           " has no cluster secret (FERRY_SECRET_FILE)"),
                      "it has a cluster secret and this engine has none (FERRY_SECRET_FILE)");
      }
      if (hello.mode != wire::kAuthModeHmacSha256) {
        return Refuse(
            c, h, s.claimed_peer,
            UnauthenticatedError("engine " + self_peer_id_ + " does not know authentication mode " +
                                 std::to_string(hello.mode)),
            "it asked for authentication mode " + std::to_string(hello.mode) +
                ", which this build does not know");
      }
      FERRY_ASSIGN_OR_RETURN(s.nonce_s, NewAuthNonce());
      s.nonce_c = hello.nonce;
      wire::AuthChallenge challenge;
      challenge.mode = hello.mode;
      challenge.nonce = s.nonce_s;
      FERRY_ASSIGN_OR_RETURN(challenge.mac, secret_->Mac(kServerLabel, s.nonce_c, s.nonce_s));
      std::string out;
      wire::EncodeAuthChallenge(challenge, &out);
      c.QueueReply(wire::FrameType::kAuthChallenge, h.seq, std::move(out));
      s.state = State::kChallenged;
      return false;
    }
    case wire::FrameType::kAuthProof: {
      const Status refused =
          UnauthenticatedError("engine " + self_peer_id_ + " refused the authentication proof");
      if (secret_ == nullptr || s.state != State::kChallenged) {
        return Refuse(
            c, h, s.claimed_peer, refused,
            "it sent an authentication proof without a challenge on this connection (a replayed "
            "proof?)");
      }
      auto proof = wire::DecodeAuthProof(body);
      if (!proof.ok())
        return Refuse(c, h, s.claimed_peer, proof.status(), proof.status().message());
      FERRY_ASSIGN_OR_RETURN(AuthMac expected, secret_->Mac(kClientLabel, s.nonce_s, s.nonce_c));
      if (!AuthMacEqual(expected, proof->mac)) {
        return Refuse(c, h, s.claimed_peer, refused,
                      "it does not share this engine's cluster secret (its proof does not match)");
      }
      s.state = State::kAuthenticated;
      return false;
    }
    default:
      break;
  }
  if (secret_ == nullptr || s.state == State::kAuthenticated) return true;
  // Who it says it is, for the log.
  std::string claimed = s.claimed_peer;
  if (claimed.empty() && h.type == wire::FrameType::kStreamHello) {
    auto hello = wire::DecodeStreamHello(body);
    if (hello.ok()) claimed = Printable(hello->initiator_peer_id);
  } else if (claimed.empty() && h.type == wire::FrameType::kHandshakeRequest) {
    auto desc = wire::DecodeDescriptor(body);
    if (desc.ok()) claimed = Printable(desc->peer_id);
  }
  return Refuse(
      c, h, claimed,
      UnauthenticatedError("engine " + self_peer_id_ +
                           " requires a cluster secret (FERRY_SECRET_FILE) and this connection "
                           "did not authenticate"),
      s.state == State::kChallenged ? "it sent its first frame without an authentication proof"
                                    : "it sent no authentication: it has no cluster secret "
                                      "(FERRY_SECRET_FILE), or is a Ferry "
                                      "build without them, and this engine requires one");
}

}  // namespace ferry::internal::stream
