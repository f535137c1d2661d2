#include "transport/shm/shm_transport.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <random>

#include "common/fd_limit.h"
#include "common/log.h"
#include "common/net.h"
#include "transport/shm/copy_frames.h"
#include "transport/shm/copy_service.h"
#include "transport/shm/mapped_segments.h"
#include "transport/shm/request_ring.h"
#include "transport/shm/same_host_probe.h"
#include "transport/stream/connection.h"
#include "transport/stream/listener.h"
#include "wire/frame.h"

namespace ferry::internal {
namespace {

using stream::Connection;

// The endpoint a descriptor advertises: "<boot id>/<abstract socket name>".
std::string Endpoint(const std::string& socket_name) { return BootId() + "/" + socket_name; }

// Splits an advertised endpoint; false if it is malformed.
bool ParseEndpoint(const std::string& ep, std::string* boot_id, std::string* socket_name) {
  const size_t slash = ep.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == ep.size()) return false;
  *boot_id = ep.substr(0, slash);
  *socket_name = ep.substr(slash + 1);
  return true;
}

class ShmTransport : public Transport {
 public:
  ShmTransport(TransportCaps caps, const TransportContext& ctx)
      : Transport(std::move(caps)),
        streams_(ctx.options->tcp_streams),
        local_peer_id_(ctx.peer_id),
        local_instance_(ctx.instance_id),
        credentials_(ctx.credentials()),
        pool_(ctx.streams->loops()),
        map_peers_(ctx.options->map_shared_memory),
        rings_(ctx.options->shm_rings),
        hello_flags_(ctx.options->testing.no_staged_lends
                         ? wire::kHelloFlagGoAway
                         : wire::kHelloFlagGoAway | wire::kHelloFlagLendStaged) {
    std::random_device rd;
    for (char& c : probe_) c = static_cast<char>(rd());
    char name[64];
    std::snprintf(name, sizeof(name), "ferry-shm-%d-%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(local_instance_));
    socket_name_ = name;
    link_cfg_.max_frame_bytes = ctx.options->max_frame_bytes;
    link_cfg_.max_frame_entries = ctx.options->max_frame_entries;
    link_cfg_.stream_window = 0;  // copies leave no bytes in socket buffers
    link_cfg_.encoder = std::make_shared<shm::CopyFrameEncoder>();
    link_cfg_.max_outstanding_slices = ctx.options->peer_max_requests;
    link_cfg_.max_outstanding_bytes = ctx.options->peer_max_bytes;
  }

  ~ShmTransport() override { Shutdown(); }

  Status Start(const TransportContext& ctx) {
    if (BootId().empty()) return UnavailableError("same-host transport: this host has no boot id");
    // Mapped segments: without a slot table, peers copy through this engine.
    auto table = shm::SlotTable::Create();
    if (table.ok()) {
      slots_ = *std::move(table);
    } else {
      FERRY_LOG(kWarning,
                "same-host peers copy through this engine (no slot table for mapped "
                "segments: "
                    << table.status() << ")");
    }
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, ListenUnix(socket_name_));
    shm::CopyOpenerConfig opener{ctx.hello_policy(), ctx.options->testing.refuse_same_host_copy,
                                 ctx.options->shm_rings};
    auto openers = std::make_shared<stream::FirstFrames>();
    // The same authentication as the rpc port (and the same once-per-peer
    // log of refusals).
    openers->SetAuth(ctx.streams->auth());
    auto open = [opener](Connection& c, const wire::FrameHeader& h, std::string_view body) {
      return shm::OpenCopyStream(opener, c, h, body);
    };
    openers->Add(wire::FrameType::kCopyHello, open);
    // On the rpc port the peer process is unknown: the hello is refused,
    // saying so.
    ctx.streams->rpc_openers().Add(wire::FrameType::kCopyHello, open);
    stream::ListenerConfig cfg;
    cfg.name = "same-host socket " + socket_name_;
    cfg.openers = std::move(openers);
    cfg.hello_timeout = ctx.streams->hello_timeout();
    cfg.on_accept = [](int fd) { return PeerPid(fd); };
    cfg.admission = ctx.streams->admission();
    FERRY_ASSIGN_OR_RETURN(listener_,
                           stream::Listener::Serve(std::move(fd), std::move(cfg), *pool_));
    return OkStatus();
  }

  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"shm", Endpoint(socket_name_)});
    if (slots_) self->transports.push_back({shm::kMapEndpoint, slots_->Endpoint()});
  }
  // Shared regions get a slot (and the key "shm") that same-host peers map
  // them by; others none.
  StatusOr<std::vector<wire::RegionKey>> RegisterRegion(const Region& region) override {
    std::vector<wire::RegionKey> keys;
    if (slots_) {
      if (std::optional<uint64_t> key = slots_->Publish(region)) {
        keys.emplace_back(shm::kMapKey, *key);
      }
    }
    return keys;
  }
  void UnregisterRegion(const Region& region) override {
    if (!slots_) return;
    for (const wire::RegionKey& k : region.keys) {
      if (k.transport == shm::kMapKey) slots_->Revoke(k.key);
    }
  }
  // Same kernel (boot id); whether the processes can reach each other (same
  // network namespace for the socket, ptrace access for the copies) only
  // connecting tells.
  bool CanReach(const wire::PeerDescriptor& peer) const override {
    const wire::TransportEndpoint* ep = peer.FindTransport("shm");
    std::string boot, name;
    return ep != nullptr && ParseEndpoint(ep->endpoint, &boot, &name) && boot == BootId();
  }

  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> info,
                                              uint16_t version,
                                              Clock::time_point deadline) override {
    const wire::PeerDescriptor& peer = info->desc();
    const wire::TransportEndpoint* ep = peer.FindTransport("shm");
    std::string boot, name;
    if (ep == nullptr || !ParseEndpoint(ep->endpoint, &boot, &name)) {
      return UnimplementedError("peer " + peer.peer_id + " offers no valid shm endpoint");
    }
    if (boot != BootId()) {
      return UnavailableError("peer " + peer.peer_id + " runs on another host (boot id " + boot +
                              ")");
    }
    std::vector<std::shared_ptr<Connection>> streams;
    int target_pid = 0;
    for (int i = 0; i < std::max(1, streams_); ++i) {
      auto ctx = [&](const Status& s) {
        return s.WithPrefix("opening same-host stream " + std::to_string(i) + " to " +
                            peer.peer_id);
      };
      auto fd = ConnectUnix(name, deadline);
      if (!fd.ok()) return ctx(fd.status());
      if (i == 0) target_pid = PeerPid(fd->get());
      shm::CopyHello hello;
      hello.hello = {local_instance_, peer.instance_id, version, static_cast<uint16_t>(i),
                     local_peer_id_};
      hello.probe_addr = reinterpret_cast<uint64_t>(probe_.data());
      hello.probe.assign(probe_.data(), probe_.size());
      // Request rings, if the peer takes them: offered in the hello, used if
      // the peer marked them taken before answering.
      std::unique_ptr<shm::RequestRing> ring;
      if (rings_ && peer.HasFeature("shm-rings")) {
        auto made = shm::RequestRing::Create();
        if (made.ok()) {
          ring = *std::move(made);
          hello.ring = ring->fds();
        } else {
          FERRY_LOG(kInfo, "same-host stream to " << info->Label()
                                                  << " goes through its socket: " << made.status());
        }
      }
      std::string body;
      shm::EncodeCopyHello(hello, &body);
      Status hi = stream::SayHello(fd->get(), credentials_, peer.peer_id,
                                   wire::FrameType::kCopyHello, body, deadline, hello_flags_);
      if (!hi.ok()) return ctx(hi);
      FERRY_RETURN_IF_ERROR(SetNonBlocking(fd->get(), true));
      streams.push_back(std::make_shared<Connection>(pool_->loop(static_cast<size_t>(i)),
                                                     std::move(*fd), info->Label(), version));
      if (ring && ring->Attached()) streams.back()->SetChannel(std::move(ring));
    }
    // Reads: the initiator copies them itself (docs/reliability.md, "Failed
    // and timed-out requests"), so this process must be able to read the
    // target's memory; if it cannot, the link is refused (auto then uses
    // tcp) rather than letting the target write reads that may already have
    // failed. A peer of an older build, which does not lend, copies them.
    stream::StreamLinkConfig cfg = link_cfg_;
    if (peer.HasFeature("shm-lend-reads")) {
      UniqueFd pidfd;
      errno = 0;
      if (target_pid > 0 && shm::CanReadProcess(target_pid)) {
        pidfd = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, target_pid, 0)));
      }
      if (!pidfd.valid() && (errno == EMFILE || errno == ENFILE)) {
        // Out of descriptors (the /proc/PID/mem check or the pidfd): a
        // limit to raise, not a peer this process cannot read.
        return DescriptorError(StatusCode::kUnavailable,
                               "same-host transport: cannot follow process " +
                                   std::to_string(target_pid) + " (" + info->Label() + ")",
                               errno);
      }
      if (!pidfd.valid()) {
        return FailedPreconditionError(
            "same-host transport: this process cannot read the memory of process " +
            std::to_string(target_pid) + " (" + info->Label() +
            "), which it needs to copy reads itself (so that a failed read never lands later); it "
            "needs "
            "ptrace access to that process: the same user with Yama ptrace_scope 0, or "
            "CAP_SYS_PTRACE");
      }
      cfg.encoder = std::make_shared<shm::CopyFrameEncoder>(std::make_shared<shm::LendReadHook>(
          target_pid, std::move(pidfd), info->Label(), version));
    } else {
      FERRY_LOG(kInfo, "same-host reads from "
                           << info->Label()
                           << " are copied by the peer (an older build that does not lend "
                              "its ranges): a read that fails may still be written later");
    }
    std::shared_ptr<PeerLink> link =
        stream::StreamLink::Open(cfg, info->Label(), version, std::move(streams));
    return MapPeer(*info, target_pid, std::move(link));
  }

  void Shutdown() override {
    if (slots_) slots_->Close();  // peers stop copying through their mappings
    pool_->Stop();
  }

 private:
  // `link` itself, or wrapped to copy through mappings of the peer's shared
  // regions if the peer publishes them and this process can map them.
  std::shared_ptr<PeerLink> MapPeer(const PeerInfo& info, int pid, std::shared_ptr<PeerLink> link) {
    const wire::TransportEndpoint* ep = info.desc().FindTransport(shm::kMapEndpoint);
    if (!map_peers_ || ep == nullptr || pid <= 0) return link;
    auto maps = shm::PeerMaps::Open(ep->endpoint, pid, info.Label());
    if (!maps.ok()) {
      FERRY_LOG(kInfo,
                "copies to and from " << info.Label() << " go through the peer: " << maps.status());
      return link;
    }
    return std::make_shared<shm::MappedLink>(std::move(link), *std::move(maps));
  }

  const int streams_;
  const std::string local_peer_id_;
  const uint64_t local_instance_;
  const stream::Credentials credentials_;
  const std::shared_ptr<stream::LoopPool> pool_;
  stream::StreamLinkConfig link_cfg_;
  const bool map_peers_;  // EngineOptions::map_shared_memory
  const bool rings_;      // EngineOptions::shm_rings
  // Of this engine's same-host hellos: kGoAway and kLendAck answers are
  // taken (but with TestingOptions::no_staged_lends).
  const uint16_t hello_flags_;
  std::unique_ptr<shm::SlotTable> slots_;  // null: peers copy through this engine
  std::shared_ptr<stream::Listener> listener_;
  std::string socket_name_;
  // Read by targets through process_vm_readv (see ProbePeer); never changes.
  std::array<char, 16> probe_{};
};

}  // namespace

