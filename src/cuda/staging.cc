#include "cuda/staging.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "base/staging_queue.h"
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

struct GpuWork : StagedWork {
  char* buffer = nullptr;  // the page-locked buffer while it has one
  bool retire = false;     // the inner link may still write the buffer: not reused
};

// A staging buffer taken out of use: freed once nothing may write it any
// more (the inner post's batch is let go). Needs only the driver, which
// outlives the stager.
class RetiredBuffer {
 public:
  ~RetiredBuffer() {
    if (buffer_ == nullptr || driver_ == nullptr) return;
    Status s = driver_->FreeHost(buffer_);
    if (!s.ok()) FERRY_LOG(kWarning, "freeing a retired staging buffer: " << s);
  }
  void Set(const CudaDriver* driver, char* buffer) {
    driver_ = driver;
    buffer_ = buffer;
  }

 private:
  const CudaDriver* driver_ = nullptr;
  char* buffer_ = nullptr;
};

// The transport's staging machinery, shared by its links: the page-locked
// buffers (at most kBuffers), a copy queue per device, and the queue and
// worker (base/staging_queue.h). Lives as long as the transport; waits for
// its work on the way out.
class Stager : public StagingQueue<GpuWork> {
 public:
  using Work = GpuWork;
  Stager(std::string cuda_driver, uint32_t chunk, std::string transport)
      : StagingQueue("a GPU slice over " + transport),
        cuda_driver_(std::move(cuda_driver)),
        chunk_(chunk),
        transport_(std::move(transport)) {}
  ~Stager() override { Stop(); }

  void Stop() {
    StopWorker();
    {
      std::lock_guard<std::mutex> lock(queues_mu_);
      queues_.clear();  // no work left: their threads end
    }
    const CudaDriver* d = DriverFor(cuda_driver_);
    std::lock_guard<std::mutex> lock(mu());
    for (char* b : buffers_) {
      Status s = d != nullptr ? d->FreeHost(b) : OkStatus();
      if (!s.ok()) FERRY_LOG(kWarning, "staging over " << transport_ << ": " << s);
    }
    buffers_.clear();
    free_.clear();
  }

 private:
  bool CanStartLocked(const Work&) const override {
    return !free_.empty() || buffers_.size() < kBuffers;
  }

  Status TakeLocked(Work& w) override {
    if (free_.empty()) {
      Status made = AddBufferLocked(w.local_kind.device());
      if (!made.ok()) return made.WithPrefix("a staging buffer for GPU memory over " + transport_);
    }
    w.buffer = free_.back();
    free_.pop_back();
    return OkStatus();
  }

  Status AddBufferLocked(int device) {
    const CudaDriver* d = DriverFor(cuda_driver_);
    if (d == nullptr) return FailedPreconditionError("no CUDA driver");
    CudaContextScope scope(*d, device);
    FERRY_RETURN_IF_ERROR(scope.status());
    FERRY_ASSIGN_OR_RETURN(void* b, d->AllocateHost(chunk_));
    buffers_.push_back(static_cast<char*>(b));
    free_.push_back(static_cast<char*>(b));
    return OkStatus();
  }

  void ReleaseLocked(Work& w) override {
    if (w.retire) {
      // Another buffer may be made in its place; this one is freed by the
      // RetiredBuffer that holds it.
      buffers_.erase(std::find(buffers_.begin(), buffers_.end(), w.buffer));
    } else {
      free_.push_back(w.buffer);
    }
    w.buffer = nullptr;
  }

  void Start(std::vector<Work> started) override {
    for (Work& w : started) StartOne(std::move(w));
  }

  void PostReady(std::vector<Work> ready) override {
    for (Work& w : ready) PostInner(std::move(w));
  }

  StatusOr<cuda::CopyQueue*> QueueFor(int device) {
    std::lock_guard<std::mutex> lock(queues_mu_);
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
  void StartOne(Work w) {
    if (w.slice.opcode == Opcode::kRead) {
      PostInner(std::move(w));
      return;
    }
    auto q = QueueFor(w.local_kind.device());
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
      Ready(std::move(*work));
    });
  }

  // Moves the buffer's bytes with the inner link, through a batch of one.
  void PostInner(Work w) {
    auto shadow = std::make_shared<BatchState>(1);
    (void)shadow->Reserve(1);
    auto work = std::make_shared<Work>(std::move(w));
    BatchState* raw = shadow.get();
    // A read that failed may still be written by the inner link (the
    // fabric provider keeps a read past its deadline in flight): its buffer
    // is retired, and freed only once the link let go of the batch, with
    // this callback.
    auto retired = std::make_shared<RetiredBuffer>();
    shadow->SetOnIdle([this, work, raw, retired] {
      const Status st = raw->Get(0).status;
      if (!st.ok() && work->slice.opcode == Opcode::kRead) {
        // The driver that made the buffer (it holds buffers only with one).
        work->retire = true;
        retired->Set(DriverFor(cuda_driver_), work->buffer);
      }
      OnInner(std::move(*work), st);
    });
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
    auto q = QueueFor(w.local_kind.device());
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

  const std::string cuda_driver_;
  const uint32_t chunk_;
  const std::string transport_;
  std::vector<char*> buffers_, free_;  // guarded by mu()
  std::mutex queues_mu_;
  std::map<int, std::unique_ptr<cuda::CopyQueue>> queues_;  // guarded by queues_mu_
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
    return std::make_shared<StagingQueueLink<GpuWork>>(
        std::move(inner), "staged GPU writes to the peer over " + std::string(Name()), self_,
        MemoryKind::Type::kCuda, stager_.get());
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
