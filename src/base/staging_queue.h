// StagingQueue: the queue and worker thread of a transport wrapper that moves
// some slices through buffers of its own (GPU staging, file staging).
//
// A staged slice waits in order until the stager has room for it (its
// buffer or byte budget: CanStartLocked / TakeLocked), is started (Start:
// a write first fills its buffer, from the device or the file; a read is
// ready at once), and once ready its inner slice is posted (PostReady) from
// the worker thread, never from the thread that made it ready (another
// transport's completion thread, the file ring's reaper). It ends by Finish:
// the caller's slice completes, a staged write leaves the link's WriteFence
// and what it held is given back (ReleaseLocked). A slice still waiting at
// its deadline fails kDeadlineExceeded.
//
// Lifetime: Stop waits until no slice waits, is ready or holds room (each
// ends by its completion, bounded by its deadline; inner links fail what
// they hold once their transport shut down), then ends the worker. Finish
// notifies under the lock, so Stop never returns while a completion still
// touches the queue. The stager calls Stop before it goes (a hook cannot
// run from a base destructor).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/batch.h"
#include "base/memory_registry.h"
#include "base/target.h"
#include "base/transport.h"
#include "base/wrapping.h"
#include "base/write_fence.h"

namespace ferry::internal {

// What every staged slice carries; a stager's Work derives from it.
struct StagedWork {
  PostContext ctx;
  Slice slice;
  std::shared_ptr<PeerLink> inner;
  std::shared_ptr<WriteFence> writes;  // the link's, for writes to the peer
  MemoryKind local_kind;               // of the slice's local range
  uint64_t seq = 0;                    // a write's number in `writes`
  bool held = false;                   // holds room (TakeLocked succeeded)
};

template <typename Work>
class StagingQueue {
 public:
  // `what`: the staged slices, for messages ("a GPU slice over tcp").
  explicit StagingQueue(std::string what) : what_(std::move(what)) {}
  virtual ~StagingQueue() = default;
  StagingQueue(const StagingQueue&) = delete;
  StagingQueue& operator=(const StagingQueue&) = delete;

