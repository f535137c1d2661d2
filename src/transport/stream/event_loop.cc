#include "transport/stream/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/cpu_relax.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "common/net.h"

namespace ferry::internal::stream {

using Clock = std::chrono::steady_clock;

EventLoop::EventLoop(std::string name, std::chrono::microseconds spin)
    : name_(std::move(name)), spin_(spin) {}

EventLoop::~EventLoop() {
  Stop();
  if (epfd_ >= 0) ::close(epfd_);
  if (wakefd_ >= 0) ::close(wakefd_);
}

Status EventLoop::Start() {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) {
    return DescriptorError(StatusCode::kInternal, "an event loop's epoll_create1", errno);
  }
  wakefd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakefd_ < 0) return DescriptorError(StatusCode::kInternal, "an event loop's eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wakefd_;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) != 0) {
    return InternalError("epoll_ctl: " + ErrnoString(errno));
  }
  thread_ = std::thread([this] { Run(); });
  thread_id_ = thread_.get_id();  // set here, before anyone else can see the loop
  return OkStatus();
}

void EventLoop::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  Wake();
  thread_.join();
}

void EventLoop::Wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakefd_, &one, sizeof(one));
}

void EventLoop::WakeIfSleeping() {
  if (sleeping_.load(std::memory_order_seq_cst) &&
      !ticking_sleep_.load(std::memory_order_seq_cst)) {
    Wake();
  }
}

void EventLoop::RunInLoop(std::function<void()> fn) {
  bool drain = false;
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks_.push_back(std::move(fn));
    if (stopped_ && !draining_) drain = draining_ = true;
  }
  if (drain) {
    DrainStopped();  // no loop thread runs tasks any more
  } else if (sleeping_.load(std::memory_order_seq_cst)) {
    Wake();
  }
}

void EventLoop::DrainStopped() {
  std::vector<std::function<void()>> tasks;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      if (tasks_.empty()) {
        draining_ = false;
        return;
      }
      tasks.swap(tasks_);
    }
    for (auto& t : tasks) t();
    tasks.clear();
  }
}

Status EventLoop::Add(int fd, uint32_t events, std::shared_ptr<Handler> handler) {
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    if (stopped_) return UnavailableError("event loop " + name_ + " stopped");
  }
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (::epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return InternalError("epoll_ctl add: " + ErrnoString(errno));
  }
  handlers_[fd] = std::move(handler);
  return OkStatus();
}

void EventLoop::Modify(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  ::epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev);
}

void EventLoop::Remove(int fd) {
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(fd);
}

void EventLoop::AddPolled(std::shared_ptr<Handler> handler) {
  polled_.push_back(std::move(handler));
}

void EventLoop::RemovePolled(const Handler* handler) {
  for (auto& h : polled_) {
    if (h.get() == handler) {
      h.reset();
      polled_holes_ = true;
    }
  }
}

bool EventLoop::PollHandlers() {
  if (polled_holes_) {
    std::erase(polled_, nullptr);
    polled_holes_ = false;
  }
  bool work = false;
  // (By index: a handler may remove itself, which only leaves a hole.)
  for (size_t i = 0; i < polled_.size(); ++i) {
    if (!polled_[i]) continue;
    std::shared_ptr<Handler> h = polled_[i];
    if (h->Poll()) work = true;
  }
  return work;
}

bool EventLoop::ArmPolled() {
  for (size_t i = 0; i < polled_.size(); ++i) {
    if (polled_[i] && !polled_[i]->ArmPoll()) {
      for (size_t j = 0; j < i; ++j) {
        if (polled_[j]) polled_[j]->DisarmPoll();
      }
      return false;
    }
  }
  return true;
}

void EventLoop::DisarmPolled() {
  for (size_t i = 0; i < polled_.size(); ++i) {
    if (polled_[i]) polled_[i]->DisarmPoll();
  }
}

