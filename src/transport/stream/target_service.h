// TargetService: what every stream transport's target side shares — pinning
// the ranges a frame names in this engine's registered memory, and the
// notification frame. A transport derives its FrameService from it and adds
// its own data frames.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/memory_registry.h"
#include "base/staging_pool.h"
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

  // What a transport stages through host memory on this side (beside
  // registered CPU memory, which it reaches directly).
  enum class Staged { kNone, kFiles, kFilesAndGpu };

  // Pins the region holding [addr, addr + length) unless *last already covers
  // it; on failure records it in `failures` (naming the range and why: not
  // registered, not exported, or memory this transport cannot touch) and
  // returns it. The entry must be in registered CPU memory (or, as `staged`
  // allows, a file region or GPU memory, which the caller stages through
  // host memory: *last tells the kind); other regions are reached only
  // through their own transports.
  Status PinEntry(uint64_t addr, uint32_t length, uint32_t index, const Region** last,
                  std::vector<RegionPin>* pins, std::vector<wire::EntryFailure>* failures,
                  Staged staged = Staged::kNone) const;

 public:
  // An entry of a frame staged through host memory: where in the region
  // (pinned for the frame), where in the frame's host buffer.
  struct StagedEntry {
    uint32_t index;
    uint64_t addr;
    const Region* region;
    size_t offset;
    uint32_t length;
  };

 protected:
  // Where in a frame's host buffer an entry of `length` bytes goes after
  // `at` bytes: one whose length O_DIRECT could take starts on a page.
  static size_t StagedOffset(size_t at, uint32_t length);
  // Page-aligned host memory for a frame's staged entries (at least n bytes),
  // so that file entries may go to the file with O_DIRECT; from this
  // stream's pool (StagingPool), back to it when the last holder lets go.
  std::shared_ptr<char> StagingBytes(size_t n) const;
  // The same for a frame with GPU entries: page-locked memory of the
  // target's CUDA driver (see StagingPool), from a second pool of the stream.
  std::shared_ptr<char> GpuStagingBytes(size_t n) const;
  static bool HasFiles(const std::vector<StagedEntry>& staged);
  // A frame's staged entries may take at most wire::kMaxPayload bytes of
  // host buffer (what a frame may carry; a Ferry initiator's frames stay
  // within max_frame_bytes): past that each of them fails, naming the sizes
  // and the limit, and *staged and *staged_bytes are emptied (nothing is
  // allocated). True if so.
  bool RefuseOversizedStaging(std::vector<StagedEntry>* staged, size_t* staged_bytes,
                              std::vector<wire::EntryFailure>* failures) const;
  // In entry order, as a Reply must list them (DecodeReply refuses others).
  static void SortByEntry(std::vector<wire::EntryFailure>* failures);
  // Starts the file entries of `staged` (others are skipped) as one batch of
  // their files' io_uring ring, between the file and `host` + each entry's
  // offset (write: host → file), without waiting: `then` runs once, with
  // their failures (naming this peer, any order), when the last is done —
  // on the ring's reaping thread, or on this one if none went to the ring.
  // The caller keeps `host` and the entries' pins until then; `then` must not
  // use this service (the stream may have closed).
  void StartFileIo(const std::vector<StagedEntry>& staged, char* host, bool write,
                   std::function<void(std::vector<wire::EntryFailure>)> then) const;

  // kNotify: delivers to the inbox and acknowledges.
  Status ServeNotify(Connection& stream, const wire::FrameHeader& h, std::string_view body) const;

 private:
  const std::shared_ptr<EngineTarget> target_;
  const std::string transport_;
  const std::shared_ptr<StagingPool> staging_ = std::make_shared<StagingPool>(target_->staging());
  mutable std::once_flag pinned_once_;
  mutable std::shared_ptr<StagingPool> pinned_staging_;  // made on first use
};

}  // namespace ferry::internal::stream
