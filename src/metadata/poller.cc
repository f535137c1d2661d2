#include "metadata/poller.h"

#include <algorithm>
#include <utility>

namespace ferry::internal {

using std::chrono::milliseconds;

StorePoller::StorePoller(Hooks hooks, milliseconds poll_interval)
    : hooks_(std::move(hooks)), poll_interval_(poll_interval) {}

void StorePoller::SetTtl(milliseconds ttl) {
  std::lock_guard<std::mutex> lock(mu_);
  ttl_ = ttl;
  if (ttl_.count() > 0 && !refresher_.joinable() && !stopping_) {
    refresher_ = std::thread([this] { RefreshLoop(); });
  }
}

Status StorePoller::Watch(MetadataStore::ChangeCallback on_change) {
  std::lock_guard<std::mutex> lock(mu_);
  if (watcher_.joinable()) return FailedPreconditionError("this store is already watched");
  if (stopping_) return FailedPreconditionError("this store is shutting down");
  callback_ = std::move(on_change);
  watcher_ = std::thread([this] { WatchLoop(); });
  return OkStatus();
}

void StorePoller::Seen(const std::string& name, std::optional<std::string> value) {
  std::lock_guard<std::mutex> lock(mu_);
  watched_[name] = std::move(value);
}

bool StorePoller::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

bool StorePoller::WaitFor(milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return stopping_; });
  return !stopping_;
}

void StorePoller::Stop() {
  std::thread refresher, watcher;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    refresher = std::move(refresher_);
    watcher = std::move(watcher_);
  }
  cv_.notify_all();
  if (refresher.joinable()) refresher.join();
  if (watcher.joinable()) watcher.join();
}

void StorePoller::RefreshLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::max(ttl_ / 3, kMinRefreshInterval), [&] { return stopping_; });
    if (stopping_ || ttl_.count() == 0) break;
    const milliseconds timeout = std::clamp(ttl_ / 3, kMinRefreshTimeout, kMaxRefreshTimeout);
    lock.unlock();
    for (const std::string& name : hooks_.published()) {
      if (stopping()) break;
      hooks_.refresh(name, timeout);
    }
    lock.lock();
  }
}

void StorePoller::WatchLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, poll_interval_, [&] { return stopping_; });
    if (stopping_) break;
    if (watched_.empty()) continue;
    const std::vector<std::pair<std::string, std::optional<std::string>>> before(watched_.begin(),
                                                                                 watched_.end());
    lock.unlock();
    std::vector<std::string> names;
    names.reserve(before.size());
    for (const auto& [name, value] : before) names.push_back(name);
    const std::vector<std::string> changed = Changes(before, hooks_.read(names));
    for (const std::string& name : changed) {
      if (stopping()) break;
      callback_(name);  // must not block (the engine only marks the segment)
    }
    lock.lock();
  }
}

std::vector<std::string> StorePoller::Changes(
    const std::vector<std::pair<std::string, std::optional<std::string>>>& before,
    std::vector<Reading> now) {
  std::vector<std::string> changed;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < before.size() && i < now.size(); ++i) {
    const auto& [name, last] = before[i];
    if (!now[i].known || now[i].value == last) continue;
    auto it = watched_.find(name);
    if (it == watched_.end() || it->second != last) continue;  // Fetch saw newer bytes meanwhile
    it->second = std::move(now[i].value);
    changed.push_back(name);
  }
  return changed;
}

}  // namespace ferry::internal
