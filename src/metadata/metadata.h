// Metadata: how an engine learns a peer's descriptor from its name.
//
// "P2PHANDSHAKE" (the default) needs no server: the descriptor is fetched
// from the peer itself over its rpc port. Services (etcd, Redis, HTTP) will
// implement the same interface. Implementations are thread-safe.
#pragma once

#include <chrono>
#include <memory>
#include <string_view>

#include "ferry/status.h"
#include "wire/descriptor.h"

namespace ferry::internal {

class MetadataClient {
 public:
  virtual ~MetadataClient() = default;
  // The peer's current descriptor. `self` is sent along so the peer can log
  // who is calling and spot version skew on its side too.
  virtual StatusOr<wire::PeerDescriptor> Fetch(std::string_view peer_id,
                                               const wire::PeerDescriptor& self,
                                               std::chrono::steady_clock::time_point deadline) = 0;
};

// kUnimplemented for URLs of services this build does not support yet.
StatusOr<std::unique_ptr<MetadataClient>> MakeMetadataClient(std::string_view url);

}  // namespace ferry::internal
