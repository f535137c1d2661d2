// Memory kinds: what registered memory is, and so who may touch it and how.
//
// `cpu` is host memory that any CPU copy may read and write. `cuda:N` is GPU
// memory of device N: the CUDA driver is loaded at run time
// (common/cuda_driver.h) to check the device, to tell device pointers from
// host ones and to move the bytes; no CPU copy ever touches it. `test-opaque` exists for the tests
// of the seam: pages the CPU must not touch directly (mapped PROT_NONE), reached only through
// CopyMemory; only engines created with EngineOptions::testing.
// allow_test_memory_kind accept it. `file` is a range of a file
// (Engine::RegisterFile): its addresses are a reserved range nothing may
// touch, address base+k standing for file offset+k; its bytes move only
// through the file I/O of src/storage/. A kind read from a peer's descriptor that
// this build does not know is kUnknown: nothing here can reach it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ferry/status.h"

namespace ferry::internal {

class CudaDriver;

class MemoryKind {
 public:
  enum class Type : uint8_t { kCpu, kCuda, kTestOpaque, kFile, kUnknown };

  MemoryKind() = default;  // cpu
  static MemoryKind Cpu() { return MemoryKind(); }
  static MemoryKind TestOpaque() { return MemoryKind(Type::kTestOpaque, 0); }
  static MemoryKind Cuda(int device) { return MemoryKind(Type::kCuda, device); }
  // Never from a location: only Engine::RegisterFile makes file regions.
  static MemoryKind File() { return MemoryKind(Type::kFile, 0); }

  // The kind a registration's location names: "cpu", "cpu:N", "*" or "" →
  // cpu; "test-opaque" (only with `allow_test`); anything else
  // kInvalidArgument listing what is accepted. "cuda:N" ("cuda" is cuda:0)
  // asks the CUDA driver (CudaDriver::Get(), or `driver`) and is refused
  // with:
  //   kFailedPrecondition: no usable driver (no libcuda.so.1, cuInit
  //     failed, or a driver without the data paths' calls), naming why —
  //     the machine, not the request, is at fault;
  //   kInvalidArgument: there is no device N (naming N and the count).
  // Every refusal names the location and says "GPU".
  static StatusOr<MemoryKind> FromLocation(std::string_view location, bool allow_test);
  static StatusOr<MemoryKind> FromLocation(std::string_view location, bool allow_test,
                                           const CudaDriver& driver);
  // The kind a peer advertised (its Name()); unknown names give kUnknown.
  static MemoryKind FromName(std::string_view name);

  // The name of a kind of that type ("cpu", "cuda", "test-opaque", "file",
  // "unknown").
  static std::string_view TypeName(Type t);

  Type type() const { return type_; }
  int device() const { return device_; }
  // "cpu", "cuda:0", "test-opaque", "file", or the unknown name's "unknown".
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

// The driver registrations check host memory against: CudaDriver::Get() if
// this process has loaded libcuda.so.1 already (only then can any of its
// pointers be device memory), else nullptr. Loads nothing.
const CudaDriver* CudaDriverForRegistrations();

// The kind of a registration of [addr, addr + length) at `location`
// (FromLocation, asking `driver` about "cuda:N"; CudaDriver::Get() if
// `driver` is null), checked against the driver (first and last byte):
//   - cuda:N: both ends must be GPU memory of device N, else
//     kInvalidArgument naming the end, what it is and the location;
//   - "*" or "": GPU memory of one device with both ends there is that
//     device's kind; host memory is cpu;
//   - any other cpu location whose first or last byte is device memory is
//     refused with kInvalidArgument naming the address, the location and
//     the device: nothing may treat GPU memory as host memory (memcpy,
//     sendmsg, process_vm_writev would fault or read the wrong bytes).
// When the driver cannot tell, its error is returned (code kept, address and
// location named). With a null or unavailable `driver` a cpu location is
// taken as host memory.
StatusOr<MemoryKind> KindOfRegistration(std::string_view location, const void* addr, size_t length,
                                        bool allow_test, const CudaDriver* driver);

// Copies `length` bytes from `src` (memory of `src_kind`) to `dst` (of
// `dst_kind`) through the kinds' own copy functions (memmove for cpu).
// kUnimplemented for kinds this build cannot copy.
Status CopyMemory(MemoryKind dst_kind, void* dst, MemoryKind src_kind, const void* src,
                  size_t length);

}  // namespace ferry::internal
