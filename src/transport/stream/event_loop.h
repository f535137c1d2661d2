// EventLoop: one thread driving non-blocking sockets with epoll.
//
// After activity the loop polls without blocking for `spin` (low latency for
// back-to-back small transfers); with nothing to do it blocks, so an idle
// engine uses no CPU (it wakes every 50 ms only while a handler has a
// deadline to watch).
// Thread contract: RunInLoop may be called from any thread; Add/Modify/
// Remove only on the loop thread (or in a task). The loop thread is started
// by Start and joined by Stop (or the destructor); handlers are called on it
// only. Once the loop stopped, each handler's OnStop ends what waits on it,
// and a task handed to RunInLoop later runs on the caller's thread (or on
// the thread running the stopped loop's tasks at that moment: one at a
// time, in order), so nothing queued to a stopped loop waits forever.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ferry/status.h"

namespace ferry::internal::stream {

class EventLoop {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    virtual void OnEvents(uint32_t events) = 0;
    // Called about every 50 ms while any registered handler WantsTick().
    virtual void OnTick(std::chrono::steady_clock::time_point now) = 0;
    // Whether the handler has a deadline to watch; when none has, the loop
    // sleeps until there is I/O or a task (an idle engine never wakes).
    virtual bool WantsTick() const = 0;
    // A far deadline that needs no ticks meanwhile: a loop with no handler
    // that WantsTick sleeps until the earliest handler's WakeAt (or I/O, or a
    // task), then calls OnTick. Default: none.
    virtual std::chrono::steady_clock::time_point WakeAt() const {
      return std::chrono::steady_clock::time_point::max();
    }
    // The loop stopped: nothing will call OnEvents or OnTick again, so end
    // whatever waits on them (a connection fails its requests in flight).
    // Called once, on the loop's thread, after its last task. Default: none.
    virtual void OnStop() {}
    // Handlers added with AddPolled (a connection over a shared-memory
    // channel, whose bytes raise no epoll event while both sides poll):
    // called on every round of the loop; whether it found work.
    virtual bool Poll() { return false; }
    // The loop is about to block: arrange to be woken through a registered
    // descriptor when work arrives. False if there is work already (the
    // loop does not block). DisarmPoll follows every ArmPoll that returned
    // true, once the loop runs again.
    virtual bool ArmPoll() { return true; }
    virtual void DisarmPoll() {}
  };

  EventLoop(std::string name, std::chrono::microseconds spin);
  ~EventLoop();

  Status Start();
  // Runs pending tasks, then stops the thread; every handler's OnStop runs
  // and the handlers are dropped.
  void Stop();

  // Runs `fn` on the loop thread (FIFO order among tasks); once the loop has
  // stopped, before returning on this thread, unless a task running at that
  // moment handed it over (it runs after that task).
  void RunInLoop(std::function<void()> fn);
  bool InLoopThread() const { return std::this_thread::get_id() == thread_id_; }
  // Makes a loop blocked in epoll_wait run one more round (so it re-reads
  // its handlers' deadlines), unless it sleeps only until its next tick
  // (~50 ms) anyway. The round does not count as activity (the loop does
  // not spin after it). Any thread.
  void WakeIfSleeping();

  // Loop thread only. The loop keeps `handler` alive while registered.
  // Fails once the loop has stopped.
  Status Add(int fd, uint32_t events, std::shared_ptr<Handler> handler);
  void Modify(int fd, uint32_t events);
  void Remove(int fd);
  // Polls `handler` on every round (Handler::Poll) until RemovePolled.
  // Loop thread only.
  void AddPolled(std::shared_ptr<Handler> handler);
  void RemovePolled(const Handler* handler);

 private:
  // Polls every polled handler; whether one found work.
  bool PollHandlers();
  // Arms every polled handler before a sleep; false (none left armed) if
  // one has work.
  bool ArmPolled();
  void DisarmPolled();
  void Run();
  void Wake();
  // Runs the tasks handed to the stopped loop until none is left (by the
  // thread that set draining_).
  void DrainStopped();

  const std::string name_;
  const std::chrono::microseconds spin_;
  int epfd_ = -1;
  int wakefd_ = -1;
  std::thread thread_;
  std::thread::id thread_id_;
  std::atomic<bool> stop_{false};
  // True while the loop is (about to be) blocked in epoll_wait. Producers
  // read it (seq_cst) after queueing a task; the loop sets it (seq_cst) before
  // re-checking the queue: one of the two always sees the other.
  std::atomic<bool> sleeping_{false};
  // True while the loop sleeps at most until its next tick (a handler
  // WantsTick); set after sleeping_, cleared when it wakes.
  std::atomic<bool> ticking_sleep_{false};

  std::mutex tasks_mu_;
  std::vector<std::function<void()>> tasks_;
  // Guarded by tasks_mu_: no loop thread runs tasks any more; and a thread
  // runs the stopped loop's tasks now (DrainStopped).
  bool stopped_ = false;
  bool draining_ = false;

  std::unordered_map<int, std::shared_ptr<Handler>> handlers_;  // loop thread only
  // Loop thread only; a removed one is null until the next round drops it.
  std::vector<std::shared_ptr<Handler>> polled_;
  bool polled_holes_ = false;
};

// The event-loop threads of an engine, shared by its socket transports and
// the rpc port; one owner (StreamHost).
class LoopPool {
 public:
  static StatusOr<std::shared_ptr<LoopPool>> Start(int threads, std::chrono::microseconds spin);
  ~LoopPool() { Stop(); }
  std::vector<EventLoop*> loops() const;
  EventLoop* loop(size_t i) const { return loops_[i % loops_.size()].get(); }
  // Stops every loop (idempotent). Anything in flight fails with kCancelled.
  void Stop();

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<EventLoop>> loops_;
};

}  // namespace ferry::internal::stream
