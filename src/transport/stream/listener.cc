#include "transport/stream/listener.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <future>

#include "common/log.h"
#include "transport/stream/connection.h"

namespace ferry::internal::stream {

Listener::Listener(UniqueFd fd, ListenerConfig cfg, std::vector<EventLoop*> loops)
    : fd_(std::move(fd)), cfg_(std::move(cfg)), loops_(std::move(loops)) {}

StatusOr<std::shared_ptr<Listener>> Listener::Serve(UniqueFd fd, ListenerConfig cfg, const LoopPool& pool) {
  auto listener = std::make_shared<Listener>(std::move(fd), std::move(cfg), pool.loops());
  EventLoop* loop = pool.loop(0);
  std::promise<Status> added;
  std::future<Status> result = added.get_future();
  loop->RunInLoop([loop, listener, &added] {
    added.set_value(loop->Add(listener->fd(), EPOLLIN, listener));
  });
  Status s = result.get();
  if (!s.ok()) return s.WithPrefix("cannot serve " + listener->cfg_.name);
  return listener;
}

void Listener::OnEvents(uint32_t) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int c = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) FERRY_LOG(kWarning, cfg_.name << ": accept: " << ErrnoString(errno));
      return;
    }
    UniqueFd accepted(c);
    const int pid = cfg_.on_accept ? cfg_.on_accept(c) : 0;
    EventLoop* loop = loops_[next_++ % loops_.size()];
    auto conn = std::make_shared<Connection>(loop, std::move(accepted),
                                             "accepted connection " + std::to_string(c) + " on " + cfg_.name,
                                             cfg_.openers, cfg_.hello_timeout);
    if (pid != 0) conn->SetPeerProcess(pid);
    loop->RunInLoop([conn] {
      Status s = conn->Attach();
      if (!s.ok()) FERRY_LOG(kWarning, "cannot serve accepted connection: " << s);
    });
  }
}

}  // namespace ferry::internal::stream
