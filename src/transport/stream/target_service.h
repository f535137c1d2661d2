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
#include "base/target.h"
#include "transport/stream/connection.h"
#include "transport/stream/service.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

// Page-aligned staging buffers of a stream, reused: a fresh one per frame
// cost a page fault per page on first touch (15 % of the cycles of a tcp
// write of 1 MiB blocks to a file). Keeps at most kMaxFreeBytes unused; each
// buffer holds its pool, so one let go after its stream closed still returns
// to it. Thread-safe (buffers are let go on the file ring's thread too).
//
// Host memory comes in 2 MiB-aligned mappings advised for transparent huge
// pages (MADV_HUGEPAGE; 4 KiB pages where the kernel gives none): an O_DIRECT
// request into one is one physically contiguous segment where 4 KiB pages
// are up to 256 (on a virtio disk that doubled 1 MiB reads). Buffers of up
// to 2 MiB are carved in turn from such a slab, which serves again once
// nothing carved from it is held; larger ones are mappings of their own.
//
// With a CUDA driver, the buffers are page-locked memory of that driver
// (cuMemHostAlloc, portable): the GPU's copies to and from them run on the
// copy engines directly, where pageable memory goes through the driver's own
// bounce buffers in small synchronous steps. If the driver has no more to
// give, heap memory serves (and the refusal is logged once).
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // `gauge`: counts the bytes of the buffers handed out (may be null).
  explicit StagingPool(std::shared_ptr<StagingGauge> gauge, const CudaDriver* pinned_by = nullptr)
      : gauge_(std::move(gauge)), pinned_by_(pinned_by) {}
  ~StagingPool();
  // At least n bytes (a free buffer of n to 2n bytes, else a new one).
  std::shared_ptr<char> Get(size_t n);

 private:
  static constexpr size_t kMaxFreeBytes = size_t{32} << 20;
  static constexpr size_t kSlabBytes = size_t{2} << 20;  // one transparent huge page
  struct Buffer {
    size_t size = 0;
    char* p = nullptr;
    bool pinned = false;  // from pinned_by_; else a mapping of its own (MapHuge)
  };
  // A kSlabBytes mapping that buffers are carved from, front to back.
  struct Slab {
    char* base = nullptr;
    size_t used = 0;  // bytes carved since it was last empty
    size_t live = 0;  // buffers carved from it and still held
  };
  Buffer Allocate(size_t size);
  void Free(const Buffer& b);
  void Put(const Buffer& b);
  // A buffer of `rounded` (<= kSlabBytes) bytes from the open slab.
  std::shared_ptr<char> Carve(size_t rounded);
  void Release(Slab* slab);
  const std::shared_ptr<StagingGauge> gauge_;
  const CudaDriver* const pinned_by_ = nullptr;
  std::mutex mu_;
  std::vector<Buffer> free_;       // guarded by mu_
  size_t free_bytes_ = 0;          // guarded by mu_: of free_ and idle_slabs_
  bool refused_ = false;           // guarded by mu_: the driver refused page-locked memory once
  Slab* open_ = nullptr;           // guarded by mu_: the slab being carved
  std::vector<Slab*> idle_slabs_;  // guarded by mu_: nothing carved from them is held
};

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
