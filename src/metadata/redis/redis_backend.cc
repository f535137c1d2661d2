// The redis backend's entry in the metadata table (registry.h), in every
// build: redis_store.cc supplies RedisStoreLacks and MakeRedisStore, or
// redis_missing.cc where hiredis was not found.
#include "metadata/registry.h"

namespace ferry::internal {
namespace {

// rediss:// too, so that MakeRedisStore can say TLS is not supported.
bool TakesRedisUrl(std::string_view url) {
  return HasScheme(url, "redis://") || HasScheme(url, "rediss://");
}

}  // namespace

MetadataBackend RedisBackend() {
  return {"redis",
          "redis://[USER:PASSWORD@]HOST:PORT[/DB]",
          "Redis: keys with a TTL, change polling",
          TakesRedisUrl,
          /*keyed=*/true,
          RedisStoreLacks,
          MakeRedisStore};
}

}  // namespace ferry::internal
