#include "transport/tcp/tcp_transport.h"

#include <algorithm>

#include "common/log.h"
#include "common/net.h"
#include "wire/frame.h"

namespace ferry::internal {
namespace {

using tcp::Connection;

class TcpTransportImpl : public Transport {
 public:
  TcpTransportImpl(TcpTransportConfig cfg, std::shared_ptr<const tcp::ServerContext> server,
                   std::shared_ptr<tcp::LoopPool> pool)
      : cfg_(std::move(cfg)), server_(std::move(server)), pool_(std::move(pool)) {}

  ~TcpTransportImpl() override { Shutdown(); }

  void Start() {
    auto listener = std::make_shared<tcp::Listener>(tcp::Listener::Kind::kTcp, std::move(cfg_.listener),
                                                    pool_->loops(), server_, cfg_.served_send_buffer);
    tcp::Listener::Serve(listener, pool_->loop(0));
  }

  std::string_view Name() const override { return "tcp"; }
  uint32_t MaxSlice() const override { return cfg_.slice_size; }
  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"tcp", cfg_.local_peer_id});
  }
  bool CanReach(const wire::PeerDescriptor& peer) const override {
    return peer.FindTransport("tcp") != nullptr;
  }

  StatusOr<std::shared_ptr<PeerLink>> Connect(const wire::PeerDescriptor& peer, uint16_t version,
                                              Clock::time_point deadline) override {
    const wire::TransportEndpoint* ep = peer.FindTransport("tcp");
    if (ep == nullptr) return UnimplementedError("peer " + peer.peer_id + " offers no tcp endpoint");
    FERRY_ASSIGN_OR_RETURN(HostPort hp, ParsePeerId(ep->endpoint));
    std::vector<std::shared_ptr<Connection>> streams;
    for (int i = 0; i < std::max(1, cfg_.streams); ++i) {
      FERRY_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTo(hp, deadline));
      wire::StreamHello hello{cfg_.local_instance, peer.instance_id, version, static_cast<uint16_t>(i),
                              cfg_.local_peer_id};
      std::string body;
      wire::EncodeStreamHello(hello, &body);
      Status hi = tcp::SayHello(fd.get(), wire::FrameType::kStreamHello, body, deadline);
      if (!hi.ok()) return hi.WithPrefix("opening stream " + std::to_string(i) + " to " + peer.peer_id);
      FERRY_RETURN_IF_ERROR(SetNonBlocking(fd.get(), true));
      EventLoop* loop = pool_->loop(static_cast<size_t>(i));
      streams.push_back(std::make_shared<Connection>(
          loop, std::move(fd), Connection::Role::kInitiator, peer.peer_id, nullptr, version));
    }
    tcp::StreamLinkConfig lc;
    lc.max_frame_bytes = cfg_.max_frame_bytes;
    lc.max_frame_entries = cfg_.max_frame_entries;
    lc.stream_window = cfg_.stream_window;
    return tcp::StreamLink::Open(lc, peer.peer_id, version, std::move(streams));
  }

  void Shutdown() override { pool_->Stop(); }

 private:
  TcpTransportConfig cfg_;
  std::shared_ptr<const tcp::ServerContext> server_;
  std::shared_ptr<tcp::LoopPool> pool_;
};

}  // namespace

StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(TcpTransportConfig config,
                                                      std::shared_ptr<const tcp::ServerContext> server,
                                                      std::shared_ptr<tcp::LoopPool> loops) {
  auto t = std::make_unique<TcpTransportImpl>(std::move(config), std::move(server), std::move(loops));
  t->Start();
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace ferry::internal
