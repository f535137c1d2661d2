// Engine: ties the memory registry, segments, batches, metadata and
// transports together. The data path of one write: Submit validates the
// requests, reserves them in the batch, slices them (Transport::MaxSlice) and
// posts the slices to the segment's PeerLink; the transport completes each
// slice through BatchState; WaitBatch returns when the batch is idle.
#include "ferry/engine.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>

#include "common/handle_table.h"
#include "common/log.h"
#include "common/net.h"
#include "core/batch.h"
#include "core/slice_order.h"
#include "core/target.h"
#include "ferry/limits.h"
#include "ferry/version.h"
#include "metadata/metadata.h"
#include "transport/local/local_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

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

namespace {

uint64_t NewInstanceId() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) | rd();
  return v;
}

std::string Hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

const std::vector<std::string>& Features() {
  static const std::vector<std::string> f = {"read", "write", "notify", "batch", "p2p-handshake"};
  return f;
}

// An opened peer segment. `mu` serializes (re)connection.
struct Segment {
  explicit Segment(std::string n) : name(std::move(n)) {}
  const std::string name;
  std::mutex mu;
  uint64_t handle = 0;          // 0 until the first handshake succeeded
  wire::PeerDescriptor desc;    // guarded by mu
  uint16_t wire_version = 0;    // guarded by mu
  Transport* transport = nullptr;  // guarded by mu
  std::shared_ptr<PeerLink> link;  // guarded by mu
  // Transports `auto` found unable to connect to this peer while another one
  // could (e.g. shm without ptrace access); skipped from then on. Guarded by mu.
  std::vector<Transport*> unusable;
};

}  // namespace
}  // namespace internal

using internal::BatchState;
using internal::Clock;
using internal::Segment;

class Engine::Impl {
 public:
  EngineOptions options;
  std::string peer_id;
  uint64_t instance_id = 0;
  std::shared_ptr<internal::EngineTarget> target;
  std::unique_ptr<internal::MetadataClient> metadata;
  std::vector<std::unique_ptr<internal::Transport>> transports;  // by preference
  uint16_t wire_min = kWireVersionMin, wire_max = kWireVersionMax;

  std::mutex segments_mu;
  std::unordered_map<std::string, std::shared_ptr<Segment>> by_name;  // guarded by segments_mu
  internal::HandleTable<Segment> segments;
  internal::HandleTable<BatchState> batches;

  ~Impl() {
    internal::LocalDirectory::Get().Remove(instance_id);
    std::unordered_map<std::string, std::shared_ptr<Segment>> open;
    {
      std::lock_guard<std::mutex> lock(segments_mu);
      open.swap(by_name);
    }
    // Lock order everywhere: a segment's mu may be held while taking
    // segments_mu (OpenSegment), never the other way round.
    for (auto& [name, seg] : open) {
      std::lock_guard<std::mutex> l(seg->mu);
      if (seg->link) seg->link->Retire();
      seg->link.reset();
    }
    for (auto& t : transports) t->Shutdown();
  }

  wire::PeerDescriptor Describe() const {
    wire::PeerDescriptor d;
    d.engine_name = options.local_name;
    d.peer_id = peer_id;
    d.instance_id = instance_id;
    d.process_token = internal::ProcessToken();
    d.hostname = internal::Hostname();
    d.pid = static_cast<uint32_t>(::getpid());
    d.version = std::string(Version());
    d.wire_min = wire_min;
    d.wire_max = wire_max;
    for (const auto& t : transports) t->Describe(&d);
    d.features = internal::Features();
    d.regions = target->registry().Snapshot();
    return d;
  }

  // Answers a peer's handshake request (runs on a loop thread).
  std::string AnswerHandshake(std::string_view request) const {
    wire::PeerDescriptor self = Describe();
    auto caller = wire::DecodeDescriptor(request);
    Status s;
    if (!caller.ok()) {
      s = caller.status().WithPrefix("handshake request rejected");
    } else {
      auto v = wire::NegotiateWireVersion(self, *caller);
      if (!v.ok()) {
        // Said here too, so the side being called learns who is behind.
        FERRY_LOG(kWarning, "peer " << caller->peer_id << " cannot talk to this engine: " << v.status().message());
      }
    }
    std::string out;
    wire::EncodeHandshakeResponse(s, self, &out);
    return out;
  }

