#include "storage/file_io.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>

#include "common/log.h"

namespace ferry::internal::storage {
namespace {

// user_data of the entry Shutdown submits to wake the reaping thread.
constexpr uint64_t kWake = 0;

std::string Describe(const FileOp& op, uint64_t offset, uint64_t length) {
  return "file '" + (op.file ? *op.file : std::string("?")) +
         "': " + (op.write ? "write" : "read") + " of " + std::to_string(length) +
         " bytes at offset " + std::to_string(offset);
}

}  // namespace

Status FileError(const FileOp& op, uint64_t offset, uint64_t length, int err) {
  const std::string what = Describe(op, offset, length) + ": " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return ResourceExhaustedError(what);
    case EIO:
      return DataLossError(what);
    case EFBIG:
    case EINVAL:
      return InvalidArgumentError(what);
    case ECANCELED:
      return CancelledError(what);
    default:
      return InternalError(what);
  }
}

StatusOr<std::shared_ptr<FileIo>> FileIo::Create(uint32_t depth) {
  std::shared_ptr<FileIo> io(new FileIo(depth));
  // One entry more than the depth: Shutdown's wake-up always finds room.
  const int r = io_uring_queue_init(depth + 1, &io->ring_, 0);
  if (r < 0) {
    return FailedPreconditionError("cannot set up an io_uring ring of " +
                                   std::to_string(depth + 1) +
                                   " entries for file I/O: " + std::strerror(-r));
  }
  io->ring_ok_ = true;
  io->reaper_ = std::thread([p = io.get()] { p->Reap(); });
  return io;
}

FileIo::~FileIo() {
  if (!ring_ok_) return;
  Shutdown();
  io_uring_queue_exit(&ring_);
}

void FileIo::Shutdown() {
  std::vector<Op*> refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;  // the first caller stops it
    stopping_ = true;
    // Ops not yet in the kernel fail; those in it are waited for.
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->started) {
        ++it;  // the rest of a short op: its landing began, let it finish
      } else {
        refused.push_back(*it);
        it = queue_.erase(it);
      }
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe != nullptr) {
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, kWake);
      io_uring_submit(&ring_);
    }
  }
  for (Op* op : refused) Finish(op, CancelledError("the engine is shutting down"));
  // Never from the reaping thread: the engine shuts it down before it can
  // drop the last reference to it there.
  if (reaper_.joinable()) reaper_.join();
}

void FileIo::Submit(std::vector<FileOp> ops) {
  std::vector<Op*> refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (FileOp& f : ops) {
      Op* op = new Op{std::move(f)};
      if (stopping_) {
        refused.push_back(op);
      } else {
        queue_.push_back(op);
      }
    }
    if (!stopping_) FillLocked(&refused);
  }
  for (Op* op : refused) {
    Finish(op, op->op.landing && op->op.landing->cancelled()
                   ? CancelledError("the request's batch was cancelled")
                   : CancelledError("the engine is shutting down"));
  }
}

std::vector<Status> FileIo::Run(std::vector<FileOp> ops) {
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    size_t left = 0;
    std::vector<Status> statuses;
  };
  auto w = std::make_shared<Waiter>();
  w->left = ops.size();
  w->statuses.resize(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i].done = [w, i](const Status& s) {
      std::lock_guard<std::mutex> lock(w->mu);
      w->statuses[i] = s;
      if (--w->left == 0) w->cv.notify_all();
    };
  }
  Submit(std::move(ops));
  std::unique_lock<std::mutex> lock(w->mu);
  w->cv.wait(lock, [&] { return w->left == 0; });
  return std::move(w->statuses);
}

FileIo::Counters FileIo::counters() const {
  Counters c;
  c.direct_ops = direct_ops_.load(std::memory_order_relaxed);
  c.direct_bytes = direct_bytes_.load(std::memory_order_relaxed);
  c.buffered_ops = buffered_ops_.load(std::memory_order_relaxed);
  c.buffered_bytes = buffered_bytes_.load(std::memory_order_relaxed);
  return c;
}

