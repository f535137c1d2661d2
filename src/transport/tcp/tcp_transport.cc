#include "transport/tcp/tcp_transport.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>

#include "common/net.h"
#include "transport/stream/connection.h"
#include "transport/stream/hello.h"
#include "transport/stream/stream_link.h"
#include "transport/tcp/tcp_frames.h"
#include "wire/frame.h"

namespace ferry::internal {
namespace {

using stream::Connection;

// The floor of a tcp stream's retransmission timeout: 10 ms instead of the
// kernel's 200 ms (TCP_RTO_MIN_US, Linux 6.15+; an older kernel refuses the
// option and keeps its floor). A lost tail segment, or a lost
// retransmission, is only recovered by the timeout; a stream waiting for it
// holds up every batch it carries a slice of, while the other streams run
// dry once the batch's other frames are done. The timeout still follows
// the path (srtt + 4 rttvar) above the floor, so long paths are unchanged.
// Measured between two network namespaces with 2 % loss (tools/bench_loss.sh;
// the figures: docs/benchmarks-history.md).
void SetRetransmitFloor(int fd) {
#ifdef TCP_RTO_MIN_US
  constexpr int kOption = TCP_RTO_MIN_US;
#else
  constexpr int kOption = 45;  // include/uapi/linux/tcp.h since 6.15
#endif
  const int us = 10000;
  (void)::setsockopt(fd, IPPROTO_TCP, kOption, &us, sizeof(us));
}

// Keepalive: a peer that vanished without a FIN or a reset (its host gone,
// the link cut) is found after about 10 s of silence (5 s idle, then 5
// probes 1 s apart) and the socket fails, so the stream closes and releases
// what it holds. Without it such a stream stays established for ever; on a
// target, the regions of a frame it had half received stay pinned, and
// UnregisterMemory (and so the engine's shutdown) waits for them for ever
// (tests/netns: APeerWhoseInitiatorVanishesMidFrameStillShutsDown). A live
// link is not disturbed: no probe while bytes flow, one per 5 s when idle.
// Keepalive runs only on an idle connection: while sent bytes wait for their
// acknowledgement (a target's read replies to a vanished initiator) the
// kernel retransmits instead, for about 15 minutes (tcp_retries2), with the
// replied ranges pinned. TCP_USER_TIMEOUT bounds that too: bytes
// unacknowledged for 10 s fail the socket (and with keepalive on, it is also
// when unanswered probes give up: the same ~10 s). A live path acknowledges
// within its RTO even when slow (tests/netns: ...MidReadReplyStillShutsDown).
void SetKeepalive(int fd) {
  const int on = 1, idle_s = 5, interval_s = 1, probes = 5;
  const unsigned user_timeout_ms = 10000;
  (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
}

class TcpTransport : public Transport {
 public:
  TcpTransport(TransportCaps caps, const TransportContext& ctx)
      : Transport(std::move(caps)),
        streams_(ctx.options->tcp_streams),
        local_peer_id_(ctx.peer_id),
        local_instance_(ctx.instance_id),
        credentials_(ctx.credentials()),
        loops_(ctx.streams->loops()),
        encoder_(std::make_shared<tcp::TcpFrameEncoder>()) {
    link_cfg_.max_frame_bytes = ctx.options->max_frame_bytes;
    link_cfg_.max_frame_entries = ctx.options->max_frame_entries;
    // Two frames per stream: measured best for 1 MiB frames (one frame: a
    // little slower; four: as slow as no window at all).
    link_cfg_.stream_window = 2 * uint64_t{ctx.options->max_frame_bytes};
    link_cfg_.encoder = encoder_;
    link_cfg_.max_outstanding_slices = ctx.options->peer_max_requests;
    link_cfg_.max_outstanding_bytes = ctx.options->peer_max_bytes;
  }
  ~TcpTransport() override { Shutdown(); }

  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"tcp", local_peer_id_});
  }
  bool CanReach(const wire::PeerDescriptor& peer) const override {
    return peer.FindTransport("tcp") != nullptr;
  }

  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> info,
                                              uint16_t version,
                                              Clock::time_point deadline) override {
    const wire::PeerDescriptor& peer = info->desc();
    const wire::TransportEndpoint* ep = peer.FindTransport("tcp");
    if (ep == nullptr)
      return UnimplementedError("peer " + peer.peer_id + " offers no tcp endpoint");
    FERRY_ASSIGN_OR_RETURN(HostPort hp, ParsePeerId(ep->endpoint));
    std::vector<std::shared_ptr<Connection>> streams;
    for (int i = 0; i < std::max(1, streams_); ++i) {
      FERRY_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTo(hp, deadline));
      SetRetransmitFloor(fd.get());
      SetKeepalive(fd.get());
      wire::StreamHello hello{local_instance_, peer.instance_id, version, static_cast<uint16_t>(i),
                              local_peer_id_};
      std::string body;
      wire::EncodeStreamHello(hello, &body);
      Status hi = stream::SayHello(fd.get(), credentials_, peer.peer_id,
                                   wire::FrameType::kStreamHello, body, deadline);
      if (!hi.ok())
        return hi.WithPrefix("opening stream " + std::to_string(i) + " to " + peer.peer_id);
      FERRY_RETURN_IF_ERROR(SetNonBlocking(fd.get(), true));
      streams.push_back(std::make_shared<Connection>(loops_->loop(static_cast<size_t>(i)),
                                                     std::move(fd), info->Label(), version));
    }
    return stream::StreamLink::Open(link_cfg_, info->Label(), version, std::move(streams));
  }

  void Shutdown() override { loops_->Stop(); }

 private:
  const int streams_;
  const std::string local_peer_id_;
  const uint64_t local_instance_;
  const stream::Credentials credentials_;
  const std::shared_ptr<stream::LoopPool> loops_;
  const std::shared_ptr<const tcp::TcpFrameEncoder> encoder_;
  stream::StreamLinkConfig link_cfg_;
};