  Clock::time_point ConnectDeadline() const { return Clock::now() + options.connect_timeout; }

  // The first transport (by preference) that `options.transport` allows, that
  // can reach `desc`, that is not unusable for this segment and comes after
  // `after` (nullptr: from the start). REQUIRES: seg.mu held.
  internal::Transport* PickTransport(const Segment& seg, const wire::PeerDescriptor& desc,
                                     internal::Transport* after) const {
    bool past = after == nullptr;
    for (const auto& t : transports) {
      if (!past) {
        past = t.get() == after;
        continue;
      }
      if (options.transport != "auto" && t->Name() != options.transport) continue;
      if (std::find(seg.unusable.begin(), seg.unusable.end(), t.get()) != seg.unusable.end()) continue;
      if (t->CanReach(desc)) return t.get();
    }
    return nullptr;
  }

  // Handshakes with the segment's peer and picks the transport.
  // REQUIRES: seg.mu held.
  Status Handshake(Segment& seg) {
    FERRY_ASSIGN_OR_RETURN(wire::PeerDescriptor desc,
                           metadata->Fetch(seg.name, Describe(), ConnectDeadline()));
    FERRY_ASSIGN_OR_RETURN(uint16_t version, wire::NegotiateWireVersion(Describe(), desc));
    for (const char* f : {"read", "write"}) {
      if (!desc.HasFeature(f)) {
        return FailedPreconditionError("peer " + seg.name + " (ferry " + desc.version +
                                       ") lacks the capability '" + f + "' this engine needs");
      }
    }
    internal::Transport* chosen = PickTransport(seg, desc, nullptr);
    if (chosen == nullptr) {
      std::string offered;
      for (const auto& e : desc.transports) offered += (offered.empty() ? "" : ", ") + e.name;
      return FailedPreconditionError("no transport reaches peer " + seg.name + " (this engine uses '" +
                                     options.transport + "', the peer offers: " + offered + ")");
    }
    if (seg.desc.instance_id != 0 && seg.desc.instance_id != desc.instance_id) {
      FERRY_LOG(kInfo, "peer " << seg.name << " restarted (instance " << seg.desc.instance_id << " -> "
                               << desc.instance_id << "); reconnecting");
    }
    if (seg.link && (seg.desc.instance_id != desc.instance_id || seg.transport != chosen)) {
      seg.link->Retire();
      seg.link.reset();
    }
    seg.desc = std::move(desc);
    seg.wire_version = version;
    seg.transport = chosen;
    return OkStatus();
  }

  // The segment's live link, reconnecting (and re-handshaking) if needed.
  StatusOr<std::shared_ptr<internal::PeerLink>> EnsureLink(Segment& seg) {
    std::lock_guard<std::mutex> lock(seg.mu);
    if (seg.link && seg.link->Healthy()) return seg.link;
    if (seg.link) {
      // The link broke: the peer may have restarted. Learn its current
      // instance before reconnecting.
      seg.link->Retire();
      seg.link.reset();
      FERRY_RETURN_IF_ERROR(Handshake(seg));
    }
    auto link = seg.transport->Connect(seg.desc, seg.wire_version, ConnectDeadline());
    if (!link.ok() && link.status().code() == StatusCode::kFailedPrecondition) {
      // Stale descriptor (the peer restarted between handshake and connect).
      FERRY_RETURN_IF_ERROR(Handshake(seg));
      link = seg.transport->Connect(seg.desc, seg.wire_version, ConnectDeadline());
    }
    // auto: a transport that says it can reach the peer may still fail to
    // connect (shm: another network namespace, no ptrace access). Try the
    // next one; if that works, skip the first for this segment from now on.
    // Not after a timeout: a peer that does not answer would only cost the
    // caller another connect_timeout.
    const bool timed_out = !link.ok() && link.status().code() == StatusCode::kDeadlineExceeded;
    for (internal::Transport* next = PickTransport(seg, seg.desc, seg.transport);
         !link.ok() && !timed_out && options.transport == "auto" && next != nullptr;
         next = PickTransport(seg, seg.desc, next)) {
      auto other = next->Connect(seg.desc, seg.wire_version, ConnectDeadline());
      if (!other.ok()) continue;
      FERRY_LOG(kWarning, "peer " << seg.name << ": transport " << seg.transport->Name()
                                  << " cannot be used (" << link.status().message() << "); using "
                                  << next->Name());
      seg.unusable.push_back(seg.transport);
      seg.transport = next;
      link = std::move(other);
    }
    if (!link.ok()) return link.status();
    seg.link = *link;
    return seg.link;
  }

