// Engine: ties the memory registry, segments, batches, metadata and
// transports together. The data path of one write: Submit validates the
// requests, picks a transport per (peer, local memory kind, remote memory
// kind), reserves the requests in the batch, slices them
// (Transport::MaxSlice) and posts the slices to that route's PeerLink; the
// transport completes each slice through BatchState; WaitBatch returns when
// the batch is idle. The engine knows transports only through
// base/transport.h and transport/registry.h.
#include "ferry/engine.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "common/cuda_driver.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "common/net.h"
#include "core/engine_impl.h"
#include "core/submit.h"
#include "ferry/limits.h"
#include "ferry/version.h"
#include "storage/file_segment.h"

namespace ferry {

using internal::BatchState;
using internal::Clock;
using internal::MemoryKind;

std::string_view Version() { return FERRY_VERSION; }

namespace internal {

uint64_t ProcessToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(::getpid());
  }();
  return token;
}

}  // namespace internal

Engine::Impl::~Impl() {
  // Withdrawn first (the store no longer refreshes this engine's entry), but
  // destroyed only after the notifier stopped: a notification job still
  // running may re-handshake through it. Watch callbacks until then only
  // mark segments stale.
  if (metadata_) (void)metadata_->Remove(options_.local_name);
  if (segments_) segments_->RetireAll();
  if (transports_) transports_->Shutdown();
  {
    std::lock_guard<std::mutex> lock(file_io_mu_);
    if (file_io_) file_io_->Shutdown();  // after the transports: nothing submits any more
  }
  if (notifier_) notifier_->Stop();  // after the shutdown: a notification in flight has failed
  metadata_.reset();
  metrics_server_.reset();
  // Nothing finishes any more (the transports and the notifier stopped):
  // wake a waiter once so it finds the engine gone. Closed with the member.
  if (completion_) completion_->Notify();
}

namespace {

uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) | rd();
  return v;
}

// Checks what ValidateOptions does not (the transport's name, the testing
// overrides) and fills in the defaults that depend on other settings.
StatusOr<internal::Identity> Resolve(EngineOptions& options) {
  FERRY_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.transport != "auto" && internal::FindTransport(options.transport) == nullptr) {
    return InvalidArgumentError("transport must be auto or one of " + internal::TransportNames() +
                                ", got '" + options.transport + "'");
  }
  internal::Identity id;
  id.wire_min = kWireVersionMin;
  id.wire_max = kWireVersionMax;
  id.descriptor_format_max = wire::kDescriptorFormatMax;
  if (options.testing.wire_version_max != 0) {
    id.wire_min = options.testing.wire_version_min;
    id.wire_max = options.testing.wire_version_max;
    if (id.wire_min > id.wire_max)
      return InvalidArgumentError("testing wire version range is empty");
  }
  if (options.testing.descriptor_format_max != 0) {
    id.descriptor_format_max =
        std::clamp<uint16_t>(options.testing.descriptor_format_max, wire::kDescriptorFormatMin,
                             wire::kDescriptorFormatMax);
  }
  if (options.io_threads == 0) options.io_threads = std::min(options.tcp_streams, 4);
  id.instance_id = NewInstanceId();
  return id;
}

}  // namespace