  // Queues `work`; once the queue stopped (the transport shut down), fails
  // it at once instead.
  void Add(std::vector<Work> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_) {
        for (Work& w : work) {
          if (w.slice.opcode == Opcode::kWrite) w.seq = w.writes->Add();
          waiting_.push_back(std::move(w));
        }
        if (!worker_.joinable()) worker_ = std::thread([this] { Run(); });
        cv_.notify_all();
        return;
      }
    }
    for (Work& w : work) {
      Finish(std::move(w), CancelledError("engine shut down: " + what_ + " was not started"));
    }
  }

  // Waits until nothing waits, is ready or holds room, then ends the worker.
  void StopWorker() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return held_ == 0 && waiting_.empty() && ready_.empty(); });
      if (stopping_) return;
      stopping_ = true;
      cv_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
  }

 protected:
  // Under mu_: whether `next` (the first waiting slice) may take room now.
  virtual bool CanStartLocked(const Work& next) const = 0;
  // Under mu_: takes `w`'s room (a buffer, bytes of the budget). An error
  // fails the slice.
  virtual Status TakeLocked(Work& w) = 0;
  // Under mu_: gives back what TakeLocked took.
  virtual void ReleaseLocked(Work& w) = 0;
  // Worker thread, no lock: the slices that just took room. Each ends up
  // in Ready or Finish.
  virtual void Start(std::vector<Work> started) = 0;
  // Worker thread, no lock: posts the inner slices of `ready` (in order).
  virtual void PostReady(std::vector<Work> ready) = 0;

  // Any thread: `w` is ready to post (the worker posts it).
  void Ready(Work w) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(std::move(w));
    cv_.notify_all();
  }

  // Any thread: `w` ends with `st`.
  void Finish(Work w, const Status& st) {
    w.ctx.batch->CompleteSlice(w.slice.request, st);
    if (w.seq != 0) w.writes->Done(w.seq);
    // Notified under the lock: once the last slice is done, Stop may return
    // and the stager go as soon as the lock is released.
    std::lock_guard<std::mutex> lock(mu_);
    if (w.held) {
      ReleaseLocked(w);
      --held_;
    }
    cv_.notify_all();
  }

  std::mutex& mu() { return mu_; }  // what the *Locked hooks run under

 private:
  bool CanStartFrontLocked() const { return !waiting_.empty() && CanStartLocked(waiting_.front()); }

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !ready_.empty() || CanStartFrontLocked(); });
      if (!ready_.empty()) {
        // Every slice ready so far, posted together.
        std::vector<Work> ready(std::make_move_iterator(ready_.begin()),
                                std::make_move_iterator(ready_.end()));
        ready_.clear();
        lock.unlock();
        PostReady(std::move(ready));
        lock.lock();
        continue;
      }
      if (stopping_) return;
      // As many waiting slices as there is room for.
      std::vector<Work> started, expired, refused;
      std::vector<Status> why;
      while (CanStartFrontLocked()) {
        Work w = std::move(waiting_.front());
        waiting_.pop_front();
        if (Clock::now() >= w.ctx.deadline) {
          expired.push_back(std::move(w));
          continue;
        }
        Status took = TakeLocked(w);
        if (!took.ok()) {
          refused.push_back(std::move(w));
          why.push_back(std::move(took));
          continue;
        }
        w.held = true;
        ++held_;
        started.push_back(std::move(w));
      }
      lock.unlock();
      for (Work& w : expired) {
        Finish(std::move(w), DeadlineExceededError("no staging buffer for " + what_ +
                                                   " before the transfer deadline"));
      }
      for (size_t i = 0; i < refused.size(); ++i) Finish(std::move(refused[i]), why[i]);
      if (!started.empty()) Start(std::move(started));
      lock.lock();
    }
  }

  const std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> waiting_;  // slices without room yet
  std::deque<Work> ready_;    // slices ready to post
  size_t held_ = 0;           // slices holding room
  bool stopping_ = false;
  std::thread worker_;
};

// The link of a staging wrapper: the slices of a post whose local range
// lies in this engine's memory of `type` go through `queue`; the others
// straight to the inner link.
template <typename Work>
class StagingQueueLink : public StagedLink {
 public:
  // `what`: the staged writes, for the deadline's message (StagedLink).
  StagingQueueLink(std::shared_ptr<PeerLink> inner, std::string what,
                   std::shared_ptr<EngineTarget> self, MemoryKind::Type type,
                   StagingQueue<Work>* queue)
      : StagedLink(std::move(inner), std::move(what)),
        self_(std::move(self)),
        type_(type),
        queue_(queue) {}

  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    if (!self_->registry().ever_non_cpu()) {
      inner()->Post(ctx, std::move(slices));
      return;
    }
    std::vector<Slice> direct;
    std::vector<Work> staged;
    MemoryRegistry::Found last;  // the region of the previous staged slice
    for (const Slice& s : slices) {
      const uint64_t local = reinterpret_cast<uint64_t>(s.local);
      bool stage =
          last.length > 0 && local >= last.addr && local + s.length <= last.addr + last.length;
      if (!stage) {
        MemoryRegistry::Found found;
        stage = self_->registry().Check(local, s.length, "local buffer", &found).ok() &&
                found.kind.type() == type_;
        if (stage) last = found;
      }
      if (!stage) {
        direct.push_back(s);
        continue;
      }
      Work w;
      w.ctx = ctx;
      w.slice = s;
      w.inner = inner();
      w.writes = writes();
      w.local_kind = last.kind;
      staged.push_back(std::move(w));
    }
    if (!direct.empty()) inner()->Post(ctx, std::move(direct));
    if (!staged.empty()) queue_->Add(std::move(staged));
  }

 private:
  const std::shared_ptr<EngineTarget> self_;
  const MemoryKind::Type type_;
  StagingQueue<Work>* const queue_;
};

}  // namespace ferry::internal
