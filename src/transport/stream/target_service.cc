#include "transport/stream/target_service.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <new>

#include "common/cuda_driver.h"
#include "common/log.h"
#include "storage/file_segment.h"

namespace ferry::internal::stream {

Status TargetService::PinEntry(uint64_t addr, uint32_t length, uint32_t index, const Region** last,
                               std::vector<RegionPin>* pins,
                               std::vector<wire::EntryFailure>* failures, Staged staged) const {
  Status s;
  const Region* r = *last;
  if (length == 0) {
    s = InvalidArgumentError("zero-length entry");
  } else if (r != nullptr && addr >= r->addr && length <= r->length &&
             addr - r->addr <= r->length - length) {
    return OkStatus();  // inside the region pinned for an earlier entry
  } else {
    auto pin = target_->registry().PinExported(addr, length, "remote range");
    const bool reachable =
        pin.ok() &&
        (pin->region()->kind.cpu_accessible() ||
         (staged == Staged::kFilesAndGpu && pin->region()->kind.type() == MemoryKind::Type::kCuda &&
          target_->cuda_driver() != nullptr) ||
         (staged != Staged::kNone && pin->region()->kind.type() == MemoryKind::Type::kFile &&
          pin->region()->file != nullptr));
    if (pin.ok() && !reachable) {
      s = InvalidArgumentError("remote range " + FormatRange(addr, length) + " is in " +
                               pin->region()->kind.Name() + " memory, which transport " +
                               transport_ + " cannot reach");
    } else if (pin.ok()) {
      *last = pin->region();
      pins->push_back(std::move(*pin));
      return OkStatus();
    } else {
      s = pin.status();
    }
    s = s.WithPrefix("peer " + target_->peer_id() + " refused");
  }
  failures->push_back({index, s.code(), std::string(s.message())});
  return s;
}

Status TargetService::ServeNotify(Connection& stream, const wire::FrameHeader& h,
                                  std::string_view body) const {
  FERRY_ASSIGN_OR_RETURN(wire::NotifyBody n, wire::DecodeNotify(body));
  Status delivered =
      target_->Deliver({std::move(n.sender), std::move(n.name), std::move(n.message)});
  std::string reply;
  wire::EncodeReply({delivered.WithPrefix("peer " + target_->peer_id() + " refused"), {}}, &reply);
  stream.QueueReply(wire::FrameType::kAck, h.seq, std::move(reply));
  return OkStatus();
}

size_t TargetService::StagedOffset(size_t at, uint32_t length) {
  return length % 512 == 0 ? (at + 4095) / 4096 * 4096 : at;
}

bool TargetService::RefuseOversizedStaging(std::vector<StagedEntry>* staged, size_t* staged_bytes,
                                           std::vector<wire::EntryFailure>* failures) const {
  if (*staged_bytes <= wire::kMaxPayload) return false;
  const std::string why = "peer " + target_->peer_id() + " refused: the frame's " +
                          std::to_string(staged->size()) + " file or GPU entries need " +
                          std::to_string(*staged_bytes) +
                          " bytes of staging, more than the 64 MiB a frame may carry";
  for (const StagedEntry& e : *staged)
    failures->push_back({e.index, StatusCode::kInvalidArgument, why});
  staged->clear();
  *staged_bytes = 0;
  return true;
}

std::shared_ptr<char> TargetService::StagingBytes(size_t n) const { return staging_->Get(n); }

std::shared_ptr<char> TargetService::GpuStagingBytes(size_t n) const {
  std::call_once(pinned_once_, [&] {
    const CudaDriver* d = target_->cuda_driver();
    pinned_staging_ =
        d != nullptr ? std::make_shared<StagingPool>(target_->staging(), d) : staging_;
  });
  return pinned_staging_->Get(n);
}

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

StagingPool::Buffer StagingPool::Allocate(size_t size) {
  if (pinned_by_ != nullptr) {
    bool refused;
    {
      std::lock_guard<std::mutex> lock(mu_);
      refused = refused_;
    }
    if (!refused) {
      // Portable page-locked memory: any context may copy to and from it;
      // device 0's context only makes the call.
      CudaContextScope scope(*pinned_by_, 0);
      StatusOr<void*> p = scope.status().ok() ? pinned_by_->AllocateHost(size) : scope.status();
      if (p.ok()) return {size, static_cast<char*>(*p), true};
      std::lock_guard<std::mutex> lock(mu_);
      if (!refused_) {
        FERRY_LOG(kWarning,
                  "staging GPU transfers through pageable memory: " << p.status().WithPrefix(
                      "no page-locked buffer of " + std::to_string(size) + " bytes"));
      }
      refused_ = true;
    }
  }
  const size_t mapped = (size + kSlabBytes - 1) / kSlabBytes * kSlabBytes;
  return {mapped, MapHuge(mapped), false};
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
  if (pinned_by_ == nullptr && rounded <= kSlabBytes) return Carve(rounded);
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
  if (b.p == nullptr) b = Allocate(rounded);
  if (gauge_) gauge_->Add(b.size);
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
  }
  if (gauge_) gauge_->Add(rounded);
  return std::shared_ptr<char>(p, [pool = shared_from_this(), slab, rounded](char*) {
    if (pool->gauge_) pool->gauge_->Sub(rounded);
    pool->Release(slab);
  });
}

