// FileRegion: a range of a file registered as a region of an engine
// (Engine::RegisterFile). Transfers reach it like memory: the region has an
// address range of its own (reserved, never mapped to anything), and address
// base + k stands for file offset `offset` + k. Its memory kind is `file`
// (docs/architecture.md, "Memory kinds: file").
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

struct FileRegion {
  // The file: a path, or a descriptor the caller owns (exactly one of the
  // two). The engine opens the file itself (a descriptor through
  // /proc/self/fd), so the caller may close its descriptor at any time.
  std::string path;
  int fd = -1;
  // The range [offset, offset + length); length 0: to the end of the file
  // as it is now. A writable range may reach past the end (writes there
  // extend the file; reading bytes never written fails, naming the offset);
  // a read-only one must lie inside the file.
  uint64_t offset = 0;
  uint64_t length = 0;
  // false: transfers may only read it (a write is refused, naming the file).
  bool writable = true;
  // true: a write to it completes only once its bytes are on stable storage
  // (each write is submitted with RWF_DSYNC).
  bool durable = false;
  // true: reads and writes whose buffer, offset and length are aligned to
  // the file's direct-I/O alignment bypass the page cache (O_DIRECT), where
  // the file system has it; false: every one goes through the page cache.
  bool direct = true;
  // Like MemoryRegion::exported: false keeps it to this engine's own
  // transfers (peers neither see it nor reach it).
  bool exported = true;
};

}  // namespace ferry
