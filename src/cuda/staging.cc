#include "cuda/staging.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "base/wrapping.h"
#include "base/write_fence.h"
#include "common/cuda_driver.h"
#include "common/log.h"
#include "cuda/copy_queue.h"

namespace ferry::internal {
namespace {

constexpr size_t kBuffers = 8;  // page-locked buffers per link

const CudaDriver* DriverFor(const std::string& library) {
  if (!library.empty()) return &CudaDriver::Load(library);
  return CudaDriver::LoadedInProcess() ? &CudaDriver::Get() : nullptr;
}

// The transport's staging machinery, shared by its links: the page-locked
// buffers, a copy queue per device and a worker that starts slices as
// buffers free up (inner posts never run on another transport's completion
// threads). Lives as long as the transport; waits for its work on the way out.
class Stager {
 public:
  Stager(std::string cuda_driver, uint32_t chunk, std::string transport)
      : cuda_driver_(std::move(cuda_driver)), chunk_(chunk), transport_(std::move(transport)) {}
  ~Stager() { Stop(); }

  struct Work {
    PostContext ctx;
    Slice slice;
    std::shared_ptr<PeerLink> inner;
    std::shared_ptr<WriteFence> writes;  // a write's link
    int device = 0;
    uint64_t seq = 0;        // a write's number in writes
    char* buffer = nullptr;  // the page-locked buffer while it has one
  };

  void Add(std::vector<Work> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Work& w : work) {
        if (w.slice.opcode == Opcode::kWrite) w.seq = w.writes->Add();
        waiting_.push_back(std::move(w));
      }
      if (!worker_.joinable() && !stopping_) worker_ = std::thread([this] { Run(); });
    }
    cv_.notify_all();
  }

  void Stop() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // In-flight work ends by its completions (each bounded by its deadline).
      cv_.wait(lock, [&] { return in_flight_ == 0 && waiting_.empty() && ready_.empty(); });
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    queues_.clear();  // no work left: their threads end
    const CudaDriver* d = DriverFor(cuda_driver_);
    for (char* b : buffers_) {
      Status s = d != nullptr ? d->FreeHost(b) : OkStatus();
      if (!s.ok()) FERRY_LOG(kWarning, "staging over " << transport_ << ": " << s);
    }
    buffers_.clear();
    free_.clear();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] {
        return stopping_ || !ready_.empty() || (!waiting_.empty() && CanStartLocked());
      });
      if (!ready_.empty()) {
        Work w = std::move(ready_.front());
        ready_.pop_front();
        lock.unlock();
        PostInner(std::move(w));
        lock.lock();
        continue;
      }
      if (stopping_) return;
      Work w = std::move(waiting_.front());
      waiting_.pop_front();
      if (Clock::now() >= w.ctx.deadline) {
        lock.unlock();
        Finish(std::move(w), DeadlineExceededError("no staging buffer for a GPU slice over " +
                                                   transport_ + " before the transfer deadline"));
        lock.lock();
        continue;
      }
      Status got = TakeBufferLocked(w);
      if (got.ok()) ++in_flight_;
      lock.unlock();
      if (!got.ok()) {
        Finish(std::move(w), got.WithPrefix("a staging buffer for GPU memory over " + transport_));
      } else {
        Start(std::move(w));
      }
      lock.lock();
    }
  }

  bool CanStartLocked() const { return !free_.empty() || buffers_.size() < kBuffers; }

  Status TakeBufferLocked(Work& w) {
    if (free_.empty()) {
      const CudaDriver* d = DriverFor(cuda_driver_);
      if (d == nullptr) return FailedPreconditionError("no CUDA driver");
      CudaContextScope scope(*d, w.device);
      FERRY_RETURN_IF_ERROR(scope.status());
      FERRY_ASSIGN_OR_RETURN(void* b, d->AllocateHost(chunk_));
      buffers_.push_back(static_cast<char*>(b));
      free_.push_back(static_cast<char*>(b));
    }
    w.buffer = free_.back();
    free_.pop_back();
    return OkStatus();
  }

  StatusOr<cuda::CopyQueue*> QueueFor(int device) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& q = queues_[device];
    if (!q) {
      const CudaDriver* d = DriverFor(cuda_driver_);
      if (d == nullptr)
        return FailedPreconditionError("staging over " + transport_ + ": no CUDA driver");
      auto made = cuda::CopyQueue::Create(*d, device);
      if (!made.ok()) {
        queues_.erase(device);
        return made.status();
      }
      q = std::move(*made);
    }
    return q.get();
  }

  // A slice with its buffer: a write copies from the device first.
  void Start(Work w) {
    if (w.slice.opcode == Opcode::kRead) {
      PostInner(std::move(w));
      return;
    }
    auto q = QueueFor(w.device);
    if (!q.ok()) {
      Finish(std::move(w), q.status());
      return;
    }
    auto work = std::make_shared<Work>(std::move(w));
    const cuda::Copy c{work->buffer, work->slice.local, work->slice.length};
    (*q)->Submit({&c, 1}, [this, work](Status st) {
      if (!st.ok()) {
        Finish(std::move(*work), st.WithPrefix("copying a GPU slice into its staging buffer"));
        return;
      }
      // Notified under the lock, as in Finish.
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(*work));
      cv_.notify_all();
    });
  }

  // Moves the buffer's bytes with the inner link, through a batch of one.
  void PostInner(Work w) {
    auto shadow = std::make_shared<BatchState>(1);
    (void)shadow->Reserve(1);
    auto work = std::make_shared<Work>(std::move(w));
    BatchState* raw = shadow.get();
    shadow->SetOnIdle([this, work, raw] { OnInner(std::move(*work), raw->Get(0).status); });
    Slice inner = work->slice;
    inner.local = work->buffer;
    inner.request = 0;
    const PostContext ctx{shadow, work->ctx.deadline, work->ctx.peer};
    std::shared_ptr<PeerLink> link = work->inner;
    shadow->BeginRange(0, 1, [](size_t) { return 1u; });
    link->Post(ctx, {inner});
  }

  // The inner slice finished: a read copies to the device, the rest ends.
  void OnInner(Work w, Status st) {
    if (!st.ok() || w.slice.opcode == Opcode::kWrite) {
      Finish(std::move(w), st);
      return;
    }
    if (!w.ctx.batch->BeginLanding()) {
      Finish(std::move(w), CancelledError("the request's batch was cancelled"));
      return;
    }
    auto q = QueueFor(w.device);
    if (!q.ok()) {
      w.ctx.batch->EndLanding();
      Finish(std::move(w), q.status());
      return;
    }
    auto work = std::make_shared<Work>(std::move(w));
    const cuda::Copy c{work->slice.local, work->buffer, work->slice.length};
    (*q)->Submit({&c, 1}, [this, work](Status s) {
      work->ctx.batch->EndLanding();
      Finish(std::move(*work),
             s.ok() ? s : s.WithPrefix("copying a staged GPU slice to the device"));
    });
  }

  void Finish(Work w, const Status& st) {
    w.ctx.batch->CompleteSlice(w.slice.request, st);
    if (w.seq != 0) w.writes->Done(w.seq);
    // Notified under the lock: once the last slice is done, Stop may return
    // and the stager go as soon as the lock is released.
    std::lock_guard<std::mutex> lock(mu_);
    if (w.buffer != nullptr) {
      free_.push_back(w.buffer);
      --in_flight_;
    }
    cv_.notify_all();
  }

  const std::string cuda_driver_;
  const uint32_t chunk_;
  const std::string transport_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> waiting_;  // slices without a buffer yet
  std::deque<Work> ready_;    // writes copied off the device, to post
  size_t in_flight_ = 0;      // slices holding a buffer
  std::vector<char*> buffers_, free_;
  std::map<int, std::unique_ptr<cuda::CopyQueue>> queues_;
  bool stopping_ = false;
  std::thread worker_;
};

