#include "core/prepared_transfer.h"

namespace ferry::internal {

void PostState::Started(uint64_t now_us) {
  std::lock_guard<std::mutex> lock(mu_);
  telemetry_.start_us = now_us;
}

void PostState::Posted(uint64_t now_us) {
  std::lock_guard<std::mutex> lock(mu_);
  telemetry_.post_us = now_us - telemetry_.start_us;
}

void PostState::Finish(Status notify, uint64_t now_us) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    notify_status_ = std::move(notify);
    telemetry_.transfer_us = now_us > telemetry_.start_us ? now_us - telemetry_.start_us : 0;
    cv_.notify_all();
  }
  // After the unlock: a status reader that wakes on it finds the post finished.
  if (signal_ != nullptr) signal_->Notify(CompletionSignal::Finished::kTransfer, transfer_);
}

bool PostState::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

bool PostState::WaitFinished(Clock::time_point deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline, [&] { return finished_; });
}

Status PostState::notify_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return notify_status_;
}

TransferTelemetry PostState::telemetry() const {
  std::lock_guard<std::mutex> lock(mu_);
  return telemetry_;
}

}  // namespace ferry::internal