StatusOr<std::unique_ptr<Engine::Impl>> Engine::Impl::Create(EngineOptions options) {
  FERRY_ASSIGN_OR_RETURN(internal::Identity id, Resolve(options));
  std::shared_ptr<const internal::ClusterSecret> secret;
  if (!options.secret_file.empty()) {
    FERRY_ASSIGN_OR_RETURN(secret, internal::ClusterSecret::Load(options.secret_file));
  }
  // Before the first descriptor: a process that talks to thousands of
  // peers needs more than the usual soft limit of 1,024 (the hard limit is
  // what it may take without privileges).
  if (options.raise_fd_limit) internal::RaiseFdLimit();
  std::unique_ptr<Impl> impl(new Impl());
  FERRY_ASSIGN_OR_RETURN(impl->completion_, internal::CompletionSignal::Create());
  FERRY_ASSIGN_OR_RETURN(impl->transports_, internal::TransportSet::Create(options));
  id.peer_id = impl->transports_->peer_id();
  if (options.local_name.empty()) options.local_name = id.peer_id;
  impl->target_ = std::make_shared<internal::EngineTarget>(id.instance_id, id.peer_id,
                                                           options.notify_inbox_bytes);
  impl->options_ = std::move(options);
  impl->publisher_ = std::make_unique<internal::Publisher>(impl->options_, std::move(id),
                                                           *impl->target_, *impl->transports_);
  FERRY_RETURN_IF_ERROR(impl->Start(secret));
  FERRY_LOG(kInfo, "engine " << impl->options_.local_name << " listening on " << impl->peer_id());
  return impl;
}

// Starts the transports, then the metadata store (publishing this engine)
// and its watch, then serves the rpc port and the metrics endpoint.
Status Engine::Impl::Start(const std::shared_ptr<const internal::ClusterSecret>& secret) {
  const internal::Identity& id = publisher_->identity();
  internal::TransportContext ctx;
  ctx.options = &options_;
  ctx.target = target_;
  ctx.peer_id = id.peer_id;
  ctx.instance_id = id.instance_id;
  ctx.wire_min = id.wire_min;
  ctx.wire_max = id.wire_max;
  ctx.secret = secret;
  FERRY_RETURN_IF_ERROR(transports_->Start(ctx));

  internal::MetadataContext mctx;
  mctx.rpc_openers = &transports_->rpc_openers();
  mctx.secret = secret;
  mctx.descriptor_format_max = id.descriptor_format_max;
  mctx.cluster = options_.metadata_cluster;
  mctx.ttl = options_.metadata_ttl;
  mctx.timeout = options_.connect_timeout;
  FERRY_ASSIGN_OR_RETURN(metadata_, internal::MakeMetadataStore(options_.metadata, mctx));
  segments_ =
      std::make_unique<internal::SegmentTable>(options_, *transports_, *metadata_, *metrics_,
                                               [p = publisher_.get()] { return p->Describe(); });
  notifier_ = std::make_unique<internal::Notifier>(*segments_, *metrics_, id.peer_id,
                                                   options_.transfer_timeout);
  FERRY_RETURN_IF_ERROR(Republish());
  internal::SegmentTable* segs = segments_.get();  // the store (and its watch) dies before it
  Status watching =
      metadata_->Watch([segs](const std::string& name) { segs->OnPeerChanged(name); });
  if (!watching.ok() && watching.code() != StatusCode::kUnimplemented) return watching;
  FERRY_RETURN_IF_ERROR(transports_->Serve());
  if (options_.metrics_address.empty()) return OkStatus();
  FERRY_ASSIGN_OR_RETURN(metrics_server_,
                         internal::MetricsServer::Start(options_.metrics_address, [this] {
                           return internal::Metrics::PrometheusText(Snapshot());
                         }));
  return OkStatus();
}

bool Engine::Impl::PeersByAddress() const {
  return internal::MetadataBackendName(options_.metadata) == "p2p";
}

StatusOr<std::shared_ptr<internal::BatchState>> Engine::Impl::GetBatch(BatchId id) const {
  auto b = batches_.Get(id.value);
  if (!b) {
    return InvalidArgumentError("batch id " + std::to_string(id.value) +
                                " is not allocated (freed, stale or never issued)");
  }
  return b;
}

StatusOr<std::shared_ptr<internal::PreparedList>> Engine::Impl::GetList(DescListHandle h) const {
  auto l = lists_.Get(h.value);
  if (!l) {
    return InvalidArgumentError("descriptor list " + std::to_string(h.value) +
                                " is not prepared (released, stale or never issued)");
  }
  return l;
}

