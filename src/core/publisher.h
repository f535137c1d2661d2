// Publisher: this engine as its peers see it — its descriptor (identity,
// versions, transports, features, exported regions) — and keeping the
// metadata store's copy of it current: the engine publishes at creation and
// after every (un)registration. Thread-safe: one Publish at a time, each
// with the registry's latest state.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/target.h"
#include "ferry/options.h"
#include "metadata/metadata.h"
#include "transport/registry.h"
#include "wire/descriptor.h"

namespace ferry::internal {

// Who this engine is, fixed at creation.
struct Identity {
  std::string peer_id;  // "host:port" of the rpc port
  uint64_t instance_id = 0;
  uint16_t wire_min = 0, wire_max = 0;
  uint16_t descriptor_format_max = 0;
};

class Publisher {
 public:
  // Borrows all three; the engine owns them.
  Publisher(const EngineOptions& options, Identity identity, const EngineTarget& target,
            const TransportSet& transports)
      : options_(options),
        identity_(std::move(identity)),
        target_(target),
        transports_(transports) {}

  const Identity& identity() const { return identity_; }
  // The features this engine advertises (options.testing.omit_features
  // left out).
  std::vector<std::string> AdvertisedFeatures() const;
  wire::PeerDescriptor Describe() const;
  // Makes `store` show the registry's current regions.
  Status Publish(MetadataStore& store);

 private:
  const EngineOptions& options_;
  const Identity identity_;
  const EngineTarget& target_;
  const TransportSet& transports_;
  std::mutex mu_;  // one Publish at a time
};

}  // namespace ferry::internal
