#include "metadata/metadata.h"

namespace ferry::internal {

StatusOr<std::unique_ptr<MetadataStore>> MakeMetadataStore(std::string_view url, const MetadataContext& ctx) {
  if (url.empty() || url == "P2PHANDSHAKE") return MakeP2PStore(ctx);
  constexpr std::string_view kMemory = "memory://";
  if (url.substr(0, kMemory.size()) == kMemory) {
    const std::string_view cluster = url.substr(kMemory.size());
    if (cluster.empty()) {
      return InvalidArgumentError("metadata '" + std::string(url) + "' names no cluster (memory://NAME)");
    }
    return MakeMemoryStore(cluster);
  }
  if (url.substr(0, 7) == "http://" || url.substr(0, 8) == "https://") {
#ifdef FERRY_HAVE_HTTP_METADATA
    return MakeHttpStore(url);
#else
    return UnimplementedError("metadata '" + std::string(url) +
                              "': this build has no HTTP metadata client (install libcpp-httplib-dev)");
#endif
  }
  return UnimplementedError("metadata '" + std::string(url) +
                            "' is not supported by this build yet; use \"P2PHANDSHAKE\" (no server)");
}

}  // namespace ferry::internal
