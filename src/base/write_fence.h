// WriteFence: what a wrapping link's Flush and Notify wait for — the writes
// it staged (GPU staging, file staging) that are still in flight, so that a
// notification still follows the data posted before it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>

#include "base/transport.h"

namespace ferry::internal {

class WriteFence {
 public:
  // A new write in flight; its number for Done.
  uint64_t Add() {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.insert(++seq_);
    return seq_;
  }
  void Done(uint64_t s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(s);
    }
    cv_.notify_all();
  }
  // True once every write added before the call is done; false at `deadline`.
  bool Wait(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t upto = seq_;
    return cv_.wait_until(lock, deadline,
                          [&] { return in_flight_.empty() || *in_flight_.begin() > upto; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t seq_ = 0;
  std::set<uint64_t> in_flight_;
};

}  // namespace ferry::internal
