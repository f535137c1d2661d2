#include "common/shared_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <utility>

#include "common/fd_limit.h"

namespace ferry::internal {
namespace {

uint64_t PageSize() { return static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)); }

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

// Identity, seal and size checks shared by both sides.
Status CheckSealedSize(int fd, const struct stat& st, uint64_t offset, uint64_t length,
                       const std::string& what) {
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgumentError(what + ": descriptor " + std::to_string(fd) +
                                " is not a memfd or regular file");
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return InvalidArgumentError(
        what + ": descriptor " + std::to_string(fd) +
        " is not sealed against shrinking (a memfd made with MFD_ALLOW_SEALING and sealed with "
        "F_SEAL_SHRINK): a same-host peer mapping it would fault if it shrank");
  }
  if (offset > static_cast<uint64_t>(st.st_size) ||
      length > static_cast<uint64_t>(st.st_size) - offset) {
    return InvalidArgumentError(what + ": bytes [" + std::to_string(offset) + ", " +
                                std::to_string(offset + length) + ") lie past the end of its " +
                                std::to_string(st.st_size) + " bytes");
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::shared_ptr<const SharedBacking>> VerifySharedMapping(const void* addr,
                                                                   uint64_t length, int fd,
                                                                   uint64_t offset) {
  const uint64_t start = reinterpret_cast<uint64_t>(addr);
  const std::string what = "shared memory at " + Hex(start);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return InvalidArgumentError(what + ": descriptor " + std::to_string(fd) +
                                " cannot be examined: " + ErrnoString(errno));
  }
  FERRY_RETURN_IF_ERROR(CheckSealedSize(fd, st, offset, length, what));
  // Walk the mappings covering the range: each must be shared, of this file,
  // and at the file offset that continues the range.
  FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) {
    return DescriptorError(StatusCode::kInvalidArgument, what + ": reading /proc/self/maps", errno);
  }
  uint64_t covered = start;  // first byte not yet found mapped as required
  const uint64_t end = start + length;
  char line[512];
  std::string problem;
  while (covered < end && std::fgets(line, sizeof(line), maps) != nullptr) {
    unsigned long long lo = 0, hi = 0, off = 0, inode = 0;
    unsigned int major_dev = 0, minor_dev = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &lo, &hi, perms, &off, &major_dev,
                    &minor_dev, &inode) != 7) {
      continue;
    }
    if (hi <= covered || lo > covered) continue;
    if (perms[3] != 's' || perms[0] != 'r' || perms[1] != 'w') {
      problem = "is not a writable shared mapping (" + std::string(perms) + ")";
      break;
    }
    if (inode != st.st_ino || major_dev != major(st.st_dev) || minor_dev != minor(st.st_dev)) {
      problem = "is not a mapping of descriptor " + std::to_string(fd);
      break;
    }
    if (off + (covered - lo) != offset + (covered - start)) {
      problem = "maps descriptor " + std::to_string(fd) + " at file offset " +
                std::to_string(off + (covered - lo)) + ", not " +
                std::to_string(offset + (covered - start));
      break;
    }
    covered = hi;
  }
  std::fclose(maps);
  if (problem.empty() && covered < end) problem = "is not mapped";
  if (!problem.empty()) {
    return InvalidArgumentError(what + ": the range from " + Hex(covered) + " " + problem +
                                " (fd and fd_offset must name the pages the memory is mapped "
                                "from, with MAP_SHARED)");
  }
  auto backing = std::make_shared<SharedBacking>();
  auto dup = std::make_shared<UniqueFd>(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  backing->file = dup;
  if (!dup->valid()) {
    return DescriptorError(StatusCode::kInvalidArgument,
                           what + ": duplicating descriptor " + std::to_string(fd), errno);
  }
  backing->offset = offset;
  backing->dev = st.st_dev;
  backing->ino = st.st_ino;
  return std::shared_ptr<const SharedBacking>(std::move(backing));
}

StatusOr<SharedMemory> SharedMemory::Create(uint64_t length, const std::string& name) {
  if (length == 0) return InvalidArgumentError("cannot allocate 0 bytes of shared memory");
  const uint64_t page = PageSize();
  if (length > UINT64_MAX - page) {
    return InvalidArgumentError("cannot allocate " + std::to_string(length) +
                                " bytes of shared memory");
  }
  const uint64_t mapped = (length + page - 1) / page * page;
  SharedMemory m;
  m.fd_ = UniqueFd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!m.fd_.valid()) {
    return DescriptorError(StatusCode::kResourceExhausted, "memfd_create for shared memory", errno);
  }
  if (::ftruncate(m.fd_.get(), static_cast<off_t>(mapped)) != 0) {
    return ResourceExhaustedError("cannot size shared memory to " + std::to_string(mapped) +
                                  " bytes: " + ErrnoString(errno));
  }
  if (::fcntl(m.fd_.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return InternalError("sealing shared memory: " + ErrnoString(errno));
  }
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd_.get(), 0);
  if (p == MAP_FAILED) {
    return ResourceExhaustedError("cannot map " + std::to_string(mapped) +
                                  " bytes of shared memory: " + ErrnoString(errno));
  }
  m.data_ = p;
  m.length_ = length;
  m.mapped_ = mapped;
  return m;
}

SharedMemory::SharedMemory(SharedMemory&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      length_(std::exchange(o.length_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      fd_(std::move(o.fd_)) {}

SharedMemory& SharedMemory::operator=(SharedMemory&& o) noexcept {
  if (this != &o) {
    Reset();
    data_ = std::exchange(o.data_, nullptr);
    length_ = std::exchange(o.length_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    fd_ = std::move(o.fd_);
  }
  return *this;
}

SharedMemory::~SharedMemory() { Reset(); }

void SharedMemory::Reset() {
  if (data_ != nullptr) ::munmap(data_, mapped_);
  data_ = nullptr;
  fd_.Reset();
}

StatusOr<std::unique_ptr<PeerMapping>> PeerMapping::Open(int fd, uint64_t offset, uint64_t length,
                                                         uint64_t dev, uint64_t ino,
                                                         const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    return InternalError(what + ": examining its descriptor: " + ErrnoString(errno));
  }
  if (st.st_dev != dev || st.st_ino != ino) {
    return FailedPreconditionError(what + ": the descriptor opened is not the one advertised");
  }
  FERRY_RETURN_IF_ERROR(CheckSealedSize(fd, st, offset, length, what));
  if (length == 0) return InvalidArgumentError(what + ": empty range");
  const uint64_t page = PageSize();
  const uint64_t base_off = offset / page * page;
  const uint64_t mapped = offset - base_off + length;
  void* p =
      ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(base_off));
  if (p == MAP_FAILED) {
    return ResourceExhaustedError(what + ": cannot map " + std::to_string(mapped) +
                                  " bytes: " + ErrnoString(errno));
  }
  return std::unique_ptr<PeerMapping>(
      new PeerMapping(p, mapped, static_cast<char*>(p) + (offset - base_off), length));
}

PeerMapping::~PeerMapping() { ::munmap(base_, mapped_); }

}  // namespace ferry::internal
