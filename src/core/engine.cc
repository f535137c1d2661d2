// Engine: ties the memory registry, segments, batches, metadata and
// transports together. The data path of one write: Submit validates the
// requests, picks a transport per (peer, local memory kind, remote memory
// kind), reserves the requests in the batch, slices them
// (Transport::MaxSlice) and posts the slices to that route's PeerLink; the
// transport completes each slice through BatchState; WaitBatch returns when
// the batch is idle. The engine knows transports only through
// transport/transport.h and transport/registry.h.
#include "ferry/engine.h"

#include "common/cuda_driver.h"
#include "core/engine_impl.h"

namespace ferry {

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

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  FERRY_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.transport != "auto" && internal::FindTransport(options.transport) == nullptr) {
    std::string names = internal::TransportNames();
    return InvalidArgumentError("transport must be auto or one of " + names + ", got '" + options.transport +
                                "'");
  }
  std::shared_ptr<const internal::ClusterSecret> secret;
  if (!options.secret_file.empty()) {
    FERRY_ASSIGN_OR_RETURN(secret, internal::ClusterSecret::Load(options.secret_file));
  }
  auto impl = std::make_unique<Impl>();
  if (options.testing.wire_version_max != 0) {
    impl->wire_min = options.testing.wire_version_min;
    impl->wire_max = options.testing.wire_version_max;
    if (impl->wire_min > impl->wire_max) {
      return InvalidArgumentError("testing wire version range is empty");
    }
  }
  if (options.testing.descriptor_format_max != 0) {
    impl->descriptor_format_max = std::clamp<uint16_t>(options.testing.descriptor_format_max,
                                                       wire::kDescriptorFormatMin, wire::kDescriptorFormatMax);
  }
  if (options.io_threads == 0) options.io_threads = std::min(options.tcp_streams, 4);

  FERRY_ASSIGN_OR_RETURN(impl->transports, internal::TransportSet::Create(options));
  impl->peer_id = impl->transports->peer_id();
  if (options.local_name.empty()) options.local_name = impl->peer_id;
  impl->instance_id = internal::NewInstanceId();
  impl->target = std::make_shared<internal::EngineTarget>(impl->instance_id, impl->peer_id,
                                                          options.notify_inbox_bytes);
  impl->options = options;

  internal::TransportContext ctx;
  ctx.options = &impl->options;
  ctx.target = impl->target;
  ctx.peer_id = impl->peer_id;
  ctx.instance_id = impl->instance_id;
  ctx.wire_min = impl->wire_min;
  ctx.wire_max = impl->wire_max;
  ctx.secret = secret;
  FERRY_RETURN_IF_ERROR(impl->transports->Start(ctx));

  internal::MetadataContext mctx;
  mctx.rpc_openers = &impl->transports->rpc_openers();
  mctx.secret = secret;
  mctx.descriptor_format_max = impl->descriptor_format_max;
  mctx.cluster = options.metadata_cluster;
  mctx.ttl = options.metadata_ttl;
  mctx.timeout = options.connect_timeout;
  FERRY_ASSIGN_OR_RETURN(impl->metadata, internal::MakeMetadataStore(options.metadata, mctx));
  FERRY_RETURN_IF_ERROR(impl->Republish());
  Impl* raw = impl.get();  // the store (and its watch) dies in ~Impl before raw
  Status watching = impl->metadata->Watch([raw](const std::string& name) { raw->OnPeerChanged(name); });
  if (!watching.ok() && watching.code() != StatusCode::kUnimplemented) return watching;
  FERRY_RETURN_IF_ERROR(impl->transports->Serve());
  if (!impl->options.metrics_address.empty()) {
    Engine::Impl* self = impl.get();
    FERRY_ASSIGN_OR_RETURN(impl->metrics_server,
                           internal::MetricsServer::Start(impl->options.metrics_address, [self] {
                             return internal::Metrics::PrometheusText(
                                 self->metrics->Snapshot(self->target->delivered()));
                           }));
  }
  FERRY_LOG(kInfo, "engine " << impl->options.local_name << " listening on " << impl->peer_id);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const std::string& Engine::PeerId() const { return impl_->peer_id; }
uint16_t Engine::RpcPort() const {
  auto hp = internal::ParsePeerId(impl_->peer_id);
  return hp.ok() ? hp->port : 0;
}
const std::string& Engine::LocalName() const { return impl_->options.local_name; }
const EngineOptions& Engine::options() const { return impl_->options; }

Capabilities Engine::GetCapabilities() const {
  Capabilities c;
  c.version = std::string(Version());
  c.wire_version_min = impl_->wire_min;
  c.wire_version_max = impl_->wire_max;
  for (const auto& t : impl_->transports->transports()) c.transports.emplace_back(t->Name());
  c.features = impl_->AdvertisedFeatures();
  return c;
}

