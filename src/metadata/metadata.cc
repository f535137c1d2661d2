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
  return UnimplementedError("metadata '" + std::string(url) +
                            "' is not supported by this build yet; use \"P2PHANDSHAKE\" (no server)");
}

}  // namespace ferry::internal
