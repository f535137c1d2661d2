// EngineTarget: the part of an engine that peers act on — its registered
// memory and its notification inbox. Shared (shared_ptr) between the engine
// and the transports that serve peers, so a transport never outlives it.
// In src/base/, below the core and the transports. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/memory_registry.h"
#include "ferry/types.h"
#include "wire/descriptor.h"

namespace ferry::internal {

class CudaDriver;

// Host memory that an engine's served streams hold for peers' staged
// entries (file regions, GPU memory): bytes handed out now, and the most at
// once (EngineMetrics::target_staging_bytes, _peak). Thread-safe.
class StagingGauge {
 public:
  void Add(uint64_t n) {
    const uint64_t now = in_use_.fetch_add(n, std::memory_order_relaxed) + n;
    uint64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }
  void Sub(uint64_t n) { in_use_.fetch_sub(n, std::memory_order_relaxed); }
  uint64_t in_use() const { return in_use_.load(std::memory_order_relaxed); }
  uint64_t peak() const { return peak_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> in_use_{0};
  std::atomic<uint64_t> peak_{0};
};

class EngineTarget {
 public:
  // `inbox_limit`: most bytes of notifications held until drained
  // (EngineOptions::notify_inbox_bytes).
  EngineTarget(uint64_t instance_id, std::string peer_id, uint64_t inbox_limit = uint64_t{64} << 20)
      : instance_id_(instance_id), peer_id_(std::move(peer_id)), inbox_limit_(inbox_limit) {}

  uint64_t instance_id() const { return instance_id_; }
  const std::string& peer_id() const { return peer_id_; }
  MemoryRegistry& registry() { return registry_; }
  const MemoryRegistry& registry() const { return registry_; }
  // The CUDA driver GPU regions were registered with (null until one was):
  // what target-side services copy them with. Set once; drivers live for
  // the process.
  void SetCudaDriver(const CudaDriver* d) { cuda_.store(d, std::memory_order_release); }
  const CudaDriver* cuda_driver() const { return cuda_.load(std::memory_order_acquire); }
  // What the served streams' staging pools count into (they may outlive
  // this target: each holds the gauge).
  const std::shared_ptr<StagingGauge>& staging() const { return staging_; }

  // kResourceExhausted (the sender's SendNotification returns it) while the
  // notifications not yet drained hold more than the limit.
  Status Deliver(Notification n) {
    const uint64_t size = n.sender.size() + n.name.size() + n.message.size();
    std::lock_guard<std::mutex> lock(mu_);
    if (!inbox_.empty() && inbox_bytes_ + size > inbox_limit_) {
      return ResourceExhaustedError(
          "the notification inbox of " + peer_id_ + " is full: " + std::to_string(inbox_.size()) +
          " notifications (" + std::to_string(inbox_bytes_) +
          " bytes) not yet fetched by its application (limit notify_inbox_bytes = " +
          std::to_string(inbox_limit_) + ")");
    }
    inbox_bytes_ += size;
    inbox_.push_back(std::move(n));
    ++delivered_;
    return OkStatus();
  }
  // Notifications taken into the inbox so far.
  uint64_t delivered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return delivered_;
  }
  std::vector<Notification> Drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Notification> out(std::make_move_iterator(inbox_.begin()),
                                  std::make_move_iterator(inbox_.end()));
    inbox_.clear();
    inbox_bytes_ = 0;
    return out;
  }

 private:
  const uint64_t instance_id_;
  const std::string peer_id_;
  const uint64_t inbox_limit_;
  MemoryRegistry registry_;
  std::atomic<const CudaDriver*> cuda_{nullptr};
  const std::shared_ptr<StagingGauge> staging_ = std::make_shared<StagingGauge>();
  mutable std::mutex mu_;
  std::deque<Notification> inbox_;  // guarded by mu_
  uint64_t delivered_ = 0;          // guarded by mu_
  uint64_t inbox_bytes_ = 0;        // guarded by mu_
};

// Identifies this process among engines (equal for all engines in it).
uint64_t ProcessToken();

}  // namespace ferry::internal
