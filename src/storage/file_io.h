// FileIo: an engine's file I/O, through one io_uring ring (liburing).
//
// Callers hand it batches of FileOps (Submit); each becomes a submission
// queue entry, at most `depth` of them in the kernel at once (the others
// wait in order, in a queue of the ring's). One thread reaps the
// completions for every request (no thread per request) and calls each op's
// `done` once, with OK or an error naming the file, the offset and what the
// kernel said. A short read or write goes on from where it stopped; a read
// that meets the end of the file fails (the file was truncated under its
// registration).
//
// Cancellation: an op with a `landing` batch starts only if
// BatchState::BeginLanding() says the batch may still store data, and ends
// its landing when the kernel is done with it, so once BatchState::Cancel
// returns no byte of such an op moves any more (in either direction).
//
// Thread-safe. Shutdown (or the destructor) fails the ops not yet started
// with kCancelled and waits for those in the kernel.
#pragma once

#include <liburing.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/batch.h"
#include "base/memory_registry.h"
#include "ferry/status.h"

namespace ferry::internal::storage {

struct FileOp {
  bool write = false;  // true: buf → file; false: file → buf
  int fd = -1;
  bool direct = false;   // fd was opened with O_DIRECT (and the op is aligned for it)
  int buffered_fd = -1;  // the same file through the page cache: for the rest of a short op
  bool dsync = false;    // the write is done only once on stable storage (RWF_DSYNC)
  int fail_errno = 0;    // tests: the kernel is not asked; the op fails with this errno
  char* buf = nullptr;
  uint64_t length = 0;
  uint64_t offset = 0;                      // in the file
  std::shared_ptr<const std::string> file;  // its name, for errors
  std::shared_ptr<BatchState> landing;      // see the header comment; may be null
  std::vector<RegionPin> pins;              // held until `done` returned
  std::function<void(const Status&)> done;
};

class FileIo {
 public:
  // A ring of `depth` entries and its reaping thread. kFailedPrecondition
  // if the kernel refuses io_uring (naming why).
  static StatusOr<std::shared_ptr<FileIo>> Create(uint32_t depth);
  ~FileIo();
  FileIo(const FileIo&) = delete;
  FileIo& operator=(const FileIo&) = delete;

  // Queues the ops; each one's `done` runs on the reaping thread (or on
  // this one, with kCancelled, after Shutdown).
  void Submit(std::vector<FileOp> ops);
  // Submits and waits: each op's status, in order (their `done` is ignored).
  std::vector<Status> Run(std::vector<FileOp> ops);
  // Idempotent; see the header comment.
  void Shutdown();

  // What went to the kernel so far: ops and bytes with O_DIRECT and
  // through the page cache.
  struct Counters {
    uint64_t direct_ops = 0;
    uint64_t direct_bytes = 0;
    uint64_t buffered_ops = 0;
    uint64_t buffered_bytes = 0;
  };
  Counters counters() const;
  uint32_t depth() const { return depth_; }

 private:
  struct Op {
    FileOp op;
    uint64_t done = 0;     // bytes moved so far
    bool started = false;  // landing begun
  };
  explicit FileIo(uint32_t depth) : depth_(depth) {}
  void Reap();
  // REQUIRES: mu_ held. Moves queued ops into the ring (up to the depth);
  // those whose batch was cancelled go to `refused`.
  void FillLocked(std::vector<Op*>* refused);
  static void Finish(Op* op, const Status& status);

  const uint32_t depth_;
  io_uring ring_{};
  bool ring_ok_ = false;  // set once by Create
  std::thread reaper_;
  mutable std::mutex mu_;
  std::deque<Op*> queue_;   // guarded by mu_
  uint32_t in_kernel_ = 0;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  std::atomic<uint64_t> direct_ops_{0}, direct_bytes_{0}, buffered_ops_{0}, buffered_bytes_{0};
};

// The status for errno `err` of an op: ENOSPC and EDQUOT
// kResourceExhausted, EIO kDataLoss, EFBIG and EINVAL kInvalidArgument,
// others kInternal; the message names the file, the direction, the length,
// the offset and strerror(err).
Status FileError(const FileOp& op, uint64_t offset, uint64_t length, int err);

}  // namespace ferry::internal::storage
