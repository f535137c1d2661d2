// Listener: accepts connections on a listening socket and hands each to a
// loop as a kAccepted Connection, whose first frame the listener's
// FirstFrames answer.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "transport/stream/admission.h"
#include "transport/stream/event_loop.h"
#include "transport/stream/service.h"

namespace ferry::internal::stream {

struct ListenerConfig {
  std::string name;  // for logs: "rpc port 127.0.0.1:4000"
  std::shared_ptr<const FirstFrames> openers;
  std::chrono::milliseconds hello_timeout{5000};
  // Tunes an accepted socket (TCP_NODELAY, buffers) and returns the peer's
  // process id if the socket tells it (unix: SO_PEERCRED), else 0. May be
  // empty.
  std::function<int(int fd)> on_accept;
  // Connections per source and hellos in progress per source; null = no
  // limit (unit tests).
  std::shared_ptr<Admission> admission;
};

class Listener : public EventLoop::Handler {
 public:
  // Serves `fd` (bound, listening, non-blocking) from the pool's first loop,
  // spreading accepted connections over all of them. Returns once the loop
  // watches the socket, or why it cannot (then nothing listens).
  static StatusOr<std::shared_ptr<Listener>> Serve(UniqueFd fd, ListenerConfig cfg,
                                                   const LoopPool& pool);

  Listener(UniqueFd fd, ListenerConfig cfg, std::vector<EventLoop*> loops);
  int fd() const { return fd_.get(); }

  void OnEvents(uint32_t) override;
  void OnTick(Clock::time_point) override {}
  bool WantsTick() const override { return false; }

 private:
  UniqueFd fd_;
  const ListenerConfig cfg_;
  std::vector<EventLoop*> loops_;
  size_t next_ = 0;  // loop thread only
  // Held open so that, out of file descriptors, a pending connection can
  // still be accepted and closed instead of waking the loop forever.
  UniqueFd spare_;
  bool out_of_fds_logged_ = false;  // loop thread only
};

}  // namespace ferry::internal::stream
