#include "transport/shm/shm_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <array>
#include <random>

#include "common/log.h"
#include "common/net.h"
#include "wire/frame.h"

namespace ferry::internal {
namespace {

using tcp::Connection;

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

class ShmTransportImpl : public Transport {
 public:
  ShmTransportImpl(ShmTransportConfig cfg, std::shared_ptr<const tcp::ServerContext> server,
                   std::shared_ptr<tcp::LoopPool> pool)
      : cfg_(std::move(cfg)), server_(std::move(server)), pool_(std::move(pool)) {
    std::random_device rd;
    for (char& c : probe_) c = static_cast<char>(rd());
    char name[64];
    std::snprintf(name, sizeof(name), "ferry-shm-%d-%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(cfg_.local_instance));
    socket_name_ = name;
  }

  ~ShmTransportImpl() override { Shutdown(); }

  Status Start() {
    if (BootId().empty()) return UnavailableError("same-host transport: this host has no boot id");
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, ListenUnix(socket_name_));
    auto listener = std::make_shared<tcp::Listener>(tcp::Listener::Kind::kUnix, std::move(fd),
                                                    pool_->loops(), server_, 0);
    tcp::Listener::Serve(listener, pool_->loop(0));
    return OkStatus();
  }

  std::string_view Name() const override { return "shm"; }
  uint32_t MaxSlice() const override { return cfg_.slice_size; }
  // The kernel pins the initiator's pages range by range (process_vm_*v's
  // remote side), so the initiator's ranges should be adjacent; the target's
  // side is plain loads and stores.
  SliceOrder PreferredOrder() const override { return SliceOrder::kByLocal; }
  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"shm", Endpoint(socket_name_)});
  }
  // Same kernel (boot id); whether the processes can reach each other (same
  // network namespace for the socket, ptrace access for the copies) only
  // connecting tells.
  bool CanReach(const wire::PeerDescriptor& peer) const override {
    const wire::TransportEndpoint* ep = peer.FindTransport("shm");
    std::string boot, name;
    return ep != nullptr && ParseEndpoint(ep->endpoint, &boot, &name) && boot == BootId();
  }

  StatusOr<std::shared_ptr<PeerLink>> Connect(const wire::PeerDescriptor& peer, uint16_t version,
                                              Clock::time_point deadline) override {
    const wire::TransportEndpoint* ep = peer.FindTransport("shm");
    std::string boot, name;
    if (ep == nullptr || !ParseEndpoint(ep->endpoint, &boot, &name)) {
      return UnimplementedError("peer " + peer.peer_id + " offers no valid shm endpoint");
    }
    if (boot != BootId()) {
      return UnavailableError("peer " + peer.peer_id + " runs on another host (boot id " + boot + ")");
    }
    std::vector<std::shared_ptr<Connection>> streams;
    for (int i = 0; i < std::max(1, cfg_.streams); ++i) {
      auto ctx = [&](const Status& s) {
        return s.WithPrefix("opening same-host stream " + std::to_string(i) + " to " + peer.peer_id);
      };
      auto fd = ConnectUnix(name, deadline);
      if (!fd.ok()) return ctx(fd.status());
      wire::CopyHello hello;
      hello.hello = {cfg_.local_instance, peer.instance_id, version, static_cast<uint16_t>(i),
                     cfg_.local_peer_id};
      hello.probe_addr = reinterpret_cast<uint64_t>(probe_.data());
      hello.probe.assign(probe_.data(), probe_.size());
      std::string body;
      wire::EncodeCopyHello(hello, &body);
      Status hi = tcp::SayHello(fd->get(), wire::FrameType::kCopyHello, body, deadline);
      if (!hi.ok()) return ctx(hi);
      FERRY_RETURN_IF_ERROR(SetNonBlocking(fd->get(), true));
      streams.push_back(std::make_shared<Connection>(pool_->loop(static_cast<size_t>(i)), std::move(*fd),
                                                     Connection::Role::kInitiator, peer.peer_id, nullptr,
                                                     version));
    }
    tcp::StreamLinkConfig lc;
    lc.max_frame_bytes = cfg_.max_frame_bytes;
    lc.max_frame_entries = cfg_.max_frame_entries;
    lc.copy = true;
    return tcp::StreamLink::Open(lc, peer.peer_id, version, std::move(streams));
  }

  void Shutdown() override { pool_->Stop(); }

 private:
  ShmTransportConfig cfg_;
  std::shared_ptr<const tcp::ServerContext> server_;
  std::shared_ptr<tcp::LoopPool> pool_;
  std::string socket_name_;
  // Read by targets through process_vm_readv (see ProbePeer); never changes.
  std::array<char, 16> probe_{};
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> MakeShmTransport(ShmTransportConfig config,
                                                      std::shared_ptr<const tcp::ServerContext> server,
                                                      std::shared_ptr<tcp::LoopPool> loops) {
  auto t = std::make_unique<ShmTransportImpl>(std::move(config), std::move(server), std::move(loops));
  FERRY_RETURN_IF_ERROR(t->Start());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace ferry::internal
