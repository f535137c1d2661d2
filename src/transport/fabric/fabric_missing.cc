// Built instead of the fabric transport where libfabric (libfabric-dev) was
// not found: the transport reports itself unavailable with the reason.
#include "ferry/transports.h"
#include "transport/fabric/fabric_transport.h"

namespace ferry::internal {

std::string FabricAvailability() {
  return "this build has no libfabric (install libfabric-dev and rebuild)";
}

bool FabricEnabled(const EngineOptions& options) { return !options.fabric_provider.empty(); }

StatusOr<std::unique_ptr<Transport>> MakeFabricTransport(const TransportContext&) {
  return UnimplementedError("the fabric transport: " + FabricAvailability());
}

}  // namespace ferry::internal

namespace ferry {

FabricInfo DescribeFabric(const std::string&, const std::string&) {
  FabricInfo f;
  f.error = internal::FabricAvailability();
  f.why_none = f.error;
  return f;
}

}  // namespace ferry
