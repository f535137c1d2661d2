#include "transport/fabric/fabric_domain.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <mutex>

#include "transport/fabric/fabric_info.h"

namespace ferry::internal::fabric {

Status MemoryDomain::Configure(const fi_info& info) {
  const int mode = info.domain_attr->mr_mode;
  mr_local_ = (mode & FI_MR_LOCAL) != 0;
  virt_addr_ = (mode & FI_MR_VIRT_ADDR) != 0;
  prov_key_ = (mode & FI_MR_PROV_KEY) != 0;
  mr_endpoint_ = (mode & FI_MR_ENDPOINT) != 0;
  if ((mode & ~kMrModes) != 0) {
    return FailedPreconditionError("provider " + cfg_.provider +
                                   " asks for memory-registration modes Ferry does not honour "
                                   "(mr_mode " +
                                   std::to_string(mode) + ")");
  }
  if (info.domain_attr->mr_key_size > 8) {
    return FailedPreconditionError("provider " + cfg_.provider + " uses " +
                                   std::to_string(info.domain_attr->mr_key_size) +
                                   "-byte memory keys (FI_MR_RAW); Ferry publishes 8-byte keys");
  }
  return OkStatus();
}

int MemoryDomain::BindToEndpoint(fid_mr* mr) const {
  if (!mr_endpoint_) return 0;
  int ret = fi_mr_bind(mr, &fids_.ep->fid, 0);
  if (ret == 0) ret = fi_mr_enable(mr);
  return ret;
}

StatusOr<uint64_t> MemoryDomain::Register(const Region& r) {
  uint64_t access = FI_READ | FI_WRITE;
  if (r.exported) access |= FI_REMOTE_READ | FI_REMOTE_WRITE;
  fid_mr* mr = nullptr;
  int ret = fi_mr_reg(fids_.domain, reinterpret_cast<void*>(r.addr), r.length, access, 0, NextKey(),
                      0, &mr, nullptr);
  if (ret != 0) {
    return UnavailableError("fi_mr_reg of " + FormatRange(r.addr, r.length) + ": " +
                            ErrorText(ret));
  }
  ret = BindToEndpoint(mr);
  if (ret != 0) {
    CloseFid(mr);
    return UnavailableError("binding " + FormatRange(r.addr, r.length) +
                            " to the endpoint: " + ErrorText(ret));
  }
  const uint64_t key = fi_mr_key(mr);
  if (key == FI_KEY_NOTAVAIL) {
    CloseFid(mr);
    return FailedPreconditionError("provider " + cfg_.provider + " gave no 8-byte key for " +
                                   FormatRange(r.addr, r.length));
  }
  std::unique_lock lock(mu_);
  mrs_[r.addr] = Mr{r.end(), mr, fi_mr_desc(mr)};
  return key;
}

void MemoryDomain::Unregister(const Region& r) {
  fid_mr* mr = nullptr;
  {
    std::unique_lock lock(mu_);
    auto it = mrs_.find(r.addr);
    if (it == mrs_.end()) return;
    mr = it->second.mr;
    mrs_.erase(it);
  }
  CloseFid(mr);
}

Status MemoryDomain::RegisterBuffer(MsgBuf& b, uint64_t access) {
  if (!mr_local_) return OkStatus();
  const int ret = fi_mr_reg(fids_.domain, b.data.data(), b.data.size(), access, 0, NextKey(), 0,
                            &b.mr, nullptr);
  if (ret != 0) return UnavailableError("registering a message buffer: " + ErrorText(ret));
  if (const int r = BindToEndpoint(b.mr); r != 0) {
    return UnavailableError("binding a message buffer to the endpoint: " + ErrorText(r));
  }
  b.desc = fi_mr_desc(b.mr);
  return OkStatus();
}

bool MemoryDomain::LocalDesc(const char* p, uint32_t len, void** desc) const {
  const uint64_t addr = reinterpret_cast<uintptr_t>(p);
  std::shared_lock lock(mu_);
  auto it = mrs_.upper_bound(addr);
  if (it == mrs_.begin()) return false;
  --it;
  if (addr + len > it->second.end) return false;
  *desc = it->second.desc;
  return true;
}

void MemoryDomain::CloseRegions() {
  std::unique_lock lock(mu_);
  for (auto& [addr, m] : mrs_) CloseFid(m.mr);
  mrs_.clear();
}

}  // namespace ferry::internal::fabric