// ---- memory ------------------------------------------------------------------

Status Engine::RegisterMemory(void* addr, size_t length, std::string_view location) {
  MemoryRegion r{addr, length, std::string(location)};
  return RegisterMemory({&r, 1});
}

Status Engine::RegisterMemory(std::span<const MemoryRegion> regions) {
  if (regions.empty()) return InvalidArgumentError("empty list of regions to register");
  std::vector<MemoryKind> kinds;
  kinds.reserve(regions.size());
  // Host memory is checked against the CUDA driver if this process uses one:
  // a device pointer registered as "cpu" is refused, never copied as host memory.
  const internal::CudaDriver* cuda = impl_->options.testing.cuda_driver.empty()
                                         ? internal::CudaDriverForRegistrations()
                                         : &internal::CudaDriver::Load(impl_->options.testing.cuda_driver);
  for (size_t i = 0; i < regions.size(); ++i) {
    auto kind = internal::KindOfRegistration(regions[i].location, regions[i].addr, regions[i].length,
                                             impl_->options.testing.allow_test_memory_kind, cuda);
    if (!kind.ok()) {
      return regions.size() > 1 ? kind.status().WithPrefix("region " + std::to_string(i) + " of the list")
                                : kind.status();
    }
    kinds.push_back(*kind);
  }
  FERRY_RETURN_IF_ERROR(impl_->target->registry().Register(regions, kinds, impl_->transports.get()));
  if (std::any_of(kinds.begin(), kinds.end(), [](MemoryKind k) { return k.type() == MemoryKind::Type::kCuda; })) {
    impl_->target->SetCudaDriver(cuda != nullptr ? cuda : &internal::CudaDriver::Get());
  }
  return impl_->Republish();
}

Status Engine::UnregisterMemory(void* addr) {
  FERRY_RETURN_IF_ERROR(
      impl_->target->registry().Unregister(reinterpret_cast<uint64_t>(addr), impl_->transports.get()));
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
  if (peer_id.empty()) return InvalidArgumentError("empty segment name");
  std::shared_ptr<Segment> seg;
  {
    std::lock_guard<std::mutex> lock(impl_->segments_mu);
    auto& slot = impl_->by_name[std::string(peer_id)];
    if (!slot) slot = std::make_shared<Segment>(std::string(peer_id));
    seg = slot;
  }
  std::lock_guard<std::mutex> lock(seg->mu);
  if (seg->handle != 0) return SegmentHandle{seg->handle};
  Status s = impl_->Handshake(*seg);
  if (!s.ok()) {
    std::lock_guard<std::mutex> l(impl_->segments_mu);
    auto it = impl_->by_name.find(seg->name);
    if (it != impl_->by_name.end() && it->second == seg) impl_->by_name.erase(it);
    return s;
  }
  seg->handle = impl_->segments.Insert(seg);
  return SegmentHandle{seg->handle};
}

Status Engine::CloseSegment(SegmentHandle h) {
  auto seg = impl_->segments.Erase(h.value);
  if (!seg) return impl_->GetSegment(h).status();
  {
    std::lock_guard<std::mutex> lock(impl_->segments_mu);
    auto it = impl_->by_name.find(seg->name);
    if (it != impl_->by_name.end() && it->second == seg) impl_->by_name.erase(it);
  }
  std::lock_guard<std::mutex> lock(seg->mu);
  seg->RetireLinks();
  return OkStatus();
}

StatusOr<SegmentInfo> Engine::QuerySegment(SegmentHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(h));
  {
    std::lock_guard<std::mutex> lock(seg->mu);
    FERRY_RETURN_IF_ERROR(impl_->Handshake(*seg));
  }
  return DescribeSegment(h);
}

StatusOr<SegmentInfo> Engine::DescribeSegment(SegmentHandle h) const {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(h));
  std::lock_guard<std::mutex> lock(seg->mu);
  SegmentInfo info;
  const auto& d = seg->peer->desc();
  info.peer_id = d.peer_id;
  info.engine_name = d.engine_name;
  info.instance_id = d.instance_id;
  info.wire_version = seg->wire_version;
  info.transport = std::string(seg->routes.front().transport->Name());
  info.capabilities.version = d.version;
  info.capabilities.wire_version_min = d.wire_min;
  info.capabilities.wire_version_max = d.wire_max;
  for (const auto& t : d.transports) info.capabilities.transports.push_back(t.name);
  info.capabilities.features = d.features;
  for (const auto& r : d.regions) info.regions.push_back({r.addr, r.length, r.location, r.kind});
  return info;
}

// ---- batches -------------------------------------------------------------------

