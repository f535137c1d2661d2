// The cluster secret (EngineOptions::secret_file) and the cryptography of
// peer authentication: HMAC-SHA256 over fresh nonces (OpenSSL 3, EVP_MAC),
// random nonces (RAND_bytes), constant-time comparison (CRYPTO_memcmp).
// The conversation that uses them is in src/transport/stream/auth.h; the
// frames in docs/wire-format.md ("Authentication").
// The key never leaves this object: it is not printed, logged or sent.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal {

inline constexpr size_t kAuthNonceSize = 32;
inline constexpr size_t kAuthMacSize = 32;
// Fewer secret bytes than this are refused (a 128-bit key at the least).
inline constexpr size_t kMinSecretBytes = 16;
using AuthNonce = std::array<uint8_t, kAuthNonceSize>;
using AuthMac = std::array<uint8_t, kAuthMacSize>;

class ClusterSecret {
 public:
  // Reads the secret from `path`: its bytes, less trailing newlines
  // ("\n", "\r\n"). kInvalidArgument naming the path if it cannot be read,
  // is empty or holds fewer than kMinSecretBytes bytes.
  static StatusOr<std::shared_ptr<const ClusterSecret>> Load(const std::string& path);
  // A secret from bytes (tests); `origin` names it in messages.
  static StatusOr<std::shared_ptr<const ClusterSecret>> FromBytes(std::string key,
                                                                  std::string origin);

  ClusterSecret(std::string key, std::string origin)
      : key_(std::move(key)), origin_(std::move(origin)) {}
  ~ClusterSecret();
  ClusterSecret(const ClusterSecret&) = delete;
  ClusterSecret& operator=(const ClusterSecret&) = delete;

  // HMAC-SHA256(key, label | a | b).
  StatusOr<AuthMac> Mac(std::string_view label, const AuthNonce& a, const AuthNonce& b) const;
  // Where the secret came from (the file's path), for messages.
  const std::string& origin() const { return origin_; }

 private:
  std::string key_;
  std::string origin_;
};

// A nonce from OpenSSL's CSPRNG.
StatusOr<AuthNonce> NewAuthNonce();
// Constant-time equality.
bool AuthMacEqual(const AuthMac& a, const AuthMac& b);

}  // namespace ferry::internal
