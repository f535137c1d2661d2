// The engine's prepared lists and transfers (Engine::PrepareLocalList ...
// MakeTransfer, PostTransfer): a prepared list with the segment of its peer,
// a transfer bound to one peer instance, and each post of it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "base/batch.h"
#include "core/completion_signal.h"
#include "core/prepared.h"
#include "core/segment_table.h"
#include "ferry/engine.h"

namespace ferry::internal {

// One post of a prepared transfer: its batch, telemetry and the outcome of
// its notification. Its finish notifies `signal` (the engine's, which
// outlives every post; may be null) naming `transfer` (its handle's value).
class PostState {
 public:
  PostState(size_t entries, uint64_t bytes, std::shared_ptr<Metrics> metrics,
            CompletionSignal* signal = nullptr, uint64_t transfer = 0)
      : batch_(std::make_shared<BatchState>(entries, std::move(metrics))),
        signal_(signal),
        transfer_(transfer) {
    telemetry_.bytes = bytes;
    telemetry_.entries = entries;
  }
  const std::shared_ptr<BatchState>& batch() const { return batch_; }

  // Marks the start of the post (now), and later how long posting took.
  void Started(uint64_t now_us);
  void Posted(uint64_t now_us);
  // Marks the post finished at `now_us`: its data done (or failed) and its
  // notification settled with `notify`. Only the first call counts (and
  // notifies the completion signal).
  void Finish(Status notify, uint64_t now_us);
  bool finished() const;
  // Waits until finished or `deadline`; whether it finished.
  bool WaitFinished(Clock::time_point deadline) const;
  // The notification's outcome (OK until finished).
  Status notify_status() const;
  TransferTelemetry telemetry() const;

 private:
  const std::shared_ptr<BatchState> batch_;
  CompletionSignal* const signal_;
  const uint64_t transfer_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  TransferTelemetry telemetry_;  // guarded by mu_; transfer_us once finished
  bool finished_ = false;        // guarded by mu_
  Status notify_status_;         // guarded by mu_
};

// A prepared list as the engine keeps it: remote lists with their segment.
struct PreparedList {
  std::shared_ptr<const DescList> list;
  std::shared_ptr<Segment> seg;  // remote lists only
};

// A prepared transfer: what MakeTransfer checked, fixed for its life, and
// its current post.
class PreparedTransfer {
 public:
  struct Spec {
    Opcode opcode = Opcode::kWrite;
    std::shared_ptr<Segment> seg;
    std::shared_ptr<const DescList> local;  // kept for StillRegistered
    std::shared_ptr<const PeerInfo> peer;   // the instance the remote list was checked against
    PreparedPairs pairs;
    std::optional<Notification> notification;
  };
  explicit PreparedTransfer(Spec spec) : spec_(std::move(spec)) {}

  const Spec& spec() const { return spec_; }
  // One Post / Cancel / status check at a time: hold this while reading or
  // replacing the current post.
  std::mutex& mu() { return mu_; }
  // Null until posted. REQUIRES: mu() held.
  const std::shared_ptr<PostState>& current() const { return current_; }
  void set_current(std::shared_ptr<PostState> p) { current_ = std::move(p); }

 private:
  const Spec spec_;
  std::mutex mu_;
  std::shared_ptr<PostState> current_;  // guarded by mu_
};

}  // namespace ferry::internal
