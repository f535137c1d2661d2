// MetricsServer: the Prometheus endpoint (EngineOptions::metrics_address).
// One thread answers GET /metrics with what `render` returns, one
// connection at a time (a scraper is one client); anything else gets 404
// (or 405). A request must arrive within 2 s and fit in 8 KiB.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/net.h"
#include "ferry/status.h"

namespace ferry::internal {

class MetricsServer {
 public:
  // Binds `address` ("HOST:PORT"; port 0 = any free one) and starts serving.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                        std::function<std::string()> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" actually bound.
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  void Loop();
  void Serve(int fd);

  UniqueFd listen_fd_;
  UniqueFd stop_fd_;  // eventfd: written once to stop the loop
  std::string address_;
  std::function<std::string()> render_;
  std::thread thread_;
};

}  // namespace ferry::internal
