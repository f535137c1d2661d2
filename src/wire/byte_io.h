// Little-endian encoding helpers for the wire formats (docs/wire-format.md).
// ByteReader never reads past its input: every getter fails softly and the
// reader remembers the first error.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::wire {

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void U8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  // u16 length + bytes; longer strings are truncated to 65535 bytes.
  void Str(std::string_view s) {
    size_t n = s.size() > 0xffff ? 0xffff : s.size();
    U16(static_cast<uint16_t>(n));
    out_->append(s.data(), n);
  }

 private:
  void Raw(const void* p, size_t n) {  // hosts are little-endian (x86-64, aarch64)
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "big-endian hosts unsupported");
    out_->append(static_cast<const char*>(p), n);
  }
  std::string* out_;
};

class ByteReader {
 public:
  ByteReader(const void* data, size_t size)
      : p_(static_cast<const uint8_t*>(data)), end_(p_ + size) {}
  explicit ByteReader(std::string_view s) : ByteReader(s.data(), s.size()) {}

  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U16(uint16_t* v) { return Raw(v, 2); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool Str(std::string* s) {
    uint16_t n;
    if (!U16(&n)) return false;
    if (remaining() < n) return Fail();
    s->assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  bool ok() const { return ok_; }

 private:
  bool Raw(void* v, size_t n) {
    if (!ok_ || remaining() < n) return Fail();
    std::memcpy(v, p_, n);
    p_ += n;
    return true;
  }
  bool Fail() {
    ok_ = false;
    return false;
  }
  const uint8_t* p_;
  const uint8_t* end_;
  bool ok_ = true;
};

}  // namespace ferry::wire