void StagingPool::Release(Slab* slab) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (--slab->live > 0) return;
    slab->used = 0;  // nothing of it is held: it serves from its start again
    if (slab == open_) return;
    if (free_bytes_ + kSlabBytes <= kMaxFreeBytes) {
      idle_slabs_.push_back(slab);
      free_bytes_ += kSlabBytes;
      return;
    }
  }
  ::munmap(slab->base, kSlabBytes);
  delete slab;
}

void StagingPool::Put(const Buffer& b) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_bytes_ + b.size <= kMaxFreeBytes) {
      free_.push_back(b);
      free_bytes_ += b.size;
      return;
    }
  }
  Free(b);
}

void TargetService::SortByEntry(std::vector<wire::EntryFailure>* failures) {
  std::sort(
      failures->begin(), failures->end(),
      [](const wire::EntryFailure& a, const wire::EntryFailure& b) { return a.index < b.index; });
}

bool TargetService::HasFiles(const std::vector<StagedEntry>& staged) {
  return std::any_of(staged.begin(), staged.end(), [](const StagedEntry& e) {
    return e.region->kind.type() == MemoryKind::Type::kFile;
  });
}

void TargetService::StartFileIo(const std::vector<StagedEntry>& staged, char* host, bool write,
                                std::function<void(std::vector<wire::EntryFailure>)> then) const {
  // What the ops' completions share: the failures so far, and how many ops
  // are still in the ring.
  struct Join {
    std::mutex mu;
    std::vector<wire::EntryFailure> failures;
    size_t left = 0;
    std::function<void(std::vector<wire::EntryFailure>)> then;
  };
  auto join = std::make_shared<Join>();
  join->then = std::move(then);
  const std::string peer = "peer " + target().peer_id();
  std::vector<storage::FileOp> ops;
  storage::FileIo* io = nullptr;
  for (const StagedEntry& e : staged) {
    if (e.region->kind.type() != MemoryKind::Type::kFile) continue;
    const storage::FileSegment& file = *e.region->file;
    auto op = file.MakeOp(write, host + e.offset, e.addr, e.length);
    if (!op.ok()) {
      const Status s = op.status().WithPrefix(peer + " refused");
      join->failures.push_back({e.index, s.code(), std::string(s.message())});
      continue;
    }
    op->done = [join, peer, index = e.index](const Status& s) {
      std::vector<wire::EntryFailure> all;
      {
        std::lock_guard<std::mutex> lock(join->mu);
        if (!s.ok()) {
          const Status named = s.WithPrefix(peer);
          join->failures.push_back({index, named.code(), std::string(named.message())});
        }
        if (--join->left > 0) return;
        all = std::move(join->failures);
      }
      join->then(std::move(all));
    };
    io = &file.io();  // one engine's regions: one ring
    ops.push_back(*std::move(op));
  }
  if (ops.empty()) {
    join->then(std::move(join->failures));
    return;
  }
  join->left = ops.size();  // before any can finish: Submit starts them
  io->Submit(std::move(ops));
}

}  // namespace ferry::internal::stream
