#include "base/staging_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <new>

#include "common/cuda_driver.h"
#include "common/log.h"

namespace ferry::internal {
namespace {

// `bytes` (a multiple of 2 MiB) of memory starting on a 2 MiB boundary,
// advised for transparent huge pages; std::bad_alloc if there is none.
char* MapHuge(size_t bytes) {
  constexpr uintptr_t kAlign = uintptr_t{2} << 20;
  void* m =
      ::mmap(nullptr, bytes + kAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (start + kAlign - 1) / kAlign * kAlign;
  if (aligned > start) ::munmap(m, aligned - start);
  const uintptr_t end = start + bytes + kAlign;
  if (end > aligned + bytes) {
    ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  }
  // Refused where transparent huge pages are off: 4 KiB pages serve.
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<char*>(aligned);
}

}  // namespace

StagingPool::~StagingPool() {
  for (const Buffer& b : free_) Free(b);
  // Every carved buffer held the pool: no slab has one left.
  if (open_ != nullptr) idle_slabs_.push_back(open_);
  for (Slab* slab : idle_slabs_) {
    ::munmap(slab->base, kSlabBytes);
    delete slab;
  }
}

StagingPool::Buffer StagingPool::AllocatePinned(size_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (refused_) return {};
  }
  // Portable page-locked memory: any context may copy to and from it;
  // device 0's context only makes the call.
  CudaContextScope scope(*pinned_by_, 0);
  StatusOr<void*> p = scope.status().ok() ? pinned_by_->AllocateHost(size) : scope.status();
  if (p.ok()) return {size, static_cast<char*>(*p), true};
  std::lock_guard<std::mutex> lock(mu_);
  if (!refused_) {
    FERRY_LOG(kWarning, "staging GPU transfers through pageable memory: " << p.status().WithPrefix(
                            "no page-locked buffer of " + std::to_string(size) + " bytes"));
  }
  refused_ = true;
  return {};
}

void StagingPool::Free(const Buffer& b) {
  if (!b.pinned) {
    ::munmap(b.p, b.size);
    return;
  }
  CudaContextScope scope(*pinned_by_, 0);
  const Status s = scope.status().ok() ? pinned_by_->FreeHost(b.p) : scope.status();
  if (!s.ok()) FERRY_LOG(kWarning, "freeing a page-locked staging buffer: " << s);
}

std::shared_ptr<char> StagingPool::Get(size_t n) {
  const size_t rounded = std::max<size_t>(4096, (n + 4095) / 4096 * 4096);
  if (rounded <= kSlabBytes) {
    // Host memory (also once the driver refused page-locked memory): from
    // the slabs, where a small buffer of its own would take a whole 2 MiB.
    bool host;
    {
      std::lock_guard<std::mutex> lock(mu_);
      host = pinned_by_ == nullptr || refused_;
    }
    if (host) return Carve(rounded);
  }
  Buffer b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = free_.size();
    for (size_t k = 0; k < free_.size(); ++k) {
      const size_t have = free_[k].size;
      if (have >= rounded && have <= 2 * rounded &&
          (best == free_.size() || have < free_[best].size)) {
        best = k;
      }
    }
    if (best != free_.size()) {
      b = free_[best];
      free_bytes_ -= b.size;
      free_[best] = free_.back();
      free_.pop_back();
    }
  }
  if (b.p == nullptr && pinned_by_ != nullptr) b = AllocatePinned(rounded);
  if (b.p == nullptr) {
    // Host memory (no driver, or it refused just now): a small buffer from
    // the slabs, a large one a mapping of its own.
    if (rounded <= kSlabBytes) return Carve(rounded);
    const size_t mapped = (rounded + kSlabBytes - 1) / kSlabBytes * kSlabBytes;
    b = {mapped, MapHuge(mapped), false};
  }
  if (gauge_) gauge_->Add(b.size);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Count(static_cast<int64_t>(b.size), std::chrono::steady_clock::now());
  }
  // The buffer keeps its pool: a buffer let go after the stream closed
  // returns to it, and the last one frees the pool (and its free list).
  return std::shared_ptr<char>(b.p, [pool = shared_from_this(), b](char*) {
    if (pool->gauge_) pool->gauge_->Sub(b.size);
    pool->Put(b);
  });
}

