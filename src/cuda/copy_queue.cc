#include "cuda/copy_queue.h"

#include <future>

namespace ferry::internal::cuda {

StatusOr<std::unique_ptr<CopyQueue>> CopyQueue::Create(const CudaDriver& driver, int device) {
  CudaContextScope scope(driver, device);
  FERRY_RETURN_IF_ERROR(scope.status());
  FERRY_ASSIGN_OR_RETURN(CudaDriver::Stream stream, driver.CreateStream());
  return std::unique_ptr<CopyQueue>(new CopyQueue(driver, device, stream));
}

CopyQueue::CopyQueue(const CudaDriver& driver, int device, CudaDriver::Stream stream)
    : driver_(driver), device_(device), stream_(stream) {
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

void CopyQueue::Submit(std::span<const Copy> copies, std::function<void(Status)> done) {
  Pending p;
  p.done = std::move(done);
  {
    std::lock_guard<std::mutex> order(submit_mu_);
    CudaContextScope scope(driver_, device_);
    p.status = scope.status();
    if (p.status.ok()) {
      for (const Copy& c : copies) {
        p.status = driver_.CopyAsync(c.dst, c.src, c.length, stream_);
        if (!p.status.ok()) break;
      }
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
      // A short spin catches small copies; then wait for this event alone.
      StatusOr<bool> ready = false;
      for (int i = 0; i < 64; ++i) {
        ready = driver_.EventDone(p.event);
        if (!ready.ok() || *ready) break;
      }
      Status waited =
          ready.ok() ? (*ready ? OkStatus() : driver_.WaitEvent(p.event)) : ready.status();
      if (p.status.ok() && !waited.ok())
        p.status = waited.WithPrefix("GPU copy on cuda:" + std::to_string(device_));
      std::lock_guard<std::mutex> lock(mu_);
      free_events_.push_back(p.event);
    }
    p.done(std::move(p.status));
  }
}

}  // namespace ferry::internal::cuda
