// A peer instance as one fabric endpoint posts to it (UCX's ep): its
// address in the endpoint's address vector, whether it broke, and what is
// posted to it. Made by Endpoint::AddPeer; shared by the link, by every
// operation queued or in flight for it, and by the notifications sent to it.
//
// Threads and locks:
// - label() and addr() are fixed at construction.
// - broken() / why_broken() / MarkBroken(): any thread. mu_ guards the
//   reason; broken_ is set after it (release), so a reader that saw
//   broken() true reads the reason that broke it. The first reason stays.
// - writes_pending_: atomic. Posting adds a Post's writes before queueing
//   them and takes each off as it completes or fails; Notifications waits
//   for it to reach zero (a notification follows every earlier write).
// - ops_inflight_ and refused_since_: guarded by the endpoint's posting lock
//   (Posting::mu_), read and written only by Posting.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "base/transport.h"

namespace ferry::internal::fabric {

class RemotePeer {
 public:
  RemotePeer(std::shared_ptr<const PeerInfo> info, fi_addr_t addr)
      : info_(std::move(info)), label_(info_->Label()), addr_(addr) {}

  const std::string& label() const { return label_; }
  fi_addr_t addr() const { return addr_; }
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  std::string why_broken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return why_broken_;
  }
  // Once broken, every request to the peer fails kUnavailable with `why`,
  // and the link reports itself unhealthy (the core builds a new one).
  void MarkBroken(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_.load()) return;
    why_broken_ = why;
    broken_.store(true, std::memory_order_release);
  }
  // Write slices posted (queued or in flight) and not yet completed.
  uint64_t writes_pending() const { return writes_pending_.load(std::memory_order_acquire); }

 private:
  friend class Posting;
  const std::shared_ptr<const PeerInfo> info_;
  const std::string label_;
  const fi_addr_t addr_;
  std::atomic<uint64_t> writes_pending_{0};
  std::atomic<bool> broken_{false};
  mutable std::mutex mu_;
  std::string why_broken_;
  // Guarded by Posting::mu_: operations in flight, and since when the
  // provider refused to post to it (-FI_EAGAIN) with none in flight.
  uint32_t ops_inflight_ = 0;
  Clock::time_point refused_since_{};
};

}  // namespace ferry::internal::fabric
