// Engine, continued: prepared descriptor lists and transfers (checked once,
// posted many times), cancellation, agent metadata export and import, and
// telemetry. The data path is Submit's (Impl::SliceAndPost) minus the
// per-request checks, which were done when the lists were prepared.
#include <algorithm>

#include "core/engine_impl.h"

namespace ferry {

using internal::DescList;
using internal::PostState;
using internal::PreparedTransfer;
using internal::SteadyMicros;

namespace {

std::string TransferName(TransferHandle h) { return "transfer " + std::to_string(h.value); }

}  // namespace

// ---- descriptor lists -------------------------------------------------------------

StatusOr<DescListHandle> Engine::PrepareLocalList(std::span<const DescRow> rows) {
  FERRY_ASSIGN_OR_RETURN(auto list, DescList::Local(rows, impl_->target->registry()));
  return DescListHandle{impl_->lists.Insert(std::make_shared<internal::PreparedList>(internal::PreparedList{std::move(list), nullptr}))};
}

StatusOr<DescListHandle> Engine::PrepareRemoteList(SegmentHandle segment, std::span<const DescRow> rows) {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(segment));
  std::shared_ptr<const PeerInfo> peer;
  {
    std::lock_guard<std::mutex> lock(seg->mu);
    FERRY_RETURN_IF_ERROR(impl_->Refresh(*seg).WithPrefix("peer " + seg->name));
    peer = seg->peer;
  }
  auto list = DescList::Remote(rows, std::move(peer));
  if (!list.ok()) return list.status().WithPrefix("remote list for peer " + seg->name);
  return DescListHandle{impl_->lists.Insert(std::make_shared<internal::PreparedList>(internal::PreparedList{std::move(*list), seg}))};
}

StatusOr<size_t> Engine::DescListEntries(DescListHandle h) const {
  FERRY_ASSIGN_OR_RETURN(auto list, impl_->GetList(h));
  return list->list->entries();
}

Status Engine::ReleaseDescList(DescListHandle h) {
  if (!impl_->lists.Erase(h.value)) return impl_->GetList(h).status();
  return OkStatus();
}

// ---- prepared transfers ---------------------------------------------------------

StatusOr<TransferHandle> Engine::MakeTransfer(Opcode opcode, DescListHandle local,
                                              std::span<const uint32_t> local_indices, DescListHandle remote,
                                              std::span<const uint32_t> remote_indices,
                                              std::optional<Notification> notification) {
  if (opcode != Opcode::kRead && opcode != Opcode::kWrite) {
    return InvalidArgumentError("unknown opcode " + std::to_string(static_cast<int>(opcode)));
  }
  if (notification) FERRY_RETURN_IF_ERROR(internal::CheckNotificationSize(notification->name, notification->message));
  FERRY_ASSIGN_OR_RETURN(auto local_list, impl_->GetList(local));
  FERRY_ASSIGN_OR_RETURN(auto remote_list, impl_->GetList(remote));
  if (local_indices.size() > kMaxBatchCapacity) {
    return InvalidArgumentError("a transfer of " + std::to_string(local_indices.size()) + " pairs; at most " +
                                std::to_string(kMaxBatchCapacity) + " (kMaxBatchCapacity)");
  }
  auto pairs = internal::PairEntries(*local_list->list, local_indices, *remote_list->list, remote_indices);
  if (!pairs.ok()) return pairs.status();
  const DescList& remote_desc = *remote_list->list;
  if (notification) FERRY_RETURN_IF_ERROR(internal::CheckPeerTakes(*remote_desc.peer(), notification->message.size()));
  auto t = std::make_shared<PreparedTransfer>();
  t->opcode = opcode;
  t->seg = remote_list->seg;
  t->local = local_list->list;
  t->peer = remote_desc.peer();
  t->pairs = std::move(*pairs);
  t->notification = std::move(notification);
  t->handle = impl_->transfers.Insert(t);
  return TransferHandle{t->handle};
}

namespace {

// Whether the post is over: its data finished (or it was cancelled) and its
// notification settled.
bool Finished(PostState& p) {
  std::lock_guard<std::mutex> lock(p.mu);
  return p.finished;
}

}  // namespace

