// Page-aligned heap buffers and pattern-layout checks shared by the suites.
#pragma once

#include <gtest/gtest.h>

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

// A zero-filled, 4 KiB-aligned heap buffer.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) : size_(size) {
    const size_t rounded = ((size == 0 ? 1 : size) + 4095) / 4096 * 4096;
    data_ = static_cast<unsigned char*>(std::aligned_alloc(4096, rounded));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(data_, 0, rounded);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(data_); }

 private:
  unsigned char* data_ = nullptr;
  size_t size_ = 0;
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