  StatusOr<std::shared_ptr<Segment>> GetSegment(SegmentHandle h) const {
    auto seg = segments.Get(h.value);
    if (!seg) {
      return InvalidArgumentError("segment handle " + std::to_string(h.value) +
                                  " is not open (closed, stale or never issued)");
    }
    return seg;
  }

  StatusOr<std::shared_ptr<BatchState>> GetBatch(BatchId id) const {
    auto b = batches.Get(id.value);
    if (!b) {
      return InvalidArgumentError("batch id " + std::to_string(id.value) +
                                  " is not allocated (freed, stale or never issued)");
    }
    return b;
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  if (options.tcp_streams < 1 || options.tcp_streams > 64) {
    return InvalidArgumentError("tcp_streams must be in [1, 64], got " + std::to_string(options.tcp_streams));
  }
  if (options.io_threads < 0 || options.io_threads > 64) {
    return InvalidArgumentError("io_threads must be in [0, 64], got " + std::to_string(options.io_threads));
  }
  if (options.transport != "auto" && options.transport != "tcp" && options.transport != "shm" &&
      options.transport != "local") {
    return InvalidArgumentError("transport must be auto, local, shm or tcp, got '" + options.transport + "'");
  }
  if (options.slice_size < 4096 || options.slice_size > wire::kMaxPayload) {
    return InvalidArgumentError("slice_size must be in [4096, 64 MiB], got " + std::to_string(options.slice_size));
  }
  if (options.max_frame_bytes < options.slice_size || options.max_frame_bytes > wire::kMaxPayload) {
    return InvalidArgumentError("max_frame_bytes must be in [slice_size, 64 MiB], got " +
                                std::to_string(options.max_frame_bytes));
  }
  if (options.tcp_send_buffer != 0 &&
      (options.tcp_send_buffer < (64u << 10) || options.tcp_send_buffer > (256u << 20))) {
    return InvalidArgumentError(
        "tcp_send_buffer must be 0 (kernel autotuning) or in [64 KiB, 256 MiB], got " +
        std::to_string(options.tcp_send_buffer));
  }
  if (options.max_frame_entries < 1 || options.max_frame_entries > 1024) {
    return InvalidArgumentError("max_frame_entries must be in [1, 1024], got " +
                                std::to_string(options.max_frame_entries));
  }
  if (options.transfer_timeout.count() <= 0 || options.connect_timeout.count() <= 0 ||
      options.handshake_timeout.count() <= 0) {
    return InvalidArgumentError("timeouts must be positive");
  }
  auto impl = std::make_unique<Impl>();
  FERRY_ASSIGN_OR_RETURN(impl->metadata, internal::MakeMetadataClient(options.metadata));
  if (options.testing.wire_version_max != 0) {
    impl->wire_min = options.testing.wire_version_min;
    impl->wire_max = options.testing.wire_version_max;
    if (impl->wire_min > impl->wire_max) {
      return InvalidArgumentError("testing wire version range is empty");
    }
  }
  if (options.io_threads == 0) options.io_threads = std::min(options.tcp_streams, 4);

  FERRY_ASSIGN_OR_RETURN(auto listener, internal::Listen(options.listen_host, options.listen_port));
  impl->peer_id = internal::FormatPeerId(options.listen_host, listener.second);
  if (options.local_name.empty()) options.local_name = impl->peer_id;
  impl->instance_id = internal::NewInstanceId();
  impl->target = std::make_shared<internal::EngineTarget>(impl->instance_id, impl->peer_id);
  impl->options = options;

  auto server = std::make_shared<internal::tcp::ServerContext>();
  server->target = impl->target;
  Impl* raw = impl.get();  // the transport is shut down in ~Impl before raw dies
  server->handshake = [raw](std::string_view body) { return raw->AnswerHandshake(body); };
  server->hello_timeout = options.handshake_timeout;
  server->wire_min = impl->wire_min;
  server->wire_max = impl->wire_max;
  server->refuse_copy = options.testing.refuse_same_host_copy;

  FERRY_ASSIGN_OR_RETURN(auto loops, internal::tcp::LoopPool::Start(options.io_threads, options.spin));
  internal::tcp::StreamTransportConfig common;
  common.streams = options.tcp_streams;
  common.slice_size = options.slice_size;
  common.max_frame_bytes = options.max_frame_bytes;
  common.max_frame_entries = options.max_frame_entries;
  common.local_peer_id = impl->peer_id;
  common.local_instance = impl->instance_id;
  internal::TcpTransportConfig tcfg;
  static_cast<internal::tcp::StreamTransportConfig&>(tcfg) = common;
  tcfg.listener = std::move(listener.first);
  // Two frames per stream: measured best for 1 MiB frames (one frame: a
  // little slower; four: as slow as no window at all).
  tcfg.stream_window = 2 * uint64_t{options.max_frame_bytes};
  tcfg.served_send_buffer = options.tcp_send_buffer;

  // By preference: the cheapest that reaches the peer.
  impl->transports.push_back(internal::MakeLocalTransport());
  auto shm = internal::MakeShmTransport(common, server, loops);
  if (shm.ok()) {
    impl->transports.push_back(std::move(*shm));
  } else if (options.transport == "shm") {
    return shm.status();
  } else {
    FERRY_LOG(kWarning, "same-host transport unavailable, peers on this host use tcp: " << shm.status());
  }
  FERRY_ASSIGN_OR_RETURN(auto tcp, internal::MakeTcpTransport(std::move(tcfg), server, loops));
  impl->transports.push_back(std::move(tcp));
  internal::LocalDirectory::Get().Add(impl->target);
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
  for (const auto& t : impl_->transports) c.transports.emplace_back(t->Name());
  c.features = internal::Features();
  return c;
}

// ---- memory ------------------------------------------------------------------

Status Engine::RegisterMemory(void* addr, size_t length, std::string_view location) {
  MemoryRegion r{addr, length, std::string(location)};
  return impl_->target->registry().Register({&r, 1});
}

Status Engine::RegisterMemory(std::span<const MemoryRegion> regions) {
  if (regions.empty()) return InvalidArgumentError("empty list of regions to register");
  return impl_->target->registry().Register(regions);
}

Status Engine::UnregisterMemory(void* addr) {
  return impl_->target->registry().Unregister(reinterpret_cast<uint64_t>(addr));
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
  FERRY_RETURN_IF_ERROR(internal::ParsePeerId(peer_id).status());
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
  if (seg->link) seg->link->Retire();
  seg->link.reset();
  return OkStatus();
}

StatusOr<SegmentInfo> Engine::QuerySegment(SegmentHandle h) {
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(h));
  std::lock_guard<std::mutex> lock(seg->mu);
  FERRY_RETURN_IF_ERROR(impl_->Handshake(*seg));
  SegmentInfo info;
  const auto& d = seg->desc;
  info.peer_id = d.peer_id;
  info.engine_name = d.engine_name;
  info.instance_id = d.instance_id;
  info.wire_version = seg->wire_version;
  info.transport = std::string(seg->transport->Name());
  info.capabilities.version = d.version;
  info.capabilities.wire_version_min = d.wire_min;
  info.capabilities.wire_version_max = d.wire_max;
  for (const auto& t : d.transports) info.capabilities.transports.push_back(t.name);
  info.capabilities.features = d.features;
  info.regions = d.regions;
  return info;
}

