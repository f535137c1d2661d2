#include "transport/stream/listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <future>

#include "common/fd_limit.h"
#include "common/log.h"
#include "transport/stream/connection.h"

namespace ferry::internal::stream {
namespace {

// The IP address and port of an IP peer; false for other families.
bool IpOf(const sockaddr_storage& ss, std::string* host, uint16_t* port) {
  char buf[INET6_ADDRSTRLEN] = {};
  const void* addr = nullptr;
  if (ss.ss_family == AF_INET) {
    addr = &reinterpret_cast<const sockaddr_in*>(&ss)->sin_addr;
    *port = ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    addr = &reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_addr;
    *port = ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  }
  if (addr == nullptr || ::inet_ntop(ss.ss_family, addr, buf, sizeof(buf)) == nullptr) return false;
  *host = buf;
  return true;
}

// "10.0.0.2:53412" / "[::1]:53412" for an IP peer; "process N" for a unix
// one whose pid is known; "" otherwise.
std::string RemoteOf(const sockaddr_storage& ss, int pid) {
  std::string host;
  uint16_t port = 0;
  if (IpOf(ss, &host, &port)) return FormatPeerId(host, port);
  return pid != 0 ? "process " + std::to_string(pid) : "";
}

// Whom an accepted connection counts against (Admission): its IP address
// without the port; on a unix socket, the connecting process's user.
std::string SourceOf(const sockaddr_storage& ss, int fd) {
  std::string host;
  uint16_t port = 0;
  if (IpOf(ss, &host, &port)) return host;
  if (ss.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
      return "uid " + std::to_string(cred.uid);
  }
  return "unknown source";
}

}  // namespace

Listener::Listener(UniqueFd fd, ListenerConfig cfg, std::vector<EventLoop*> loops)
    : fd_(std::move(fd)),
      cfg_(std::move(cfg)),
      loops_(std::move(loops)),
      spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

StatusOr<std::shared_ptr<Listener>> Listener::Serve(UniqueFd fd, ListenerConfig cfg,
                                                    const LoopPool& pool) {
  auto listener = std::make_shared<Listener>(std::move(fd), std::move(cfg), pool.loops());
  EventLoop* loop = pool.loop(0);
  std::promise<Status> added;
  std::future<Status> result = added.get_future();
  loop->RunInLoop(
      [loop, listener, &added] { added.set_value(loop->Add(listener->fd(), EPOLLIN, listener)); });
  Status s = result.get();
  if (!s.ok()) return s.WithPrefix("cannot serve " + listener->cfg_.name);
  return listener;
}

void Listener::OnEvents(uint32_t) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int c =
        ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      if ((errno == EMFILE || errno == ENFILE) && spare_.valid()) {
        // Out of descriptors: take the connection with the spare one and
        // close it, or the level-triggered loop wakes for it forever.
        if (!out_of_fds_logged_) {
          FERRY_LOG(kWarning,
                    DescriptorError(StatusCode::kInternal, cfg_.name + ": accept", errno).message()
                        << "; closing new connections until some are freed");
          out_of_fds_logged_ = true;
        }
        spare_.Reset();
        const int drop = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (drop >= 0) ::close(drop);
        spare_ = UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        continue;
      }
      if (errno != EAGAIN) FERRY_LOG(kWarning, cfg_.name << ": accept: " << ErrnoString(errno));
      return;
    }
    out_of_fds_logged_ = false;
    UniqueFd accepted(c);
    std::unique_ptr<Admission::Ticket> ticket;
    if (cfg_.admission) {
      ticket = cfg_.admission->Admit(SourceOf(ss, c), cfg_.name);
      if (!ticket) continue;  // over its source's limits: closed now
    }
    const int pid = cfg_.on_accept ? cfg_.on_accept(c) : 0;
    EventLoop* loop = loops_[next_++ % loops_.size()];
    auto conn = std::make_shared<Connection>(
        loop, std::move(accepted), "accepted connection " + std::to_string(c) + " on " + cfg_.name,
        cfg_.openers, cfg_.hello_timeout);
    if (pid != 0) conn->SetPeerProcess(pid);
    conn->SetAdmission(std::move(ticket));
    conn->SetRemote(RemoteOf(ss, pid));
    loop->RunInLoop([conn] {
      Status s = conn->Attach();
      if (!s.ok()) FERRY_LOG(kWarning, "cannot serve accepted connection: " << s);
    });
  }
}

}  // namespace ferry::internal::stream
