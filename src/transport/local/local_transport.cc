#include "transport/local/local_transport.h"

#include <cstring>
#include <mutex>
#include <unordered_map>

namespace ferry::internal {

struct LocalDirectory::Impl {
  mutable std::mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<EngineTarget>> targets;
};

LocalDirectory::LocalDirectory() : impl_(std::make_unique<Impl>()) {}

LocalDirectory& LocalDirectory::Get() {
  static LocalDirectory* dir =
      new LocalDirectory();  // never destroyed: engines may outlive statics
  return *dir;
}

void LocalDirectory::Add(const std::shared_ptr<EngineTarget>& target) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->targets[target->instance_id()] = target;
}

void LocalDirectory::Remove(uint64_t instance_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->targets.erase(instance_id);
}

std::shared_ptr<EngineTarget> LocalDirectory::Find(uint64_t instance_id) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->targets.find(instance_id);
  return it == impl_->targets.end() ? nullptr : it->second.lock();
}

namespace {

class LocalLink : public PeerLink {
 public:
  LocalLink(std::shared_ptr<EngineTarget> self, std::weak_ptr<EngineTarget> target,
            std::string peer_id)
      : self_(std::move(self)), target_(std::move(target)), peer_id_(std::move(peer_id)) {}

  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    std::shared_ptr<EngineTarget> target = target_.lock();
    BatchState::Completer done(*ctx.batch);
    for (const Slice& s : slices) {
      if (!target) {
        done.Complete(s.request, 1, UnavailableError("peer engine " + peer_id_ + " was shut down"));
        continue;
      }
      auto pin = target->registry().PinExported(s.remote, s.length, "remote range");
      if (!pin.ok()) {
        done.Complete(s.request, 1, pin.status().WithPrefix("peer " + peer_id_ + " refused"));
        continue;
      }
      void* remote = reinterpret_cast<void*>(s.remote);
      const MemoryKind remote_kind = pin->region()->kind;
      MemoryKind local_kind;
      if (self_->registry().ever_non_cpu()) {
        MemoryRegistry::Found found;
        if (self_->registry()
                .Check(reinterpret_cast<uint64_t>(s.local), s.length, "local buffer", &found)
                .ok()) {
          local_kind = found.kind;
        }
      }
      // A read stores into this engine's memory: not once its batch was
      // cancelled (BatchState::BeginLanding).
      if (s.opcode == Opcode::kRead && !ctx.batch->BeginLanding()) {
        done.Complete(s.request, 1, CancelledError("the request's batch was cancelled"));
        continue;
      }
      Status copied;
      if (remote_kind.cpu_accessible() && local_kind.cpu_accessible()) {
        if (s.opcode == Opcode::kWrite) {
          std::memmove(remote, s.local, s.length);
        } else {
          std::memmove(s.local, remote, s.length);
        }
      } else if (s.opcode == Opcode::kWrite) {
        copied = CopyMemory(remote_kind, remote, local_kind, s.local, s.length);
      } else {
        copied = CopyMemory(local_kind, s.local, remote_kind, remote, s.length);
      }
      if (s.opcode == Opcode::kRead) ctx.batch->EndLanding();
      done.Complete(s.request, 1, copied);
    }
  }

  Status Notify(const wire::NotifyBody& body, Clock::time_point) override {
    // Writes complete synchronously in Post, so every earlier write is done.
    std::shared_ptr<EngineTarget> target = target_.lock();
    if (!target) return UnavailableError("peer engine " + peer_id_ + " was shut down");
    return target->Deliver({body.sender, body.name, body.message})
        .WithPrefix("peer " + peer_id_ + " refused");
  }

  bool Healthy() const override { return !target_.expired(); }
  // Post and Notify finish before they return: nothing is ever in flight.
  bool Idle() const override { return true; }
  void Retire() override {}

 private:
  const std::shared_ptr<EngineTarget> self_;
  std::weak_ptr<EngineTarget> target_;
  std::string peer_id_;
};

class LocalTransport : public Transport {
 public:
  // Listed in the process's directory while it lives, so engines of this
  // process can reach its target.
  LocalTransport(TransportCaps caps, std::shared_ptr<EngineTarget> self)
      : Transport(std::move(caps)), self_(std::move(self)) {
    LocalDirectory::Get().Add(self_);
  }
  ~LocalTransport() override { Shutdown(); }
  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"local", std::to_string(ProcessToken())});
  }
  bool CanReach(const wire::PeerDescriptor& peer) const override {
    return peer.process_token == ProcessToken() && peer.FindTransport("local") != nullptr &&
           LocalDirectory::Get().Find(peer.instance_id) != nullptr;
  }
  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> info, uint16_t,
                                              Clock::time_point) override {
    const wire::PeerDescriptor& peer = info->desc();
    std::shared_ptr<EngineTarget> t = LocalDirectory::Get().Find(peer.instance_id);
    if (!t) {
      return UnavailableError("peer " + peer.peer_id +
                              " is not an engine of this process (local transport)");
    }
    return std::shared_ptr<PeerLink>(std::make_shared<LocalLink>(self_, t, peer.peer_id));
  }
  void Shutdown() override { LocalDirectory::Get().Remove(self_->instance_id()); }

 private:
  const std::shared_ptr<EngineTarget> self_;
};

}  // namespace

TransportCaps LocalCaps() {
  TransportCaps c;
  c.name = "local";
  c.reach = Reach::kSameProcess;
  // Copies go through CopyMemory, which reaches the test kind too.
  c.memory_kinds = {MemoryKind::Type::kCpu, MemoryKind::Type::kTestOpaque};
  c.max_slice = 1u << 30;
  return c;
}

StatusOr<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx) {
  return std::unique_ptr<Transport>(std::make_unique<LocalTransport>(LocalCaps(), ctx.target));
}

}  // namespace ferry::internal