// ---- batches -------------------------------------------------------------------

StatusOr<BatchId> Engine::AllocateBatch(size_t capacity) {
  if (capacity == 0 || capacity > kMaxBatchCapacity) {
    return InvalidArgumentError("batch capacity must be in [1, " + std::to_string(kMaxBatchCapacity) +
                                "], got " + std::to_string(capacity));
  }
  return BatchId{impl_->batches.Insert(std::make_shared<BatchState>(capacity))};
}

// Requests sliced, ordered and posted at a time by Submit.
constexpr size_t kPostChunk = 8192;

Status Engine::Submit(BatchId id, std::span<const TransferRequest> requests) {
  FERRY_ASSIGN_OR_RETURN(auto batch, impl_->GetBatch(id));
  if (requests.empty()) return InvalidArgumentError("no requests to submit");
  // 1. Validate everything before anything moves.
  std::vector<Segment*> segs(requests.size());  // owned by `distinct`
  std::map<uint64_t, std::shared_ptr<Segment>> distinct;
  RemoteRegion local_region;  // the last local region found; most requests share it
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
    }
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
  // 2. Make sure every peer is reachable (connects lazily).
  struct PeerPost {
    std::shared_ptr<internal::PeerLink> link;
    uint32_t max_slice = 0;
    internal::SliceOrder order = internal::SliceOrder::kByDestination;
    std::vector<internal::Slice> slices;  // of the chunk being prepared
  };
  std::map<Segment*, PeerPost> peers;
  for (auto& [h, seg] : distinct) {
    auto link = impl_->EnsureLink(*seg);
    if (!link.ok()) return link.status().WithPrefix("peer " + seg->name);
    PeerPost& p = peers[seg.get()];
    p.link = *link;
    std::lock_guard<std::mutex> lock(seg->mu);
    p.max_slice = seg->transport->MaxSlice();
    p.order = seg->transport->PreferredOrder();
  }
  // Requests mostly share one peer: one map lookup per run of them.
  Segment* cached_seg = nullptr;
  PeerPost* cached = nullptr;
  auto peer_of = [&](Segment* seg) -> PeerPost& {
    if (seg != cached_seg) cached_seg = seg, cached = &peers[seg];
    return *cached;
  };
  // 3. Reserve, then slice, order and post chunk by chunk: the transport
  // starts sending the first chunk while the next ones are prepared (for
  // 262,144 requests, preparing them all first left the streams idle for
  // 30-80 ms per batch).
  FERRY_ASSIGN_OR_RETURN(size_t base, batch->Reserve(requests.size()));
  // Every request is pending before the first slice moves, so no observer
  // sees the batch idle between chunks.
  batch->BeginRange(base, requests.size(), [&](size_t index) {
    const size_t i = index - base;
    const uint32_t max_slice = peer_of(segs[i]).max_slice;
    const uint64_t length = requests[i].length;
    return length <= max_slice ? 1u : static_cast<uint32_t>((length + max_slice - 1) / max_slice);
  });
  const Clock::time_point deadline = Clock::now() + impl_->options.transfer_timeout;
  for (size_t begin = 0; begin < requests.size(); begin += kPostChunk) {
    const size_t end = std::min(requests.size(), begin + kPostChunk);
    for (size_t i = begin; i < end; ++i) {
      const TransferRequest& r = requests[i];
      PeerPost& p = peer_of(segs[i]);
      if (p.slices.capacity() == 0) p.slices.reserve(end - i);  // emptied by the last chunk's Post
      for (uint64_t off = 0; off < r.length; off += p.max_slice) {
        uint32_t len = static_cast<uint32_t>(std::min<uint64_t>(p.max_slice, r.length - off));
        p.slices.push_back({r.opcode, static_cast<char*>(r.local) + off, r.remote_addr + off, len,
                            static_cast<uint32_t>(base + i)});
      }
    }
    for (auto& [seg, p] : peers) {
      if (p.slices.empty()) continue;
      internal::OrderForSending(p.slices, p.order);
      p.link->Post(batch, std::move(p.slices), deadline);
      p.slices.clear();  // moved-from: empty and ready for the next chunk
    }
  }
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
  if (name.size() > kMaxNotificationName || message.size() > kMaxNotificationMessage) {
    return InvalidArgumentError("notification too large: name " + std::to_string(name.size()) +
                                " bytes (at most " + std::to_string(kMaxNotificationName) + "), message " +
                                std::to_string(message.size()) + " bytes (at most " +
                                std::to_string(kMaxNotificationMessage) + ")");
  }
  FERRY_ASSIGN_OR_RETURN(auto seg, impl_->GetSegment(h));
  FERRY_ASSIGN_OR_RETURN(auto link, impl_->EnsureLink(*seg));
  wire::NotifyBody body{impl_->peer_id, std::string(name), std::string(message)};
  return link->Notify(body, Clock::now() + impl_->options.transfer_timeout)
      .WithPrefix("notification to " + seg->name);
}

std::vector<Notification> Engine::GetNotifications() { return impl_->target->Drain(); }

}  // namespace ferry
