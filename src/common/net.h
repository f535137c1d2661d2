// Socket helpers shared by the rpc listener, the handshake and the TCP
// transport. All functions are thread-safe; none keeps state.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "ferry/status.h"

namespace ferry::internal {

using Clock = std::chrono::steady_clock;

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;  // without brackets
  uint16_t port = 0;
};

// Parses "host:port", "[v6addr]:port". kInvalidArgument names the input.
StatusOr<HostPort> ParsePeerId(std::string_view peer_id);
// "host:port", with brackets around IPv6 hosts.
std::string FormatPeerId(std::string_view host, uint16_t port);

// Binds and listens (non-blocking, SO_REUSEADDR). Returns the fd and the
// bound port (useful when `port` is 0).
StatusOr<std::pair<UniqueFd, uint16_t>> Listen(const std::string& host, uint16_t port);

// Connects with a deadline. The returned socket is blocking, TCP_NODELAY.
// kUnavailable (refused, unreachable) or kDeadlineExceeded, naming the peer.
StatusOr<UniqueFd> ConnectTo(const HostPort& peer, Clock::time_point deadline);

// Blocking send/receive of exactly `len` bytes before the deadline (the
// socket may be blocking or not; poll() waits).
Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline);
Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline);

Status SetNonBlocking(int fd, bool on);
void SetNoDelay(int fd);
void SetSendBuffer(int fd, int bytes);

// Unix-domain stream sockets in the abstract namespace (`name` without the
// leading NUL): visible to every process of this network namespace, gone
// with the socket. ListenUnix: non-blocking, like Listen.
StatusOr<UniqueFd> ListenUnix(const std::string& name);
// Connects with a deadline; the returned socket is blocking. kUnavailable
// when nothing listens under `name` here (another host or network namespace).
StatusOr<UniqueFd> ConnectUnix(const std::string& name, Clock::time_point deadline);
// The process at the other end of a connected Unix socket (SO_PEERCRED), as
// seen from this process's pid namespace; 0 if it is not visible here.
int PeerPid(int fd);
// This kernel's boot id (/proc/sys/kernel/random/boot_id): equal for all
// processes of one host (and boot), different on any other. Empty if unknown.
const std::string& BootId();

// strerror for errno values, thread-safe.
std::string ErrnoString(int err);

}  // namespace ferry::internal
