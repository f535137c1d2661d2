// FileSegment: one registered range of a file (Engine::RegisterFile) — the
// engine's own descriptors of the file and the address range that stands
// for it in the registry.
//
// The address range is reserved (mmap PROT_NONE, MAP_NORESERVE) and never
// touched: it only gives the region addresses, so the registry, bounds
// checks, descriptors, exports and TransferRequest addresses work as for
// memory. Address base() + k is file offset offset() + k.
//
// The file is opened by the engine (a path as given; a caller's descriptor
// through /proc/self/fd/N, a new open file of the same inode), so the caller
// may close its descriptor at any time, and a file renamed or replaced after
// registration is still the one registered. Two descriptors: one through
// the page cache, and one with O_DIRECT where the file system supports it;
// an op uses O_DIRECT when its buffer, offset and length are aligned to the
// file's direct-I/O alignment (statx STATX_DIOALIGN), unless the region was
// registered with FileRegion::direct false.
//
// Immutable after Open; the region's pins keep it alive while I/O runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "ferry/file_region.h"
#include "storage/file_io.h"

namespace ferry::internal::storage {

class FileSegment {
 public:
  // Opens the file of `r`, checks the range against its size and reserves
  // the addresses. kInvalidArgument: neither or both of path and fd, a
  // file that is not a regular file, a range past the end of the file
  // (naming the file, the range and its size), a range that wraps; the
  // errors of open(2) (kNotFound for ENOENT, kInvalidArgument otherwise,
  // naming the file).
  // `eio_offsets` (tests: TestingOptions::file_eio_offsets): ops covering
  // one of these file offsets fail with EIO.
  static StatusOr<std::shared_ptr<FileSegment>> Open(const FileRegion& r,
                                                     std::shared_ptr<FileIo> io,
                                                     std::vector<uint64_t> eio_offsets = {});
  ~FileSegment();
  FileSegment(const FileSegment&) = delete;
  FileSegment& operator=(const FileSegment&) = delete;

  void* base() const { return base_; }
  uint64_t length() const { return length_; }
  uint64_t offset() const { return offset_; }
  // The path as registered, or "fd N (PATH)".
  const std::string& name() const { return *name_; }
  bool writable() const { return writable_; }
  bool durable() const { return durable_; }
  bool has_direct() const { return direct_.valid(); }
  uint32_t direct_alignment() const { return align_; }
  FileIo& io() const { return *io_; }

  // The op moving `length` bytes between `buf` and the file range that
  // addresses [addr, addr + length) of this region stand for (the caller
  // checked that they lie inside). `write`: buf → file. kInvalidArgument
  // for a write to a read-only registration, naming the file and offset.
  StatusOr<FileOp> MakeOp(bool write, char* buf, uint64_t addr, uint64_t length) const;

 private:
  FileSegment() = default;
  std::shared_ptr<FileIo> io_;
  std::shared_ptr<const std::string> name_;
  UniqueFd buffered_;
  UniqueFd direct_;     // invalid where the file system has no O_DIRECT
  uint32_t align_ = 0;  // for buffer address, offset and length; 0 without direct_
  void* base_ = nullptr;
  uint64_t length_ = 0;
  uint64_t offset_ = 0;
  bool writable_ = true;
  bool durable_ = false;
  std::vector<uint64_t> eio_offsets_;
};

}  // namespace ferry::internal::storage
