#include "cuda/copy_queue.h"

#include <algorithm>
#include <future>

#include "common/log.h"

namespace ferry::internal::cuda {

namespace {

// The PTX of scatter_copy.cu (scripts/gen-scatter-copy-ptx.sh).
constexpr char kScatterCopyPtx[] =
#include "cuda/scatter_copy_ptx.inc"
    ;

// scatter_copy.cu's FerryCopyTask.
struct KernelTask {
  const void* src;
  void* dst;
  unsigned long long len;
};
static_assert(sizeof(KernelTask) == 24);

constexpr unsigned kBlockThreads = 256;  // scatter_copy.cu's __launch_bounds__
constexpr unsigned kMaxBlocks = 4096;

}  // namespace

StatusOr<std::unique_ptr<CopyQueue>> CopyQueue::Create(const CudaDriver& driver, int device) {
  CudaContextScope scope(driver, device);
  FERRY_RETURN_IF_ERROR(scope.status());
  FERRY_ASSIGN_OR_RETURN(CudaDriver::Stream stream, driver.CreateStream());
  std::unique_ptr<CopyQueue> q(new CopyQueue(driver, device, stream));
  if (Status k = q->LoadKernel(); !k.ok()) {
    FERRY_LOG(kInfo, "GPU copies on cuda:" << device << " without the copy kernel: " << k);
  }
  return q;
}

Status CopyQueue::LoadKernel() {
  if (!driver_.has_kernels()) return UnimplementedError("the driver cannot load kernels");
  FERRY_ASSIGN_OR_RETURN(module_, driver_.LoadModule(kScatterCopyPtx));
  auto f = driver_.GetFunction(module_, "ferry_scatter_copy");
  if (!f.ok()) {
    driver_.UnloadModule(module_);
    module_ = nullptr;
    return f.status();
  }
  kernel_ = *f;
  return OkStatus();
}

HostBlock CopyQueue::TakeBlock(size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_blocks_.size(); ++i) {
      if (free_blocks_[i].size >= bytes) {
        HostBlock b = free_blocks_[i];
        free_blocks_[i] = free_blocks_.back();
        free_blocks_.pop_back();
        return b;
      }
    }
  }
  const size_t size = std::max<size_t>(64 << 10, (bytes + 4095) / 4096 * 4096);
  auto p = driver_.AllocateHost(size);  // (the queue's context is current)
  return p.ok() ? HostBlock{*p, size} : HostBlock{};
}

void CopyQueue::GiveBack(HostBlock b) {
  if (b.p == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  free_blocks_.push_back(b);
}

Status CopyQueue::LaunchKernel(std::span<const Copy> copies, HostBlock* table) {
  size_t tasks = 0;
  for (const Copy& c : copies) tasks += (c.length + kTaskBytes - 1) / kTaskBytes;
  if (tasks == 0) return OkStatus();  // nothing to move
  *table = TakeBlock(tasks * sizeof(KernelTask));
  if (table->p == nullptr) return ResourceExhaustedError("no page-locked memory for a task list");
  auto* t = static_cast<KernelTask*>(table->p);
  for (const Copy& c : copies) {
    for (size_t at = 0; at < c.length; at += kTaskBytes) {
      *t++ = {static_cast<const char*>(c.src) + at, static_cast<char*>(c.dst) + at,
              std::min(kTaskBytes, c.length - at)};
    }
  }
  void* list = table->p;
  unsigned long long n = tasks;
  void* params[] = {&list, &n};
  const unsigned grid = static_cast<unsigned>(std::min<size_t>(tasks, kMaxBlocks));
  return driver_.Launch(kernel_, grid, kBlockThreads, stream_, params);
}

Status CopyQueue::QueueCopies(std::span<const Copy> copies) {
  if (copies.size() > 1 && batch_) {
    // One driver call for them all (cuMemcpyBatchAsync). If the driver
    // refuses it, the copies go one by one: those it may have queued run
    // twice, which is harmless (their sources stay as they are until
    // `done`). A refusal is not tried again on this queue.
    dsts_.clear();
    srcs_.clear();
    lengths_.clear();
    for (const Copy& c : copies) {
      dsts_.push_back(c.dst);
      srcs_.push_back(c.src);
      lengths_.push_back(c.length);
    }
    Status batched =
        driver_.CopyBatchAsync(dsts_.data(), srcs_.data(), lengths_.data(), copies.size(), stream_);
    if (batched.ok()) return OkStatus();
    FERRY_LOG(kWarning, "GPU copies on cuda:" << device_ << " go one by one: " << batched);
    batch_ = false;
  }
  for (const Copy& c : copies) {
    FERRY_RETURN_IF_ERROR(driver_.CopyAsync(c.dst, c.src, c.length, stream_));
  }
  return OkStatus();
}

CopyQueue::CopyQueue(const CudaDriver& driver, int device, CudaDriver::Stream stream)
    : driver_(driver), device_(device), stream_(stream), batch_(driver.has_batch_copies()) {
  thread_ = std::thread([this] { Run(); });
}

CopyQueue::~CopyQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();  // runs every pending `done` first
  CudaContextScope scope(driver_, device_);
  if (!scope.status().ok()) return;
  for (CudaDriver::Event e : free_events_) driver_.DestroyEvent(e);
  driver_.DestroyStream(stream_);
  for (const HostBlock& b : free_blocks_) (void)driver_.FreeHost(b.p);
  driver_.UnloadModule(module_);
}

