// StagingPool: host buffers for bytes on their way between a file or GPU
// memory and a peer, reused and counted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "base/target.h"

namespace ferry::internal {

class CudaDriver;

// Page-aligned staging buffers, reused (a served stream's on a target; the
// local transport's for GPU memory and this engine's files; a transport's
// for this engine's own file regions, storage/file_staging): a fresh one per
// frame cost a page fault per page on first touch (15 % of the cycles of a
// tcp write of 1 MiB blocks to a file). Each buffer holds its pool, so one
// let go after its stream closed still returns to it. Thread-safe (buffers
// are let go on the file ring's thread too).
//
// What it keeps unused: as many bytes as it had handed out at once within
// the last kWindow to two (its working set), at least kMinFreeBytes, at
// most kMaxFreeBytes; a buffer let go beyond that is unmapped. Keeping only
// a fixed 32 MiB, a stream serving reads of KV pages from a file (16 MiB
// frames, ~130 MiB staged at once) mapped most frames afresh: the kernel
// zeroing those pages took 68 % of the cycles, and the disk sat idle for
// 30-50 % of the time behind it (docs/benchmarks.md, "Staging that stays").
// The window rolls when the pool is used: an idle pool keeps its last
// working set (at most kMaxFreeBytes) until its next use, or until it goes
// (a served stream's pool goes with its stream, at the latest at the
// engine's idle_link_timeout).
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
// bounce buffers in small synchronous steps. Once the driver has no more to
// give, host memory serves from then on, as without a driver (the refusal is
// logged once).
class StagingPool : public std::enable_shared_from_this<StagingPool> {
 public:
  // `gauge`: counts the bytes of the buffers handed out (may be null).
  explicit StagingPool(std::shared_ptr<StagingGauge> gauge, const CudaDriver* pinned_by = nullptr)
      : gauge_(std::move(gauge)), pinned_by_(pinned_by) {}
  ~StagingPool();
  // At least n bytes, page-aligned: up to 2 MiB (not page-locked) carved
  // from the open slab; else a free buffer of n to 2n bytes, or a new one.
  // Throws std::bad_alloc if the system has no memory to give.
  std::shared_ptr<char> Get(size_t n);

 private:
  static constexpr size_t kMinFreeBytes = size_t{32} << 20;
  static constexpr size_t kMaxFreeBytes = size_t{256} << 20;
  static constexpr std::chrono::milliseconds kWindow{1000};
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
  // `size` bytes of page-locked memory of pinned_by_; {} once it refused
  // (the refusal is remembered, and logged once).
  Buffer AllocatePinned(size_t size);
  void Free(const Buffer& b);
  void Put(const Buffer& b);
  // A buffer of `rounded` (<= kSlabBytes) bytes from the open slab.
  std::shared_ptr<char> Carve(size_t rounded);
  // A carved buffer of `rounded` bytes of `slab` was let go.
  void Release(Slab* slab, size_t rounded);
  // Moves what it keeps beyond KeepBytes() into `buffers` and `slabs`, to be
  // unmapped (FreeAll) after mu_ is let go. REQUIRES: mu_ held.
  void TakeExcess(std::vector<Buffer>* buffers, std::vector<Slab*>* slabs);
  void FreeAll(const std::vector<Buffer>& buffers, const std::vector<Slab*>& slabs);
  // Counts `bytes` handed out (+) or let go (-) and rolls the window.
  // REQUIRES: mu_ held.
  void Count(int64_t bytes, std::chrono::steady_clock::time_point now);
  // How many unused bytes it keeps now (see the class comment). REQUIRES: mu_.
  size_t KeepBytes() const;
  const std::shared_ptr<StagingGauge> gauge_;
  const CudaDriver* const pinned_by_ = nullptr;
  std::mutex mu_;
  std::vector<Buffer> free_;       // guarded by mu_
  size_t free_bytes_ = 0;          // guarded by mu_: of free_ and idle_slabs_
  bool refused_ = false;           // guarded by mu_: the driver refused page-locked memory once
  Slab* open_ = nullptr;           // guarded by mu_: the slab being carved
  std::vector<Slab*> idle_slabs_;  // guarded by mu_: nothing carved from them is held
  size_t in_use_bytes_ = 0;        // guarded by mu_: handed out and not yet let go
  size_t peak_now_ = 0;            // guarded by mu_: most in use at once in this window
  size_t peak_before_ = 0;         // guarded by mu_: ... in the window before it
  std::chrono::steady_clock::time_point window_start_{};  // guarded by mu_
};

}  // namespace ferry::internal
