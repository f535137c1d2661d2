#include "common/auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/fd_limit.h"
#include "common/net.h"

namespace ferry::internal {
namespace {

Status BadFile(const std::string& path, const std::string& why) {
  return InvalidArgumentError("cluster secret file '" + path +
                              "' (secret_file, FERRY_SECRET_FILE) " + why);
}

}  // namespace

StatusOr<std::shared_ptr<const ClusterSecret>> ClusterSecret::Load(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    const int err = errno;
    if (err == EMFILE || err == ENFILE) {
      return DescriptorError(StatusCode::kResourceExhausted, "secret_file '" + path + "'", err);
    }
    return BadFile(path, "cannot be read: " + ErrnoString(err));
  }
  std::string key;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
    key.append(buf, n);
    if (key.size() > (1u << 20)) {
      std::fclose(f);
      return BadFile(path, "is larger than 1 MiB (not a secret?)");
    }
  }
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  OPENSSL_cleanse(buf, sizeof(buf));
  if (failed) return BadFile(path, "cannot be read: " + ErrnoString(err));
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
  return FromBytes(std::move(key), path);
}

StatusOr<std::shared_ptr<const ClusterSecret>> ClusterSecret::FromBytes(std::string key,
                                                                        std::string origin) {
  if (key.empty()) return BadFile(origin, "is empty");
  if (key.size() < kMinSecretBytes) {
    const size_t size = key.size();
    OPENSSL_cleanse(key.data(), key.size());
    return BadFile(origin, "holds " + std::to_string(size) +
                               " bytes; a cluster secret needs at least " +
                               std::to_string(kMinSecretBytes));
  }
  return std::shared_ptr<const ClusterSecret>(
      std::make_shared<ClusterSecret>(std::move(key), std::move(origin)));
}

ClusterSecret::~ClusterSecret() { OPENSSL_cleanse(key_.data(), key_.size()); }

StatusOr<AuthMac> ClusterSecret::Mac(std::string_view label, const AuthNonce& a,
                                     const AuthNonce& b) const {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) return InternalError("OpenSSL has no HMAC");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);  // the context holds its own reference
  if (ctx == nullptr) return InternalError("OpenSSL: cannot create an HMAC context");
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  AuthMac out{};
  size_t out_len = 0;
  const bool ok =
      EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key_.data()), key_.size(), params) ==
          1 &&
      EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(label.data()), label.size()) ==
          1 &&
      EVP_MAC_update(ctx, a.data(), a.size()) == 1 &&
      EVP_MAC_update(ctx, b.data(), b.size()) == 1 &&
      EVP_MAC_final(ctx, out.data(), &out_len, out.size()) == 1 && out_len == out.size();
  EVP_MAC_CTX_free(ctx);
  if (!ok) return InternalError("OpenSSL: HMAC-SHA256 failed");
  return out;
}

StatusOr<AuthNonce> NewAuthNonce() {
  AuthNonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    return InternalError("OpenSSL: no random bytes for an authentication nonce");
  }
  return n;
}

bool AuthMacEqual(const AuthMac& a, const AuthMac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace ferry::internal
