#include "core/notifier.h"

#include "ferry/limits.h"

namespace ferry::internal {

Status CheckNotificationSize(std::string_view name, std::string_view message) {
  if (name.size() <= kMaxNotificationName && message.size() <= kMaxNotificationMessage) {
    return OkStatus();
  }
  return InvalidArgumentError("notification too large: name " + std::to_string(name.size()) +
                              " bytes (at most " + std::to_string(kMaxNotificationName) +
                              "), message " + std::to_string(message.size()) + " bytes (at most " +
                              std::to_string(kMaxNotificationMessage) + ")");
}

Status CheckPeerTakes(const PeerInfo& peer, size_t message_size) {
  if (message_size <= kMaxNotificationMessageV1 || peer.desc().HasFeature("notify-1m")) {
    return OkStatus();
  }
  return FailedPreconditionError("peer " + peer.Label() + " (ferry " + peer.desc().version +
                                 ") takes notification messages of at most " +
                                 std::to_string(kMaxNotificationMessageV1) +
                                 " bytes; this one has " + std::to_string(message_size));
}

Status Notifier::Send(Segment& seg, std::string_view name, std::string_view message,
                      std::optional<uint64_t> instance) {
  auto routed = segments_.Route(seg, MemoryKind::Cpu(), MemoryKind::Cpu());
  if (!routed.ok()) return routed.status().WithPrefix("peer " + seg.name());
  const wire::PeerDescriptor& peer = routed->peer->desc();
  if (instance && peer.instance_id != *instance) {
    return UnavailableError("peer " + seg.name() +
                            " restarted before the transfer's notification was sent");
  }
  FERRY_RETURN_IF_ERROR(CheckPeerTakes(*routed->peer, message.size()));
  const wire::NotifyBody body{sender_, std::string(name), std::string(message)};
  const Clock::time_point deadline = Clock::now() + timeout_;
  Status s;
  for (auto& other : segments_.OtherLinks(seg, *routed->link)) {
    s = other->Flush(deadline);
    if (!s.ok()) break;
  }
  if (s.ok()) s = routed->link->Notify(body, deadline);
  if (!s.ok()) return s.WithPrefix("notification to " + seg.name());
  metrics_.AddNotificationSent();
  return OkStatus();
}

void Notifier::Push(std::function<void(bool run)> job) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopped_) {
    lock.unlock();
    job(false);
    return;
  }
  jobs_.push_back(std::move(job));
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  cv_.notify_one();
}

void Notifier::Stop() {
  std::unique_lock<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_one();
  lock.unlock();
  if (thread_.joinable()) thread_.join();
  lock.lock();
  std::deque<std::function<void(bool)>> left;
  left.swap(jobs_);
  lock.unlock();
  for (auto& j : left) j(false);
}

void Notifier::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopped_ || !jobs_.empty(); });
    if (stopped_) return;
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job(true);
    lock.lock();
  }
}

}  // namespace ferry::internal
