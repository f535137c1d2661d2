// libfabric discovery for the fabric transport: which providers and domains
// this machine offers, which one an engine uses, and libfabric's errors in
// words and as status codes. The transport's only file that calls
// fi_getinfo.
#pragma once

#include <rdma/fabric.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "ferry/transports.h"

namespace ferry::internal::fabric {

// The libfabric API version Ferry asks for (1.17, Debian 12's).
inline constexpr uint32_t kApiVersion = FI_VERSION(1, 17);

// What every endpoint of the transport needs: reliable datagrams, one-sided
// reads and writes both ways, and messages (notifications).
inline constexpr uint64_t kCaps =
    FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_MSG | FI_SEND | FI_RECV;
// The memory-registration modes Ferry honours (docs in fabric_domain.h).
inline constexpr int kMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

struct InfoDeleter {
  void operator()(fi_info* i) const { fi_freeinfo(i); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

// fi_strerror of a libfabric return code (negative or positive), with the
// number: "Connection refused (-111)".
std::string ErrorText(int ret);
// Whether a libfabric error (positive FI_E* code) means the peer is gone or
// unreachable.
bool IsConnectionError(int err);
// The status code an operation failing with `err` (positive) reports.
StatusCode CodeOf(int err);

// Providers that are not hardware: emulations over sockets and same-host
// memory. A hardware provider layered under a utility (verbs;ofi_rxm) is.
bool IsHardwareProvider(std::string_view provider);

// Why Ferry refuses `provider` (as libfabric names it), or "" if it does not:
// providers measured not to enforce what Ferry relies on (keys and bounds,
// completions from dead peers), or to crash, on these versions
// (tools/fabric_probe/README.md).
std::string ProviderRefusal(std::string_view provider);

// fi_getinfo for Ferry's endpoints at `node` ("" = any), optionally of one
// provider (exact name as libfabric lists it). kNotFound if none.
StatusOr<InfoPtr> GetInfo(const std::string& node, const std::string& provider);

// Lists what GetInfo offers: provider, fabric, domain.
StatusOr<std::vector<FabricDomainInfo>> ListDomains(const std::string& node);

// The provider name an engine uses for `wanted` (fabric_provider): "" = the
// first hardware provider listed; else the provider named `wanted`, or the
// one whose core provider it is ("tcp" = "tcp;ofi_rxm", since tcp's RMA
// over reliable datagrams is rxm's). kNotFound, naming what exists, if none.
StatusOr<std::string> ResolveProvider(const std::vector<FabricDomainInfo>& domains,
                                      std::string_view wanted);

}  // namespace ferry::internal::fabric
