#include "transport/tcp/stream_link.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "common/net.h"
#include "wire/exchange.h"

namespace ferry::internal::tcp {

Status SayHello(int fd, wire::FrameType type, const std::string& body, Clock::time_point deadline) {
  FERRY_ASSIGN_OR_RETURN(std::string ack,
                         wire::Exchange(fd, type, body, wire::FrameType::kStreamHelloAck, deadline));
  Status remote;
  FERRY_RETURN_IF_ERROR(wire::DecodeStatus(ack, &remote));
  return remote;
}

StatusOr<std::shared_ptr<LoopPool>> LoopPool::Start(int threads, std::chrono::microseconds spin) {
  auto pool = std::make_shared<LoopPool>();
  for (int i = 0; i < std::max(1, threads); ++i) {
    pool->loops_.push_back(std::make_unique<EventLoop>("io-" + std::to_string(i), spin));
    FERRY_RETURN_IF_ERROR(pool->loops_.back()->Start());
  }
  return pool;
}

std::vector<EventLoop*> LoopPool::loops() const {
  std::vector<EventLoop*> raw;
  for (const auto& l : loops_) raw.push_back(l.get());
  return raw;
}

void LoopPool::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& l : loops_) l->Stop();
}

Listener::Listener(Kind kind, UniqueFd fd, std::vector<EventLoop*> loops,
                   std::shared_ptr<const ServerContext> server, uint32_t send_buffer)
    : kind_(kind),
      fd_(std::move(fd)),
      loops_(std::move(loops)),
      server_(std::move(server)),
      send_buffer_(send_buffer) {}

void Listener::Serve(const std::shared_ptr<Listener>& listener, EventLoop* loop) {
  loop->RunInLoop([loop, listener] {
    Status s = loop->Add(listener->fd(), EPOLLIN, listener);
    if (!s.ok()) FERRY_LOG(kError, "cannot serve a listening socket: " << s);
  });
}

void Listener::OnEvents(uint32_t) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int c = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) FERRY_LOG(kWarning, "accept: " << ErrnoString(errno));
      return;
    }
    int pid = 0;
    if (kind_ == Kind::kTcp) {
      SetNoDelay(c);
      if (send_buffer_ != 0) SetSendBuffer(c, static_cast<int>(send_buffer_));
    } else {
      pid = PeerPid(c);
    }
    EventLoop* loop = loops_[next_++ % loops_.size()];
    auto conn = std::make_shared<Connection>(loop, UniqueFd(c), Connection::Role::kAccepted,
                                             "accepted connection " + std::to_string(c), server_, 0);
    if (pid != 0) conn->SetPeerProcess(pid);
    loop->RunInLoop([conn] {
      Status s = conn->Attach();
      if (!s.ok()) FERRY_LOG(kWarning, "cannot serve accepted connection: " << s);
    });
  }
}

}  // namespace ferry::internal::tcp
