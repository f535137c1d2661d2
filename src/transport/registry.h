// The transport registry: every transport built into Ferry, with its
// capability record and factory, in preference order; and TransportSet, the
// transports of one engine with the machinery they share.
//
// Adding a transport: its folder under src/transport/ (with a CMakeLists.txt
// that adds its sources to the library) and one line in BuiltinTransports()
// (registry.cc). The engine, `ferry info`, the bench and the conformance
// suite take the list from here.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/memory_registry.h"
#include "base/transport.h"
#include "transport/context.h"
#include "transport/stream/host.h"

namespace ferry::internal {

struct TransportEntry {
  TransportCaps (*caps)();
  // "" if the transport can work on this machine, else why not. May probe.
  std::string (*availability)();
  StatusOr<std::unique_ptr<Transport>> (*make)(const TransportContext& ctx);
  // Whether the engine's options turn it on (null: always). An engine
  // skips a transport that is off, without a word, unless it is forced
  // (`transport`), when `make` says why it cannot start.
  bool (*enabled)(const EngineOptions& options) = nullptr;
};

// By preference: the cheapest that reaches a peer first.
std::span<const TransportEntry> BuiltinTransports();
// The entry named `name`, or null.
const TransportEntry* FindTransport(std::string_view name);
// Every transport's name, in preference order, comma-separated.
std::string TransportNames();

// The transports of one engine, the stream machinery they share (its only
// owner) and the memory-domain hook through which registrations reach them.
// Thread-safe after Start.
class TransportSet : public RegionHooks {
 public:
  // Binds the rpc port and starts the loops (no transport yet).
  static StatusOr<std::unique_ptr<TransportSet>> Create(
      const EngineOptions& options, std::span<const TransportEntry> entries = BuiltinTransports());
  ~TransportSet() override { Shutdown(); }

  const std::string& peer_id() const { return streams_->peer_id(); }
  // Creates the transports. One that fails to start is left out with a
  // warning (its peers use the next one), unless it is `options.transport`.
  Status Start(const TransportContext& ctx);
  // What handles first frames on the rpc port adds itself here before Serve.
  stream::FirstFrames& rpc_openers() { return streams_->rpc_openers(); }
  Status Serve() { return streams_->Serve(); }

  const std::vector<std::unique_ptr<Transport>>& transports() const { return transports_; }
  void Describe(wire::PeerDescriptor* self) const;

  // RegionHooks: every transport that needs per-region keys registers the
  // region; its key goes into the region (and so into the descriptor).
  Status OnRegister(Region& region) override;
  Status BeforeUnregister(const Region& region, Clock::time_point deadline) override;
  void OnUnregister(const Region& region) override;

  // Stops every transport and the loops (idempotent).
  void Shutdown();

 private:
  std::vector<TransportEntry> entries_;
  std::unique_ptr<stream::StreamHost> streams_;
  std::vector<std::unique_ptr<Transport>> transports_;
};

}  // namespace ferry::internal
