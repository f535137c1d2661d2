// The same-host transport's data path, both sides: the initiator's encoder
// (kCopyWrite / kCopyRead frames carrying its own addresses, no payload), the
// opener of a same-host stream (kCopyHello: which process is at the other end
// of the unix socket, a pidfd that follows it, and a probe read out of its
// memory), and the target's service, which validates and pins its own ranges
// and then moves the bytes with process_vm_readv / process_vm_writev.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "transport/stream/hello.h"
#include "transport/stream/stream_link.h"
#include "transport/stream/target_service.h"

namespace ferry::internal::shm {

class CopyFrameEncoder : public stream::FrameEncoder {
 public:
  void Encode(Opcode op, const Slice* slices, size_t n, uint64_t bytes, uint16_t wire_version,
              stream::RequestFrame* r) const override;
};

struct CopyOpenerConfig {
  stream::HelloPolicy policy;
  // Test-only: refuse every same-host hello as if the initiator's memory
  // could not be reached (EngineOptions::testing.refuse_same_host_copy).
  bool refuse = false;
};

// kCopyHello: answers the hello (a refusal says why) and, on success, serves
// the stream with a CopyStreamService. Refused on a connection whose peer
// process is unknown (the rpc port, another pid namespace).
Status OpenCopyStream(const CopyOpenerConfig& cfg, stream::Connection& c, const wire::FrameHeader& h,
                      std::string_view body);

// The frames of an accepted same-host stream: kCopyWrite, kCopyRead, kNotify.
class CopyStreamService : public stream::TargetService {
 public:
  CopyStreamService(std::shared_ptr<EngineTarget> target, int pid, UniqueFd pidfd)
      : TargetService(std::move(target), "shm"), pid_(pid), pidfd_(std::move(pidfd)) {}
  bool Accepts(wire::FrameType t) const override;
  Status OnFrame(stream::Connection& c, const wire::FrameHeader& h, std::string_view body) override;
  Status OnPayload(stream::Connection& c, const wire::FrameHeader&) override {
    return InternalError("same-host stream of " + c.peer_name() + " received a payload");
  }

 private:
  Status ServeCopy(stream::Connection& c, const wire::FrameHeader& h, std::string_view body, bool write);

  const int pid_;
  // Readable once the process has exited, so a recycled pid is never copied
  // to or from.
  const UniqueFd pidfd_;
};

}  // namespace ferry::internal::shm
