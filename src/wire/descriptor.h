// PeerDescriptor: what an engine tells a peer about itself during the
// handshake. Layout in docs/wire-format.md ("Descriptor").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::wire {

inline constexpr uint16_t kDescriptorFormat = 1;

struct TransportEndpoint {
  std::string name;      // "tcp", "local"
  std::string endpoint;  // "host:port" for tcp; process token for local
};

struct PeerDescriptor {
  std::string engine_name;
  std::string peer_id;  // "host:port"
  uint64_t instance_id = 0;
  uint64_t process_token = 0;  // equal for engines of one process
  std::string hostname;
  uint32_t pid = 0;
  std::string version;  // ferry::Version()
  uint16_t wire_min = 0;
  uint16_t wire_max = 0;
  std::vector<TransportEndpoint> transports;
  std::vector<std::string> features;
  std::vector<RemoteRegion> regions;

  bool HasFeature(std::string_view f) const;
  const TransportEndpoint* FindTransport(std::string_view name) const;
};

void EncodeDescriptor(const PeerDescriptor& d, std::string* out);
StatusOr<PeerDescriptor> DecodeDescriptor(std::string_view bytes);

// Highest wire version both ranges contain, or kFailedPrecondition naming
// both ranges and both peers.
StatusOr<uint16_t> NegotiateWireVersion(const PeerDescriptor& local, const PeerDescriptor& remote);

// kHandshakeResponse body: status, then the responder's descriptor.
void EncodeHandshakeResponse(const Status& s, const PeerDescriptor& d, std::string* out);
StatusOr<std::pair<Status, PeerDescriptor>> DecodeHandshakeResponse(std::string_view body);

}  // namespace ferry::wire
