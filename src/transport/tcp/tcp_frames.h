// The tcp transport's data frames, both sides: the initiator's encoder
// (kWrite with the bytes as payload, kRead), and the target's service, which
// validates and pins every range, then receives a write's payload straight
// into registered memory (readv) or sends a read's bytes straight from it
// (sendmsg). Ranges in GPU memory (issue 13) and in file regions (issue 30)
// are staged through host memory here: a write's bytes are received into a
// host buffer and copied to the device, or written to the file (the frame's
// file entries as one batch of the file's io_uring ring), before the
// acknowledgement; a read's are copied off the device or read from the file
// before they are sent. The file I/O does not hold up the stream: the
// frame's reply keeps its place (Connection::ReserveReply) while the ring
// works and later frames are served.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/sync_copies.h"
#include "transport/stream/stream_link.h"
#include "transport/stream/target_service.h"

namespace ferry::internal::tcp {

class TcpFrameEncoder : public stream::FrameEncoder {
 public:
  void Encode(Opcode op, const Slice* slices, size_t n, uint64_t bytes, uint16_t wire_version,
              stream::RequestFrame* r) const override;
};

// The frames of a tcp stream whose hello was accepted: kWrite, kRead, kNotify.
class TcpStreamService : public stream::TargetService {
 public:
  // pinned_gpu_staging: GPU entries are staged through page-locked memory
  // (TargetService::GpuStagingBytes).
  TcpStreamService(std::shared_ptr<EngineTarget> target, bool pinned_gpu_staging)
      : TargetService(std::move(target), "tcp"), pinned_gpu_staging_(pinned_gpu_staging) {}
  bool Accepts(wire::FrameType t) const override;
  Status OnFrame(stream::Connection& c, const wire::FrameHeader& h, std::string_view body) override;
  Status OnPayload(stream::Connection& c, const wire::FrameHeader& h) override;

 private:
  Status ServeWrite(stream::Connection& c, const wire::FrameHeader& h, std::string_view body);
  Status ServeRead(stream::Connection& c, const wire::FrameHeader& h, std::string_view body);

  cuda::SyncCopies& Copies();
  // A host buffer of n bytes for `staged`: page-locked if it holds GPU
  // entries (and pinned_gpu_staging_).
  std::shared_ptr<char> BufferFor(const std::vector<StagedEntry>& staged, size_t n) const;
  // Moves the GPU entries of `staged` between the host buffer at `host` and
  // the device (to_device: a write), failures into `failures`: all queued,
  // then one wait per device.
  void CopyGpu(const std::vector<StagedEntry>& staged, char* host, bool to_device,
               std::vector<wire::EntryFailure>* failures);

  // The write frame whose payload is arriving.
  std::vector<RegionPin> pins_;
  std::vector<wire::EntryFailure> failures_;
  std::vector<StagedEntry> staged_;
  std::shared_ptr<char> staged_bytes_;  // the host buffer its staged entries land in
  std::unique_ptr<cuda::SyncCopies> copies_;
  const bool pinned_gpu_staging_;
};

}  // namespace ferry::internal::tcp
