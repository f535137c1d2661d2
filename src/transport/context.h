// What a transport's factory is given: the engine's settings, what peers act
// on, and the shared stream machinery. Borrowed: valid until the transport is
// shut down.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/target.h"
#include "common/auth.h"
#include "ferry/options.h"
#include "transport/stream/hello.h"
#include "transport/stream/host.h"

namespace ferry::internal {

struct TransportContext {
  const EngineOptions* options = nullptr;  // resolved (io_threads set)
  std::shared_ptr<EngineTarget> target;
  stream::StreamHost* streams = nullptr;
  std::string peer_id;  // "host:port" of the rpc port
  uint64_t instance_id = 0;
  uint16_t wire_min = 1, wire_max = 1;
  // The cluster secret (EngineOptions::secret_file), or null: proven on
  // every connection this engine opens and required of every one it accepts.
  std::shared_ptr<const ClusterSecret> secret;

  stream::HelloPolicy hello_policy() const {
    return {target, wire_min, wire_max,
            options != nullptr ? options->idle_link_timeout : std::chrono::milliseconds(0)};
  }
  stream::Credentials credentials() const { return {secret, peer_id}; }
};

}  // namespace ferry::internal