void FileIo::FillLocked(std::vector<Op*>* refused) {
  bool added = false;
  while (in_kernel_ < depth_ && !queue_.empty()) {
    Op* op = queue_.front();
    if (!op->started) {
      if (op->op.landing && !op->op.landing->BeginLanding()) {
        queue_.pop_front();
        refused->push_back(op);
        continue;
      }
      op->started = true;
      (op->op.direct ? direct_ops_ : buffered_ops_).fetch_add(1, std::memory_order_relaxed);
      (op->op.direct ? direct_bytes_ : buffered_bytes_)
          .fetch_add(op->op.length, std::memory_order_relaxed);
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) break;  // the ring is full until the next submit
    queue_.pop_front();
    char* at = op->op.buf + op->done;
    const unsigned n = static_cast<unsigned>(
        std::min<uint64_t>(op->op.length - op->done, uint64_t{1} << 30));  // one call's most
    const uint64_t offset = op->op.offset + op->done;
    if (op->op.fail_errno != 0) {
      io_uring_prep_nop(sqe);  // an injected fault: answered in Reap
    } else if (op->op.write) {
      io_uring_prep_write(sqe, op->op.fd, at, n, offset);
      if (op->op.dsync) sqe->rw_flags = RWF_DSYNC;
    } else {
      io_uring_prep_read(sqe, op->op.fd, at, n, offset);
    }
    io_uring_sqe_set_data(sqe, op);
    ++in_kernel_;
    added = true;
  }
  if (!added) return;
  for (;;) {
    const int r = io_uring_submit(&ring_);
    if (r >= 0 || (r != -EINTR && r != -EAGAIN && r != -EBUSY)) {
      if (r < 0) FERRY_LOG(kError, "io_uring_submit failed: " << std::strerror(-r));
      return;
    }
    if (r == -EBUSY) return;  // completions pending; the reaping thread submits again
  }
}

void FileIo::Finish(Op* op, const Status& status) {
  if (op->started && op->op.landing) op->op.landing->EndLanding();
  if (op->op.done) op->op.done(status);
  delete op;
}

void FileIo::Reap() {
  std::vector<std::pair<Op*, Status>> finished;
  std::vector<Op*> refused;
  std::vector<io_uring_cqe*> cqes;
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    const int r = io_uring_wait_cqe(&ring_, &cqe);
    if (r == -EINTR || r == -EAGAIN) continue;
    if (r < 0) {
      FERRY_LOG(kError, "io_uring_wait_cqe failed: " << std::strerror(-r));
      continue;
    }
    // Each op was written under mu_ before its entry went to the kernel
    // (Submit, FillLocked); its completion can only be here after that.
    // Taking mu_ once states that order where ThreadSanitizer can see it
    // (the kernel's hand-off is invisible to it); uncontended, it is cheap.
    // Only the completions counted before taking it are handled in this
    // round: one posted later may be of an op submitted after the lock.
    const unsigned ready = io_uring_cq_ready(&ring_);
    { std::lock_guard<std::mutex> order(mu_); }
    cqes.resize(std::max(ready, 1u));
    const unsigned seen = io_uring_peek_batch_cqe(&ring_, cqes.data(), ready);
    unsigned completed = 0;
    std::vector<Op*> again;
    for (unsigned k = 0; k < seen; ++k) {
      cqe = cqes[k];
      if (cqe->user_data == kWake) continue;
      ++completed;
      Op* op = static_cast<Op*>(io_uring_cqe_get_data(cqe));
      const uint64_t left = op->op.length - op->done;
      const uint64_t at = op->op.offset + op->done;
      if (op->op.fail_errno != 0) {
        finished.emplace_back(op, FileError(op->op, at, left, op->op.fail_errno));
      } else if (cqe->res < 0) {
        finished.emplace_back(op, FileError(op->op, at, left, -cqe->res));
      } else if (cqe->res == 0 && !op->op.write) {
        struct stat st {};
        const std::string size =
            ::fstat(op->op.fd, &st) == 0 ? std::to_string(st.st_size) + " bytes" : "unknown";
        finished.emplace_back(
            op, FailedPreconditionError(Describe(op->op, at, left) +
                                        ": the file ends there (its size is now " + size +
                                        ": not written that far yet, or truncated under its "
                                        "registration)"));
      } else if (cqe->res == 0) {
        finished.emplace_back(op, FileError(op->op, at, left, EIO));
      } else if (static_cast<uint64_t>(cqe->res) < left) {
        op->done += static_cast<uint64_t>(cqe->res);        // short: the rest goes again,
        if (op->op.direct) op->op.fd = op->op.buffered_fd;  // maybe unaligned now
        again.push_back(op);
      } else {
        finished.emplace_back(op, OkStatus());
      }
    }
    io_uring_cq_advance(&ring_, seen);
    bool exit = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_kernel_ -= completed;
      // The rests of short ops first: their landing began.
      for (auto it = again.rbegin(); it != again.rend(); ++it) queue_.push_front(*it);
      FillLocked(&refused);
      exit = stopping_ && in_kernel_ == 0 && queue_.empty();
    }
    for (auto& [op, status] : finished) Finish(op, status);
    for (Op* op : refused) Finish(op, CancelledError("the request's batch was cancelled"));
    finished.clear();
    refused.clear();
    if (exit) return;
  }
}

}  // namespace ferry::internal::storage
