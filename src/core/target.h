// EngineTarget: the part of an engine that peers act on — its registered
// memory and its notification inbox. Shared (shared_ptr) between the engine
// and the transports that serve peers, so a transport never outlives it.
// Published by the core for the transports. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/memory_registry.h"
#include "ferry/types.h"
#include "wire/descriptor.h"

namespace ferry::internal {

class EngineTarget {
 public:
  EngineTarget(uint64_t instance_id, std::string peer_id)
      : instance_id_(instance_id), peer_id_(std::move(peer_id)) {}

  uint64_t instance_id() const { return instance_id_; }
  const std::string& peer_id() const { return peer_id_; }
  MemoryRegistry& registry() { return registry_; }
  const MemoryRegistry& registry() const { return registry_; }

  void Deliver(Notification n) {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(std::move(n));
  }
  std::vector<Notification> Drain() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Notification> out(std::make_move_iterator(inbox_.begin()),
                                  std::make_move_iterator(inbox_.end()));
    inbox_.clear();
    return out;
  }

 private:
  const uint64_t instance_id_;
  const std::string peer_id_;
  MemoryRegistry registry_;
  std::mutex mu_;
  std::deque<Notification> inbox_;
};

// Identifies this process among engines (equal for all engines in it).
uint64_t ProcessToken();

}  // namespace ferry::internal
