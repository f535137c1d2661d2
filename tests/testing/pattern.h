// Deterministic byte patterns for checking transferred data.
//
// A pattern is an endless byte stream named by a 64-bit seed; the byte at
// position `pos` depends on both, so data that lands at the wrong offset, is
// shifted by one byte, or belongs to another request (another seed) is
// detected. Fill and check a window of the stream with FillPattern and
// CheckPattern. Typical uses:
//   - one seed per request (RequestSeed(test_seed, index)), position 0 at
//     the request's first byte;
//   - one seed per buffer, position = offset in the buffer, so any sub-range
//     can be checked on its own (used by the multi-process peer).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

namespace ferry::test {

// SplitMix64 finalizer: a cheap, well-mixed 64-bit hash.
inline constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The seed of request `index` in a test seeded with `base`.
inline constexpr uint64_t RequestSeed(uint64_t base, uint64_t index) {
  return Mix64(Mix64(base) ^ (index * 0x2545f4914f6cdd1dull + 1));
}

// The 8 pattern bytes at positions [8*word, 8*word + 8), little-endian.
inline constexpr uint64_t PatternWord(uint64_t seed, uint64_t word) {
  return Mix64(seed * 0xd6e8feb86659fd93ull ^ Mix64(word));
}

inline constexpr uint8_t PatternByte(uint64_t seed, uint64_t pos) {
  return static_cast<uint8_t>(PatternWord(seed, pos >> 3) >> ((pos & 7) * 8));
}

// Writes stream `seed`, positions [pos, pos + len), to dst.
inline void FillPattern(void* dst, size_t len, uint64_t seed, uint64_t pos = 0) {
  auto* out = static_cast<unsigned char*>(dst);
  size_t i = 0;
  // Head: up to the next word boundary of the stream.
  while (i < len && ((pos + i) & 7) != 0) {
    out[i] = PatternByte(seed, pos + i);
    ++i;
  }
  if constexpr (std::endian::native == std::endian::little) {
    for (; i + 8 <= len; i += 8) {
      const uint64_t w = PatternWord(seed, (pos + i) >> 3);
      std::memcpy(out + i, &w, 8);
    }
  }
  for (; i < len; ++i) out[i] = PatternByte(seed, pos + i);
}

// Offset (from src) of the first byte that differs from stream `seed` at
// positions [pos, pos + len), or nullopt if all match.
inline std::optional<size_t> CheckPattern(const void* src, size_t len, uint64_t seed,
                                          uint64_t pos = 0) {
  const auto* in = static_cast<const unsigned char*>(src);
  size_t i = 0;
  while (i < len && ((pos + i) & 7) != 0) {
    if (in[i] != PatternByte(seed, pos + i)) return i;
    ++i;
  }
  if constexpr (std::endian::native == std::endian::little) {
    for (; i + 8 <= len; i += 8) {
      const uint64_t w = PatternWord(seed, (pos + i) >> 3);
      if (std::memcmp(in + i, &w, 8) != 0) break;  // the byte loop finds it
    }
  }
  for (; i < len; ++i) {
    if (in[i] != PatternByte(seed, pos + i)) return i;
  }
  return std::nullopt;
}

// Human-readable result of CheckPattern, for assertion messages: "" if the
// range matches, else "first mismatch at offset N: got 0x.., want 0x..".
inline std::string DescribePatternMismatch(const void* src, size_t len, uint64_t seed,
                                           uint64_t pos = 0) {
  const std::optional<size_t> bad = CheckPattern(src, len, seed, pos);
  if (!bad) return "";
  char buf[160];
  std::snprintf(buf, sizeof(buf), "first mismatch at offset %zu of %zu: got 0x%02x, want 0x%02x",
                *bad, len, static_cast<const unsigned char*>(src)[*bad],
                PatternByte(seed, pos + *bad));
  return buf;
}

}  // namespace ferry::test
