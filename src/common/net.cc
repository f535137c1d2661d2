#include "common/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "common/fd_limit.h"

namespace ferry::internal {

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string ErrnoString(int err) {
  char buf[128];
  // GNU strerror_r returns a char*.
  const char* s = strerror_r(err, buf, sizeof(buf));
  return s;
}

StatusOr<HostPort> ParsePeerId(std::string_view id) {
  HostPort hp;
  std::string_view port_str;
  if (!id.empty() && id.front() == '[') {
    size_t close = id.find(']');
    if (close == std::string_view::npos || close + 1 >= id.size() || id[close + 1] != ':') {
      return InvalidArgumentError("peer id '" + std::string(id) +
                                  "' is not of the form [ipv6]:port");
    }
    hp.host = std::string(id.substr(1, close - 1));
    port_str = id.substr(close + 2);
  } else {
    size_t colon = id.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      return InvalidArgumentError("peer id '" + std::string(id) + "' is not of the form host:port");
    }
    hp.host = std::string(id.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) {
      return InvalidArgumentError("peer id '" + std::string(id) +
                                  "': IPv6 hosts must be in brackets, [addr]:port");
    }
    port_str = id.substr(colon + 1);
  }
  if (hp.host.find_first_of("[]") != std::string::npos) {
    return InvalidArgumentError("peer id '" + std::string(id) + "' has a bracket inside its host");
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_str.data(), port_str.data() + port_str.size(), port);
  if (ec != std::errc() || ptr != port_str.data() + port_str.size() || port == 0 || port > 65535 ||
      hp.host.empty()) {
    return InvalidArgumentError("peer id '" + std::string(id) +
                                "' has no valid port (expected host:port, port 1-65535)");
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

std::string FormatPeerId(std::string_view host, uint16_t port) {
  std::string s;
  if (host.find(':') != std::string_view::npos) {
    s = "[" + std::string(host) + "]";
  } else {
    s = std::string(host);
  }
  return s + ":" + std::to_string(port);
}

namespace {

StatusOr<addrinfo*> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0) {
    return InvalidArgumentError("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  return res;
}

}  // namespace

StatusOr<std::pair<UniqueFd, uint16_t>> Listen(const std::string& host, uint16_t port) {
  FERRY_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, true));
  const std::string name = FormatPeerId(host, port);
  Status last = UnavailableError("cannot listen on " + name + ": no address");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = DescriptorError(StatusCode::kUnavailable,
                             "cannot create a socket to listen on " + name, errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
      last = UnavailableError("cannot listen on " + name + ": " + ErrnoString(errno));
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    uint16_t bound = ss.ss_family == AF_INET6
                         ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                         : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    ::freeaddrinfo(res);
    return std::make_pair(std::move(fd), bound);
  }
  ::freeaddrinfo(res);
  return last;
}

Status SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) return InternalError("fcntl: " + ErrnoString(errno));
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, flags) != 0) return InternalError("fcntl: " + ErrnoString(errno));
  return OkStatus();
}

void SetNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void SetSendBuffer(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

namespace {
int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}
}  // namespace

StatusOr<UniqueFd> ConnectTo(const HostPort& peer, Clock::time_point deadline) {
  std::string name = FormatPeerId(peer.host, peer.port);
  FERRY_ASSIGN_OR_RETURN(addrinfo * res, Resolve(peer.host, peer.port, false));
  Status last = UnavailableError("cannot connect to " + name + ": no address");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = DescriptorError(StatusCode::kUnavailable, "cannot create a socket for " + name, errno);
      continue;
    }
    int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno != EINPROGRESS) {
      last = UnavailableError("cannot connect to " + name + ": " + ErrnoString(errno));
      continue;
    }
    if (rc != 0) {
      pollfd p{fd.get(), POLLOUT, 0};
      int n;
      do {
        n = ::poll(&p, 1, RemainingMs(deadline));
      } while (n < 0 && errno == EINTR);
      if (n == 0) {
        last = DeadlineExceededError("connecting to " + name + " timed out");
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = UnavailableError("cannot connect to " + name + ": " + ErrnoString(err));
        continue;
      }
    }
    SetNoDelay(fd.get());
    Status s = SetNonBlocking(fd.get(), false);
    if (!s.ok()) {
      last = s;
      continue;
    }
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

Status SendAll(int fd, const void* data, size_t len, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    pollfd pfd{fd, POLLOUT, 0};
    int n = ::poll(&pfd, 1, RemainingMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return DeadlineExceededError("send timed out");
    ssize_t w = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return UnavailableError("send failed: " + ErrnoString(errno));
    }
    p += w;
    len -= static_cast<size_t>(w);
  }
  return OkStatus();
}

Status RecvAll(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int n = ::poll(&pfd, 1, RemainingMs(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return DeadlineExceededError("receive timed out");
    ssize_t r = ::recv(fd, p, len, MSG_DONTWAIT);
    if (r == 0) return UnavailableError("connection closed by peer");
    if (r < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return UnavailableError("receive failed: " + ErrnoString(errno));
    }
    p += r;
    len -= static_cast<size_t>(r);
  }
  return OkStatus();
}

namespace {
socklen_t AbstractAddress(const std::string& name, sockaddr_un* addr) {
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr->sun_path) - 1);
  std::memcpy(addr->sun_path + 1, name.data(), n);  // sun_path[0] = 0: abstract
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}
}  // namespace

StatusOr<UniqueFd> ListenUnix(const std::string& name) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return DescriptorError(StatusCode::kUnavailable, "cannot create a unix socket", errno);
  }
  sockaddr_un addr;
  socklen_t len = AbstractAddress(name, &addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(fd.get(), 1024) != 0) {
    return UnavailableError("cannot listen on unix socket @" + name + ": " + ErrnoString(errno));
  }
  return fd;
}

StatusOr<UniqueFd> ConnectUnix(const std::string& name, Clock::time_point deadline) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    return DescriptorError(StatusCode::kUnavailable, "cannot create a unix socket", errno);
  }
  sockaddr_un addr;
  socklen_t len = AbstractAddress(name, &addr);
  while (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    if (errno == EINTR) continue;
    if (errno != EAGAIN) {  // EAGAIN: the listener's backlog is full; wait for room
      return UnavailableError("cannot connect to unix socket @" + name + ": " + ErrnoString(errno));
    }
    if (Clock::now() >= deadline)
      return DeadlineExceededError("connecting to unix socket @" + name + " timed out");
    ::usleep(1000);
  }
  FERRY_RETURN_IF_ERROR(SetNonBlocking(fd.get(), false));
  return fd;
}

int PeerPid(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return cred.pid;
}

const std::string& BootId() {
  static const std::string id = [] {
    std::string s;
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
      char buf[64] = {0};
      if (std::fgets(buf, sizeof(buf), f) != nullptr) s = buf;
      std::fclose(f);
    }
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }();
  return id;
}

}  // namespace ferry::internal
