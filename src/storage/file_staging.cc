#include "storage/file_staging.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "base/batch.h"
#include "base/memory_registry.h"
#include "base/staging_pool.h"
#include "base/staging_queue.h"
#include "base/wrapping.h"
#include "base/write_fence.h"
#include "storage/file_io.h"
#include "storage/file_segment.h"

namespace ferry::internal::storage {
namespace {

// Bytes of slices holding a staging buffer at once, per transport.
constexpr uint64_t kMaxStagedBytes = uint64_t{64} << 20;

// One staged slice, from its post to its completion.
struct FileWork : StagedWork {
  std::shared_ptr<char> buffer;  // page-aligned, while it has one
};

// The transport's staging: a byte budget of kMaxStagedBytes for the slices'
// buffers, and the queue and worker (base/staging_queue.h). Lives as long as
// the transport; waits for its work on the way out.
class Stager : public StagingQueue<FileWork> {
 public:
  using Work = FileWork;
  Stager(std::shared_ptr<EngineTarget> self, std::string transport)
      : StagingQueue("a file slice over " + transport),
        self_(std::move(self)),
        transport_(std::move(transport)) {}
  ~Stager() override { StopWorker(); }

 private:
  // Always when nothing is staged, however long the slice is.
  bool CanStartLocked(const Work& next) const override {
    return staged_bytes_ == 0 || staged_bytes_ + next.slice.length <= kMaxStagedBytes;
  }
  Status TakeLocked(Work& w) override {
    staged_bytes_ += w.slice.length;
    return OkStatus();
  }
  void ReleaseLocked(Work& w) override { staged_bytes_ -= w.slice.length; }

  // Reads are posted together; writes read their files first.
  void Start(std::vector<Work> started) override {
    std::vector<Work> reads;
    for (Work& w : started) {
      if (!TakeBuffer(w)) continue;
      if (w.slice.opcode == Opcode::kRead) {
        reads.push_back(std::move(w));
      } else {
        ReadFile(std::move(w));
      }
    }
    if (!reads.empty()) PostReady(std::move(reads));
  }

  // A page-aligned buffer for `w` from the pool (its slice fails if there
  // is none).
  bool TakeBuffer(Work& w) {
    try {
      w.buffer = pool_->Get(w.slice.length);
    } catch (const std::bad_alloc&) {
      Finish(std::move(w),
             ResourceExhaustedError("no host memory to stage a file slice over " + transport_));
      return false;
    }
    return true;
  }

  // A write's first step: the file range into the buffer; then it is
  // ready to post (unless its batch was cancelled meanwhile).
  void ReadFile(Work w) {
    auto work = std::make_shared<Work>(std::move(w));
    Status st = SubmitFileOp(*work, /*write_file=*/false, [this, work](const Status& s) {
      if (!s.ok()) {
        Finish(std::move(*work), s);
        return;
      }
      if (work->ctx.batch->cancelled()) {
        Finish(std::move(*work), CancelledError("the request's batch was cancelled"));
        return;
      }
      Ready(std::move(*work));
    });
    if (!st.ok()) Finish(std::move(*work), st);
  }

  // Queues the file op of `w` (its local range, which lies in a file region
  // of this engine) on the file's ring: `write_file` buffer → file, else
  // file → buffer. A write to the file lands only while the batch may.
  Status SubmitFileOp(const Work& w, bool write_file, std::function<void(const Status&)> done) {
    const uint64_t local = reinterpret_cast<uint64_t>(w.slice.local);
    FERRY_ASSIGN_OR_RETURN(RegionPin pin,
                           self_->registry().Pin(local, w.slice.length, "local buffer"));
    const Region* region = pin.region();
    if (region->file == nullptr) {
      return InternalError("local range " + FormatRange(local, w.slice.length) +
                           " was staged as a file region but is not one");
    }
    const FileSegment& file = *region->file;
    FERRY_ASSIGN_OR_RETURN(FileOp op,
                           file.MakeOp(write_file, w.buffer.get(), local, w.slice.length));
    op.landing = write_file ? w.ctx.batch : nullptr;
    op.pins.push_back(std::move(pin));
    op.done = std::move(done);
    std::vector<FileOp> ops;
    ops.push_back(std::move(op));
    file.io().Submit(std::move(ops));
    return OkStatus();
  }

