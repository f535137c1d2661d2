#include "storage/file_staging.h"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/batch.h"
#include "base/memory_registry.h"
#include "base/wrapping.h"
#include "base/write_fence.h"
#include "storage/file_io.h"
#include "storage/file_segment.h"

namespace ferry::internal::storage {
namespace {

// Bytes of slices holding a staging buffer at once, per transport.
constexpr uint64_t kMaxStagedBytes = uint64_t{64} << 20;
constexpr size_t kPage = 4096;

// One staged slice, from its post to its completion.
struct Work {
  PostContext ctx;
  Slice slice;
  std::shared_ptr<PeerLink> inner;
  std::shared_ptr<WriteFence> writes;  // the link's, for writes to the peer
  uint64_t seq = 0;                    // a write's number in `writes`
  std::shared_ptr<char> buffer;        // page-aligned, while it has one
  bool started = false;                // counted in the stager's bytes
};

// The transport's staging: a queue of slices waiting for buffer space and a
// worker that starts them and posts their inner slices. Lives as long as the
// transport; waits for its work on the way out.
class Stager {
 public:
  Stager(std::shared_ptr<EngineTarget> self, std::string transport)
      : self_(std::move(self)), transport_(std::move(transport)) {}
  ~Stager() { Stop(); }

  void Add(std::vector<Work> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Work& w : work) {
        if (w.slice.opcode == Opcode::kWrite) w.seq = w.writes->Add();
        waiting_.push_back(std::move(w));
      }
      if (!worker_.joinable() && !stopping_) worker_ = std::thread([this] { Run(); });
    }
    cv_.notify_all();
  }

  // Waits until no slice is staged or waiting (each ends by its completion,
  // bounded by its deadline and the file I/O), then ends the worker.
  void Stop() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return staged_bytes_ == 0 && waiting_.empty() && ready_.empty(); });
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !ready_.empty() || CanStartLocked(); });
      if (!ready_.empty()) {
        // Every write read from its file so far, posted together.
        std::vector<Work> ready(std::make_move_iterator(ready_.begin()),
                                std::make_move_iterator(ready_.end()));
        ready_.clear();
        lock.unlock();
        PostInner(std::move(ready));
        lock.lock();
        continue;
      }
      if (stopping_) return;
      // As many waiting slices as the staging bytes allow: reads are posted
      // together, writes read their files first.
      std::vector<Work> started, expired;
      while (CanStartLocked()) {
        Work w = std::move(waiting_.front());
        waiting_.pop_front();
        if (Clock::now() >= w.ctx.deadline) {
          expired.push_back(std::move(w));
          continue;
        }
        staged_bytes_ += w.slice.length;
        w.started = true;
        started.push_back(std::move(w));
      }
      lock.unlock();
      for (Work& w : expired) {
        Finish(std::move(w), DeadlineExceededError("no staging buffer for a file slice over " +
                                                   transport_ + " before the transfer deadline"));
      }
      std::vector<Work> reads;
      for (Work& w : started) {
        if (!TakeBuffer(w)) continue;
        if (w.slice.opcode == Opcode::kRead) {
          reads.push_back(std::move(w));
        } else {
          ReadFile(std::move(w));
        }
      }
      PostInner(std::move(reads));
      lock.lock();
    }
  }

  // Whether the first waiting slice may take its buffer (always when none
  // is staged, however long it is).
  bool CanStartLocked() const {
    return !waiting_.empty() &&
           (staged_bytes_ == 0 || staged_bytes_ + waiting_.front().slice.length <= kMaxStagedBytes);
  }

  // A page-aligned buffer for `w` (its slice fails if there is none).
  bool TakeBuffer(Work& w) {
    const size_t size = std::max(kPage, (size_t{w.slice.length} + kPage - 1) / kPage * kPage);
    void* p = std::aligned_alloc(kPage, size);
    if (p == nullptr) {
      Finish(std::move(w),
             ResourceExhaustedError("no host memory to stage a file slice over " + transport_));
      return false;
    }
    w.buffer = std::shared_ptr<char>(static_cast<char*>(p), std::free);
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
      // Notified under the lock, as in Finish.
      std::lock_guard<std::mutex> lock(mu_);
      ready_.push_back(std::move(*work));
      cv_.notify_all();
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
  void PostInner(std::vector<Work> works) {
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
      shadow->SetOnIdle([this, run, raw] {
        for (size_t i = 0; i < run->size(); ++i) OnInner(std::move((*run)[i]), raw->Get(i).status);
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

  void Finish(Work w, const Status& st) {
    w.ctx.batch->CompleteSlice(w.slice.request, st);
    if (w.seq != 0) w.writes->Done(w.seq);
    w.buffer.reset();
    // Notified under the lock: once the last slice is done, Stop may return
    // and the stager go as soon as the lock is released.
    std::lock_guard<std::mutex> lock(mu_);
    if (w.started) staged_bytes_ -= w.slice.length;
    // Space for waiting slices, or nothing left (Stop waits for that).
    if (!waiting_.empty() || staged_bytes_ == 0) cv_.notify_all();
  }

  const std::shared_ptr<EngineTarget> self_;
  const std::string transport_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> waiting_;  // slices without buffer space yet
  std::deque<Work> ready_;    // writes read from their files, to post
  uint64_t staged_bytes_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

class FileStagingLink : public StagedLink {
 public:
  FileStagingLink(std::shared_ptr<PeerLink> inner, std::shared_ptr<EngineTarget> self,
                  Stager* stager, const std::string& transport)
      : StagedLink(std::move(inner), "staged writes of file regions to the peer over " + transport),
        self_(std::move(self)),
        stager_(stager) {}

  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    if (!self_->registry().ever_non_cpu()) {
      inner()->Post(ctx, std::move(slices));
      return;
    }
    std::vector<Slice> direct;
    std::vector<Work> staged;
    MemoryRegistry::Found last;  // the file region of the previous staged slice
    for (const Slice& s : slices) {
      const uint64_t local = reinterpret_cast<uint64_t>(s.local);
      bool file =
          last.length > 0 && local >= last.addr && local + s.length <= last.addr + last.length;
      if (!file) {
        MemoryRegistry::Found found;
        file = self_->registry().Check(local, s.length, "local buffer", &found).ok() &&
               found.kind.type() == MemoryKind::Type::kFile;
        if (file) last = found;
      }
      if (!file) {
        direct.push_back(s);
        continue;
      }
      staged.push_back({ctx, s, inner(), writes(), 0, nullptr, false});
    }
    if (!direct.empty()) inner()->Post(ctx, std::move(direct));
    if (!staged.empty()) stager_->Add(std::move(staged));
  }

 private:
  const std::shared_ptr<EngineTarget> self_;
  Stager* const stager_;
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
    return std::make_shared<FileStagingLink>(std::move(inner), self_, stager_.get(),
                                             std::string(Name()));
  }
  void Drain() override { stager_->Stop(); }

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
