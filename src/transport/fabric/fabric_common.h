// What the parts of one fabric endpoint share (fabric_endpoint.h lists the
// parts): the endpoint's configuration, its libfabric objects, and the
// context every operation it posts carries.
//
// Threads: Endpoint::Open fills an EndpointConfig and the Fids before any
// other thread runs; Endpoint::Shutdown closes the Fids once the progress
// thread has stopped. In between both are read by every thread without a
// lock.
#pragma once

#include <rdma/fabric.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal {
class EngineTarget;  // core/target.h
}  // namespace ferry::internal

namespace ferry::internal::fabric {

struct EndpointConfig {
  std::string provider;              // as libfabric names it ("tcp;ofi_rxm")
  std::string node;                  // address the endpoint binds to; "" = the provider's choice
  uint32_t max_ops = 256;            // operations in flight (bounded by the provider's queue)
  uint32_t max_op_bytes = 1u << 20;  // bytes of one operation (bounded by max_msg_size)
  // Bytes of one operation gathered from several slices (a single slice
  // may be up to max_op_bytes).
  uint32_t max_gather_bytes = 1u << 20;
  std::chrono::microseconds spin{50};
  // Longer spin while two or more operations are in flight: the progress
  // thread blocks only once none completed for this long.
  std::chrono::microseconds spin_in_flight{1000};
  // A peer the provider refuses every operation to (-FI_EAGAIN, nothing in
  // flight) for this long is unreachable: its requests fail kUnavailable.
  std::chrono::milliseconds unreachable_after{5000};
  std::shared_ptr<EngineTarget> target;  // notifications go to its inbox
  // The name of this endpoint's keys in the peers' region entries: "fabric"
  // (rail 0), "fabric.N" (rail N, where its keys differ from rail 0's).
  // A region without a key of that name is reached with its "fabric" key.
  std::string key_name = "fabric";
};

// Slices per operation, further capped by the provider's iov limits.
inline constexpr uint32_t kMaxIov = 16;

// The libfabric objects of one endpoint and what Open learnt of them.
struct Fids {
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  bool cq_waits = true;    // the CQ has a wait object (fi_cq_sread works)
  uint32_t iov_limit = 1;  // slices per operation (kMaxIov and the provider's limits)
  uint64_t max_msg = 0;    // bytes per operation (max_msg_size, capped)
  uint32_t addr_format = 0;
  std::string address;  // fi_getname's bytes

  // Whether `a` has the form of an address of this provider.
  Status CheckAddress(std::string_view a) const;
};

template <class T>
void CloseFid(T*& p) {
  if (p != nullptr) {
    (void)fi_close(&p->fid);
    p = nullptr;
  }
}

// What every posted operation carries as its context: libfabric's scratch
// space first (FI_CONTEXT / FI_CONTEXT2 modes), then what it is, so the
// progress thread knows whose completion it reaped.
enum class Kind : uint8_t { kRma, kRecv, kSend };
struct Context {
  fi_context2 fi{};
  Kind kind = Kind::kRma;
};

// A message buffer (fabric_messages.h): one of the posted receives, or a
// send. Receives belong to Notifications; a send belongs to whoever holds
// it (Notifications until queued, then Posting until the provider completes
// it or the endpoint shuts down, then Notifications::OnSendDone frees it).
struct MsgBuf : Context {
  std::string data;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  fi_addr_t to = FI_ADDR_UNSPEC;
  uint64_t notify_seq = 0;  // a notification's send: its number; 0 for acks
};

}  // namespace ferry::internal::fabric
