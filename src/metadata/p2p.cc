// The peer-to-peer handshake: one short connection to the peer's rpc port,
// one kHandshakeRequest carrying our descriptor, one kHandshakeResponse
// carrying the peer's. See docs/wire-format.md.
#include <cstring>

#include "common/net.h"
#include "metadata/metadata.h"
#include "wire/frame.h"

namespace ferry::internal {
namespace {

class P2PMetadata : public MetadataClient {
 public:
  StatusOr<wire::PeerDescriptor> Fetch(std::string_view peer_id, const wire::PeerDescriptor& self,
                                       Clock::time_point deadline) override {
    FERRY_ASSIGN_OR_RETURN(HostPort hp, ParsePeerId(peer_id));
    const std::string name(peer_id);
    FERRY_ASSIGN_OR_RETURN(UniqueFd fd, ConnectTo(hp, deadline));
    std::string body;
    wire::EncodeDescriptor(self, &body);
    wire::FrameHeader h;
    h.type = wire::FrameType::kHandshakeRequest;
    h.seq = 1;
    std::string frame = wire::BuildFrame(h, body);
    auto ctx = [&](const Status& s) { return s.WithPrefix("handshake with " + name); };
    Status s = SendAll(fd.get(), frame.data(), frame.size(), deadline);
    if (!s.ok()) return ctx(s);
    uint8_t hdr[wire::kFrameHeaderSize];
    s = RecvAll(fd.get(), hdr, sizeof(hdr), deadline);
    if (!s.ok()) return ctx(s);
    auto rh = wire::DecodeHeader(hdr);
    if (!rh.ok()) return ctx(rh.status());
    if (rh->type != wire::FrameType::kHandshakeResponse) {
      return ctx(DataLossError("peer answered with frame type " +
                               std::to_string(static_cast<int>(rh->type))));
    }
    std::string resp(rh->body_len, '\0');
    s = RecvAll(fd.get(), resp.data(), resp.size(), deadline);
    if (!s.ok()) return ctx(s);
    auto decoded = wire::DecodeHandshakeResponse(resp);
    if (!decoded.ok()) return ctx(decoded.status());
    if (!decoded->first.ok()) return ctx(decoded->first);
    return std::move(decoded->second);
  }
};

}  // namespace

StatusOr<std::unique_ptr<MetadataClient>> MakeMetadataClient(std::string_view url) {
  if (url.empty() || url == "P2PHANDSHAKE") {
    return std::unique_ptr<MetadataClient>(std::make_unique<P2PMetadata>());
  }
  return UnimplementedError("metadata '" + std::string(url) +
                            "' is not supported by this build yet; use \"P2PHANDSHAKE\" (no server)");
}

}  // namespace ferry::internal
