// The http backend's entry in the metadata table (registry.h), in every
// build: http_store.cc supplies HttpStoreLacks and MakeHttpStore, or
// http_missing.cc where cpp-httplib was not found.
#include "metadata/registry.h"

namespace ferry::internal {
namespace {

// https:// too, so that MakeHttpStore can say it is not supported.
bool TakesHttpUrl(std::string_view url) {
  return HasScheme(url, "http://") || HasScheme(url, "https://");
}

}  // namespace

MetadataBackend HttpBackend() {
  return {"http",
          "http://HOST:PORT[/PATH]",
          "a REST key-value service such as `ferry metadata-server`",
          TakesHttpUrl,
          /*keyed=*/true,
          HttpStoreLacks,
          MakeHttpStore};
}

}  // namespace ferry::internal
