// The peer-to-peer handshake store: one short connection to the peer's rpc
// port, one kHandshakeRequest carrying our descriptor, one kHandshakeResponse
// carrying the peer's (docs/wire-format.md). The responder answers on this
// engine's rpc port with the descriptor last published. With a cluster
// secret the connection authenticates first (transport/stream/auth.h); the
// rpc port's own authentication guards the responder.
#include <mutex>

#include "common/log.h"
#include "common/net.h"
#include "metadata/metadata.h"
#include "metadata/registry.h"
#include "transport/stream/auth.h"
#include "transport/stream/connection.h"
#include "wire/exchange.h"

namespace ferry::internal {
namespace {

// What the responder answers with. Thread-safe.
class Published {
 public:
  void Set(wire::PeerDescriptor d) {
    auto p = std::make_shared<const wire::PeerDescriptor>(std::move(d));
    std::lock_guard<std::mutex> lock(mu_);
    current_ = std::move(p);
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    current_.reset();
  }
  std::shared_ptr<const wire::PeerDescriptor> Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return current_;
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const wire::PeerDescriptor> current_;
};

// kHandshakeRequest: the caller's descriptor in, ours out, in the highest
// descriptor format both read. The connection stays waiting for another
// first frame (the caller closes it).
Status Answer(const Published& published, uint16_t format_max, stream::Connection& c,
              const wire::FrameHeader& h, std::string_view body) {
  std::shared_ptr<const wire::PeerDescriptor> self = published.Get();
  if (!self) return UnavailableError("engine is shutting down (no descriptor published)");
  auto caller = wire::DecodeDescriptor(body);
  Status s;
  uint16_t format = wire::kDescriptorFormatMin;
  if (!caller.ok()) {
    s = caller.status().WithPrefix("handshake request rejected");
  } else {
    format = wire::AnswerFormat(*caller, format_max);
    auto v = wire::NegotiateWireVersion(*self, *caller);
    if (!v.ok()) {
      // Said here too, so the side being called learns who is behind.
      FERRY_LOG(kWarning, "peer " << caller->peer_id
                                  << " cannot talk to this engine: " << v.status().message());
    }
  }
  std::string out;
  wire::EncodeHandshakeResponse(s, *self, &out, format);
  c.QueueReply(wire::FrameType::kHandshakeResponse, h.seq, std::move(out));
  return OkStatus();
}

class P2PStore : public MetadataStore {
 public:
  explicit P2PStore(std::shared_ptr<const ClusterSecret> secret) : secret_(std::move(secret)) {}

  Status Publish(const wire::PeerDescriptor& self) override {
    published_->Set(self);
    return OkStatus();
  }

  StatusOr<wire::PeerDescriptor> Fetch(std::string_view name, const wire::PeerDescriptor& self,
                                       Clock::time_point deadline) override {
    auto hp = ParsePeerId(name);
    if (!hp.ok()) {
      return hp.status().WithPrefix(
          "P2PHANDSHAKE names peers by \"host:port\" (a metadata service "
          "resolves other names)");
    }
    const std::string peer(name);
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTo(*hp, deadline));
    // Requests are written in format 1, which every build reads; the
    // features say which formats we read back.
    std::string body;
    wire::EncodeDescriptor(self, &body, wire::kDescriptorFormatMin);
    auto ctx = [&](const Status& s) { return s.WithPrefix("handshake with " + peer); };
    const stream::Credentials cred{secret_, self.peer_id};
    auto resp =
        stream::AuthenticatedExchange(fd.get(), cred, peer, wire::FrameType::kHandshakeRequest,
                                      body, wire::FrameType::kHandshakeResponse, deadline);
    if (!resp.ok()) return ctx(resp.status());
    auto decoded = wire::DecodeHandshakeResponse(*resp);
    if (!decoded.ok()) return ctx(decoded.status());
    if (!decoded->first.ok()) return ctx(stream::ExplainRefusal(decoded->first, cred, peer));
    return std::move(decoded->second);
  }

  Status Remove(std::string_view) override {
    published_->Clear();
    return OkStatus();
  }

  Status Watch(ChangeCallback) override {
    return UnimplementedError(
        "P2PHANDSHAKE cannot watch peers (a restart is found when its streams break)");
  }

  const std::shared_ptr<Published>& published() const { return published_; }

 private:
  const std::shared_ptr<const ClusterSecret> secret_;
  const std::shared_ptr<Published> published_ = std::make_shared<Published>();
};

bool TakesP2PUrl(std::string_view url) { return url.empty() || url == "P2PHANDSHAKE"; }

}  // namespace

StatusOr<std::unique_ptr<MetadataStore>> MakeP2PStore(std::string_view,
                                                      const MetadataContext& ctx) {
  auto store = std::make_unique<P2PStore>(ctx.secret);
  if (ctx.rpc_openers == nullptr) return InternalError("P2PHANDSHAKE needs the rpc port");
  std::shared_ptr<Published> published = store->published();
  const uint16_t format_max = ctx.descriptor_format_max;
  ctx.rpc_openers->Add(wire::FrameType::kHandshakeRequest,
                       [published, format_max](stream::Connection& c, const wire::FrameHeader& h,
                                               std::string_view body) {
                         return Answer(*published, format_max, c, h, body);
                       });
  return std::unique_ptr<MetadataStore>(std::move(store));
}

MetadataBackend P2PBackend() {
  return {"p2p",
          "P2PHANDSHAKE",
          "no server: peers are named HOST:PORT and asked for their descriptor",
          TakesP2PUrl,
          /*keyed=*/false,
          NothingLacking,
          MakeP2PStore};
}

}  // namespace ferry::internal