StatusOr<BatchId> Engine::AllocateBatch(size_t capacity) {
  if (capacity == 0 || capacity > kMaxBatchCapacity) {
    return InvalidArgumentError("batch capacity must be in [1, " + std::to_string(kMaxBatchCapacity) +
                                "], got " + std::to_string(capacity));
  }
  return BatchId{impl_->batches.Insert(std::make_shared<BatchState>(capacity, impl_->metrics))};
}

Status Engine::Submit(BatchId id, std::span<const TransferRequest> requests) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (requests.empty()) return InvalidArgumentError("no requests to submit");
  // 1. Validate everything before anything moves.
  std::vector<Segment*> segs(requests.size());  // owned by `distinct`
  std::vector<MemoryKind> local_kinds;          // filled only once some local memory is not cpu
  bool mixed_kinds = false;
  std::map<uint64_t, std::shared_ptr<Segment>> distinct;
  internal::MemoryRegistry::Found local_region;  // the last local region found; most requests share it
  local_region.length = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const TransferRequest& r = requests[i];
    auto bad = [&](const Status& s) { return s.WithPrefix("request " + std::to_string(i)); };
    if (r.opcode != Opcode::kRead && r.opcode != Opcode::kWrite) {
      return bad(InvalidArgumentError("unknown opcode " + std::to_string(static_cast<int>(r.opcode))));
    }
    if (r.local == nullptr) return bad(InvalidArgumentError("local address is null"));
    if (r.length == 0) return bad(InvalidArgumentError("length is zero"));
    const uint64_t local = reinterpret_cast<uint64_t>(r.local);
    if (!(local >= local_region.addr && r.length <= local_region.length &&
          local - local_region.addr <= local_region.length - r.length)) {
      Status s = impl_->target->registry().Check(local, r.length, "local buffer", &local_region);
      if (!s.ok()) return bad(s);
      if (!local_region.kind.cpu_accessible() && !mixed_kinds) {
        mixed_kinds = true;
        local_kinds.assign(i, MemoryKind::Cpu());
      }
    }
    if (mixed_kinds) local_kinds.push_back(local_region.kind);
    if (r.remote_addr + r.length < r.remote_addr) {
      return bad(InvalidArgumentError("remote range " + internal::FormatRange(r.remote_addr, r.length) +
                                      " wraps around the address space"));
    }
    auto seg = distinct.find(r.segment.value);
    if (seg == distinct.end()) {
      auto got = impl_->GetSegment(r.segment);
      if (!got.ok()) return bad(got.status());
      seg = distinct.emplace(r.segment.value, *got).first;
    }
    segs[i] = seg->second.get();
  }
  // 2. Each peer's current descriptor (fetched again if a watch said it
  // changed), then the route of every request: its peer and the memory kinds
  // on both sides. Routes mostly repeat: one lookup per run of them.
  // 3. Make sure every route is connected (connects lazily). Connecting may
  // find that a peer restarted (a new descriptor): then the routes are worked
  // out again against it, so every slice's region index (and so its key)
  // belongs to the descriptor it is posted with.
  struct PeerPost {
    internal::RouteKey key;
    Impl::RoutePost post;
  };
  std::vector<PeerPost> posts;  // a handful: one per route
  std::vector<uint8_t> post_of(requests.size());
  std::vector<uint32_t> region_of(requests.size());
  std::vector<Impl::Routed> routed_of;  // by post
  for (int attempt = 0;; ++attempt) {
    std::map<Segment*, std::shared_ptr<const PeerInfo>> infos;
    for (auto& [h, seg] : distinct) {
      std::lock_guard<std::mutex> lock(seg->mu);
      Status s = impl_->Refresh(*seg);
      if (!s.ok()) return s.WithPrefix("peer " + seg->name);
      infos[seg.get()] = seg->peer;
    }
    posts.clear();
    Segment* last_seg = nullptr;
    const PeerInfo* info = nullptr;
    uint32_t last_region = internal::kNoRegion;
    size_t last_post = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      const TransferRequest& r = requests[i];
      if (segs[i] != last_seg) {
        last_seg = segs[i];
        info = infos[last_seg].get();
        last_region = internal::kNoRegion;
      }
      // The peer's region holding the remote range (requests mostly share one).
      uint32_t region = last_region;
      if (region == internal::kNoRegion ||
          !(r.remote_addr >= info->desc().regions[region].addr &&
            r.length <= info->desc().regions[region].length &&
            r.remote_addr - info->desc().regions[region].addr <= info->desc().regions[region].length - r.length)) {
        region = info->FindRegion(r.remote_addr, r.length);
        if (region != internal::kNoRegion) last_region = region;
      }
      region_of[i] = region;
      const internal::RouteKey key{segs[i], mixed_kinds ? local_kinds[i] : MemoryKind::Cpu(),
                                   info->KindOf(region)};
      if (posts.empty() || !(posts[last_post].key == key)) {
        auto it = std::find_if(posts.begin(), posts.end(), [&](const PeerPost& p) { return p.key == key; });
        if (it == posts.end()) {
          if (posts.size() == 255) return InvalidArgumentError("requests of one submit use more than 255 routes");
          posts.push_back({key, {}});
          posts.back().post.peer = infos[segs[i]];
          it = posts.end() - 1;
        }
        last_post = static_cast<size_t>(it - posts.begin());
      }
      post_of[i] = static_cast<uint8_t>(last_post);
    }
    bool changed = false;
    routed_of.assign(posts.size(), {});
    for (size_t k = 0; k < posts.size(); ++k) {
      PeerPost& p = posts[k];
      auto routed = impl_->EnsureRoute(*p.key.seg, p.key.local, p.key.remote);
      if (!routed.ok()) return routed.status().WithPrefix("peer " + p.key.seg->name);
      p.post.SetRoute(routed->link, *routed->transport);
      routed_of[k] = *routed;
      std::lock_guard<std::mutex> lock(p.key.seg->mu);
      changed = changed || p.key.seg->peer != p.post.peer;
    }
    // A transport with per-region keys cannot post a range outside the
    // descriptor it has (the peer may have registered it since): fetch the
    // descriptor again, once. Ranges still outside it fail in the transport.
    bool missing_keys = false;
    if (attempt == 0 && !changed) {
      for (size_t i = 0; i < requests.size(); ++i) {
        if (region_of[i] == internal::kNoRegion && routed_of[post_of[i]].transport->caps().needs_region_keys) {
          segs[i]->stale.store(true, std::memory_order_release);
          missing_keys = true;
        }
      }
    }
    if (!(changed || missing_keys) || attempt == 1) break;  // a second restart within one submit: its target validates
  }
  // 4. Reserve, then slice, order and post chunk by chunk.
  FERRY_ASSIGN_OR_RETURN(size_t base, batch->Reserve(requests.size()));
  std::vector<Impl::RoutePost> routes;
  routes.reserve(posts.size());
  for (size_t k = 0; k < posts.size(); ++k) {
    routes.push_back(std::move(posts[k].post));
    routes.back().Tag(*batch, routed_of[k]);
  }
  const Clock::time_point deadline = Clock::now() + impl_->options.transfer_timeout;
  const bool posted = impl_->SliceAndPost(batch, base, requests.size(), routes, deadline, [&](size_t i) {
    const TransferRequest& r = requests[i];
    return Impl::PostEntry{r.opcode, static_cast<char*>(r.local), r.remote_addr, r.length, region_of[i], post_of[i]};
  });
  if (!posted) return CancelledError("batch " + std::to_string(id.value) + " was cancelled; nothing was submitted");
  return OkStatus();
}

