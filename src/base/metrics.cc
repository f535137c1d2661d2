// Metrics: the counters, their snapshot and the Prometheus text (see metrics.h).
#include "base/metrics.h"

#include <cstdio>

namespace ferry::internal {

Metrics::Metrics() {
  for (auto& b : buckets_) b.store(0, std::memory_order_relaxed);
}

RouteCounters* Metrics::Route(std::string_view peer, std::string_view transport, Opcode opcode) {
  std::string key;
  key.reserve(peer.size() + transport.size() + 3);
  key.append(peer).push_back('\0');
  key.append(transport).push_back('\0');
  key.push_back(static_cast<char>(opcode));
  std::lock_guard<std::mutex> lock(mu_);
  RouteCounters*& slot = by_key_[key];
  if (slot == nullptr)
    slot = &routes_.emplace_back(std::string(peer), std::string(transport), opcode);
  return slot;
}

void Metrics::ObserveLatency(std::chrono::nanoseconds d) {
  const uint64_t ns = d.count() > 0 ? static_cast<uint64_t>(d.count()) : 0;
  size_t b = 0;
  uint64_t bound_ns = 10'000;
  while (b < kBuckets && ns > bound_ns) {
    ++b;
    bound_ns *= 2;
  }
  buckets_[b].fetch_add(1, std::memory_order_relaxed);
  latency_sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  latency_count_.fetch_add(1, std::memory_order_relaxed);
}

EngineMetrics Metrics::Snapshot(uint64_t notifications_received) const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const RouteCounters& r : routes_) {
      m.routes.push_back({r.peer, r.transport, r.opcode,
                          r.requests_completed.load(std::memory_order_relaxed),
                          r.requests_failed.load(std::memory_order_relaxed),
                          r.bytes_completed.load(std::memory_order_relaxed),
                          r.bytes_failed.load(std::memory_order_relaxed)});
    }
  }
  double bound = 10;
  for (size_t b = 0; b < kBuckets; ++b, bound *= 2) m.transfer_latency.bounds_us.push_back(bound);
  for (const auto& c : buckets_)
    m.transfer_latency.counts.push_back(c.load(std::memory_order_relaxed));
  m.transfer_latency.count = latency_count_.load(std::memory_order_relaxed);
  m.transfer_latency.sum_us =
      static_cast<double>(latency_sum_ns_.load(std::memory_order_relaxed)) / 1e3;
  m.batches_finished = m.transfer_latency.count;
  m.notifications_sent = notifications_sent_.load(std::memory_order_relaxed);
  m.notifications_received = notifications_received;
  m.cancelled_requests = cancelled_.load(std::memory_order_relaxed);
  m.links_opened = links_opened_.load(std::memory_order_relaxed);
  m.links_closed_idle = links_closed_idle_.load(std::memory_order_relaxed);
  m.links_evicted = links_evicted_.load(std::memory_order_relaxed);
  return m;
}

