// Built instead of etcd_store.cc where cpp-httplib (libcpp-httplib-dev) or
// nlohmann-json (nlohmann-json3-dev) was not found: etcd connection strings
// are kUnimplemented, saying what to install.
#include "metadata/registry.h"

namespace ferry::internal {

std::string_view EtcdStoreLacks() { return "libcpp-httplib-dev and nlohmann-json3-dev"; }

StatusOr<std::unique_ptr<MetadataStore>> MakeEtcdStore(std::string_view url,
                                                       const MetadataContext&) {
  return NotBuiltError(url, EtcdBackend());
}

}  // namespace ferry::internal
