// The completion side of a fabric endpoint (with Posting, UCX's iface): one
// progress thread per endpoint reads the completion queue and hands each
// completion to its owner (an operation to Posting, a message to
// Notifications), posts what callers queued while it is awake, and fails
// the slices of operations past their deadline. It spins a little after
// activity (longer while several operations are in flight and completing),
// then blocks in fi_cq_sread, so an idle engine uses no CPU. It also drives
// the provider's progress for peers that write into this engine
// (manual-progress providers need it).
//
// Threads:
// - Wakeup::Wake, asleep(), stopping(): any thread. Wake after queueing
//   work: the progress thread does not go to sleep past work it has not
//   seen (work_gen_), and a sleeping one is signalled out of fi_cq_sread.
// - Wakeup::Stop and Progress::Stop: Endpoint::Shutdown, once.
// - Everything else of Progress: its own thread (started by Open, joined by
//   Stop). It holds no lock of its own; last_scan_ is its thread's alone.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "base/transport.h"
#include "transport/fabric/fabric_common.h"

namespace ferry::internal::fabric {

class Posting;
class Notifications;

// What callers share with the progress thread: whether it sleeps, the
// generation of queued work, and whether the endpoint is shutting down.
// Atomics only (sequentially consistent where the sleep protocol needs it).
class Wakeup {
 public:
  explicit Wakeup(const Fids& fids) : fids_(fids) {}

  // After queueing work.
  void Wake() {
    work_gen_.fetch_add(1, std::memory_order_seq_cst);
    // A CQ without a wait object has nothing to signal: its nap is short.
    if (fids_.cq_waits && sleeping_.load(std::memory_order_seq_cst)) (void)fi_cq_signal(fids_.cq);
  }
  bool asleep() const { return sleeping_.load(std::memory_order_seq_cst); }
  bool stopping() const { return stop_.load(); }
  // True the first time: the caller shuts the endpoint down.
  bool Stop() { return !stop_.exchange(true); }

  // The progress thread's side: it reads the generation before a round,
  // and goes to sleep only if no work was queued since (BeginSleep false:
  // go round again). EndSleep once it woke up.
  bool running() const { return !stop_.load(std::memory_order_acquire); }
  uint64_t generation() const { return work_gen_.load(std::memory_order_seq_cst); }
  bool BeginSleep(uint64_t gen) {
    sleeping_.store(true, std::memory_order_seq_cst);
    if (stop_.load() || work_gen_.load(std::memory_order_seq_cst) != gen) {
      sleeping_.store(false);
      return false;
    }
    return true;
  }
  void EndSleep() { sleeping_.store(false, std::memory_order_seq_cst); }

 private:
  const Fids& fids_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  // Bumped whenever work is queued.
  std::atomic<uint64_t> work_gen_{0};
};

class Progress {
 public:
  Progress(const EndpointConfig& cfg, const Fids& fids, Wakeup& wakeup, Posting& posting,
           Notifications& notify)
      : cfg_(cfg), fids_(fids), wakeup_(wakeup), posting_(posting), notify_(notify) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Open, once the receives are posted.
  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  // Shutdown, after Wakeup::Stop: wakes the thread and waits for it.
  void Stop();

 private:
  void Run();
  // Blocks until a completion, a Wake or a timeout: briefly while work
  // waits for room, longer when all is quiet.
  void Sleep(uint64_t gen, fi_cq_data_entry* e, Clock::time_point* active);
  // Returns how many completions it handled (<0: none and a hard error).
  ssize_t Drain(fi_cq_data_entry* e, ssize_t n);
  void Handle(const fi_cq_data_entry& e);
  void HandleError();
  // Fails the slices of operations in flight past their deadline.
  void ScanDeadlines(Clock::time_point now);

  const EndpointConfig& cfg_;
  const Fids& fids_;
  Wakeup& wakeup_;
  Posting& posting_;
  Notifications& notify_;
  Clock::time_point last_scan_{};
  std::thread thread_;
};

}  // namespace ferry::internal::fabric
