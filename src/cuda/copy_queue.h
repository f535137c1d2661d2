// An in-order queue of GPU copies on one CUDA stream, completed from events.
//
// Submit queues copies (host or device memory on either side: one
// cuMemcpyBatchAsync where the driver has it, else cuMemcpyAsync each) and
// records an event after them; the queue's own thread waits for the
// events in order (a bounded spin on cuEventQuery, kSpin, then cuEventSynchronize of
// that one event: never a device-wide wait) and runs each submission's `done`
// once its bytes are in place. With nothing queued the thread sleeps on a
// condition variable: an idle queue uses no CPU.
#pragma once

#include <chrono>
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

// Page-locked host memory of the driver (cuMemHostAlloc).
struct HostBlock {
  void* p = nullptr;
  size_t size = 0;
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
  // Queues `copies` (in no order among themselves, after everything
  // submitted before); `done` runs on the queue's thread once all of them
  // completed, with the first error if a copy could not be queued or failed
  // on the device (the copies queued before it still ran). Called from any
  // thread. `on_device`: every range of every copy is GPU memory, so that
  // two or more go in one launch of the copy kernel (scatter_copy.cu);
  // otherwise, and where the driver cannot load the kernel, they go in one
  // cuMemcpyBatchAsync, else one cuMemcpyAsync each.
  void Submit(std::span<const Copy> copies, std::function<void(Status)> done,
              bool on_device = false);

  // The kernel's unit of work: copies longer than this are cut into tasks
  // of this many bytes, so that a long copy keeps many blocks busy.
  static constexpr size_t kTaskBytes = size_t{256} << 10;
  // How long the queue's thread polls a submission's event before it blocks.
  static constexpr std::chrono::microseconds kSpin{200};
  // Whether the copy kernel is loaded (else on_device copies go as others).
  bool has_kernel() const { return kernel_ != nullptr; }
  // Returns once everything submitted before it completed, or at
  // `deadline` (kDeadlineExceeded).
  Status Drain(Clock::time_point deadline);

 private:
  CopyQueue(const CudaDriver& driver, int device, CudaDriver::Stream stream);
  void Run();
  StatusOr<CudaDriver::Event> TakeEvent();
  // Loads the copy kernel into this device's context (current), or says why not.
  Status LoadKernel();
  // Queues `copies` as one kernel launch; its task list goes in *table
  // (page-locked, held until the launch completed).
  Status LaunchKernel(std::span<const Copy> copies, HostBlock* table);
  Status QueueCopies(std::span<const Copy> copies);  // batch call, else one by one
  HostBlock TakeBlock(size_t bytes);
  void GiveBack(HostBlock b);

  struct Pending {
    CudaDriver::Event event = nullptr;  // null: nothing was queued (its status says why)
    Status status;
    std::function<void(Status)> done;
    HostBlock table;  // the kernel's task list, if it launched one
  };

  const CudaDriver& driver_;
  const int device_;
  CudaDriver::Stream stream_;
  std::mutex submit_mu_;  // orders the copies on the stream with their events in `pending_`
  // Guarded by submit_mu_: whether copies go in one driver call
  // (cuMemcpyBatchAsync), and that call's arrays, kept to reuse.
  bool batch_;
  CudaDriver::Module module_ = nullptr;  // the copy kernel's, if loaded
  CudaDriver::Function kernel_ = nullptr;

  std::vector<HostBlock> free_blocks_;  // task lists to reuse, guarded by mu_
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> lengths_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
  std::vector<CudaDriver::Event> free_events_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry::internal::cuda
