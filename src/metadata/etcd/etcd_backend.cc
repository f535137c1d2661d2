// The etcd backend's entry in the metadata table (registry.h), in every
// build: etcd_store.cc supplies EtcdStoreLacks and MakeEtcdStore, or
// etcd_missing.cc where cpp-httplib or nlohmann-json was not found.
#include <algorithm>

#include "metadata/registry.h"

namespace ferry::internal {
namespace {

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

bool TakesEtcdUrl(std::string_view url) {
  return HasScheme(url, "etcd://") || IsBareEndpointList(url);
}

}  // namespace

MetadataBackend EtcdBackend() {
  return {"etcd",
          "etcd://HOST:PORT[,HOST:PORT...] or HOST:PORT",
          "etcd v3 (JSON gateway): leases, watches, fail-over",
          TakesEtcdUrl,
          /*keyed=*/true,
          EtcdStoreLacks,
          MakeEtcdStore};
}

}  // namespace ferry::internal
