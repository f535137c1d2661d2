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
  static LocalDirectory* dir = new LocalDirectory();  // never destroyed: engines may outlive statics
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
  LocalLink(std::weak_ptr<EngineTarget> target, std::string peer_id)
      : target_(std::move(target)), peer_id_(std::move(peer_id)) {}

  void Post(const std::shared_ptr<BatchState>& batch, std::vector<Slice> slices,
            Clock::time_point /*deadline*/) override {
    std::shared_ptr<EngineTarget> target = target_.lock();
    BatchState::Completer done(*batch);
    for (const Slice& s : slices) {
      if (!target) {
        done.Complete(s.request, 1, UnavailableError("peer engine " + peer_id_ + " was shut down"));
        continue;
      }
      auto pin = target->registry().Pin(s.remote, s.length, "remote range");
      if (!pin.ok()) {
        done.Complete(s.request, 1, pin.status().WithPrefix("peer " + peer_id_ + " refused"));
        continue;
      }
      void* remote = reinterpret_cast<void*>(s.remote);
      if (s.opcode == Opcode::kWrite) {
        std::memmove(remote, s.local, s.length);
      } else {
        std::memmove(s.local, remote, s.length);
      }
      done.Complete(s.request, 1, OkStatus());
    }
  }

  Status Notify(const wire::NotifyBody& body, Clock::time_point) override {
    // Writes complete synchronously in Post, so every earlier write is done.
    std::shared_ptr<EngineTarget> target = target_.lock();
    if (!target) return UnavailableError("peer engine " + peer_id_ + " was shut down");
    target->Deliver({body.sender, body.name, body.message});
    return OkStatus();
  }

  bool Healthy() const override { return !target_.expired(); }
  void Retire() override {}

 private:
  std::weak_ptr<EngineTarget> target_;
  std::string peer_id_;
};

class LocalTransport : public Transport {
 public:
  std::string_view Name() const override { return "local"; }
  uint32_t MaxSlice() const override { return 1u << 30; }
  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"local", std::to_string(ProcessToken())});
  }
  bool CanReach(const wire::PeerDescriptor& peer) const override {
    return peer.process_token == ProcessToken() && peer.FindTransport("local") != nullptr &&
           LocalDirectory::Get().Find(peer.instance_id) != nullptr;
  }
  StatusOr<std::shared_ptr<PeerLink>> Connect(const wire::PeerDescriptor& peer, uint16_t,
                                              Clock::time_point) override {
    std::shared_ptr<EngineTarget> t = LocalDirectory::Get().Find(peer.instance_id);
    if (!t) {
      return UnavailableError("peer " + peer.peer_id + " is not an engine of this process (local transport)");
    }
    return std::shared_ptr<PeerLink>(std::make_shared<LocalLink>(t, peer.peer_id));
  }
  void Shutdown() override {}
};

}  // namespace

std::unique_ptr<Transport> MakeLocalTransport() { return std::make_unique<LocalTransport>(); }

}  // namespace ferry::internal
