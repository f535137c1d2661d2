// An in-order queue of GPU copies on one CUDA stream, completed from events.
//
// Submit queues copies (cuMemcpyAsync: host or device memory on either side)
// and records an event after them; the queue's own thread waits for the
// events in order (a bounded spin on cuEventQuery, then cuEventSynchronize of
// that one event: never a device-wide wait) and runs each submission's `done`
// once its bytes are in place. With nothing queued the thread sleeps on a
// condition variable: an idle queue uses no CPU.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "base/transport.h"
#include "common/cuda_driver.h"

namespace ferry::internal::cuda {

struct Copy {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t length = 0;
};

class CopyQueue {
 public:
  // A stream on device `device`'s primary context.
  static StatusOr<std::unique_ptr<CopyQueue>> Create(const CudaDriver& driver, int device);
  // Waits for everything queued, then stops.
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  int device() const { return device_; }
  // Queues `copies` in order; `done` runs on the queue's thread once all of
  // them completed, with the first error if a copy could not be queued or
  // failed on the device (the copies queued before it still ran). Called
  // from any thread.
  void Submit(std::span<const Copy> copies, std::function<void(Status)> done);
  // Returns once everything submitted before it completed, or at
  // `deadline` (kDeadlineExceeded).
  Status Drain(Clock::time_point deadline);

 private:
  CopyQueue(const CudaDriver& driver, int device, CudaDriver::Stream stream);
  void Run();
  StatusOr<CudaDriver::Event> TakeEvent();

  struct Pending {
    CudaDriver::Event event = nullptr;  // null: nothing was queued (its status says why)
    Status status;
    std::function<void(Status)> done;
  };

  const CudaDriver& driver_;
  const int device_;
  CudaDriver::Stream stream_;
  std::mutex submit_mu_;  // orders the copies on the stream with their events in `pending_`
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<CudaDriver::Event> free_events_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry::internal::cuda
