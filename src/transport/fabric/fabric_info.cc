#include "transport/fabric/fabric_info.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cstring>

namespace ferry::internal::fabric {

std::string ErrorText(int ret) {
  const int e = ret < 0 ? -ret : ret;
  return std::string(fi_strerror(e)) + " (" + std::to_string(-e) + ")";
}

bool IsConnectionError(int err) {
  switch (err) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ETIMEDOUT:
    case FI_EIO:
    case FI_EADDRNOTAVAIL:
      return true;
    default:
      return false;
  }
}

StatusCode CodeOf(int err) {
  if (err == FI_ECANCELED) return StatusCode::kCancelled;
  if (IsConnectionError(err)) return StatusCode::kUnavailable;
  switch (err) {
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
    case FI_EINVAL:
    case FI_EFAULT:
    case FI_ETRUNC:
    case FI_EMSGSIZE:
    case FI_ENOENT:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kUnavailable;
  }
}

bool IsHardwareProvider(std::string_view provider) {
  // The core provider is the first of "core;utility".
  const std::string_view core = provider.substr(0, provider.find(';'));
  static constexpr std::string_view kEmulated[] = {
      "tcp", "udp",     "sockets", "shm",   "sm2",        "net",      "rxm",
      "rxd", "ofi_rxm", "ofi_rxd", "mrail", "hook_debug", "hook_noop"};
  return std::find(std::begin(kEmulated), std::end(kEmulated), core) == std::end(kEmulated) &&
         !core.starts_with("ofi_");
}

std::string ProviderRefusal(std::string_view provider) {
  const std::string_view core = provider.substr(0, provider.find(';'));
  if (core == "shm" && fi_version() < FI_VERSION(1, 18)) {
    return "libfabric " + std::to_string(FI_MAJOR(fi_version())) + "." +
           std::to_string(FI_MINOR(fi_version())) +
           "'s shm provider is refused: measured here (tools/fabric_probe/README.md), it checks "
           "neither "
           "keys nor bounds (a write out of range lands outside the region, a read out of range "
           "returns the "
           "bytes outside it), gives no completion at all for delivery-complete operations to a "
           "killed peer, "
           "has no completion-queue wait object (an idle engine would poll), and crashed the "
           "initiator "
           "(SIGSEGV in fi_writemsg) writing to a peer endpoint that had closed; on one host "
           "Ferry's own "
           "shm transport does this job";
  }
  return "";
}

StatusOr<InfoPtr> GetInfo(const std::string& node, const std::string& provider) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return ResourceExhaustedError("fi_allocinfo failed");
  hints->caps = kCaps;
  hints->ep_attr->type = FI_EP_RDM;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = kMrModes;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  if (!provider.empty()) hints->fabric_attr->prov_name = strdup(provider.c_str());
  fi_info* out = nullptr;
  const int ret = fi_getinfo(kApiVersion, node.empty() ? nullptr : node.c_str(), nullptr,
                             node.empty() ? 0 : FI_SOURCE, hints.get(), &out);
  if (ret == -FI_ENODATA || (ret == 0 && out == nullptr)) {
    return NotFoundError("libfabric offers no reliable-datagram endpoint with RMA" +
                         (provider.empty() ? std::string() : " of provider " + provider) +
                         (node.empty() ? std::string() : " at " + node));
  }
  if (ret != 0) return UnavailableError("fi_getinfo: " + ErrorText(ret));
  return InfoPtr(out);
}

StatusOr<std::vector<FabricDomainInfo>> ListDomains(const std::string& node) {
  auto info = GetInfo(node, "");
  if (!info.ok()) {
    if (info.status().code() == StatusCode::kNotFound) return std::vector<FabricDomainInfo>{};
    return info.status();
  }
  std::vector<FabricDomainInfo> out;
  for (const fi_info* i = info->get(); i != nullptr; i = i->next) {
    FabricDomainInfo d;
    d.provider = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "";
    d.fabric = i->fabric_attr->name ? i->fabric_attr->name : "";
    d.domain = i->domain_attr->name ? i->domain_attr->name : "";
    d.hardware = IsHardwareProvider(d.provider);
    const bool seen = std::any_of(out.begin(), out.end(), [&](const FabricDomainInfo& o) {
      return o.provider == d.provider && o.fabric == d.fabric && o.domain == d.domain;
    });
    if (!seen) out.push_back(std::move(d));
  }
  return out;
}

StatusOr<std::string> ResolveProvider(const std::vector<FabricDomainInfo>& domains,
                                      std::string_view wanted) {
  std::string names;
  for (const auto& d : domains) {
    if (names.find(d.provider) == std::string::npos)
      names += (names.empty() ? "" : ", ") + d.provider;
  }
  if (names.empty()) names = "none";
  if (wanted.empty()) {
    for (const auto& d : domains) {
      if (d.hardware && ProviderRefusal(d.provider).empty()) return d.provider;
    }
    return NotFoundError("no hardware fabric provider found (providers here: " + names +
                         "); set fabric_provider (FERRY_FABRIC_PROVIDER) to use one of them");
  }
  auto checked = [](const std::string& p) -> StatusOr<std::string> {
    const std::string refusal = ProviderRefusal(p);
    if (!refusal.empty()) return FailedPreconditionError(refusal);
    return p;
  };
  for (const auto& d : domains) {
    if (d.provider == wanted) return checked(d.provider);
  }
  for (const auto& d : domains) {
    if (d.provider.starts_with(std::string(wanted) + ";")) return checked(d.provider);
  }
  return NotFoundError("fabric provider '" + std::string(wanted) +
                       "' not found (providers here: " + names + ")");
}

}  // namespace ferry::internal::fabric