// kStreamHello on the rpc port: checks the hello, then serves the stream.
Status OpenTcpStream(const stream::HelloPolicy& policy, bool pinned_gpu_staging, Connection& c,
                     const wire::FrameHeader& h, std::string_view body) {
  FERRY_ASSIGN_OR_RETURN(wire::StreamHello hello, wire::DecodeStreamHello(body));
  Status result = stream::CheckHello(policy, hello);
  std::string reply;
  wire::EncodeStatus(result, &reply);
  c.QueueReply(wire::FrameType::kStreamHelloAck, h.seq, std::move(reply));
  if (result.ok()) {
    c.Serve(std::make_shared<tcp::TcpStreamService>(policy.target, pinned_gpu_staging),
            hello.wire_version,
            hello.initiator_peer_id + " (stream " + std::to_string(hello.stream_index) + ")");
    stream::ArrangeIdleClose(policy, h, c);
  }
  return OkStatus();
}

}  // namespace

TransportCaps TcpCaps() {
  TransportCaps c;
  c.name = "tcp";
  c.reach = Reach::kNetwork;
  // The peer's GPU memory and file regions too: its stream service stages
  // them (tcp_frames.h).
  c.remote_kinds = {MemoryKind::Type::kCpu, MemoryKind::Type::kCuda, MemoryKind::Type::kFile};
  return c;
}

StatusOr<std::unique_ptr<Transport>> MakeTcpTransport(const TransportContext& ctx) {
  TransportCaps caps = TcpCaps();
  caps.max_slice = ctx.options->slice_size;
  const stream::HelloPolicy policy = ctx.hello_policy();
  const bool pinned = !ctx.options->testing.pageable_gpu_staging;
  ctx.streams->rpc_openers().Add(
      wire::FrameType::kStreamHello,
      [policy, pinned](Connection& c, const wire::FrameHeader& h, std::string_view body) {
        return OpenTcpStream(policy, pinned, c, h, body);
      });
  // The served streams carry read replies: a small send buffer keeps the
  // bytes the reader copies in its cache (EngineOptions::tcp_send_buffer).
  const uint32_t send_buffer = ctx.options->tcp_send_buffer;
  ctx.streams->SetRpcAcceptHook([send_buffer](int fd) {
    SetNoDelay(fd);
    SetRetransmitFloor(fd);
    SetKeepalive(fd);
    if (send_buffer != 0) SetSendBuffer(fd, static_cast<int>(send_buffer));
    return 0;
  });
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(std::move(caps), ctx));
}

}  // namespace ferry::internal
