// Picks the store for a connection string. One table says which backends
// exist, how their strings look and whether this build has them; each
// backend's folder supplies its entry (registry.h).
#include "metadata/metadata.h"

#include <array>

#include "ferry/metadata.h"
#include "metadata/entries.h"
#include "metadata/registry.h"

namespace ferry::internal {

std::span<const MetadataBackend> MetadataBackends() {
  static const std::array<MetadataBackend, 5> kTable = {
      P2PBackend(), MemoryBackend(), HttpBackend(), EtcdBackend(), RedisBackend(),
  };
  return kTable;
}

const MetadataBackend* FindMetadataBackend(std::string_view url) {
  for (const MetadataBackend& b : MetadataBackends()) {
    if (b.takes(url)) return &b;
  }
  return nullptr;
}

Status NotBuiltError(std::string_view url, const MetadataBackend& backend) {
  return UnimplementedError("metadata '" + RedactMetadataUrl(std::string(url)) +
                            "': this build has no " + std::string(backend.name) +
                            " metadata client (install " + std::string(backend.lacks()) +
                            " and rebuild)");
}

std::string_view MetadataBackendName(std::string_view url) {
  const MetadataBackend* backend = FindMetadataBackend(url);
  return backend == nullptr ? std::string_view() : backend->name;
}

StatusOr<std::unique_ptr<MetadataStore>> MakeMetadataStore(std::string_view url,
                                                           const MetadataContext& ctx) {
  const MetadataBackend* backend = FindMetadataBackend(url);
  if (backend == nullptr) {
    std::string forms;
    for (const MetadataBackend& b : MetadataBackends()) {
      forms += (forms.empty() ? "" : ", ") + std::string(b.form);
    }
    return InvalidArgumentError("metadata '" + RedactMetadataUrl(std::string(url)) +
                                "': unknown kind of connection string (one of: " + forms + ")");
  }
  if (!backend->lacks().empty()) return NotBuiltError(url, *backend);
  if (backend->keyed) FERRY_RETURN_IF_ERROR(CheckClusterName(ctx.cluster));
  return backend->make(url, ctx);
}

}  // namespace ferry::internal

namespace ferry {

std::vector<MetadataBackendInfo> ListMetadataBackends() {
  std::vector<MetadataBackendInfo> out;
  for (const internal::MetadataBackend& b : internal::MetadataBackends()) {
    const std::string_view lacks = b.lacks();
    out.push_back({std::string(b.name), std::string(b.form), std::string(b.description),
                   lacks.empty(), std::string(lacks)});
  }
  return out;
}

std::string MetadataBackendOf(const std::string& url) {
  return std::string(internal::MetadataBackendName(url));
}

std::string RedactMetadataUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t start = scheme + 3;
  const size_t end = url.find_first_of("/?#", start);
  const size_t at = url.rfind('@', end == std::string::npos ? std::string::npos : end);
  if (at == std::string::npos || at < start) return url;
  const size_t colon = url.find(':', start);
  if (colon == std::string::npos || colon > at) return url;  // a user, no password
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

}  // namespace ferry
