// Peer authentication on every connection an engine accepts or opens (the rpc
// port: handshakes and tcp streams; the same-host socket: shm streams). With
// a cluster secret the initiator opens each connection with a mutual
// challenge-response before its usual first frame (docs/wire-format.md,
// "Authentication"):
//   AuthHello{mode, nonce_c, peer id} ──▶
//                                      ◀── AuthChallenge{status, nonce_s, mac_s}
//   AuthProof{mac_c}, first frame      ──▶  (one send)
// with mac_s = HMAC(K, "ferry-auth-v1 server" | nonce_c | nonce_s) and
// mac_c = HMAC(K, "ferry-auth-v1 client" | nonce_s | nonce_c). Every accepted
// connection draws its own nonce_s, so a proof recorded on one connection
// never opens another. Without a secret nothing is sent (today's protocol).
// Both sides of the conversation are here: the client's for the blocking
// sockets of handshakes and hellos, the server's for the first frames of an
// accepted Connection (before any opener sees them).
#pragma once

#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "common/auth.h"
#include "common/net.h"
#include "ferry/status.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

class Connection;

// ---- client ---------------------------------------------------------------

// What an initiator proves itself with.
struct Credentials {
  std::shared_ptr<const ClusterSecret> secret;  // null: this engine has none
  std::string self_peer_id;                     // claimed in AuthHello, for the peer's logs
};

// With a secret: AuthHello → AuthChallenge on the blocking socket `fd`,
// checks that `peer` knows the secret, and returns the AuthProof frame to
// send in front of the connection's first frame (wire::Exchange's prefix).
// Without one: "" and nothing is sent. kUnauthenticated, saying which side
// lacks the secret, when the peer has none or another one.
StatusOr<std::string> Authenticate(int fd, const Credentials& cred, std::string_view peer,
                                   Clock::time_point deadline);

// The status a peer answered a first frame with, told from this side: a
// refusal for want of authentication (kUnauthenticated) says that `peer`
// requires a secret and this engine has none.
Status ExplainRefusal(const Status& remote, const Credentials& cred, std::string_view peer);

// One blocking conversation: Authenticate, then the first frame (`type`,
// `body`, header `flags`) and its reply of `reply_type`, whose body is
// returned.
StatusOr<std::string> AuthenticatedExchange(int fd, const Credentials& cred, std::string_view peer,
                                            wire::FrameType type, std::string_view body,
                                            wire::FrameType reply_type, Clock::time_point deadline,
                                            uint16_t flags = 0);

// ---- server ---------------------------------------------------------------

// Where one accepted connection is in the conversation (Connection keeps one).
struct AuthSession {
  enum class State { kNone, kChallenged, kAuthenticated };
  State state = State::kNone;
  AuthNonce nonce_c{};
  AuthNonce nonce_s{};
  std::string claimed_peer;  // from AuthHello, for logs
};

// The accepting side of one engine (shared by its listeners). Thread-safe.
class AuthServer {
 public:
  AuthServer(std::shared_ptr<const ClusterSecret> secret, std::string self_peer_id)
      : secret_(std::move(secret)), self_peer_id_(std::move(self_peer_id)) {}
  // A server without a secret and without a name (listeners of unit tests).
  static const AuthServer& None();

  bool has_secret() const { return secret_ != nullptr; }

  // Every first frame of an accepted connection goes through here before its
  // opener. Returns true when the opener may handle the frame (authenticated,
  // or no secret and not an authentication frame); false when the frame was
  // part of the conversation and has been answered; an error when the
  // connection has been refused (answered if the frame has an answer, and
  // closed: Connection::Refuse).
  StatusOr<bool> OnFirstFrame(AuthSession& s, Connection& c, const wire::FrameHeader& h,
                              std::string_view body) const;

 private:
  Status Refuse(Connection& c, const wire::FrameHeader& h, const std::string& key,
                const Status& why, const std::string& log) const;
  // Logs `message` unless a refusal of `key` (a peer id or an address) was
  // logged before: once per peer, not per connection.
  void LogOnce(const std::string& key, const std::string& message) const;

  const std::shared_ptr<const ClusterSecret> secret_;
  const std::string self_peer_id_;
  mutable std::mutex mu_;
  mutable std::set<std::string> logged_;  // guarded by mu_; bounded (kMaxLogged)
  mutable bool logged_full_ = false;      // guarded by mu_
};

}  // namespace ferry::internal::stream