namespace {

// A Prometheus label value: backslash, quote and newline escaped.
std::string Label(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

std::string Metrics::PrometheusText(const EngineMetrics& m) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto route_lines = [&](const char* name, auto value_of) {
    for (const RouteMetrics& r : m.routes) {
      for (const char* outcome : {"completed", "failed"}) {
        out += std::string(name) + "{peer=\"" + Label(r.peer) + "\",transport=\"" +
               Label(r.transport) + "\",op=\"" + (r.opcode == Opcode::kRead ? "read" : "write") +
               "\",outcome=\"" + outcome + "\"} " + std::to_string(value_of(r, outcome[0] == 'c')) +
               "\n";
      }
    }
  };
  family("ferry_requests_total", "counter",
         "Requests finished, by peer, transport, opcode and outcome.");
  route_lines("ferry_requests_total", [](const RouteMetrics& r, bool ok) {
    return ok ? r.requests_completed : r.requests_failed;
  });
  family("ferry_bytes_total", "counter",
         "Bytes of finished requests, by peer, transport, opcode and outcome.");
  route_lines("ferry_bytes_total", [](const RouteMetrics& r, bool ok) {
    return ok ? r.bytes_completed : r.bytes_failed;
  });
  family("ferry_transfer_latency_seconds", "histogram",
         "From submit (or post) until the last request of a batch or prepared transfer finished.");
  uint64_t cumulative = 0;
  const LatencyHistogram& h = m.transfer_latency;
  for (size_t b = 0; b < h.counts.size(); ++b) {
    cumulative += h.counts[b];
    const std::string le = b < h.bounds_us.size() ? Number(h.bounds_us[b] / 1e6) : "+Inf";
    out += "ferry_transfer_latency_seconds_bucket{le=\"" + le + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  out += "ferry_transfer_latency_seconds_sum " + Number(h.sum_us / 1e6) + "\n";
  out += "ferry_transfer_latency_seconds_count " + std::to_string(h.count) + "\n";
  family("ferry_batches_open", "gauge", "Batches allocated and not yet freed.");
  out += "ferry_batches_open " + std::to_string(m.batches_open) + "\n";
  family("ferry_notifications_sent_total", "counter",
         "Notifications this engine delivered to peers.");
  out += "ferry_notifications_sent_total " + std::to_string(m.notifications_sent) + "\n";
  family("ferry_notifications_received_total", "counter",
         "Notifications peers delivered to this engine.");
  out += "ferry_notifications_received_total " + std::to_string(m.notifications_received) + "\n";
  family("ferry_cancelled_requests_total", "counter", "Requests failed by a cancellation.");
  out += "ferry_cancelled_requests_total " + std::to_string(m.cancelled_requests) + "\n";
  family("ferry_peer_links_open", "gauge", "Links to peers open now.");
  out += "ferry_peer_links_open " + std::to_string(m.peer_links_open) + "\n";
  family("ferry_peer_links_opened_total", "counter", "Links to peers opened.");
  out += "ferry_peer_links_opened_total " + std::to_string(m.links_opened) + "\n";
  family("ferry_peer_links_closed_idle_total", "counter",
         "Links to peers closed after idle_link_timeout without a request.");
  out += "ferry_peer_links_closed_idle_total " + std::to_string(m.links_closed_idle) + "\n";
  family("ferry_peer_links_evicted_total", "counter",
         "Idle links to peers closed to make room under max_peer_links.");
  out += "ferry_peer_links_evicted_total " + std::to_string(m.links_evicted) + "\n";
  family("ferry_file_ops_total", "counter",
         "Reads and writes of file regions handed to the kernel, by I/O mode.");
  out += "ferry_file_ops_total{mode=\"direct\"} " + std::to_string(m.file_direct_ops) + "\n";
  out += "ferry_file_ops_total{mode=\"buffered\"} " + std::to_string(m.file_buffered_ops) + "\n";
  family("ferry_file_bytes_total", "counter",
         "Bytes of file regions' reads and writes handed to the kernel, by I/O mode.");
  out += "ferry_file_bytes_total{mode=\"direct\"} " + std::to_string(m.file_direct_bytes) + "\n";
  out +=
      "ferry_file_bytes_total{mode=\"buffered\"} " + std::to_string(m.file_buffered_bytes) + "\n";
  family("ferry_target_staging_bytes", "gauge",
         "Host buffers held now for peers' staged requests (this engine's file regions, GPU "
         "memory over tcp).");
  out += "ferry_target_staging_bytes " + std::to_string(m.target_staging_bytes) + "\n";
  family("ferry_target_staging_bytes_peak", "gauge",
         "The most host buffer held at once for peers' staged requests.");
  out += "ferry_target_staging_bytes_peak " + std::to_string(m.target_staging_bytes_peak) + "\n";
  return out;
}

}  // namespace ferry::internal
