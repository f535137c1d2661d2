// The same-host transport's data path, both sides: the initiator's encoder
// (kCopyWrite / kCopyRead frames carrying its own addresses, no payload), the
// opener of a same-host stream (kCopyHello: which process is at the other end
// of the unix socket, a pidfd that follows it, and a probe read out of its
// memory), and the target's service, which validates and pins its own ranges
// and then moves the bytes with process_vm_readv / process_vm_writev.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/net.h"
#include "transport/shm/copy_frames.h"
#include "transport/stream/hello.h"
#include "transport/stream/stream_link.h"
#include "transport/stream/target_service.h"

namespace ferry::internal::shm {

// Reads where the initiator copies (kCopyLendRead): on the target's answer
// it copies the ranges out of the target process with process_vm_readv,
// on the stream's loop thread, then returns them (kCopyReturn). A read that
// fails (its deadline, a closed stream) therefore never lands later: the
// only copy into this process's memory is this one, and it runs before or
// instead of the failure, never after it. Used when this process may read
// the target's memory and the target lends (feature "shm-lend-reads").
class LendReadHook : public stream::ReplyHook {
 public:
  // `pid`/`pidfd`: the target process (the pidfd tells once it exited, so a
  // recycled pid is never read); `peer`: its name, for errors.
  LendReadHook(int pid, UniqueFd pidfd, std::string peer, uint16_t wire_version)
      : pid_(pid), pidfd_(std::move(pidfd)), peer_(std::move(peer)), wire_version_(wire_version) {}
  std::optional<stream::RequestFrame> OnReply(
      const stream::RequestFrame& r, uint64_t seq, const std::vector<wire::StagedLend>& staged,
      std::vector<wire::EntryFailure>* failures) const override;

 private:
  const int pid_;
  const UniqueFd pidfd_;
  const std::string peer_;
  const uint16_t wire_version_;
};

// Whether this process may read the memory of process `pid` (what
// process_vm_readv checks: ptrace access), without touching it.
bool CanReadProcess(int pid);

class CopyFrameEncoder : public stream::FrameEncoder {
 public:
  // `lend`: reads as kCopyLendRead with this hook; null: kCopyRead (the
  // target copies).
  explicit CopyFrameEncoder(std::shared_ptr<const LendReadHook> lend = nullptr)
      : lend_(std::move(lend)) {}
  void Encode(Opcode op, const Slice* slices, size_t n, uint64_t bytes, uint16_t wire_version,
              stream::RequestFrame* r) const override;

 private:
  const std::shared_ptr<const LendReadHook> lend_;
};

struct CopyOpenerConfig {
  stream::HelloPolicy policy;
  // Test-only: refuse every same-host hello as if the initiator's memory
  // could not be reached (EngineOptions::testing.refuse_same_host_copy).
  bool refuse = false;
  // EngineOptions::shm_rings: serve a stream through the request rings its
  // hello offers.
  bool rings = true;
};

// kCopyHello: answers the hello (a refusal says why) and, on success, serves
// the stream with a CopyStreamService. Refused on a connection whose peer
// process is unknown (the rpc port, another pid namespace).
Status OpenCopyStream(const CopyOpenerConfig& cfg, stream::Connection& c,
                      const wire::FrameHeader& h, std::string_view body);

// The frames of an accepted same-host stream: kCopyWrite, kCopyRead,
// kCopyLendRead + kCopyReturn, kNotify.
class CopyStreamService : public stream::TargetService {
 public:
  // `lend_staged`: the initiator's hello carried kHelloFlagLendStaged.
  CopyStreamService(std::shared_ptr<EngineTarget> target, int pid, UniqueFd pidfd, bool lend_staged)
      : TargetService(std::move(target), "shm"),
        pid_(pid),
        pidfd_(std::move(pidfd)),
        lend_staged_(lend_staged) {}
  bool Accepts(wire::FrameType t) const override;
  Status OnFrame(stream::Connection& c, const wire::FrameHeader& h, std::string_view body) override;
  Status OnPayload(stream::Connection& c, const wire::FrameHeader&) override {
    return InternalError("same-host stream of " + c.peer_name() + " received a payload");
  }

 private:
  // write: kCopyWrite; else kCopyRead, or with `lend` kCopyLendRead (pin
  // and answer; the pins are kept until kCopyReturn or the stream closes).
  Status ServeCopy(stream::Connection& c, const wire::FrameHeader& h, std::string_view body,
                   bool write, bool lend = false);
  Status ServeReturn(stream::Connection& c, const wire::FrameHeader& h, std::string_view body);
  void ReleaseLent(uint64_t up_to);
  // What a frame holds until its reply, or for a lend until the initiator
  // returns it: its regions, and the buffer its file entries are staged in.
  struct Held {
    std::vector<RegionPin> pins;
    std::shared_ptr<char> host;
  };
  // The file entries of a frame (`staged`, `staged_bytes` of buffer; the
  // failures so far): a write copies the initiator's bytes into the buffer,
  // then writes the files; a read reads the files into the buffer, then
  // lends those ranges (kLendAck naming where each is) or, not lending,
  // copies them into the initiator. The file I/O goes on off the loop; the
  // reply keeps its place.
  void ServeFileEntries(stream::Connection& c, uint64_t seq, bool write, bool lend,
                        const std::vector<CopyEntry>& entries, std::vector<StagedEntry> staged,
                        size_t staged_bytes, std::vector<wire::EntryFailure> failures,
                        std::shared_ptr<Held> held);

  const int pid_;
  // Readable once the process has exited, so a recycled pid is never copied
  // to or from.
  const UniqueFd pidfd_;
  // Its hello carried kHelloFlagLendStaged: file entries of its lent reads
  // are staged here and named in a kLendAck.
  const bool lend_staged_;
  // Ranges lent to the initiator (kCopyLendRead), by the frame's sequence
  // number, until it returns them, with the buffer holding the frame's file
  // entries. Loop thread only.
  struct Lent {
    uint64_t seq;
    std::shared_ptr<Held> held;
    size_t staged_bytes;
  };
  std::deque<Lent> lent_;
  size_t lent_staged_bytes_ = 0;
};

}  // namespace ferry::internal::shm
