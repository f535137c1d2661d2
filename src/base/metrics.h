// Metrics: an engine's counters — requests and bytes by (peer, transport,
// opcode) and outcome, the latency histogram of batches and prepared
// transfers, notifications and cancellations. Updated by BatchState (once
// per frame's worth of completions, see BatchState::Completer) and read by
// Engine::GetMetrics / MetricsText (Prometheus' text format). Thread-safe;
// the counters are relaxed atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "ferry/types.h"

namespace ferry::internal {

struct RouteCounters {
  RouteCounters(std::string p, std::string t, Opcode o)
      : peer(std::move(p)), transport(std::move(t)), opcode(o) {}
  const std::string peer;
  const std::string transport;
  const Opcode opcode;
  std::atomic<uint64_t> requests_completed{0};
  std::atomic<uint64_t> requests_failed{0};
  std::atomic<uint64_t> bytes_completed{0};
  std::atomic<uint64_t> bytes_failed{0};
};

class Metrics {
 public:
  Metrics();
  // The counters of one route; created on first use, stable for the life
  // of the Metrics.
  RouteCounters* Route(std::string_view peer, std::string_view transport, Opcode opcode);

  void ObserveLatency(std::chrono::nanoseconds d);
  void AddCancelled(uint64_t n) { cancelled_.fetch_add(n, std::memory_order_relaxed); }
  void AddNotificationSent() { notifications_sent_.fetch_add(1, std::memory_order_relaxed); }
  // Peer links opened, closed for idleness (idle_link_timeout) and closed to
  // make room (max_peer_links).
  void AddLinkOpened() { links_opened_.fetch_add(1, std::memory_order_relaxed); }
  void AddLinkClosedIdle() { links_closed_idle_.fetch_add(1, std::memory_order_relaxed); }
  void AddLinkEvicted() { links_evicted_.fetch_add(1, std::memory_order_relaxed); }

  // `notifications_received`: what the engine's inbox took in so far.
  EngineMetrics Snapshot(uint64_t notifications_received) const;
  static std::string PrometheusText(const EngineMetrics& m);

 private:
  static constexpr size_t kBuckets =
      16;  // upper bounds in us: 10 * 2^k, k = 0..15 (~0.33 s); then +Inf
  mutable std::mutex mu_;
  std::deque<RouteCounters> routes_;  // guarded by mu_ (insertion); deque: stable addresses
  std::unordered_map<std::string, RouteCounters*> by_key_;  // guarded by mu_
  std::atomic<uint64_t> buckets_[kBuckets + 1];
  std::atomic<uint64_t> latency_count_{0};
  std::atomic<uint64_t> latency_sum_ns_{0};
  std::atomic<uint64_t> cancelled_{0};
  std::atomic<uint64_t> notifications_sent_{0};
  std::atomic<uint64_t> links_opened_{0};
  std::atomic<uint64_t> links_closed_idle_{0};
  std::atomic<uint64_t> links_evicted_{0};
};

}  // namespace ferry::internal