void EventLoop::Run() {
  constexpr int kMaxEvents = 64;
  constexpr auto kTick = std::chrono::milliseconds(50);
  epoll_event events[kMaxEvents];
  std::vector<std::function<void()>> tasks;
  Clock::time_point last_activity = Clock::now();
  Clock::time_point next_tick = Clock::now() + kTick;
  constexpr unsigned kSyscallRound = 16;
  unsigned poll_rounds = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(tasks_mu_);
      tasks.swap(tasks_);
    }
    bool active = !tasks.empty();
    for (auto& t : tasks) t();
    tasks.clear();
    if (stop_.load()) break;
    if (!polled_.empty() && PollHandlers()) active = true;

    int timeout_ms = 0;
    bool armed = false;
    Clock::time_point now = Clock::now();
    if (active) last_activity = now;
    if (now - last_activity >= spin_) {
      // Nothing recent: block, but re-check the queue after announcing it.
      sleeping_.store(true, std::memory_order_seq_cst);
      bool queued;
      {
        std::lock_guard<std::mutex> lock(tasks_mu_);
        queued = !tasks_.empty();
      }
      if (queued) {
        sleeping_.store(false, std::memory_order_relaxed);
        continue;
      }
      if (!polled_.empty()) {
        if (!ArmPolled()) {  // work arrived meanwhile: poll it
          sleeping_.store(false, std::memory_order_relaxed);
          continue;
        }
        armed = true;
      }
      // One pass: whether a handler wants the tick, else the earliest
      // wake-up any handler asked for.
      bool ticking = false;
      Clock::time_point wake = Clock::time_point::max();
      for (const auto& [fd, h] : handlers_) {
        if (h->WantsTick()) {
          ticking = true;
          break;
        }
        wake = std::min(wake, h->WakeAt());
      }
      if (!ticking) {
        timeout_ms = -1;
        if (wake != Clock::time_point::max()) {
          // Rounded up, so the wake-up finds the deadline passed; at most an
          // hour per sleep.
          const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - now).count();
          timeout_ms = static_cast<int>(std::clamp<long long>(ms, 1, 3'600'000));
          next_tick = now;  // the wake-up ticks
        }
      } else {
        if (now >= next_tick + kTick) next_tick = now + kTick;  // was asleep: start afresh
        timeout_ms = static_cast<int>(std::max<long long>(
            1, std::chrono::duration_cast<std::chrono::milliseconds>(next_tick - now).count()));
        ticking_sleep_.store(true, std::memory_order_seq_cst);
      }
    }
    // Spinning with polled handlers (shared-memory rings): most rounds only
    // poll them; one in kSyscallRound also looks at the sockets and yields
    // the core. (A request in a ring is found without waiting for two
    // system calls.)
    if (timeout_ms == 0 && !polled_.empty() && ++poll_rounds % kSyscallRound != 0) {
      CpuRelax();
      continue;
    }
    // While spinning, give the core to any other runnable thread between
    // polls: on a machine with few cores the thread we wait for (a peer's
    // loop, the caller) may be queued behind us.
    if (timeout_ms == 0) std::this_thread::yield();
    int n = ::epoll_wait(epfd_, events, kMaxEvents, timeout_ms);
    sleeping_.store(false, std::memory_order_relaxed);
    ticking_sleep_.store(false, std::memory_order_relaxed);
    if (armed) DisarmPolled();
    if (n < 0 && errno != EINTR) {
      FERRY_LOG(kError, "event loop " << name_ << ": epoll_wait: " << ErrnoString(errno));
      break;
    }
    int handled = 0;  // events other than a wake-up
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wakefd_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wakefd_, &v, sizeof(v));
        continue;
      }
      ++handled;
      auto it = handlers_.find(fd);
      if (it == handlers_.end()) continue;
      std::shared_ptr<Handler> h = it->second;  // may remove itself
      h->OnEvents(events[i].events);
    }
    now = Clock::now();
    // (A wake-up alone is not activity: its tasks are, next round.)
    if (handled > 0) last_activity = now;
    if (now >= next_tick) {
      next_tick = now + kTick;
      std::vector<std::shared_ptr<Handler>> hs;
      hs.reserve(handlers_.size());
      for (auto& [fd, h] : handlers_) hs.push_back(h);
      for (auto& h : hs) h->OnTick(now);
    }
  }
  // The last pass: the tasks queued until now run, then every handler ends
  // what waits on it, then the tasks those handed over. From here on a task
  // runs on the thread that hands it over (RunInLoop), or on the one
  // draining the tasks at that moment: one at a time, in order.
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    stopped_ = true;
    draining_ = true;
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
  std::vector<std::shared_ptr<Handler>> hs;
  hs.reserve(handlers_.size());
  for (auto& [fd, h] : handlers_) hs.push_back(h);
  for (auto& h : hs) h->OnStop();
  hs.clear();
  handlers_.clear();
  polled_.clear();
  DrainStopped();
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

}  // namespace ferry::internal::stream