StatusOr<TransferStatus> Engine::GetTransferStatus(BatchId id, size_t index) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (index >= batch->reserved()) {
    return InvalidArgumentError("request index " + std::to_string(index) + " is out of range: batch " +
                                std::to_string(id.value) + " has " + std::to_string(batch->reserved()) +
                                " submitted requests");
  }
  return batch->Get(index);
}

StatusOr<BatchStatus> Engine::GetBatchStatus(BatchId id) const {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  return batch->Summary();
}

Status Engine::WaitBatch(BatchId id, std::chrono::milliseconds timeout) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (!batch->WaitIdle(Clock::now() + timeout, impl_->options.wait_spin)) {
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
    return FailedPreconditionError("batch " + std::to_string(id.value) + " still has " +
                                   std::to_string(batch->pending()) +
                                   " requests in flight; wait for them (each ends by its transfer deadline)");
  }
  impl_->batches.Erase(id.value);
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
      (*batch)->WaitIdle(Clock::now() + impl_->options.transfer_timeout + std::chrono::seconds(5),
                         impl_->options.wait_spin);
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
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(h));
  FERRY_ASSIGN_OR_RETURN(auto routed, impl_->EnsureRoute(*seg, MemoryKind::Cpu(), MemoryKind::Cpu()));
  {
    std::lock_guard<std::mutex> lock(seg->mu);
    FERRY_RETURN_IF_ERROR(internal::CheckPeerTakes(*seg->peer, message.size()));
  }
  wire::NotifyBody body{impl_->peer_id, std::string(name), std::string(message)};
  const Clock::time_point deadline = Clock::now() + impl_->options.transfer_timeout;
  Status s = impl_->FlushOtherLinks(*seg, *routed.link, deadline);
  if (s.ok()) s = routed.link->Notify(body, deadline);
  s = s.WithPrefix("notification to " + seg->name);
  if (s.ok()) impl_->metrics->AddNotificationSent();
  return s;
}

std::vector<Notification> Engine::GetNotifications() { return impl_->target->Drain(); }

}  // namespace ferry
