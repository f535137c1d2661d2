#include "net.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "cli.h"

namespace ferry::bench {

void SplitHostPort(std::string_view what, std::string_view text, std::string* host,
                   uint16_t* port) {
  std::string_view h, p;
  if (text.starts_with("[")) {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw cli::UsageError("bad value '" + std::string(text) + "' for " + std::string(what) +
                            ": expected [IPV6]:PORT");
    }
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0) {
      throw cli::UsageError("bad value '" + std::string(text) + "' for " + std::string(what) +
                            ": expected HOST:PORT");
    }
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
  }
  uint64_t v = cli::ParseUint(what, p);
  if (v == 0 || v > 65535) {
    throw cli::UsageError("bad value '" + std::string(text) + "' for " + std::string(what) +
                          ": port must be 1..65535");
  }
  *host = std::string(h);
  *port = static_cast<uint16_t>(v);
}

std::string JoinHostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

namespace {

addrinfo* Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    throw cli::RunError("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return res;
}

}  // namespace

int ListenOn(const std::string& host, uint16_t* port) {
  addrinfo* res = Resolve(host, *port, true);
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    throw cli::RunError(std::string("socket: ") + std::strerror(errno));
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    int err = errno;
    freeaddrinfo(res);
    close(fd);
    throw cli::RunError("cannot listen on " + JoinHostPort(host, *port) + ": " +
                        std::strerror(err));
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t sl = sizeof(ss);
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  if (ss.ss_family == AF_INET) {
    *port = ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  } else {
    *port = ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  }
  return fd;
}

int ConnectTo(const std::string& host, uint16_t port) {
  addrinfo* res = Resolve(host, port, false);
  int err = 0;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      freeaddrinfo(res);
      return fd;
    }
    err = errno;
    close(fd);
  }
  freeaddrinfo(res);
  throw cli::RunError("cannot connect to " + JoinHostPort(host, port) + ": " + std::strerror(err));
}

bool SendAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool RecvAll(int fd, void* data, size_t len) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool SendU64(int fd, uint64_t v) { return SendAll(fd, &v, sizeof(v)); }
bool RecvU64(int fd, uint64_t* v) { return RecvAll(fd, v, sizeof(*v)); }

Fd::~Fd() { reset(); }

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset(o.fd_);
    o.fd_ = -1;
  }
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
}

}  // namespace ferry::bench
