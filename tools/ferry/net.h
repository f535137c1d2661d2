// Plain socket helpers for the bench's control channel and baselines. Kept
// apart from the engine on purpose: the baselines must be plain sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ferry::bench {

// Splits "host:port" or "[v6]:port". Throws cli::UsageError naming `what`.
void SplitHostPort(std::string_view what, std::string_view text, std::string* host, uint16_t* port);
// "host:port", bracketing IPv6 hosts.
std::string JoinHostPort(const std::string& host, uint16_t port);

// Listening socket on host (port 0: any). Throws cli::RunError.
int ListenOn(const std::string& host, uint16_t* port);
// Connected socket with TCP_NODELAY. Throws cli::RunError.
int ConnectTo(const std::string& host, uint16_t port);

// Blocking full send/receive; false on error or EOF.
bool SendAll(int fd, const void* data, size_t len);
bool RecvAll(int fd, void* data, size_t len);
bool SendU64(int fd, uint64_t v);
bool RecvU64(int fd, uint64_t* v);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

}  // namespace ferry::bench
