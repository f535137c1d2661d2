// Built instead of http_store.cc where cpp-httplib (libcpp-httplib-dev) was
// not found: http:// connection strings are kUnimplemented, saying what to
// install.
#include "metadata/registry.h"

namespace ferry::internal {

std::string_view HttpStoreLacks() { return "libcpp-httplib-dev"; }

StatusOr<std::unique_ptr<MetadataStore>> MakeHttpStore(std::string_view url,
                                                       const MetadataContext&) {
  return NotBuiltError(url, HttpBackend());
}

}  // namespace ferry::internal
