// Engine, continued: prepared descriptor lists and transfers (checked once,
// posted many times), cancellation, agent metadata export and import, and
// telemetry. The data path is Submit's (SliceAndPost, poster.h) minus the
// per-request checks, which were done when the lists were prepared.
#include <algorithm>
#include <thread>

#include "core/engine_impl.h"
#include "core/poster.h"
#include "ferry/limits.h"

namespace ferry {

using internal::Clock;
using internal::DescList;
using internal::PeerInfo;
using internal::PostState;
using internal::PreparedTransfer;
using internal::Segment;

namespace {

std::string TransferName(TransferHandle h) { return "transfer " + std::to_string(h.value); }

uint64_t SteadyMicros() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
          .count());
}

}  // namespace

// ---- descriptor lists -------------------------------------------------------------

StatusOr<DescListHandle> Engine::PrepareLocalList(std::span<const DescRow> rows) {
  FERRY_ASSIGN_OR_RETURN(auto list, DescList::Local(rows, impl_->target().registry()));
  auto prepared =
      std::make_shared<internal::PreparedList>(internal::PreparedList{std::move(list), nullptr});
  return DescListHandle{impl_->lists().Insert(std::move(prepared))};
}

StatusOr<DescListHandle> Engine::PrepareRemoteList(SegmentHandle segment,
                                                   std::span<const DescRow> rows) {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->segments().Get(segment));
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const PeerInfo> peer, impl_->segments().Current(*seg));
  auto list = DescList::Remote(rows, std::move(peer));
  if (!list.ok()) return list.status().WithPrefix("remote list for peer " + seg->name());
  auto prepared =
      std::make_shared<internal::PreparedList>(internal::PreparedList{std::move(*list), seg});
  return DescListHandle{impl_->lists().Insert(std::move(prepared))};
}

StatusOr<size_t> Engine::DescListEntries(DescListHandle h) const {
  FERRY_ASSIGN_OR_RETURN(auto list, impl_->GetList(h));
  return list->list->entries();
}

Status Engine::ReleaseDescList(DescListHandle h) {
  if (!impl_->lists().Erase(h.value)) return impl_->GetList(h).status();
  return OkStatus();
}

// ---- prepared transfers ---------------------------------------------------------

StatusOr<TransferHandle> Engine::MakeTransfer(Opcode opcode, DescListHandle local,
                                              std::span<const uint32_t> local_indices,
                                              DescListHandle remote,
                                              std::span<const uint32_t> remote_indices,
                                              std::optional<Notification> notification) {
  if (opcode != Opcode::kRead && opcode != Opcode::kWrite) {
    return InvalidArgumentError("unknown opcode " + std::to_string(static_cast<int>(opcode)));
  }
  if (notification) {
    FERRY_RETURN_IF_ERROR(
        internal::CheckNotificationSize(notification->name, notification->message));
  }
  FERRY_ASSIGN_OR_RETURN(auto local_list, impl_->GetList(local));
  FERRY_ASSIGN_OR_RETURN(auto remote_list, impl_->GetList(remote));
  if (local_indices.size() > kMaxBatchCapacity) {
    return InvalidArgumentError("a transfer of " + std::to_string(local_indices.size()) +
                                " pairs; at most " + std::to_string(kMaxBatchCapacity) +
                                " (kMaxBatchCapacity)");
  }
  FERRY_ASSIGN_OR_RETURN(auto pairs, internal::PairEntries(*local_list->list, local_indices,
                                                           *remote_list->list, remote_indices));
  const std::shared_ptr<const PeerInfo>& peer = remote_list->list->peer();
  if (notification) {
    FERRY_RETURN_IF_ERROR(internal::CheckPeerTakes(*peer, notification->message.size()));
  }
  auto t = std::make_shared<PreparedTransfer>(PreparedTransfer::Spec{
      opcode, remote_list->seg, local_list->list, peer, std::move(pairs), std::move(notification)});
  return TransferHandle{impl_->transfers().Insert(std::move(t))};
}

namespace {

// Whether the transfer may be posted now: not in flight, its local memory
// still registered, its segment open, its peer the instance it was prepared
// against.
Status CheckPostable(Engine::Impl& impl, TransferHandle h, const PreparedTransfer& t) {
  if (t.current() && !t.current()->finished()) {
    return FailedPreconditionError(TransferName(h) +
                                   " is still in flight; wait for it, cancel it or release it "
                                   "before posting it again");
  }
  const PreparedTransfer::Spec& spec = t.spec();
  FERRY_RETURN_IF_ERROR(
      spec.local->StillRegistered(impl.target().registry()).WithPrefix(TransferName(h)));
  if (!impl.segments().IsOpen(*spec.seg)) {
    return FailedPreconditionError(TransferName(h) + ": the segment of peer " + spec.seg->name() +
                                   " was closed");
  }
  return OkStatus();
}

// kFailedPrecondition if the peer is no longer the instance the transfer's
// remote list was prepared for (it restarted).
Status CheckSameInstance(Engine::Impl& impl, TransferHandle h, const PreparedTransfer& t) {
  Segment& seg = *t.spec().seg;
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const PeerInfo> now, impl.segments().Current(seg));
  const uint64_t instance = t.spec().peer->desc().instance_id;
  if (now->desc().instance_id == instance) return OkStatus();
  return FailedPreconditionError(TransferName(h) + ": its remote list was prepared for instance " +
                                 std::to_string(instance) + " of peer " + seg.name() +
                                 ", which restarted (now instance " +
                                 std::to_string(now->desc().instance_id) +
                                 "); prepare the remote list again from the peer's new metadata");
}

