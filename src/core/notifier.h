// Notifier: the one path by which this engine sends a notification to a
// peer — Engine::SendNotification, and the notification of a finished
// prepared transfer — and the thread the latter run on: they block for a
// round trip, so they must not run on a transport's thread.
//
// A notification follows every write posted to the peer before it: the
// peer's other links are flushed first (PeerLink::Flush), then it is sent on
// the cpu/cpu route's link. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "base/metrics.h"
#include "core/segment_table.h"

namespace ferry::internal {

// kInvalidArgument if a notification's name or message is over the limits
// (ferry/limits.h).
Status CheckNotificationSize(std::string_view name, std::string_view message);
// Peers of builds before "notify-1m" take messages of at most
// kMaxNotificationMessageV1 bytes.
Status CheckPeerTakes(const PeerInfo& peer, size_t message_size);

class Notifier {
 public:
  // Borrows both; they outlive the notifier's Stop.
  Notifier(SegmentTable& segments, Metrics& metrics, std::string sender,
           std::chrono::milliseconds timeout)
      : segments_(segments), metrics_(metrics), sender_(std::move(sender)), timeout_(timeout) {}
  ~Notifier() { Stop(); }

  // Sends the notification to the segment's peer, within the transfer
  // timeout. With `instance`: kUnavailable if the peer is no longer that
  // instance (it restarted after the transfer was prepared).
  Status Send(Segment& seg, std::string_view name, std::string_view message,
              std::optional<uint64_t> instance = std::nullopt);

  // Runs `job` on the notifier's thread (started on first use), one at a
  // time, in order. A job is called with run = false instead when the engine
  // is shutting down.
  void Push(std::function<void(bool run)> job);
  // Drops the jobs not started (calling them with run = false), waits for
  // the one running.
  void Stop();

 private:
  void Loop();

  SegmentTable& segments_;
  Metrics& metrics_;
  const std::string sender_;  // this engine's peer id, as the peer sees it
  const std::chrono::milliseconds timeout_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(bool)>> jobs_;  // guarded by mu_
  bool stopped_ = false;                        // guarded by mu_
  std::thread thread_;
};

}  // namespace ferry::internal
