// Page-aligned heap buffers and pattern-layout checks shared by the suites.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "tests/testing/pattern.h"

namespace ferry::test {

// A zero-filled, 4 KiB-aligned heap buffer; or, `shared`, the pages of a
// memfd sealed against shrinking, mapped shared (fd(): what to register it
// with, MemoryRegion::fd).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size, bool shared = false) : size_(size) {
    rounded_ = ((size == 0 ? 1 : size) + 4095) / 4096 * 4096;
    if (shared) {
      fd_ = memfd_create("ferry-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(rounded_)) != 0 ||
          fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        throw std::bad_alloc();
      }
      void* p = mmap(nullptr, rounded_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = static_cast<unsigned char*>(p);
      return;
    }
    data_ = static_cast<unsigned char*>(std::aligned_alloc(4096, rounded_));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, rounded_);
  }
  ~AlignedBuffer() {
    if (fd_ < 0) {
      std::free(data_);
      return;
    }
    munmap(data_, rounded_);
    close(fd_);
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  int fd() const { return fd_; }  // -1 unless shared
  unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(data_); }

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
  size_t rounded_ = 0;
  int fd_ = -1;
};

// A file of `size` bytes (zeros) in $TMPDIR (else /tmp), removed from its
// folder at once, and a shared mapping of it (data()): what a test reads and
// writes to see the file's bytes. Register it with its descriptor
// (FileRegion::fd).
class FileBuffer {
 public:
  explicit FileBuffer(size_t size) : size_(size) {
    rounded_ = ((size == 0 ? 1 : size) + 4095) / 4096 * 4096;
    const char* dir = std::getenv("TMPDIR");
    std::string path =
        std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/ferry-test-file-XXXXXX";
    fd_ = mkstemp(path.data());
    if (fd_ < 0) throw std::bad_alloc();
    unlink(path.c_str());
    if (ftruncate(fd_, static_cast<off_t>(size)) != 0) throw std::bad_alloc();
    void* p = mmap(nullptr, rounded_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<unsigned char*>(p);
  }
  ~FileBuffer() {
    munmap(data_, rounded_);
    close(fd_);
  }
  FileBuffer(const FileBuffer&) = delete;
  FileBuffer& operator=(const FileBuffer&) = delete;

  int fd() const { return fd_; }
  unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
  size_t rounded_ = 0;
  int fd_ = -1;
};

// A range of a buffer expected to hold stream `seed` from position `pos`.
struct PatternRange {
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t seed = 0;
  uint64_t pos = 0;
};

// Checks that each of `ranges` (non-overlapping) holds its pattern and that
// every other byte of buf[0, size) holds the background stream `background`
// at position = offset in the buffer (i.e. was not touched).
inline ::testing::AssertionResult CheckLayout(const unsigned char* buf, size_t size,
                                              std::vector<PatternRange> ranges,
                                              uint64_t background) {
  std::sort(ranges.begin(), ranges.end(),
            [](const PatternRange& a, const PatternRange& b) { return a.offset < b.offset; });
  uint64_t cursor = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const PatternRange& r = ranges[i];
    if (r.offset < cursor || r.offset + r.length > size) {
      return ::testing::AssertionFailure() << "bad test layout at range " << i;
    }
    if (r.offset > cursor) {
      const std::string bad =
          DescribePatternMismatch(buf + cursor, r.offset - cursor, background, cursor);
      if (!bad.empty()) {
        return ::testing::AssertionFailure() << "bytes outside the target ranges changed: gap ["
                                             << cursor << ", " << r.offset << "): " << bad;
      }
    }
    const std::string bad = DescribePatternMismatch(buf + r.offset, r.length, r.seed, r.pos);
    if (!bad.empty()) {
      return ::testing::AssertionFailure() << "range [" << r.offset << ", " << r.offset + r.length
                                           << ") (sorted index " << i << "): " << bad;
    }
    cursor = r.offset + r.length;
  }
  if (cursor < size) {
    const std::string bad =
        DescribePatternMismatch(buf + cursor, size - cursor, background, cursor);
    if (!bad.empty()) {
      return ::testing::AssertionFailure() << "bytes outside the target ranges changed: gap ["
                                           << cursor << ", " << size << "): " << bad;
    }
  }
  return ::testing::AssertionSuccess();
}

// Fills buf[0, size) with `background` (position = offset), then each range
// with its pattern.
inline void FillLayout(unsigned char* buf, size_t size, const std::vector<PatternRange>& ranges,
                       uint64_t background) {
  FillPattern(buf, size, background, 0);
  for (const PatternRange& r : ranges) FillPattern(buf + r.offset, r.length, r.seed, r.pos);
}

}  // namespace ferry::test
