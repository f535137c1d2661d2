// MetricsServer: the Prometheus endpoint (see metrics_server.h).
#include "core/metrics_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/fd_limit.h"
#include "common/log.h"

namespace ferry::internal {

namespace {
constexpr size_t kMaxRequest = 8192;
constexpr auto kRequestTimeout = std::chrono::seconds(2);
}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                              std::function<std::string()> render) {
  // "HOST:PORT", where PORT may be 0 (any free port).
  const size_t colon = address.rfind(':');
  const std::string port_text = colon == std::string::npos ? "" : address.substr(colon + 1);
  char* end = nullptr;
  const unsigned long port = std::strtoul(port_text.c_str(), &end, 10);
  if (port_text.empty() || *end != '\0' || port > 65535) {
    return InvalidArgumentError("metrics_address must be HOST:PORT (port 0-65535), got '" +
                                address + "'");
  }
  auto hp = ParsePeerId(address.substr(0, colon) + ":1");  // checks the host part
  if (!hp.ok())
    return InvalidArgumentError("metrics_address must be HOST:PORT, got '" + address + "'");
  hp->port = static_cast<uint16_t>(port);
  auto listening = Listen(hp->host, hp->port);
  if (!listening.ok()) return listening.status().WithPrefix("metrics endpoint " + address);
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->listen_fd_ = std::move(listening->first);
  s->address_ = FormatPeerId(hp->host, listening->second);
  s->stop_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->stop_fd_.valid()) {
    return DescriptorError(StatusCode::kInternal, "eventfd for the metrics endpoint", errno);
  }
  s->render_ = std::move(render);
  s->thread_ = std::thread([raw = s.get()] { raw->Loop(); });
  FERRY_LOG(kInfo, "metrics endpoint on http://" << s->address_ << "/metrics");
  return s;
}

MetricsServer::~MetricsServer() {
  const uint64_t one = 1;
  if (stop_fd_.valid()) (void)!::write(stop_fd_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void MetricsServer::Loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) continue;  // EAGAIN, EMFILE, a client gone: try the next
    Serve(conn.get());
  }
}

void MetricsServer::Serve(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + kRequestTimeout;
  std::string request;
  char buf[1024];
  while (request.find("\r\n\r\n") == std::string::npos &&
         request.find("\n\n") == std::string::npos) {
    if (request.size() > kMaxRequest) return;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd fds[2] = {{fd, POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, static_cast<int>(left.count())) <= 0 || fds[1].revents != 0) return;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      return;
    }
    request.append(buf, static_cast<size_t>(n));
  }
  const size_t line_end = request.find_first_of("\r\n");
  const std::string line = request.substr(0, line_end);
  std::string status = "200 OK", type = "text/plain; version=0.0.4; charset=utf-8", body;
  const bool get = line.rfind("GET ", 0) == 0, head = line.rfind("HEAD ", 0) == 0;
  const size_t path_start = line.find(' ') + 1;
  const std::string path = line.substr(path_start, line.find(' ', path_start) - path_start);
  if (!get && !head) {
    status = "405 Method Not Allowed";
    type = "text/plain";
    body = "only GET /metrics\n";
  } else if (path != "/metrics" && path.rfind("/metrics?", 0) != 0) {
    status = "404 Not Found";
    type = "text/plain";
    body = "not found; the metrics are at /metrics\n";
  } else {
    body = render_();
  }
  std::string out = "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
                    "\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n\r\n";
  if (!head) out += body;
  (void)SendAll(fd, out.data(), out.size(), deadline);
}

}  // namespace ferry::internal