std::shared_ptr<char> StagingPool::Carve(size_t rounded) {
  Slab* slab;
  char* p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_ != nullptr && open_->used + rounded > kSlabBytes) {
      // Full: the last buffer of it let go parks it (Release); a slab with
      // none held is carved again from its start.
      if (open_->live == 0) {
        open_->used = 0;
      } else {
        open_ = nullptr;
      }
    }
    if (open_ == nullptr) {
      if (!idle_slabs_.empty()) {
        open_ = idle_slabs_.back();
        idle_slabs_.pop_back();
        free_bytes_ -= kSlabBytes;
      } else {
        open_ = new Slab{MapHuge(kSlabBytes)};
      }
    }
    slab = open_;
    p = slab->base + slab->used;
    slab->used += rounded;
    ++slab->live;
    Count(static_cast<int64_t>(rounded), std::chrono::steady_clock::now());
  }
  if (gauge_) gauge_->Add(rounded);
  return std::shared_ptr<char>(p, [pool = shared_from_this(), slab, rounded](char*) {
    if (pool->gauge_) pool->gauge_->Sub(rounded);
    pool->Release(slab, rounded);
  });
}

void StagingPool::Count(int64_t bytes, std::chrono::steady_clock::time_point now) {
  if (now - window_start_ >= kWindow) {
    // A new window; one that saw no use at all leaves nothing behind it.
    peak_before_ = now - window_start_ >= 2 * kWindow ? in_use_bytes_ : peak_now_;
    peak_now_ = in_use_bytes_;
    window_start_ = now;
  }
  in_use_bytes_ = static_cast<size_t>(static_cast<int64_t>(in_use_bytes_) + bytes);
  peak_now_ = std::max(peak_now_, in_use_bytes_);
}

size_t StagingPool::KeepBytes() const {
  return std::clamp(std::max(peak_now_, peak_before_), kMinFreeBytes, kMaxFreeBytes);
}

void StagingPool::Release(Slab* slab, size_t rounded) {
  std::vector<Buffer> excess;
  std::vector<Slab*> excess_slabs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Count(-static_cast<int64_t>(rounded), std::chrono::steady_clock::now());
    if (--slab->live == 0) {
      slab->used = 0;  // nothing of it is held: it serves from its start again
      if (slab != open_) {
        idle_slabs_.push_back(slab);
        free_bytes_ += kSlabBytes;
      }
    }
    TakeExcess(&excess, &excess_slabs);
  }
  FreeAll(excess, excess_slabs);
}

void StagingPool::Put(const Buffer& b) {
  std::vector<Buffer> excess;
  std::vector<Slab*> excess_slabs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Count(-static_cast<int64_t>(b.size), std::chrono::steady_clock::now());
    free_.push_back(b);
    free_bytes_ += b.size;
    TakeExcess(&excess, &excess_slabs);
  }
  FreeAll(excess, excess_slabs);
}

void StagingPool::TakeExcess(std::vector<Buffer>* buffers, std::vector<Slab*>* slabs) {
  const size_t keep = KeepBytes();
  // Idle slabs first (whole 2 MiB pages), then the largest free buffers.
  while (free_bytes_ > keep && !idle_slabs_.empty()) {
    slabs->push_back(idle_slabs_.back());
    idle_slabs_.pop_back();
    free_bytes_ -= kSlabBytes;
  }
  while (free_bytes_ > keep && !free_.empty()) {
    auto largest =
        std::max_element(free_.begin(), free_.end(),
                         [](const Buffer& a, const Buffer& b) { return a.size < b.size; });
    buffers->push_back(*largest);
    free_bytes_ -= largest->size;
    *largest = free_.back();
    free_.pop_back();
  }
}

void StagingPool::FreeAll(const std::vector<Buffer>& buffers, const std::vector<Slab*>& slabs) {
  for (const Buffer& b : buffers) Free(b);
  for (Slab* slab : slabs) {
    ::munmap(slab->base, kSlabBytes);
    delete slab;
  }
}

}  // namespace ferry::internal