// Once the post's data finished: the notification (on the notifier's
// thread, which may block for a round trip), or the end of the post.
void NotifyWhenIdle(Engine::Impl& impl, const std::shared_ptr<PostState>& post,
                    const PreparedTransfer& t, std::optional<Notification> note) {
  std::weak_ptr<PostState> weak = post;
  internal::Notifier* notifier = &impl.notifier();  // stops in ~Impl before the rest goes
  std::shared_ptr<Segment> seg = t.spec().seg;
  const uint64_t instance = t.spec().peer->desc().instance_id;
  internal::CompletionSignal* signal = &impl.completion();
  post->batch()->SetOnIdle([weak, notifier, seg, note = std::move(note), instance, signal] {
    signal->Wake();  // pollers waiting for the data (PollStep) look again
    std::shared_ptr<PostState> p = weak.lock();
    if (!p) return;
    if (!note || p->batch()->cancelled() || p->batch()->Summary().failed > 0) {
      p->Finish(OkStatus(), SteadyMicros());
      return;
    }
    notifier->Push([p, notifier, seg, note, instance](bool run) {
      if (!run) {
        p->Finish(
            CancelledError("the engine shut down before the transfer's notification was sent"),
            SteadyMicros());
        return;
      }
      p->Finish(notifier->Send(*seg, note->name, note->message, instance), SteadyMicros());
    });
  });
}

}  // namespace

Status Engine::PostTransfer(TransferHandle h, std::optional<Notification> notification) {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  if (notification) {
    FERRY_RETURN_IF_ERROR(
        internal::CheckNotificationSize(notification->name, notification->message));
  }
  std::lock_guard<std::mutex> lock(t->mu());
  FERRY_RETURN_IF_ERROR(CheckPostable(*impl_, h, *t));
  FERRY_RETURN_IF_ERROR(CheckSameInstance(*impl_, h, *t));
  const PreparedTransfer::Spec& spec = t->spec();
  // A replacement notification is checked against the peer as MakeTransfer
  // checked the transfer's own: up front, not later in the notifier.
  if (notification) {
    FERRY_RETURN_IF_ERROR(internal::CheckPeerTakes(*spec.peer, notification->message.size())
                              .WithPrefix(TransferName(h)));
  }
  const internal::PreparedPairs& pairs = spec.pairs;
  std::vector<internal::RoutePost> routes(pairs.kinds.size());
  std::vector<internal::Routed> routed_of(pairs.kinds.size());
  for (size_t k = 0; k < routes.size(); ++k) {
    auto routed = impl_->segments().Route(*spec.seg, pairs.kinds[k].first, pairs.kinds[k].second);
    if (!routed.ok()) {
      return routed.status().WithPrefix(TransferName(h) + " to peer " + spec.seg->name());
    }
    routes[k].SetRoute(*routed);
    routes[k].peer = spec.peer;
    routed_of[k] = *std::move(routed);
  }
  FERRY_RETURN_IF_ERROR(CheckSameInstance(*impl_, h, *t));  // connecting may have found a restart

  const size_t n = pairs.entries.size();
  auto post =
      std::make_shared<PostState>(n, pairs.bytes, impl_->metrics(), &impl_->completion(), h.value);
  for (size_t k = 0; k < routes.size(); ++k) routes[k].Tag(*post->batch(), routed_of[k]);
  NotifyWhenIdle(*impl_, post, *t, notification ? std::move(notification) : spec.notification);
  post->Started(SteadyMicros());
  FERRY_ASSIGN_OR_RETURN(size_t base, post->batch()->Reserve(n));
  t->set_current(post);
  const Clock::time_point deadline = Clock::now() + impl_->options().transfer_timeout;
  internal::SliceAndPost(post->batch(), base, n, routes, deadline, [&](size_t i) {
    const internal::PreparedEntry& e = pairs.entries[i];
    return internal::PostEntry{spec.opcode, e.local, e.remote, e.length, e.region, e.route};
  });
  post->Posted(SteadyMicros());
  return OkStatus();
}

