// StreamHost: the machinery an engine's stream transports share, with one
// owner (the TransportSet): the event-loop threads, and the rpc port — the
// TCP port in the engine's peer id, which serves the peer-to-peer handshake
// and the tcp transport's streams (whoever handles a first frame adds its
// Opener before Serve).
// Thread-safe after Serve; Create, the setters and Serve are called by the
// engine's constructing thread.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/net.h"
#include "transport/stream/event_loop.h"
#include "transport/stream/listener.h"
#include "transport/stream/service.h"

namespace ferry::internal::stream {

struct StreamHostOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  int io_threads = 1;
  std::chrono::microseconds spin{50};
  std::chrono::milliseconds hello_timeout{5000};
  // EngineOptions::max_handshakes_per_source / max_connections_per_source.
  uint32_t max_handshakes_per_source = 64;
  uint32_t max_connections_per_source = 4096;
};

class StreamHost {
 public:
  // Binds the rpc port (not served yet) and starts the loops.
  static StatusOr<std::unique_ptr<StreamHost>> Create(const StreamHostOptions& options);
  ~StreamHost() { Stop(); }

  // "host:port" of the rpc port.
  const std::string& peer_id() const { return peer_id_; }
  const std::shared_ptr<LoopPool>& loops() const { return loops_; }
  std::chrono::milliseconds hello_timeout() const { return options_.hello_timeout; }
  // The per-source connection limits every listener of this engine applies.
  const std::shared_ptr<Admission>& admission() const { return admission_; }

  // Before Serve: the openers of the rpc port's first frames, and how its
  // accepted sockets are tuned.
  FirstFrames& rpc_openers() { return *rpc_openers_; }
  void SetRpcAcceptHook(std::function<int(int fd)> hook) { rpc_on_accept_ = std::move(hook); }
  // Before Serve: the cluster secret every connection accepted here (and on
  // the transports' own listeners, which take auth()) must prove; null = none.
  void SetSecret(std::shared_ptr<const ClusterSecret> secret);
  // The accepting side of authentication, for every listener of this engine.
  const std::shared_ptr<const AuthServer>& auth() const { return auth_; }
  // Starts serving the rpc port; fails (and nothing listens) if the loop
  // cannot watch it.
  Status Serve();
  // Stops the loops (idempotent); anything in flight fails with kCancelled.
  void Stop();

 private:
  StreamHostOptions options_;
  std::string peer_id_;
  UniqueFd rpc_fd_;  // until Serve
  std::shared_ptr<FirstFrames> rpc_openers_ = std::make_shared<FirstFrames>();
  std::shared_ptr<const AuthServer> auth_;
  std::function<int(int)> rpc_on_accept_;
  std::shared_ptr<LoopPool> loops_;
  std::shared_ptr<Listener> rpc_listener_;
  std::shared_ptr<Admission> admission_;
};

}  // namespace ferry::internal::stream
