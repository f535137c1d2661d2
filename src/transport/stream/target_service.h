// TargetService: what every stream transport's target side shares — pinning
// the ranges a frame names in this engine's registered memory, and the
// notification frame. A transport derives its FrameService from it and adds
// its own data frames.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/memory_registry.h"
#include "base/target.h"
#include "transport/stream/connection.h"
#include "transport/stream/service.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

class TargetService : public FrameService {
 public:
  // `transport`: the name said in refusals ("tcp", "shm").
  TargetService(std::shared_ptr<EngineTarget> target, std::string transport)
      : target_(std::move(target)), transport_(std::move(transport)) {}

 protected:
  EngineTarget& target() const { return *target_; }

  // Pins the region holding [addr, addr + length) unless *last already covers
  // it; on failure records it in `failures` (naming the range and why: not
  // registered, not exported, or memory this transport cannot touch) and
  // returns it. The entry must be in registered CPU memory (or, with
  // `allow_staged`, GPU memory or a file region, which the caller stages
  // through host memory: *last tells the kind); other regions are reached
  // only through their own transports.
  Status PinEntry(uint64_t addr, uint32_t length, uint32_t index, const Region** last,
                  std::vector<RegionPin>* pins, std::vector<wire::EntryFailure>* failures,
                  bool allow_staged = false) const;

  // kNotify: delivers to the inbox and acknowledges.
  Status ServeNotify(Connection& stream, const wire::FrameHeader& h, std::string_view body) const;

 private:
  const std::shared_ptr<EngineTarget> target_;
  const std::string transport_;
};

}  // namespace ferry::internal::stream
