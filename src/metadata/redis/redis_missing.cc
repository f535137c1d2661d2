// Built instead of redis_store.cc where hiredis (libhiredis-dev) was not
// found: redis:// connection strings are kUnimplemented, saying what to
// install.
#include "metadata/registry.h"

namespace ferry::internal {

std::string_view RedisStoreLacks() { return "libhiredis-dev"; }

StatusOr<std::unique_ptr<MetadataStore>> MakeRedisStore(std::string_view url,
                                                        const MetadataContext&) {
  return NotBuiltError(url, RedisBackend());
}

}  // namespace ferry::internal