StatusOr<TransferStatus> Engine::GetTransferStatus(TransferHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  std::lock_guard<std::mutex> lock(t->mu());
  if (!t->current()) return FailedPreconditionError(TransferName(h) + " was never posted");
  PostState& p = *t->current();
  BatchStatus s = p.batch()->Summary();
  if (s.failed > 0 && !p.batch()->cancelled()) {
    // Its other requests may still be moving: stop them first, so that
    // nothing of a transfer reported failed lands afterwards.
    p.batch()->Cancel(CancelledError(TransferName(h) + " failed (" +
                                     std::string(s.first_error.message()) +
                                     "); its other requests were cancelled"));
    s = p.batch()->Summary();
  }
  if (s.failed > 0) {
    return TransferStatus{TransferState::kFailed, s.first_error.WithPrefix(TransferName(h))};
  }
  if (s.state == TransferState::kPending) return TransferStatus{};
  if (!p.finished()) return TransferStatus{};  // its notification is on its way
  if (Status notified = p.notify_status(); !notified.ok()) {
    return TransferStatus{
        TransferState::kFailed,
        notified.WithPrefix(TransferName(h) + ": the data arrived but its notification did not")};
  }
  return TransferStatus{TransferState::kCompleted, OkStatus()};
}

StatusOr<std::shared_ptr<PostState>> Engine::Impl::CurrentPost(TransferHandle h) const {
  FERRY_ASSIGN_OR_RETURN(auto t, GetTransfer(h));
  std::lock_guard<std::mutex> lock(t->mu());
  if (!t->current()) return FailedPreconditionError(TransferName(h) + " was never posted");
  return t->current();
}

StatusOr<TransferStatus> Engine::PollTransfer(TransferHandle h, std::chrono::microseconds wait) {
  if (wait.count() > 0) {
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<PostState> p, impl_->CurrentPost(h));
    // While only its notification is on its way (a short round trip) it
    // yields the core once instead.
    if (impl_->PollStep(*p->batch(), wait) && !p->finished()) {
      std::this_thread::yield();
    }
  }
  return GetTransferStatus(h);
}

StatusOr<TransferStatus> Engine::SpinTransfer(TransferHandle h, std::chrono::microseconds spin) {
  if (spin.count() > 0) {
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<PostState> p, impl_->CurrentPost(h));
    const Clock::time_point end = Clock::now() + spin;
    // As SpinBatch, then the notification's round trip within the same spin.
    if (p->batch()->WaitIdle(Clock::now(), spin)) {
      while (!p->finished() && Clock::now() < end) std::this_thread::yield();
    }
  }
  return GetTransferStatus(h);
}

Status Engine::WaitTransfer(TransferHandle h, std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<PostState> p, impl_->CurrentPost(h));
  const bool done =
      p->batch()->WaitIdle(deadline, impl_->options().wait_spin) && p->WaitFinished(deadline);
  FERRY_ASSIGN_OR_RETURN(TransferStatus s, GetTransferStatus(h));
  if (s.state == TransferState::kFailed) return s.status;
  if (s.state == TransferState::kPending || !done) {
    return DeadlineExceededError(TransferName(h) + " is still in flight after " +
                                 std::to_string(timeout.count()) + " ms");
  }
  return OkStatus();
}

StatusOr<TransferTelemetry> Engine::GetTransferTelemetry(TransferHandle h) const {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  std::lock_guard<std::mutex> lock(t->mu());
  if (!t->current()) return FailedPreconditionError(TransferName(h) + " was never posted");
  return t->current()->telemetry();
}

Status Engine::CancelTransfer(TransferHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto t, impl_->GetTransfer(h));
  std::lock_guard<std::mutex> lock(t->mu());
  if (!t->current()) return OkStatus();
  t->current()->batch()->Cancel(CancelledError(TransferName(h) + " was cancelled"));
  t->current()->Finish(
      CancelledError(TransferName(h) + " was cancelled before its notification was sent"),
      SteadyMicros());
  return OkStatus();
}

Status Engine::ReleaseTransfer(TransferHandle h) {
  FERRY_RETURN_IF_ERROR(CancelTransfer(h));
  impl_->transfers().Erase(h.value);
  return OkStatus();
}

// ---- agent metadata ---------------------------------------------------------------

std::string Engine::ExportMetadata() const {
  std::string out;
  const wire::PeerDescriptor self = impl_->publisher().Describe();
  const uint16_t format =
      std::min(impl_->publisher().identity().descriptor_format_max, wire::LowestFormatFor(self));
  wire::EncodeExportedMetadata(self, &out, format);
  return out;
}

StatusOr<SegmentHandle> Engine::ImportMetadata(std::string_view bytes) {
  FERRY_ASSIGN_OR_RETURN(wire::PeerDescriptor desc, wire::DecodeExportedMetadata(bytes));
  // The name the metadata store (and so a later re-handshake) knows the
  // peer by: "host:port" for P2P, its engine name for a service.
  const std::string name = impl_->PeersByAddress() ? desc.peer_id : desc.engine_name;
  if (name.empty()) return InvalidArgumentError("agent metadata without a peer name");
  return impl_->segments().Import(name, std::move(desc));
}

// ---- telemetry ----------------------------------------------------------------------

EngineMetrics Engine::GetMetrics() const { return impl_->Snapshot(); }

std::string Engine::MetricsText() const { return internal::Metrics::PrometheusText(GetMetrics()); }

std::string Engine::MetricsAddress() const {
  return impl_->metrics_server() ? impl_->metrics_server()->address() : std::string();
}

}  // namespace ferry