StatusOr<std::shared_ptr<internal::PreparedTransfer>> Engine::Impl::GetTransfer(
    TransferHandle h) const {
  auto t = transfers_.Get(h.value);
  if (!t) {
    return InvalidArgumentError("transfer " + std::to_string(h.value) +
                                " is not prepared (released, stale or never issued)");
  }
  return t;
}

// ---- Engine ------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Create(std::move(options)));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const std::string& Engine::PeerId() const { return impl_->peer_id(); }
uint16_t Engine::RpcPort() const {
  auto hp = internal::ParsePeerId(impl_->peer_id());
  return hp.ok() ? hp->port : 0;
}
const std::string& Engine::LocalName() const { return impl_->options().local_name; }
const EngineOptions& Engine::options() const { return impl_->options(); }

Capabilities Engine::GetCapabilities() const {
  Capabilities c;
  c.version = std::string(Version());
  c.wire_version_min = impl_->publisher().identity().wire_min;
  c.wire_version_max = impl_->publisher().identity().wire_max;
  for (const auto& t : impl_->transports().transports()) c.transports.emplace_back(t->Name());
  c.features = impl_->publisher().AdvertisedFeatures();
  return c;
}

// ---- memory ------------------------------------------------------------------

Status Engine::RegisterMemory(void* addr, size_t length, std::string_view location) {
  MemoryRegion r{addr, length, std::string(location)};
  return RegisterMemory({&r, 1});
}

Status Engine::RegisterMemory(std::span<const MemoryRegion> regions) {
  if (regions.empty()) return InvalidArgumentError("empty list of regions to register");
  const EngineOptions& options = impl_->options();
  // Host memory is checked against the CUDA driver if this process uses one:
  // a device pointer registered as "cpu" is refused, never copied as host memory.
  const internal::CudaDriver* cuda = options.testing.cuda_driver.empty()
                                         ? internal::CudaDriverForRegistrations()
                                         : &internal::CudaDriver::Load(options.testing.cuda_driver);
  std::vector<MemoryKind> kinds;
  kinds.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    auto kind =
        internal::KindOfRegistration(regions[i].location, regions[i].addr, regions[i].length,
                                     options.testing.allow_test_memory_kind, cuda);
    if (!kind.ok()) {
      return regions.size() > 1
                 ? kind.status().WithPrefix("region " + std::to_string(i) + " of the list")
                 : kind.status();
    }
    kinds.push_back(*kind);
  }
  internal::EngineTarget& target = impl_->target();
  FERRY_RETURN_IF_ERROR(target.registry().Register(regions, kinds, &impl_->transports()));
  if (std::any_of(kinds.begin(), kinds.end(),
                  [](MemoryKind k) { return k.type() == MemoryKind::Type::kCuda; })) {
    target.SetCudaDriver(cuda != nullptr ? cuda : &internal::CudaDriver::Get());
  }
  return impl_->Republish();
}

StatusOr<std::shared_ptr<internal::storage::FileIo>> Engine::Impl::file_io() {
  std::lock_guard<std::mutex> lock(file_io_mu_);
  if (!file_io_) {
    FERRY_ASSIGN_OR_RETURN(file_io_, internal::storage::FileIo::Create(options_.file_queue_depth));
  }
  return file_io_;
}

StatusOr<void*> Engine::RegisterFile(const FileRegion& file) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<internal::storage::FileIo> io, impl_->file_io());
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const internal::storage::FileSegment> segment,
                         internal::storage::FileSegment::Open(
                             file, std::move(io), impl_->options().testing.file_eio_offsets));
  MemoryRegion r{segment->base(), segment->length(), "file", file.exported};
  const MemoryKind kind = MemoryKind::File();
  FERRY_RETURN_IF_ERROR(impl_->target().registry().Register({&r, 1}, {&kind, 1},
                                                            &impl_->transports(), {&segment, 1}));
  if (Status published = impl_->Republish(); !published.ok()) {
    // The caller gets no address to unregister it with: undo it.
    (void)impl_->target().registry().Unregister(reinterpret_cast<uint64_t>(segment->base()),
                                                &impl_->transports());
    return published;
  }
  return segment->base();
}

