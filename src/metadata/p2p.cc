// The peer-to-peer handshake: one short connection to the peer's rpc port,
// one kHandshakeRequest carrying our descriptor, one kHandshakeResponse
// carrying the peer's. See docs/wire-format.md.
#include <cstring>

#include "common/net.h"
#include "metadata/metadata.h"
#include "wire/exchange.h"

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
    auto ctx = [&](const Status& s) { return s.WithPrefix("handshake with " + name); };
    auto resp = wire::Exchange(fd.get(), wire::FrameType::kHandshakeRequest, body,
                               wire::FrameType::kHandshakeResponse, deadline);
    if (!resp.ok()) return ctx(resp.status());
    auto decoded = wire::DecodeHandshakeResponse(*resp);
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
