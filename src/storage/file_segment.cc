#include "storage/file_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry::internal::storage {
namespace {

// What `path` names: "PATH", or for a descriptor "fd N (PATH)".
std::string NameOf(const FileRegion& r) {
  if (r.fd < 0) return r.path;
  char target[4096];
  const std::string link = "/proc/self/fd/" + std::to_string(r.fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  return "fd " + std::to_string(r.fd) + (n > 0 ? " (" + std::string(target, n) + ")" : "");
}

Status OpenError(const std::string& name, int err, bool writable) {
  const std::string what = "cannot open file '" + name + "'" +
                           (writable ? " for reading and writing" : " for reading") + ": " +
                           std::strerror(err);
  return err == ENOENT ? NotFoundError(what) : InvalidArgumentError(what);
}

}  // namespace

StatusOr<std::shared_ptr<FileSegment>> FileSegment::Open(const FileRegion& r,
                                                         std::shared_ptr<FileIo> io,
                                                         std::vector<uint64_t> eio_offsets) {
  if (r.path.empty() == (r.fd < 0)) {
    return InvalidArgumentError(
        "a file region names its file by a path or by a descriptor (fd >= 0), exactly one of "
        "the two");
  }
  std::shared_ptr<FileSegment> f(new FileSegment());
  f->io_ = std::move(io);
  f->name_ = std::make_shared<const std::string>(NameOf(r));
  f->writable_ = r.writable;
  f->durable_ = r.durable;
  f->eio_offsets_ = std::move(eio_offsets);
  // A caller's descriptor is opened anew through /proc: the engine's own
  // open file, whatever the caller does with its descriptor later.
  const std::string path = r.fd >= 0 ? "/proc/self/fd/" + std::to_string(r.fd) : r.path;
  const int flags = (r.writable ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  f->buffered_ = UniqueFd(::open(path.c_str(), flags));
  if (!f->buffered_.valid()) return OpenError(f->name(), errno, r.writable);
  struct stat st {};
  if (::fstat(f->buffered_.get(), &st) != 0) {
    return InternalError("cannot stat file '" + f->name() + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError("'" + f->name() + "' is not a regular file");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  f->offset_ = r.offset;
  f->length_ = r.length != 0 ? r.length : (r.offset < size ? size - r.offset : 0);
  if (f->length_ == 0) {
    return InvalidArgumentError("file '" + f->name() + "' has no bytes at offset " +
                                std::to_string(r.offset) + " (its size is " + std::to_string(size) +
                                " bytes)");
  }
  // A writable region may reach past the end: writes there extend the file
  // (as NIXL's POSIX backend lets a new, empty file be registered and
  // written), and a read of bytes not written yet fails naming the offset.
  // A read-only region can only ever read, so it must lie inside the file.
  if (r.offset + f->length_ < r.offset) {
    return InvalidArgumentError("file '" + f->name() + "': the range at offset " +
                                std::to_string(r.offset) + " of " + std::to_string(f->length_) +
                                " bytes overflows");
  }
  if (!r.writable && r.offset + f->length_ > size) {
    return InvalidArgumentError(
        "file '" + f->name() + "': the read-only range [" + std::to_string(r.offset) + ", " +
        std::to_string(r.offset + f->length_) + ") goes past its end (its size is " +
        std::to_string(size) + " bytes)");
  }
  // O_DIRECT where the file system has it and says how to align for it.
  struct statx sx {};
  if (r.direct && ::statx(f->buffered_.get(), "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0) {
    UniqueFd direct(::open(path.c_str(), flags | O_DIRECT));
    if (direct.valid()) {
      f->direct_ = std::move(direct);
      f->align_ = std::max(sx.stx_dio_mem_align, sx.stx_dio_offset_align);
    }
  }
  void* base =
      ::mmap(nullptr, f->length_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return ResourceExhaustedError("cannot reserve " + std::to_string(f->length_) +
                                  " bytes of address space for file '" + f->name() +
                                  "': " + std::strerror(errno));
  }
  f->base_ = base;
  return f;
}

FileSegment::~FileSegment() {
  if (base_ != nullptr) ::munmap(base_, length_);
}

StatusOr<FileOp> FileSegment::MakeOp(bool write, char* buf, uint64_t addr, uint64_t length) const {
  FileOp op;
  op.write = write;
  op.buf = buf;
  op.length = length;
  op.offset = offset_ + (addr - reinterpret_cast<uintptr_t>(base_));
  op.file = name_;
  if (write && !writable_) {
    return InvalidArgumentError("file '" + name() + "' is registered read-only: a write of " +
                                std::to_string(length) + " bytes at offset " +
                                std::to_string(op.offset) + " is refused");
  }
  op.dsync = write && durable_;
  op.direct = align_ != 0 && reinterpret_cast<uintptr_t>(buf) % align_ == 0 &&
              op.offset % align_ == 0 && length % align_ == 0;
  op.fd = op.direct ? direct_.get() : buffered_.get();
  op.buffered_fd = buffered_.get();
  for (uint64_t bad : eio_offsets_) {
    if (bad >= op.offset && bad - op.offset < length) op.fail_errno = EIO;
  }
  return op;
}

}  // namespace ferry::internal::storage
