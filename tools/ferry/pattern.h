// The verification pattern: a pseudo-random byte for every (position, seed).
// The byte at remote offset `o` is byte (o % 8) of Mix((o / 8) ^ SeedKey(seed)),
// so a block that lands at the wrong place, a stale block and a torn block
// all differ from what is expected.
#pragma once

#include <cstdint>
#include <cstring>

namespace ferry::bench {

inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t PatternWord(uint64_t word_index, uint64_t seed) {
  return Mix64(word_index ^ Mix64(seed));
}

// Writes the pattern (or its bitwise complement, which differs from it in
// every byte: used to poison memory before a transfer) for remote offsets
// [remote_off, remote_off + len) into dst.
inline void FillPattern(uint8_t* dst, uint64_t remote_off, uint64_t len, uint64_t seed,
                        bool complement = false) {
  const uint64_t flip = complement ? ~0ull : 0;
  const uint64_t key = Mix64(seed);
  uint64_t o = remote_off;
  const uint64_t end = remote_off + len;
  while (o < end && (o & 7) != 0) {
    *dst++ = static_cast<uint8_t>((Mix64((o >> 3) ^ key) ^ flip) >> (8 * (o & 7)));
    ++o;
  }
  while (o + 8 <= end) {
    uint64_t w = Mix64((o >> 3) ^ key) ^ flip;
    std::memcpy(dst, &w, 8);
    dst += 8;
    o += 8;
  }
  while (o < end) {
    *dst++ = static_cast<uint8_t>((Mix64((o >> 3) ^ key) ^ flip) >> (8 * (o & 7)));
    ++o;
  }
}

// Counts the bytes of src that differ from the pattern for remote offsets
// [remote_off, remote_off + len). *first_bad gets the remote offset of the
// first bad byte (left alone when none is bad).
inline uint64_t CheckPattern(const uint8_t* src, uint64_t remote_off, uint64_t len, uint64_t seed,
                             uint64_t* first_bad) {
  const uint64_t key = Mix64(seed);
  uint64_t bad = 0;
  uint64_t o = remote_off;
  const uint64_t end = remote_off + len;
  auto check_byte = [&](uint8_t got) {
    uint8_t want = static_cast<uint8_t>(Mix64((o >> 3) ^ key) >> (8 * (o & 7)));
    if (got != want) {
      if (bad == 0 && first_bad != nullptr) *first_bad = o;
      ++bad;
    }
  };
  while (o < end && (o & 7) != 0) {
    check_byte(*src++);
    ++o;
  }
  while (o + 8 <= end) {
    uint64_t w;
    std::memcpy(&w, src, 8);
    if (w != Mix64((o >> 3) ^ key)) {
      for (int k = 0; k < 8; ++k) {
        check_byte(src[k]);
        ++o;
      }
      src += 8;
      continue;
    }
    src += 8;
    o += 8;
  }
  while (o < end) {
    check_byte(*src++);
    ++o;
  }
  return bad;
}

}  // namespace ferry::bench
