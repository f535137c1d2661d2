// Engine::Impl: what an engine owns, built in Create and torn down in one
// stated order. The work is done by the parts it owns, each with its own
// state and lock:
//   Publisher      this engine's descriptor and its copy in the metadata store
//   SegmentTable   the peers opened, their routes and links (handshakes,
//                  restarts, fallback between transports)
//   Submission     Submit's validate / resolve routes / post (submit.h)
//   SliceAndPost   slicing and posting, for Submit and prepared transfers
//                  (poster.h)
//   Notifier       notifications to peers, and the thread of those that
//                  follow prepared transfers
//   CompletionSignal  the eventfd of Engine::CompletionFd, written when a
//                  batch or a prepared transfer's post finishes
// The files that implement Engine: engine.cc (creation, memory, segments,
// batches, notifications) and engine_prepared.cc (prepared lists and
// transfers, metadata export and import, telemetry). Not part of any other
// layer's view of the core.
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "base/batch.h"
#include "base/metrics.h"
#include "base/target.h"
#include "common/handle_table.h"
#include "common/shared_mapping.h"
#include "core/completion_signal.h"
#include "core/metrics_server.h"
#include "core/notifier.h"
#include "core/prepared_transfer.h"
#include "core/publisher.h"
#include "core/segment_table.h"
#include "ferry/engine.h"
#include "metadata/metadata.h"
#include "storage/file_io.h"
#include "transport/registry.h"

namespace ferry {

class Engine::Impl {
 public:
  // Validates `options`, starts the transports, the metadata store (and
  // publishes this engine in it), the watch and the metrics endpoint.
  static StatusOr<std::unique_ptr<Impl>> Create(EngineOptions options);
  // Shutdown order: withdraw from the metadata store; retire every link;
  // stop the transports (a notification in flight then fails); stop the
  // notifier; destroy the metadata store (its watch and threads); stop the
  // metrics endpoint; write the completion signal once more (waiters wake
  // and find the engine gone) and, last of all, close it.
  ~Impl();

  const EngineOptions& options() const { return options_; }
  const std::string& peer_id() const { return publisher_->identity().peer_id; }
  internal::EngineTarget& target() { return *target_; }
  internal::TransportSet& transports() { return *transports_; }
  internal::Publisher& publisher() { return *publisher_; }
  internal::SegmentTable& segments() { return *segments_; }
  internal::Notifier& notifier() { return *notifier_; }
  // Lives as long as the engine: batches and posts hold it by pointer.
  internal::CompletionSignal& completion() { return *completion_; }

  // One step of a caller polling `batch` in a loop (Engine::PollBatch,
  // PollTransfer): BatchState::PollIdle, where a poll counts as part of a
  // tight loop when it comes within kPollTightGap (or 4 x `wait`, if less) of
  // the previous one, and blocks until any of this engine's work finished or
  // `wait` passed. So a long `wait` costs a caller that polls several
  // transfers in turn nothing (it wakes on the first to finish), and one
  // that checks only now and then never waits.
  static constexpr std::chrono::microseconds kPollTightGap{200};
  bool PollStep(internal::BatchState& batch, std::chrono::microseconds wait) {
    const uint64_t seen = completion_->changes();
    return batch.PollIdle(wait, options().wait_spin, std::min(4 * wait, kPollTightGap),
                          [&](std::chrono::steady_clock::time_point deadline) {
                            completion_->WaitForChange(seen, deadline);
                          });
  }
  const std::shared_ptr<internal::Metrics>& metrics() const { return metrics_; }
  const internal::MetricsServer* metrics_server() const { return metrics_server_.get(); }
  internal::HandleTable<internal::BatchState>& batches() { return batches_; }
  internal::HandleTable<internal::PreparedList>& lists() { return lists_; }
  internal::HandleTable<internal::PreparedTransfer>& transfers() { return transfers_; }

  // The engine's file I/O (io_uring), made by the first RegisterFile.
  StatusOr<std::shared_ptr<internal::storage::FileIo>> file_io();
  // The engine's metrics now (Engine::GetMetrics, the metrics server).
  EngineMetrics Snapshot() {
    EngineMetrics m = metrics_->Snapshot(target_->delivered());
    m.batches_open = batches_.size();
    m.peer_links_open = segments_->OpenLinks();
    m.target_staging_bytes = target_->staging()->in_use();
    m.target_staging_bytes_peak = target_->staging()->peak();
    FileCounters(&m);
    return m;
  }
  // Adds the file I/O counters (none before the first RegisterFile).
  void FileCounters(EngineMetrics* m) {
    std::lock_guard<std::mutex> lock(file_io_mu_);
    if (!file_io_) return;
    const internal::storage::FileIo::Counters c = file_io_->counters();
    m->file_direct_ops = c.direct_ops;
    m->file_direct_bytes = c.direct_bytes;
    m->file_buffered_ops = c.buffered_ops;
    m->file_buffered_bytes = c.buffered_bytes;
  }

  // Makes the metadata store show the registry's current regions.
  Status Republish() { return publisher_->Publish(*metadata_); }
  // Whether the metadata store knows peers by "host:port" (P2P) rather than
  // by engine name.
  bool PeersByAddress() const;

  // The object behind a handle; kInvalidArgument naming the handle if it is
  // not live.
  StatusOr<std::shared_ptr<internal::BatchState>> GetBatch(BatchId id) const;
  StatusOr<std::shared_ptr<internal::PreparedList>> GetList(DescListHandle h) const;
  StatusOr<std::shared_ptr<internal::PreparedTransfer>> GetTransfer(TransferHandle h) const;
  // The transfer's current post; kFailedPrecondition if it was never posted.
  StatusOr<std::shared_ptr<internal::PostState>> CurrentPost(TransferHandle h) const;

 private:
  Impl() = default;
  Status Start(const std::shared_ptr<const internal::ClusterSecret>& secret);

  // First: destroyed last, after every batch and post that may notify it.
  std::unique_ptr<internal::CompletionSignal> completion_;

 public:
  // Engine::AllocateShared's memory by address: unmapped by FreeShared, or
  // after everything else of the engine is gone.
  std::mutex shared_mu_;
  std::map<uint64_t, internal::SharedMemory> shared_;  // guarded by shared_mu_

 private:
  EngineOptions options_;
  std::shared_ptr<internal::EngineTarget> target_;
  std::unique_ptr<internal::TransportSet> transports_;
  std::unique_ptr<internal::MetadataStore> metadata_;
  std::unique_ptr<internal::Publisher> publisher_;
  std::shared_ptr<internal::Metrics> metrics_ = std::make_shared<internal::Metrics>();
  std::unique_ptr<internal::SegmentTable> segments_;
  std::unique_ptr<internal::Notifier> notifier_;
  internal::HandleTable<internal::BatchState> batches_;
  internal::HandleTable<internal::PreparedList> lists_;
  internal::HandleTable<internal::PreparedTransfer> transfers_;
  std::unique_ptr<internal::MetricsServer> metrics_server_;
  // Shut down after the transports (nothing submits file I/O any more),
  // which waits for the ops in the kernel; file regions may hold it longer.
  std::mutex file_io_mu_;
  std::shared_ptr<internal::storage::FileIo> file_io_;  // guarded by file_io_mu_
};

}  // namespace ferry
