// Shared mappings: memory whose pages a same-host peer can map too.
//
// A registered range may say which file descriptor it is a MAP_SHARED
// mapping of (MemoryRegion::fd, fd_offset; Engine::AllocateShared makes such
// memory). The shm transport then lets same-host peers map the same pages
// and copy with plain loads and stores (docs/architecture.md, "Mapped
// segments"). Only a memfd sealed against shrinking qualifies: a peer that
// maps a file which later shrinks would fault (SIGBUS) on its next copy, so
// descriptors that cannot promise their size are refused at registration.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "ferry/status.h"

namespace ferry::internal {

// What a peer needs to map a registered range: the descriptor (this
// process's duplicate), the file offset of the range's first byte, and the
// file's identity, which a peer checks after opening it.
struct SharedBacking {
  // Shared by the regions of one file (MemoryRegistry keeps one descriptor
  // per file, however many regions map it).
  std::shared_ptr<const UniqueFd> file;
  uint64_t offset = 0;
  uint64_t dev = 0;
  uint64_t ino = 0;
  int fd() const { return file->get(); }
};

// Checks that [addr, addr + length) is a MAP_SHARED mapping of `fd` at file
// offset `offset` in this process (/proc/self/maps), that `fd` is sealed
// against shrinking (F_SEAL_SHRINK) and holds the whole range, and returns
// the backing with a duplicate of `fd`. kInvalidArgument names what does not
// hold; kResourceExhausted if no descriptor is left for the duplicate.
StatusOr<std::shared_ptr<const SharedBacking>> VerifySharedMapping(const void* addr,
                                                                   uint64_t length, int fd,
                                                                   uint64_t offset);

// Memory from a new memfd (named `name`, page-rounded, sealed against
// shrinking and growing), mapped shared and writable. Unmapped and closed
// by its destructor.
class SharedMemory {
 public:
  static StatusOr<SharedMemory> Create(uint64_t length, const std::string& name);
  SharedMemory() = default;
  SharedMemory(SharedMemory&& o) noexcept;
  SharedMemory& operator=(SharedMemory&& o) noexcept;
  ~SharedMemory();
  void* data() const { return data_; }
  uint64_t length() const { return length_; }  // what was asked for
  int fd() const { return fd_.get(); }

 private:
  void Reset();
  void* data_ = nullptr;
  uint64_t length_ = 0;
  uint64_t mapped_ = 0;  // page-rounded
  UniqueFd fd_;
};

// Maps [offset, offset + length) of a shared memory descriptor that a peer
// exported: checks its identity (dev, ino), its seal against shrinking and
// its size first, so a copy through the mapping can never fault. Unmapped by
// its destructor.
class PeerMapping {
 public:
  // `what` names it in errors ("region 0x... of peer X").
  static StatusOr<std::unique_ptr<PeerMapping>> Open(int fd, uint64_t offset, uint64_t length,
                                                     uint64_t dev, uint64_t ino,
                                                     const std::string& what);
  PeerMapping(const PeerMapping&) = delete;
  PeerMapping& operator=(const PeerMapping&) = delete;
  ~PeerMapping();
  // The first byte of the range.
  char* data() const { return data_; }
  uint64_t length() const { return length_; }

 private:
  PeerMapping(void* base, uint64_t mapped, char* data, uint64_t length)
      : base_(base), mapped_(mapped), data_(data), length_(length) {}
  void* base_;
  uint64_t mapped_;
  char* data_;
  uint64_t length_;
};

}  // namespace ferry::internal
