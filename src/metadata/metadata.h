// The metadata store seam: how an engine publishes its descriptor and learns
// its peers' descriptors by name.
//
//  - "P2PHANDSHAKE" (the default, src/metadata/p2p/): no server. Publishing
//    keeps the descriptor to answer handshakes on the rpc port; fetching asks
//    the peer itself, so names must be "host:port". No watch: a restarted peer
//    is found when its streams break (the engine handshakes again).
//  - "memory://CLUSTER" (src/metadata/memory/): engines of one process share
//    a store by cluster name, with watches — for tests of the seam and for
//    single-process deployments.
//  - "http://HOST:PORT/PATH" (src/metadata/http/): a REST key-value service
//    (`ferry metadata-server`): GET/PUT/DELETE PATH?key=ferry/segments/NAME.
//    Entries expire unless refreshed, so a crashed engine's name frees
//    itself; watches poll.
//  - "etcd://H:P[,H:P...]" or a bare "H:P" (src/metadata/etcd/): etcd v3
//    through its JSON gateway; entries under a lease kept alive, a watch
//    on the prefix, fail-over between endpoints.
//  - "redis://[USER:PASS@]H:P[/DB]" (src/metadata/redis/): keys with a TTL
//    the store refreshes; watches poll.
// Which backends exist, and which this build has: metadata/registry.h.
//
// Thread contract:
//  - Publish, Fetch, Remove and Watch may be called from any thread, at the
//    same time; a store orders its own writes (Publish, Remove) itself. Watch
//    is called at most once. The destructor must not overlap any other call;
//    it ends the store's threads, waiting for a callback that is running.
//  - Threads each backend starts:
//      p2p     none. Fetch connects on the caller's thread; handshake requests
//              are answered on the engine's rpc port (its stream threads).
//      memory  none. Callbacks run on the thread that called Publish or
//              Remove on a store of the same cluster (this one included),
//              before that call returns.
//      http,   a refresher, at the first Publish (http: the first whose
//      redis   reply carries a TTL), and a watcher, at Watch; both are
//              metadata/poller.h's. Callbacks run on the watcher.
//      etcd    the lease keep-alive, at the first Publish; the watcher (one
//              streamed request), at Watch. Callbacks run on the watcher.
//  - A store runs one callback at a time, and none once its destructor has
//    returned. A callback must not block — it holds up the store's polling,
//    or (memory) the publisher — and must not call into this store or, for
//    memory, any store of its cluster (memory calls it under a lock that
//    Publish and Remove take), nor destroy the store. The engine's callback
//    only marks the peer stale; its next transfer there fetches it again.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/net.h"
#include "ferry/status.h"
#include "transport/stream/service.h"
#include "wire/descriptor.h"

namespace ferry::internal {

class MetadataStore {
 public:
  virtual ~MetadataStore() = default;

  // Makes `self` what peers see under self.engine_name from now on. The
  // engine publishes at creation and again after every (un)registration.
  virtual Status Publish(const wire::PeerDescriptor& self) = 0;
  // The current descriptor of the peer called `name`. `self` is sent along
  // where the store talks to the peer itself, so it can log who is calling
  // and spot version skew on its side too.
  virtual StatusOr<wire::PeerDescriptor> Fetch(std::string_view name,
                                               const wire::PeerDescriptor& self,
                                               Clock::time_point deadline) = 0;
  // Withdraws this engine's descriptor (clean shutdown).
  virtual Status Remove(std::string_view name) = 0;

  // Called with a peer's name when its published descriptor changed or was
  // removed; the engine then fetches it again before the next transfer. Which
  // thread runs it and what it may do: the thread contract above.
  using ChangeCallback = std::function<void(const std::string& name)>;
  // kUnimplemented where the store cannot watch (P2P).
  virtual Status Watch(ChangeCallback on_change) = 0;
};

struct MetadataContext {
  // The rpc port's first-frame handlers, for a store that answers peers on
  // it (P2P); filled before the port is served.
  stream::FirstFrames* rpc_openers = nullptr;
  // The cluster secret (EngineOptions::secret_file) a store that opens
  // connections to peers' rpc ports (P2P) proves; null = none.
  std::shared_ptr<const ClusterSecret> secret;
  // Highest descriptor format this engine writes (tests play older builds).
  uint16_t descriptor_format_max = wire::kDescriptorFormatMax;
  // Key prefix (metadata/entries.h): EngineOptions::metadata_cluster.
  std::string cluster = "ferry";
  // Stores with leases or TTLs (etcd, Redis): EngineOptions::metadata_ttl.
  std::chrono::milliseconds ttl{10000};
  // Bounds every call to the service that has no deadline of its own
  // (Publish, Remove): EngineOptions::connect_timeout.
  std::chrono::milliseconds timeout{5000};
};

// kInvalidArgument for a malformed or unknown connection string,
// kUnimplemented for a backend this build lacks (saying what to install).
StatusOr<std::unique_ptr<MetadataStore>> MakeMetadataStore(std::string_view url,
                                                           const MetadataContext& ctx);

// "p2p", "memory", "http", "etcd", "redis", or "" for a string no backend
// takes (the table of metadata/registry.h decides).
std::string_view MetadataBackendName(std::string_view url);

}  // namespace ferry::internal
