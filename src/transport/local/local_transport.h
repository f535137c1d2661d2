// The "local" transport: the peer engine lives in this process, so a
// transfer is a copy between the two engines' registered memory, after the
// peer's registry has validated (and pinned) the remote range: memcpy for
// cpu memory, the kinds' own copy functions (CopyMemory) for the others.
#pragma once

#include <memory>

#include "base/target.h"
#include "base/transport.h"
#include "transport/context.h"

namespace ferry::internal {

// Engines of this process, by instance id, so the local transport can reach
// a peer's EngineTarget. Holds weak references only. Thread-safe. This is the
// one process-wide table Ferry keeps (a process is the scope of "local").
class LocalDirectory {
 public:
  static LocalDirectory& Get();
  void Add(const std::shared_ptr<EngineTarget>& target);
  void Remove(uint64_t instance_id);
  std::shared_ptr<EngineTarget> Find(uint64_t instance_id) const;

 private:
  struct Impl;
  LocalDirectory();
  std::unique_ptr<Impl> impl_;
};

TransportCaps LocalCaps();
StatusOr<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx);

}  // namespace ferry::internal
