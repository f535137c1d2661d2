// The memory half of a fabric endpoint (UCX's md): the memory registered
// with its libfabric domain, honouring the provider's mr_mode:
// FI_MR_PROV_KEY (the provider's key, else Ferry numbers them),
// FI_MR_VIRT_ADDR (remote addresses are virtual, else offsets into the
// region), FI_MR_LOCAL (local buffers carry their descriptor),
// FI_MR_ENDPOINT (bound to the endpoint), FI_MR_ALLOCATED (memory is
// allocated: the engine's always is). The key goes into the region, so into
// the descriptor peers fetch.
//
// Threads and locks:
// - Configure: Endpoint::Open, before the domain is opened.
// - Register / Unregister: the engine's registering threads (any, several
//   at once). RegisterBuffer: whoever sends a message (a notifying caller,
//   the progress thread's acknowledgements) and Open (the receives).
// - LocalDesc: Posting, under its lock (FI_MR_LOCAL providers only).
// - CloseRegions: Endpoint::Shutdown, after the endpoint closed.
// mu_ (shared for lookups) guards the table of regions and is a leaf: no
// other lock is taken under it. fi_mr_reg runs outside it; CloseRegions
// closes the registrations under it.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <shared_mutex>
#include <string>

#include "base/memory_registry.h"
#include "ferry/status.h"
#include "transport/fabric/fabric_common.h"

namespace ferry::internal::fabric {

class MemoryDomain {
 public:
  // `fids`: the endpoint's objects (the domain to register with, the
  // endpoint FI_MR_ENDPOINT binds to), opened after Configure.
  MemoryDomain(const EndpointConfig& cfg, const Fids& fids) : cfg_(cfg), fids_(fids) {}
  MemoryDomain(const MemoryDomain&) = delete;
  MemoryDomain& operator=(const MemoryDomain&) = delete;

  // Takes the provider's mr_mode and key size; refuses what Ferry does not
  // honour.
  Status Configure(const fi_info& info);
  bool mr_local() const { return mr_local_; }
  bool virt_addr() const { return virt_addr_; }

  // Registers [region.addr, end) with the domain; returns the remote key.
  StatusOr<uint64_t> Register(const Region& region);
  void Unregister(const Region& region);
  // Registers a message buffer for `access` (FI_SEND, FI_RECV) where the
  // provider needs local descriptors (FI_MR_LOCAL); else nothing to do.
  Status RegisterBuffer(MsgBuf& b, uint64_t access);

  // The descriptor of the registered memory holding [p, p + len), or false
  // if none (FI_MR_LOCAL only).
  bool LocalDesc(const char* p, uint32_t len, void** desc) const;

  // Closes every region's registration (the endpoint is closed).
  void CloseRegions();

 private:
  // Ferry's key for a registration, or 0 where the provider picks it.
  uint64_t NextKey() { return prov_key_ ? 0 : next_key_.fetch_add(1); }
  // Binds `mr` to the endpoint (FI_MR_ENDPOINT) and enables it.
  int BindToEndpoint(fid_mr* mr) const;

  const EndpointConfig& cfg_;
  const Fids& fids_;
  bool mr_local_ = false, virt_addr_ = false, prov_key_ = false, mr_endpoint_ = false;
  std::atomic<uint64_t> next_key_{1};

  // Registered memory, by start address.
  struct Mr {
    uint64_t end = 0;
    fid_mr* mr = nullptr;
    void* desc = nullptr;
  };
  mutable std::shared_mutex mu_;
  std::map<uint64_t, Mr> mrs_;
};

}  // namespace ferry::internal::fabric