Status Engine::PostTransfer(TransferHandle h, std::optional<Notification> notification) {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  if (notification) FERRY_RETURN_IF_ERROR(internal::CheckNotificationSize(notification->name, notification->message));
  std::lock_guard<std::mutex> lock(t->mu);
  if (t->current && !Finished(*t->current)) {
    return FailedPreconditionError(TransferName(h) + " is still in flight; wait for it, cancel it or release it "
                                   "before posting it again");
  }
  FERRY_RETURN_IF_ERROR(t->local->StillRegistered(impl_->target->registry()).WithPrefix(TransferName(h)));
  Segment& seg = *t->seg;
  if (!impl_->segments.Get(seg.handle)) {
    return FailedPreconditionError(TransferName(h) + ": the segment of peer " + seg.name + " was closed");
  }
  const uint64_t instance = t->peer->desc().instance_id;
  auto same_instance = [&]() -> Status {
    std::lock_guard<std::mutex> l(seg.mu);
    FERRY_RETURN_IF_ERROR(impl_->Refresh(seg).WithPrefix("peer " + seg.name));
    if (seg.peer->desc().instance_id != instance) {
      return FailedPreconditionError(TransferName(h) + ": its remote list was prepared for instance " +
                                     std::to_string(instance) + " of peer " + seg.name +
                                     ", which restarted (now instance " +
                                     std::to_string(seg.peer->desc().instance_id) +
                                     "); prepare the remote list again from the peer's new metadata");
    }
    return OkStatus();
  };
  FERRY_RETURN_IF_ERROR(same_instance());
  // A replacement notification is checked against the peer as MakeTransfer
  // checked the transfer's own: up front, not later in the notifier.
  if (notification) {
    FERRY_RETURN_IF_ERROR(internal::CheckPeerTakes(*t->peer, notification->message.size()).WithPrefix(TransferName(h)));
  }
  const internal::PreparedPairs& pairs = t->pairs;
  std::vector<Impl::RoutePost> routes(pairs.kinds.size());
  std::vector<Impl::Routed> routed_of(pairs.kinds.size());
  for (size_t k = 0; k < routes.size(); ++k) {
    auto routed = impl_->EnsureRoute(seg, pairs.kinds[k].first, pairs.kinds[k].second);
    if (!routed.ok()) return routed.status().WithPrefix(TransferName(h) + " to peer " + seg.name);
    routes[k].SetRoute(routed->link, *routed->transport);
    routes[k].peer = t->peer;
    routed_of[k] = *routed;
  }
  FERRY_RETURN_IF_ERROR(same_instance());  // connecting may have found a restart

  auto post = std::make_shared<PostState>();
  const size_t n = pairs.entries.size();
  post->batch = std::make_shared<BatchState>(n, impl_->metrics);
  post->telemetry.bytes = pairs.bytes;
  post->telemetry.entries = n;
  std::optional<Notification> note = notification ? std::move(notification) : t->notification;
  for (size_t k = 0; k < routes.size(); ++k) routes[k].Tag(*post->batch, routed_of[k]);

  // Once its data finished: the notification (on the notifier's thread,
  // which may block for a round trip), or the end of the post.
  std::weak_ptr<PostState> weak = post;
  Impl* impl = impl_.get();  // the notifier stops in ~Impl before the rest goes
  std::shared_ptr<Segment> seg_ref = t->seg;
  post->batch->SetOnIdle([weak, impl, seg_ref, note = std::move(note), instance] {
    std::shared_ptr<PostState> p = weak.lock();
    if (!p) return;
    if (!note || p->batch->cancelled() || p->batch->Summary().failed > 0) {
      p->Finish(OkStatus(), SteadyMicros());
      return;
    }
    impl->notifier.Push([p, impl, seg_ref, note, instance](bool run) {
      if (!run) {
        p->Finish(CancelledError("the engine shut down before the transfer's notification was sent"), SteadyMicros());
        return;
      }
      p->Finish(impl->SendTransferNotification(*seg_ref, instance, *note), SteadyMicros());
    });
  });

  post->telemetry.start_us = SteadyMicros();
  FERRY_ASSIGN_OR_RETURN(size_t base, post->batch->Reserve(n));
  t->current = post;
  const Clock::time_point deadline = Clock::now() + impl_->options.transfer_timeout;
  const Opcode op = t->opcode;
  impl_->SliceAndPost(post->batch, base, n, routes, deadline, [&](size_t i) {
    const internal::PreparedEntry& e = pairs.entries[i];
    return Impl::PostEntry{op, e.local, e.remote, e.length, e.region, e.route};
  });
  {
    std::lock_guard<std::mutex> l(post->mu);
    post->telemetry.post_us = SteadyMicros() - post->telemetry.start_us;
  }
  return OkStatus();
}