StatusOr<void*> Engine::AllocateShared(size_t length, std::string_view location, bool exported) {
  FERRY_ASSIGN_OR_RETURN(internal::SharedMemory mem,
                         internal::SharedMemory::Create(length, "ferry-shared"));
  MemoryRegion r{mem.data(), length, std::string(location), exported};
  r.fd = mem.fd();
  FERRY_RETURN_IF_ERROR(RegisterMemory({&r, 1}));
  void* addr = mem.data();
  std::lock_guard<std::mutex> lock(impl_->shared_mu_);
  impl_->shared_.emplace(reinterpret_cast<uint64_t>(addr), std::move(mem));
  return addr;
}

Status Engine::FreeShared(void* addr) {
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  {
    std::lock_guard<std::mutex> lock(impl_->shared_mu_);
    if (impl_->shared_.count(a) == 0) {
      return NotFoundError("no memory from AllocateShared starts at " + internal::FormatAddr(a));
    }
  }
  // Already unregistered (kNotFound) is fine: nothing reaches it any more.
  Status s = UnregisterMemory(addr);
  if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  std::lock_guard<std::mutex> lock(impl_->shared_mu_);
  impl_->shared_.erase(a);
  return OkStatus();
}

Status Engine::UnregisterMemory(void* addr) {
  // A one-sided operation that failed at its deadline may still be with
  // its device: wait (transfer_timeout at most) for it to let go first.
  FERRY_RETURN_IF_ERROR(
      impl_->target().registry().Unregister(reinterpret_cast<uint64_t>(addr), &impl_->transports(),
                                            Clock::now() + impl_->options().transfer_timeout));
  return impl_->Republish();
}

Status Engine::UnregisterMemory(std::span<void* const> addrs) {
  Status first;
  for (void* a : addrs) {
    Status s = UnregisterMemory(a);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

// ---- segments ------------------------------------------------------------------

StatusOr<SegmentHandle> Engine::OpenSegment(std::string_view peer_id) {
  return impl_->segments().Open(peer_id);
}

Status Engine::CloseSegment(SegmentHandle h) { return impl_->segments().Close(h); }

StatusOr<SegmentInfo> Engine::QuerySegment(SegmentHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->segments().Get(h));
  FERRY_RETURN_IF_ERROR(impl_->segments().Rehandshake(*seg));
  return impl_->segments().Info(*seg);
}

StatusOr<SegmentInfo> Engine::DescribeSegment(SegmentHandle h) const {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->segments().Get(h));
  return impl_->segments().Info(*seg);
}

// ---- batches -------------------------------------------------------------------

StatusOr<BatchId> Engine::AllocateBatch(size_t capacity) {
  if (capacity == 0 || capacity > kMaxBatchCapacity) {
    return InvalidArgumentError("batch capacity must be in [1, " +
                                std::to_string(kMaxBatchCapacity) + "], got " +
                                std::to_string(capacity));
  }
  auto batch = std::make_shared<BatchState>(capacity, impl_->metrics());
  BatchState& state = *batch;
  const BatchId id{impl_->batches().Insert(std::move(batch))};
  // Each time the batch's last pending request finishes (completed, failed,
  // cancelled). The signal outlives every batch (Impl destroys it last).
  // Set before the id is returned: nothing was submitted yet.
  state.SetOnIdle([signal = &impl_->completion(), id] {
    signal->Notify(internal::CompletionSignal::Finished::kBatch, id.value);
  });
  return id;
}

Status Engine::Submit(BatchId id, std::span<const TransferRequest> requests) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (requests.empty()) return InvalidArgumentError("no requests to submit");
  internal::Submission submission(impl_->segments(), impl_->target().registry(), requests);
  FERRY_RETURN_IF_ERROR(submission.Validate());
  FERRY_RETURN_IF_ERROR(submission.ResolveRoutes());
  Status posted = submission.Post(batch, id, Clock::now() + impl_->options().transfer_timeout);
  // Requests submitted to a cancelled batch failed at once, with no
  // pending period to end: tell waiters of the batch's new failures too.
  if (batch->cancelled()) {
    impl_->completion().Notify(internal::CompletionSignal::Finished::kBatch, id.value);
  }
  return posted;
}

