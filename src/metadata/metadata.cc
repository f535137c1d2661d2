// Picks the store for a connection string. One table says which backends
// exist, how their strings look and whether this build has them.
#include "metadata/metadata.h"

#include <algorithm>

#include "ferry/metadata.h"
#include "metadata/entries.h"

namespace ferry::internal {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// A bare "HOST:PORT[,HOST:PORT...]" (Mooncake's way of naming etcd): no
// scheme, and every item ends in ":digits".
bool IsBareEndpointList(std::string_view url) {
  if (url.empty() || url.find("://") != std::string_view::npos) return false;
  size_t start = 0;
  while (start <= url.size()) {
    size_t comma = url.find(',', start);
    if (comma == std::string_view::npos) comma = url.size();
    const std::string_view item = url.substr(start, comma - start);
    const size_t colon = item.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == item.size()) return false;
    if (!std::all_of(item.begin() + static_cast<std::ptrdiff_t>(colon) + 1, item.end(),
                     [](char c) { return c >= '0' && c <= '9'; })) {
      return false;
    }
    start = comma + 1;
  }
  return true;
}

struct Backend {
  const char* name;
  const char* form;
  const char* description;
  bool built;
  const char* missing;
};

constexpr Backend kBackends[] = {
    {"p2p", "P2PHANDSHAKE", "no server: peers are named HOST:PORT and asked for their descriptor", true, ""},
    {"memory", "memory://CLUSTER", "engines of one process share a store (tests, single-process use)", true, ""},
    {"http", "http://HOST:PORT[/PATH]", "a REST key-value service such as `ferry metadata-server`",
#ifdef FERRY_HAVE_HTTP_METADATA
     true, ""},
#else
     false, "libcpp-httplib-dev"},
#endif
    {"etcd", "etcd://HOST:PORT[,HOST:PORT...] or HOST:PORT", "etcd v3 (JSON gateway): leases, watches, fail-over",
#ifdef FERRY_HAVE_ETCD_METADATA
     true, ""},
#else
     false, "libcpp-httplib-dev and nlohmann-json3-dev"},
#endif
    {"redis", "redis://[USER:PASSWORD@]HOST:PORT[/DB]", "Redis: keys with a TTL, change polling",
#ifdef FERRY_HAVE_REDIS_METADATA
     true, ""},
#else
     false, "libhiredis-dev"},
#endif
};

const Backend* Find(std::string_view name) {
  for (const Backend& b : kBackends) {
    if (name == b.name) return &b;
  }
  return nullptr;
}

}  // namespace

std::string_view MetadataBackendName(std::string_view url) {
  if (url.empty() || url == "P2PHANDSHAKE") return "p2p";
  if (StartsWith(url, "memory://")) return "memory";
  if (StartsWith(url, "http://") || StartsWith(url, "https://")) return "http";
  if (StartsWith(url, "etcd://") || IsBareEndpointList(url)) return "etcd";
  if (StartsWith(url, "redis://") || StartsWith(url, "rediss://")) return "redis";
  return "";
}

StatusOr<std::unique_ptr<MetadataStore>> MakeMetadataStore(std::string_view url, const MetadataContext& ctx) {
  const std::string text = RedactMetadataUrl(std::string(url));
  const std::string_view name = MetadataBackendName(url);
  if (name.empty()) {
    std::string forms;
    for (const Backend& b : kBackends) forms += std::string(forms.empty() ? "" : ", ") + b.form;
    return InvalidArgumentError("metadata '" + text + "': unknown kind of connection string (one of: " + forms + ")");
  }
  const Backend* backend = Find(name);
  if (!backend->built) {
    return UnimplementedError("metadata '" + text + "': this build has no " + backend->name +
                              " metadata client (install " + backend->missing + " and rebuild)");
  }
  if (name == "p2p") return MakeP2PStore(ctx);
  FERRY_RETURN_IF_ERROR(CheckClusterName(ctx.cluster));
  if (name == "memory") {
    const std::string_view cluster = url.substr(std::string_view("memory://").size());
    if (cluster.empty()) return InvalidArgumentError("metadata '" + text + "' names no cluster (memory://NAME)");
    return MakeMemoryStore(cluster);
  }
#ifdef FERRY_HAVE_HTTP_METADATA
  if (name == "http") return MakeHttpStore(url, ctx);
#endif
#ifdef FERRY_HAVE_ETCD_METADATA
  if (name == "etcd") return MakeEtcdStore(url, ctx);
#endif
#ifdef FERRY_HAVE_REDIS_METADATA
  if (name == "redis") return MakeRedisStore(url, ctx);
#endif
  return UnimplementedError("metadata '" + text + "': the " + backend->name + " backend is not linked in");
}

}  // namespace ferry::internal

namespace ferry {

std::vector<MetadataBackendInfo> ListMetadataBackends() {
  std::vector<MetadataBackendInfo> out;
  for (const auto& b : internal::kBackends) out.push_back({b.name, b.form, b.description, b.built, b.missing});
  return out;
}

std::string MetadataBackendOf(const std::string& url) { return std::string(internal::MetadataBackendName(url)); }

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
