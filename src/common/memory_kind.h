// Memory kinds: what registered memory is, and so who may touch it and how.
//
// `cpu` is host memory that any CPU copy may read and write (every transport
// today). `cuda:N` is GPU memory (not in this build: registering it fails
// with kUnimplemented). `test-opaque` exists for the tests of the seam: pages
// the CPU must not touch directly (mapped PROT_NONE), reached only through
// CopyMemory; only engines created with EngineOptions::testing.
// allow_test_memory_kind accept it. A kind read from a peer's descriptor that
// this build does not know is kUnknown: nothing here can reach it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal {

class MemoryKind {
 public:
  enum class Type : uint8_t { kCpu, kCuda, kTestOpaque, kUnknown };

  MemoryKind() = default;  // cpu
  static MemoryKind Cpu() { return MemoryKind(); }
  static MemoryKind TestOpaque() { return MemoryKind(Type::kTestOpaque, 0); }

  // The kind a registration's location names: "cpu", "cpu:N", "*" or "" →
  // cpu; "cuda:N" → kUnimplemented (no GPU memory in this build yet);
  // "test-opaque" (only with `allow_test`); anything else kInvalidArgument
  // listing what is accepted.
  static StatusOr<MemoryKind> FromLocation(std::string_view location, bool allow_test);
  // The kind a peer advertised (its Name()); unknown names give kUnknown.
  static MemoryKind FromName(std::string_view name);

  // The name of a kind of that type ("cpu", "cuda", "test-opaque", "unknown").
  static std::string_view TypeName(Type t);

  Type type() const { return type_; }
  int device() const { return device_; }
  // "cpu", "cuda:0", "test-opaque", or the unknown name's "unknown".
  std::string Name() const;
  // Whether plain CPU loads and stores (memcpy, sendmsg, process_vm_*v) may
  // touch this memory.
  bool cpu_accessible() const { return type_ == Type::kCpu; }

  friend bool operator==(const MemoryKind& a, const MemoryKind& b) {
    return a.type_ == b.type_ && a.device_ == b.device_;
  }

 private:
  MemoryKind(Type t, int device) : type_(t), device_(device) {}
  Type type_ = Type::kCpu;
  int device_ = 0;
};

// Copies `length` bytes from `src` (memory of `src_kind`) to `dst` (of
// `dst_kind`) through the kinds' own copy functions (memmove for cpu).
// kUnimplemented for kinds this build cannot copy.
Status CopyMemory(MemoryKind dst_kind, void* dst, MemoryKind src_kind, const void* src, size_t length);

}  // namespace ferry::internal
