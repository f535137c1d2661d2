// One libfabric domain with its reliable-datagram endpoint (FI_EP_RDM), as
// one engine's fabric transport drives it (one per rail): the data path.
// Split like UCX's md / iface / ep, one part per file, each stating its own
// thread contract:
//
//   fabric_domain.*    MemoryDomain: memory registration and keys (md)
//   fabric_posting.*   Posting: the posting queue, the operations in flight,
//                      the messages going out (iface, transmit side)
//   fabric_progress.*  Progress: the progress thread, completion reaping,
//                      deadline scans; Wakeup (iface, completion side)
//   fabric_notify.*    Notifications: the notification protocol
//   fabric_peer.h      RemotePeer: a peer instance as this endpoint posts to it (ep)
//   fabric_common.h    what they share: configuration, libfabric objects,
//                      operation contexts
//   fabric_endpoint.*  Endpoint: opens the objects, ties the parts, shuts down
//
// Threads: Register / Unregister, AddPeer / RemovePeer, Post, Notify and
// WaitForWrites may be called from any threads at once (the engine's
// registering, connecting, submitting and notifying threads). Post waits
// for nothing but the posting lock; Notify and WaitForWrites block until
// their condition or their deadline. Shutdown (also run by the destructor) runs once, after the
// engine stopped posting (the core retires its links first): a Notify or
// WaitForWrites waiting in it returns kCancelled, and so does what is
// posted later. The endpoint's one thread of its own is Progress's.
//
// Locks, and the one order in which they nest:
//   Posting::mu_  ->  RemotePeer::mu_
//   Posting::mu_  ->  MemoryDomain::mu_ (shared)
// Notifications::mu_, RemotePeer::mu_ and MemoryDomain::mu_ are leaves.
// No lock is held while slices complete (a batch's completion may post
// again), while a notification is delivered to the target's inbox, or
// while a caller waits.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/memory_registry.h"
#include "base/target.h"
#include "base/transport.h"
#include "ferry/status.h"
#include "transport/fabric/fabric_common.h"
#include "transport/fabric/fabric_peer.h"
#include "wire/frame.h"

namespace ferry::internal::fabric {

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
  StatusOr<std::shared_ptr<RemotePeer>> AddPeer(std::shared_ptr<const PeerInfo> info,
                                                std::string_view address);
  // The link is retired (its address stays in the vector until close).
  void RemovePeer(const std::shared_ptr<RemotePeer>& peer);

  void Post(const std::shared_ptr<RemotePeer>& peer, const PostContext& ctx,
            std::vector<Slice> slices);
  // Sends after every write posted to `peer` before it has completed.
  Status Notify(const std::shared_ptr<RemotePeer>& peer, const wire::NotifyBody& body,
                Clock::time_point deadline);
  // Returns once every write posted to `peer` before it has completed
  // (kDeadlineExceeded at `deadline`, kCancelled at shutdown); a write that
  // failed counts as completed (the caller checks RemotePeer::broken).
  Status WaitForWrites(const std::shared_ptr<RemotePeer>& peer, Clock::time_point deadline);

  // Returns once no operation that failed at its deadline is still with the
  // provider touching `region` (Posting::WaitForLate).
  Status WaitForLate(const Region& region, Clock::time_point deadline);

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