TransportCaps ShmCaps() {
  TransportCaps c;
  c.name = "shm";
  c.reach = Reach::kSameHost;
  // The kernel pins the initiator's pages range by range (process_vm_*v's
  // remote side), so the initiator's ranges should be adjacent; the target's
  // side is plain loads and stores.
  c.order = SliceOrder::kByLocal;
  // Shared regions get a slot that same-host peers map them by
  // (mapped_segments.h); every region stays reachable without one.
  c.sees_registrations = true;
  // A region registered after the descriptor was fetched has no key here
  // yet: the core fetches the descriptor again (once per submit) first.
  c.refresh_for_keys = true;
  // The peer's file regions too: its stream service stages them
  // (copy_service.h).
  c.remote_kinds = {MemoryKind::Type::kCpu, MemoryKind::Type::kFile};
  return c;
}

std::string ShmAvailability() { return shm::SameHostCopyRefusal(); }

StatusOr<std::unique_ptr<Transport>> MakeShmTransport(const TransportContext& ctx) {
  TransportCaps caps = ShmCaps();
  caps.max_slice = ctx.options->slice_size;
  auto t = std::make_unique<ShmTransport>(std::move(caps), ctx);
  FERRY_RETURN_IF_ERROR(t->Start(ctx));
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace ferry::internal