class StagingLink : public StagedLink {
 public:
  StagingLink(std::shared_ptr<PeerLink> inner, std::shared_ptr<EngineTarget> self, Stager* stager,
              const std::string& transport)
      : StagedLink(std::move(inner), "staged GPU writes to the peer over " + transport),
        self_(std::move(self)),
        stager_(stager) {}

  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    if (!self_->registry().ever_non_cpu()) {
      inner()->Post(ctx, std::move(slices));
      return;
    }
    std::vector<Slice> direct;
    std::vector<Stager::Work> staged;
    for (const Slice& s : slices) {
      MemoryRegistry::Found found;
      const bool gpu =
          self_->registry()
              .Check(reinterpret_cast<uint64_t>(s.local), s.length, "local buffer", &found)
              .ok() &&
          found.kind.type() == MemoryKind::Type::kCuda;
      if (!gpu) {
        direct.push_back(s);
        continue;
      }
      staged.push_back({ctx, s, inner(), writes(), found.kind.device(), 0, nullptr});
    }
    if (!direct.empty()) inner()->Post(ctx, std::move(direct));
    if (!staged.empty()) stager_->Add(std::move(staged));
  }

 private:
  const std::shared_ptr<EngineTarget> self_;
  Stager* const stager_;
};

class StagingTransport : public WrappingTransport {
 public:
  StagingTransport(std::unique_ptr<Transport> inner, std::shared_ptr<EngineTarget> self,
                   std::string cuda_driver)
      : WrappingTransport(std::move(inner), CapsOf),
        self_(std::move(self)),
        stager_(std::make_unique<Stager>(std::move(cuda_driver), MaxSlice(), std::string(Name()))) {
  }

  // This side's GPU memory too; the peer's kinds stay the inner transport's.
  static TransportCaps CapsOf(TransportCaps c) {
    if (c.remote_kinds.empty()) c.remote_kinds = c.memory_kinds;
    c.memory_kinds.push_back(MemoryKind::Type::kCuda);
    return c;
  }

 protected:
  std::shared_ptr<PeerLink> Wrap(std::shared_ptr<PeerLink> inner) override {
    return std::make_shared<StagingLink>(std::move(inner), self_, stager_.get(),
                                         std::string(Name()));
  }
  void Drain() override { stager_->Stop(); }

 private:
  const std::shared_ptr<EngineTarget> self_;
  const std::unique_ptr<Stager> stager_;
};

}  // namespace

std::unique_ptr<Transport> WithStaging(std::unique_ptr<Transport> inner,
                                       std::shared_ptr<EngineTarget> self,
                                       std::string cuda_driver) {
  return std::make_unique<StagingTransport>(std::move(inner), std::move(self),
                                            std::move(cuda_driver));
}

}  // namespace ferry::internal