StatusOr<TransferStatus> Engine::GetTransferStatus(BatchId id, size_t index) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (index >= batch->reserved()) {
    return InvalidArgumentError("request index " + std::to_string(index) +
                                " is out of range: batch " + std::to_string(id.value) + " has " +
                                std::to_string(batch->reserved()) + " submitted requests");
  }
  return batch->Get(index);
}

StatusOr<BatchStatus> Engine::GetBatchStatus(BatchId id) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  return batch->Summary();
}

StatusOr<BatchStatus> Engine::PollBatch(BatchId id, std::chrono::microseconds wait) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (wait.count() > 0) (void)impl_->PollStep(*batch, wait);
  return batch->Summary();
}

StatusOr<BatchStatus> Engine::SpinBatch(BatchId id, std::chrono::microseconds spin) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  // A deadline already passed: WaitIdle spins for `spin`, then only looks.
  if (spin.count() > 0) (void)batch->WaitIdle(Clock::now(), spin);
  return batch->Summary();
}

Status Engine::WaitBatch(BatchId id, std::chrono::milliseconds timeout) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (!batch->WaitIdle(Clock::now() + timeout, impl_->options().wait_spin)) {
    return DeadlineExceededError("batch " + std::to_string(id.value) + " still has " +
                                 std::to_string(batch->pending()) + " requests pending after " +
                                 std::to_string(timeout.count()) + " ms");
  }
  BatchStatus s = batch->Summary();
  return s.failed > 0 ? s.first_error : OkStatus();
}

Status Engine::FreeBatch(BatchId id) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (!batch->SettleIfFinal()) {
    return FailedPreconditionError(
        "batch " + std::to_string(id.value) + " still has " + std::to_string(batch->pending()) +
        " requests in flight; wait for them (each ends by its transfer deadline)");
  }
  impl_->batches().Erase(id.value);
  return OkStatus();
}

Status Engine::CancelBatch(BatchId id) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  batch->Cancel(CancelledError("batch " + std::to_string(id.value) + " was cancelled"));
  return OkStatus();
}

Status Engine::TransferSync(const TransferRequest& request) { return TransferSync({&request, 1}); }

Status Engine::TransferSync(std::span<const TransferRequest> requests) {
  if (requests.empty()) return InvalidArgumentError("no requests to transfer");
  FERRY_ASSIGN_OR_RETURN(BatchId id, AllocateBatch(requests.size()));
  Status s = Submit(id, requests);
  if (s.ok()) {
    auto batch = impl_->GetBatch(id);
    // Each request ends by its deadline; wait a little longer than that so
    // the transport's own deadline is what reports a timeout.
    if (batch.ok()) {
      const EngineOptions& o = impl_->options();
      (*batch)->WaitIdle(Clock::now() + o.transfer_timeout + std::chrono::seconds(5), o.wait_spin);
    }
    s = WaitBatch(id, std::chrono::milliseconds(0));
  }
  Status f = FreeBatch(id);
  if (!f.ok() && s.ok()) s = f;
  return s;
}

// ---- notifications --------------------------------------------------------------

Status Engine::SendNotification(SegmentHandle h, std::string_view name, std::string_view message) {
  FERRY_RETURN_IF_ERROR(internal::CheckNotificationSize(name, message));
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->segments().Get(h));
  return impl_->notifier().Send(*seg, name, message);
}

std::vector<Notification> Engine::GetNotifications() { return impl_->target().Drain(); }

// ---- event loops ------------------------------------------------------------------

int Engine::CompletionFd() { return impl_->completion().Arm(); }

FinishedWork Engine::TakeFinished() { return impl_->completion().TakeFinished(); }

}  // namespace ferry
