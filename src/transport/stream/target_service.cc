#include "transport/stream/target_service.h"

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "common/cuda_driver.h"
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
