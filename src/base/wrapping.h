// Transports that wrap another one (GPU staging, file staging, fault
// injection): WrappingTransport hands everything but the links to the inner
// transport; StagedLink is the link of a wrapper that moves some slices
// through buffers of its own, whose Notify and Flush first wait for the
// staged writes posted before them (so a notification still follows the
// data).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/transport.h"
#include "base/write_fence.h"

namespace ferry::internal {

class WrappingTransport : public Transport {
 public:
  // Its caps: `caps_of` of the inner transport's (by default the same).
  using CapsOf = TransportCaps (*)(TransportCaps);
  static TransportCaps SameCaps(TransportCaps c) { return c; }
  explicit WrappingTransport(std::unique_ptr<Transport> inner, CapsOf caps_of = SameCaps)
      : Transport(caps_of(inner->caps())), inner_(std::move(inner)) {}

  void Describe(wire::PeerDescriptor* self) const override { inner_->Describe(self); }
  bool CanReach(const wire::PeerDescriptor& peer) const override { return inner_->CanReach(peer); }
  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> peer,
                                              uint16_t version,
                                              Clock::time_point deadline) override {
    FERRY_ASSIGN_OR_RETURN(auto link, inner_->Connect(std::move(peer), version, deadline));
    return Wrap(std::move(link));
  }
  StatusOr<std::vector<wire::RegionKey>> RegisterRegion(const Region& r) override {
    return inner_->RegisterRegion(r);
  }
  void UnregisterRegion(const Region& r) override { inner_->UnregisterRegion(r); }
  Status QuiesceRegion(const Region& r, Clock::time_point deadline) override {
    return inner_->QuiesceRegion(r, deadline);
  }
  // The inner transport fails what is in flight; then the wrapper's own
  // work drains (Drain).
  void Shutdown() override {
    inner_->Shutdown();
    Drain();
  }

 protected:
  // The link this wrapper puts around an inner one.
  virtual std::shared_ptr<PeerLink> Wrap(std::shared_ptr<PeerLink> inner) = 0;
  // Waits for the wrapper's own work in flight (after the inner shutdown).
  virtual void Drain() {}

 private:
  const std::unique_ptr<Transport> inner_;
};

class StagedLink : public PeerLink {
 public:
  // `what`: the staged writes, for the deadline's message ("staged GPU
  // writes to the peer over tcp").
  StagedLink(std::shared_ptr<PeerLink> inner, std::string what)
      : inner_(std::move(inner)), what_(std::move(what)) {}

  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override {
    FERRY_RETURN_IF_ERROR(WaitForStagedWrites(deadline));
    return inner_->Notify(body, deadline);
  }
  Status Flush(Clock::time_point deadline) override {
    FERRY_RETURN_IF_ERROR(WaitForStagedWrites(deadline));
    return inner_->Flush(deadline);
  }
  bool Healthy() const override { return inner_->Healthy(); }
  // Every staged slice holds the inner link until it is done; only Post
  // makes new ones, and the core asks while nobody posts.
  bool Idle() const override { return inner_.use_count() == 1 && inner_->Idle(); }
  bool Closing() const override { return inner_->Closing(); }
  void Retire() override { inner_->Retire(); }

 protected:
  const std::shared_ptr<PeerLink>& inner() const { return inner_; }
  // Staged writes add themselves here while in flight.
  const std::shared_ptr<WriteFence>& writes() const { return writes_; }

 private:
  Status WaitForStagedWrites(Clock::time_point deadline) {
    if (writes_->Wait(deadline)) return OkStatus();
    return DeadlineExceededError(what_ + " did not complete before the deadline");
  }

  const std::shared_ptr<PeerLink> inner_;
  const std::string what_;
  const std::shared_ptr<WriteFence> writes_ = std::make_shared<WriteFence>();
};

}  // namespace ferry::internal