  // Moves the buffers' bytes with the inner links: each run of slices for
  // one link and deadline (a post's) through one batch of its own, so the
  // link frames them together.
  void PostReady(std::vector<Work> works) override {
    for (size_t first = 0; first < works.size();) {
      size_t end = first + 1;
      while (end < works.size() && works[end].inner == works[first].inner &&
             works[end].ctx.deadline == works[first].ctx.deadline &&
             works[end].ctx.peer == works[first].ctx.peer) {
        ++end;
      }
      auto run = std::make_shared<std::vector<Work>>(
          std::make_move_iterator(works.begin() + static_cast<std::ptrdiff_t>(first)),
          std::make_move_iterator(works.begin() + static_cast<std::ptrdiff_t>(end)));
      first = end;
      const size_t n = run->size();
      auto shadow = std::make_shared<BatchState>(n);
      (void)shadow->Reserve(n);
      BatchState* raw = shadow.get();
      // A read that failed may still be written by the inner link (the
      // fabric provider keeps a read past its deadline in flight): its
      // buffer goes back to the pool only once the link let go of the
      // batch, with this callback, not when the slice is reported.
      auto retired = std::make_shared<std::vector<std::shared_ptr<char>>>();
      shadow->SetOnIdle([this, run, raw, retired] {
        for (size_t i = 0; i < run->size(); ++i) {
          const Status st = raw->Get(i).status;
          if (!st.ok() && (*run)[i].slice.opcode == Opcode::kRead) {
            retired->push_back((*run)[i].buffer);
          }
          OnInner(std::move((*run)[i]), st);
        }
      });
      std::vector<Slice> inner;
      inner.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        Slice s = (*run)[i].slice;
        s.local = (*run)[i].buffer.get();
        s.request = static_cast<uint32_t>(i);
        inner.push_back(s);
      }
      const PostContext ctx{shadow, (*run)[0].ctx.deadline, (*run)[0].ctx.peer};
      std::shared_ptr<PeerLink> link = (*run)[0].inner;
      shadow->BeginRange(0, n, [](size_t) { return 1u; });
      link->Post(ctx, std::move(inner));
    }
  }

  // The inner slice finished: a read writes the buffer to the file, the
  // rest ends.
  void OnInner(Work w, Status st) {
    if (!st.ok() || w.slice.opcode == Opcode::kWrite) {
      Finish(std::move(w), st);
      return;
    }
    auto work = std::make_shared<Work>(std::move(w));
    Status submitted = SubmitFileOp(*work, /*write_file=*/true,
                                    [this, work](const Status& s) { Finish(std::move(*work), s); });
    if (!submitted.ok()) Finish(std::move(*work), submitted);
  }

  const std::shared_ptr<EngineTarget> self_;
  const std::string transport_;
  // The slices' buffers: huge-page slabs, reused (base/staging_pool.h).
  const std::shared_ptr<StagingPool> pool_ = std::make_shared<StagingPool>(nullptr);
  uint64_t staged_bytes_ = 0;  // guarded by mu(): bytes of the slices holding room
};

class FileStagingTransport : public WrappingTransport {
 public:
  FileStagingTransport(std::unique_ptr<Transport> inner, std::shared_ptr<EngineTarget> self)
      : WrappingTransport(std::move(inner), CapsOf),
        self_(std::move(self)),
        stager_(std::make_unique<Stager>(self_, std::string(Name()))) {}

  // This side's file regions too; the peer's kinds stay the inner transport's.
  static TransportCaps CapsOf(TransportCaps c) {
    if (c.remote_kinds.empty()) c.remote_kinds = c.memory_kinds;
    c.memory_kinds.push_back(MemoryKind::Type::kFile);
    return c;
  }

 protected:
  std::shared_ptr<PeerLink> Wrap(std::shared_ptr<PeerLink> inner) override {
    return std::make_shared<StagingQueueLink<FileWork>>(
        std::move(inner), "staged writes of file regions to the peer over " + std::string(Name()),
        self_, MemoryKind::Type::kFile, stager_.get());
  }
  void Drain() override { stager_->StopWorker(); }

 private:
  const std::shared_ptr<EngineTarget> self_;
  const std::unique_ptr<Stager> stager_;
};

}  // namespace

std::unique_ptr<Transport> WithFileStaging(std::unique_ptr<Transport> inner,
                                           std::shared_ptr<EngineTarget> self) {
  return std::make_unique<FileStagingTransport>(std::move(inner), std::move(self));
}

}  // namespace ferry::internal::storage