StatusOr<TransferStatus> Engine::GetTransferStatus(TransferHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  std::lock_guard<std::mutex> lock(t->mu);
  if (!t->current) return FailedPreconditionError(TransferName(h) + " was never posted");
  PostState& p = *t->current;
  BatchStatus s = p.batch->Summary();
  if (s.failed > 0 && !p.batch->cancelled()) {
    // Its other requests may still be moving: stop them first, so that
    // nothing of a transfer reported failed lands afterwards.
    p.batch->Cancel(CancelledError(TransferName(h) + " failed (" + std::string(s.first_error.message()) +
                                   "); its other requests were cancelled"));
    s = p.batch->Summary();
  }
  if (s.failed > 0) return TransferStatus{TransferState::kFailed, s.first_error.WithPrefix(TransferName(h))};
  if (s.state == TransferState::kPending) return TransferStatus{};
  std::lock_guard<std::mutex> l(p.mu);
  if (!p.finished) return TransferStatus{};  // its notification is on its way
  if (!p.notify_status.ok()) {
    return TransferStatus{TransferState::kFailed,
                          p.notify_status.WithPrefix(TransferName(h) + ": the data arrived but its notification did not")};
  }
  return TransferStatus{TransferState::kCompleted, OkStatus()};
}

Status Engine::WaitTransfer(TransferHandle h, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::shared_ptr<PostState> p;
  {
    FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
    std::lock_guard<std::mutex> lock(t->mu);
    if (!t->current) return FailedPreconditionError(TransferName(h) + " was never posted");
    p = t->current;
  }
  bool done = p->batch->WaitIdle(deadline, impl_->options.wait_spin);
  if (done) {
    std::unique_lock<std::mutex> lock(p->mu);
    done = p->cv.wait_until(lock, deadline, [&] { return p->finished; });
  }
  FERRY_ASSIGN_OR_RETURN(TransferStatus s, GetTransferStatus(h));
  if (s.state == TransferState::kFailed) return s.status;
  if (s.state == TransferState::kPending || !done) {
    return DeadlineExceededError(TransferName(h) + " is still in flight after " + std::to_string(timeout.count()) +
                                 " ms");
  }
  return OkStatus();
}

StatusOr<TransferTelemetry> Engine::GetTransferTelemetry(TransferHandle h) const {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  std::lock_guard<std::mutex> lock(t->mu);
  if (!t->current) return FailedPreconditionError(TransferName(h) + " was never posted");
  std::lock_guard<std::mutex> l(t->current->mu);
  return t->current->telemetry;
}

Status Engine::CancelTransfer(TransferHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  std::lock_guard<std::mutex> lock(t->mu);
  if (!t->current) return OkStatus();
  t->current->batch->Cancel(CancelledError(TransferName(h) + " was cancelled"));
  t->current->Finish(CancelledError(TransferName(h) + " was cancelled before its notification was sent"),
                     SteadyMicros());
  return OkStatus();
}

Status Engine::ReleaseTransfer(TransferHandle h) {
  FERRY_RETURN_IF_ERROR(CancelTransfer(h));
  impl_->transfers.Erase(h.value);
  return OkStatus();
}

// ---- agent metadata ---------------------------------------------------------------

std::string Engine::ExportMetadata() const {
  std::string out;
  const wire::PeerDescriptor self = impl_->Describe();
  wire::EncodeExportedMetadata(self, &out, std::min(impl_->descriptor_format_max, wire::LowestFormatFor(self)));
  return out;
}

StatusOr<SegmentHandle> Engine::ImportMetadata(std::string_view bytes) {
  FERRY_ASSIGN_OR_RETURN(wire::PeerDescriptor desc, wire::DecodeExportedMetadata(bytes));
  // The name the metadata store (and so a later re-handshake) knows the
  // peer by: "host:port" for P2P, its engine name for a service.
  const bool p2p = internal::MetadataBackendName(impl_->options.metadata) == "p2p";
  const std::string name = p2p ? desc.peer_id : desc.engine_name;
  if (name.empty()) return InvalidArgumentError("agent metadata without a peer name");
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(impl_->segments_mu);
    auto& slot = impl_->by_name[name];
    if (!slot) slot = std::make_shared<Segment>(name);
    seg = slot;
  }
  std::lock_guard<std::mutex> lock(seg->mu);
  Status s = impl_->Adopt(*seg, impl_->Describe(), std::move(desc));
  if (!s.ok()) {
    if (seg->handle == 0) {
      std::lock_guard<std::mutex> l(impl_->segments_mu);
      auto it = impl_->by_name.find(seg->name);
      if (it != impl_->by_name.end() && it->second == seg) impl_->by_name.erase(it);
    }
    return s.WithPrefix("importing the metadata of " + name);
  }
  seg->stale.store(false, std::memory_order_release);
  if (seg->handle == 0) seg->handle = impl_->segments.Insert(seg);
  return SegmentHandle{seg->handle};
}

// ---- telemetry ----------------------------------------------------------------------

EngineMetrics Engine::GetMetrics() const { return impl_->metrics->Snapshot(impl_->target->delivered()); }

std::string Engine::MetricsText() const { return internal::Metrics::PrometheusText(GetMetrics()); }

std::string Engine::MetricsAddress() const {
  return impl_->metrics_server ? impl_->metrics_server->address() : std::string();
}

}  // namespace ferry
