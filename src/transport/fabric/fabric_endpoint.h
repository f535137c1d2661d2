// One libfabric domain with its reliable-datagram endpoint (FI_EP_RDM), as
// one engine's fabric transport drives it: the data path.
//
// - Memory: every region the engine registers is registered with the domain
//   (fi_mr_reg), honouring the provider's mr_mode: FI_MR_PROV_KEY (the
//   provider's key, else Ferry numbers them), FI_MR_VIRT_ADDR (remote
//   addresses are virtual, else offsets into the region), FI_MR_LOCAL (local
//   buffers carry their descriptor), FI_MR_ENDPOINT (bound to the endpoint),
//   FI_MR_ALLOCATED (memory is allocated: the engine's always is). The key
//   goes into the region, so into the descriptor peers fetch.
// - Posting: slices queue per endpoint and are posted as vectored one-sided
//   writes and reads (fi_writemsg / fi_readmsg), up to the provider's iov
//   limits and `max_gather_bytes` per operation and `max_ops` operations in
//   flight. -FI_EAGAIN leaves the rest queued until completions make room
//   (back-pressure, no spinning). Writes ask for FI_DELIVERY_COMPLETE: their completion means
//   the bytes are in the target's memory. A read holds its batch's landing
//   fence (BatchState::BeginLanding) until it completed, so a cancel returns
//   only once no read of the batch can still store into this engine.
// - Completions: one progress thread per endpoint reads the completion
//   queue, spins a little after activity (longer while several operations
//   are in flight and completing), then blocks in fi_cq_sread (so an idle
//   engine uses no CPU). It posts what callers queue while it runs (a caller posts
//   itself while it sleeps), and also drives the provider's progress for
//   peers that write into this engine (manual-progress providers need it).
//   It fails operations past their deadline (the slices; the operation's
//   resources wait for its completion or the endpoint's close).
// - Notifications: messages (fabric_messages.h) sent after every earlier
//   write to that peer completed; the target delivers them to its inbox and
//   answers with an acknowledgement carrying the inbox's status.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/memory_registry.h"
#include "base/target.h"
#include "ferry/status.h"
#include "base/transport.h"
#include "wire/frame.h"

namespace ferry::internal::fabric {

struct EndpointConfig {
  std::string provider;  // as libfabric names it ("tcp;ofi_rxm")
  std::string node;      // address the endpoint binds to; "" = the provider's choice
  uint32_t max_ops = 256;  // operations in flight (bounded by the provider's queue)
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

class Endpoint;

// A peer instance as the endpoint posts to it. Made by Endpoint::AddPeer.
class RemotePeer {
 public:
  const std::string& label() const { return label_; }
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  std::string why_broken() const;

 private:
  friend class Endpoint;
  std::shared_ptr<const PeerInfo> info_;
  std::string label_;
  fi_addr_t addr_ = FI_ADDR_UNSPEC;
  // Write slices posted (queued or in flight) and not yet completed:
  // a notification waits for none.
  std::atomic<uint64_t> writes_pending_{0};
  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;
  std::string why_broken_;
  // Guarded by the endpoint's lock: operations in flight, and since when
  // the provider refused to post to it (-FI_EAGAIN) with none in flight.
  uint32_t ops_inflight_ = 0;
  Clock::time_point refused_since_{};
};

class Endpoint {
 public:
  static StatusOr<std::unique_ptr<Endpoint>> Open(const EndpointConfig& cfg);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  const std::string& provider() const { return provider_; }
  // fi_getname's bytes: what peers insert into their address vector.
  const std::string& address() const { return address_; }
  uint32_t addr_format() const { return addr_format_; }
  // Largest operation the provider takes (its max_msg_size, capped).
  uint64_t max_message() const { return max_msg_; }

  // Registers [region.addr, end) with the domain; returns the remote key.
  StatusOr<uint64_t> Register(const Region& region);
  void Unregister(const Region& region);

  // `address`: the peer's fi_getname bytes (from its descriptor).
  StatusOr<std::shared_ptr<RemotePeer>> AddPeer(std::shared_ptr<const PeerInfo> info, std::string_view address);
  // The link is retired (its address stays in the vector until close).
  void RemovePeer(const std::shared_ptr<RemotePeer>& peer);

  void Post(const std::shared_ptr<RemotePeer>& peer, const PostContext& ctx, std::vector<Slice> slices);
  // Sends after every write posted to `peer` before it has completed.
  Status Notify(const std::shared_ptr<RemotePeer>& peer, const wire::NotifyBody& body, Clock::time_point deadline);
  // Returns once every write posted to `peer` before it has completed
  // (kDeadlineExceeded at `deadline`, kUnavailable if the peer broke).
  Status WaitForWrites(const std::shared_ptr<RemotePeer>& peer, Clock::time_point deadline);

  // Fails what is queued or in flight with kCancelled and closes everything.
  void Shutdown();

 private:
  struct Impl;
  explicit Endpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string provider_, address_;
  uint32_t addr_format_ = 0;
  uint64_t max_msg_ = 0;
};

}  // namespace ferry::internal::fabric