StatusOr<CudaDriver::Event> CopyQueue::TakeEvent() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_events_.empty()) {
      CudaDriver::Event e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  return driver_.CreateEvent();
}

void CopyQueue::Submit(std::span<const Copy> copies, std::function<void(Status)> done,
                       bool on_device) {
  Pending p;
  p.done = std::move(done);
  {
    std::lock_guard<std::mutex> order(submit_mu_);
    CudaContextScope scope(driver_, device_);
    p.status = scope.status();
    if (p.status.ok()) {
      bool launched = false;
      if (on_device && copies.size() > 1 && kernel_ != nullptr) {
        // A launch that could not be queued ran nothing: the copies go as
        // others do. (One whose copies fault on the GPU fails the event.)
        Status k = LaunchKernel(copies, &p.table);
        launched = k.ok();
        if (!launched) {
          GiveBack(p.table);
          p.table = {};
          FERRY_LOG(kWarning, "GPU copies on cuda:" << device_ << " without the kernel: " << k);
        }
      }
      if (!launched) p.status = QueueCopies(copies);
      // The event follows whatever was queued, so `done` runs only once no
      // copy of this submission can still touch its memory.
      auto event = TakeEvent();
      Status recorded = event.ok() ? driver_.RecordEvent(*event, stream_) : event.status();
      if (recorded.ok()) {
        p.event = *event;
      } else {
        if (event.ok()) driver_.DestroyEvent(*event);
        if (p.status.ok()) p.status = recorded;
        // Without an event, wait for the stream before saying anything.
        Status drained = driver_.WaitStream(stream_);
        if (p.status.ok()) p.status = drained;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(p));
  }
  cv_.notify_one();
}

Status CopyQueue::Drain(Clock::time_point deadline) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> f = promise->get_future();
  Submit({}, [promise](Status s) { promise->set_value(std::move(s)); });
  if (f.wait_until(deadline) != std::future_status::ready) {
    return DeadlineExceededError("GPU copies on cuda:" + std::to_string(device_) +
                                 " did not finish in time");
  }
  return f.get();
}

void CopyQueue::Run() {
  CudaContextScope scope(driver_, device_);  // for the event calls
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, and everything is done
      p = std::move(pending_.front());
      pending_.pop_front();
    }
    if (p.event != nullptr) {
      // A spin of up to kSpin catches copies of up to some hundred MiB on
      // the GPU without the blocking wait's wake-up (about 10 % of a 64 MiB
      // copy's 45 us on an H200); then wait for this event alone.
      StatusOr<bool> ready = false;
      const auto spin_end = Clock::now() + kSpin;
      do {
        ready = driver_.EventDone(p.event);
      } while (ready.ok() && !*ready && Clock::now() < spin_end);
      Status waited =
          ready.ok() ? (*ready ? OkStatus() : driver_.WaitEvent(p.event)) : ready.status();
      if (p.status.ok() && !waited.ok())
        p.status = waited.WithPrefix("GPU copy on cuda:" + std::to_string(device_));
      std::lock_guard<std::mutex> lock(mu_);
      free_events_.push_back(p.event);
    }
    GiveBack(p.table);  // (the launch that read it has completed)
    p.done(std::move(p.status));
  }
}

}  // namespace ferry::internal::cuda
