// A minimal JSON writer (objects, arrays, numbers, strings, booleans, null).
// Not thread-safe. Non-finite numbers are written as null.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::bench {

class JsonWriter {
 public:
  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }
  JsonWriter& Key(std::string_view key) {
    Separate();
    String(key);
    out_ += ':';
    after_key_ = true;
    return *this;
  }
  JsonWriter& Value(std::string_view s) {
    Separate();
    String(s);
    return *this;
  }
  JsonWriter& Value(const char* s) { return Value(std::string_view(s)); }
  JsonWriter& Value(const std::string& s) { return Value(std::string_view(s)); }
  JsonWriter& Value(bool b) {
    Separate();
    out_ += b ? "true" : "false";
    return *this;
  }
  JsonWriter& Value(double d) {
    Separate();
    if (!std::isfinite(d)) {
      out_ += "null";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.6g", d);
      out_ += buf;
    }
    return *this;
  }
  JsonWriter& Value(uint64_t v) {
    Separate();
    out_ += std::to_string(v);
    return *this;
  }
  JsonWriter& Value(int v) {
    Separate();
    out_ += std::to_string(v);
    return *this;
  }
  JsonWriter& Null() {
    Separate();
    out_ += "null";
    return *this;
  }
  template <typename T>
  JsonWriter& Field(std::string_view key, const T& v) {
    Key(key);
    return Value(v);
  }
  const std::string& str() const { return out_; }

 private:
  JsonWriter& Open(char c) {
    Separate();
    out_ += c;
    first_.push_back(true);
    return *this;
  }
  JsonWriter& Close(char c) {
    out_ += c;
    first_.pop_back();
    return *this;
  }
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void String(std::string_view s) {
    out_ += '"';
    for (char c : s) {
      switch (c) {
        case '"':
          out_ += "\\\"";
          break;
        case '\\':
          out_ += "\\\\";
          break;
        case '\n':
          out_ += "\\n";
          break;
        case '\t':
          out_ += "\\t";
          break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out_ += buf;
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

}  // namespace ferry::bench
