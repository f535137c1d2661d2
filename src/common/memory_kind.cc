#include "common/memory_kind.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <vector>

#include "common/cuda_driver.h"
#include "common/fd_limit.h"
#include "common/net.h"

namespace ferry::internal {
namespace {

constexpr std::string_view kTestOpaqueName = "test-opaque";
constexpr std::string_view kFileName = "file";

// `prefix:N` → N; -1 if `s` is not of that form.
int DeviceSuffix(std::string_view s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix || s.size() == prefix.size()) return -1;
  int n = -1;
  auto [end, ec] = std::from_chars(s.data() + prefix.size(), s.data() + s.size(), n);
  if (ec != std::errc() || end != s.data() + s.size() || n < 0) return -1;
  return n;
}

// The test kind's copy function: /proc/self/mem reaches pages whatever their
// protection, as a debugger does; a plain memcpy of them faults.
Status ProcMemCopy(void* dst, const void* src, size_t length, bool to_opaque) {
  UniqueFd fd(::open("/proc/self/mem", O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return DescriptorError(StatusCode::kInternal, "test-opaque memory: /proc/self/mem", errno);
  }
  size_t done = 0;
  while (done < length) {
    ssize_t n = to_opaque ? ::pwrite(fd.get(), static_cast<const char*>(src) + done, length - done,
                                     static_cast<off_t>(reinterpret_cast<uintptr_t>(dst) + done))
                          : ::pread(fd.get(), static_cast<char*>(dst) + done, length - done,
                                    static_cast<off_t>(reinterpret_cast<uintptr_t>(src) + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return InternalError(std::string("test-opaque memory: ") + (to_opaque ? "pwrite" : "pread") +
                           " of /proc/self/mem: " + (n < 0 ? ErrnoString(errno) : "short copy"));
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

bool IsCpuLocation(std::string_view location) {
  return location.empty() || location == "*" || location == "cpu" ||
         DeviceSuffix(location, "cpu:") >= 0;
}

// The device a cuda location names ("cuda" is device 0), or -1.
int CudaLocationDevice(std::string_view location) {
  return location == "cuda" ? 0 : DeviceSuffix(location, "cuda:");
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%#llx",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

// Whether device `n` can be registered: the driver usable and the device there.
Status CheckCudaDevice(std::string_view location, int n, const CudaDriver& driver) {
  const std::string what = "memory location '" + std::string(location) + "' is GPU memory";
  if (!driver.loaded())
    return FailedPreconditionError(what +
                                   ", and there is no CUDA driver: " + driver.why_unavailable());
  if (!driver.available()) {
    return FailedPreconditionError(what + ", and the CUDA driver (" + driver.library() +
                                   ") is not usable: " + driver.why_unavailable());
  }
  if (!driver.data_path()) {
    return FailedPreconditionError(what + ", and the CUDA driver (" + driver.library() +
                                   ") cannot move it: " + driver.why_no_data_path());
  }
  auto count = driver.DeviceCount();
  if (!count.ok()) return count.status().WithPrefix(what);
  if (n >= *count) {
    return InvalidArgumentError(
        what + " of CUDA device " + std::to_string(n) +
        ", which does not exist: this machine has " + std::to_string(*count) + " CUDA device" +
        (*count == 1 ? "" : "s") +
        (*count > 0 ? " (cuda:0..cuda:" + std::to_string(*count - 1) + ")" : ""));
  }
  return OkStatus();
}

bool IsAutoLocation(std::string_view location) { return location.empty() || location == "*"; }

StatusOr<MemoryKind> ParseLocation(std::string_view location, bool allow_test,
                                   const CudaDriver* driver) {
  if (IsCpuLocation(location)) return MemoryKind::Cpu();
  if (location == kTestOpaqueName && allow_test) return MemoryKind::TestOpaque();
  const int n = CudaLocationDevice(location);
  if (n >= 0) {
    FERRY_RETURN_IF_ERROR(
        CheckCudaDevice(location, n, driver != nullptr ? *driver : CudaDriver::Get()));
    return MemoryKind::Cuda(n);
  }
  return InvalidArgumentError("unknown memory location '" + std::string(location) +
                              "' (expected \"cpu\", \"cpu:N\", \"cuda:N\" or \"*\")");
}

}  // namespace

StatusOr<MemoryKind> MemoryKind::FromLocation(std::string_view location, bool allow_test) {
  return ParseLocation(location, allow_test, nullptr);
}

StatusOr<MemoryKind> MemoryKind::FromLocation(std::string_view location, bool allow_test,
                                              const CudaDriver& driver) {
  return ParseLocation(location, allow_test, &driver);
}

const CudaDriver* CudaDriverForRegistrations() {
  return CudaDriver::LoadedInProcess() ? &CudaDriver::Get() : nullptr;
}

StatusOr<MemoryKind> KindOfRegistration(std::string_view location, const void* addr, size_t length,
                                        bool allow_test, const CudaDriver* driver) {
  FERRY_ASSIGN_OR_RETURN(MemoryKind kind, ParseLocation(location, allow_test, driver));
  const bool is_cuda = kind.type() == MemoryKind::Type::kCuda;
  if (!is_cuda &&
      (kind.type() != MemoryKind::Type::kCpu || driver == nullptr || !driver->available()))
    return kind;
  const CudaDriver& d = driver != nullptr ? *driver : CudaDriver::Get();
  const char* first = static_cast<const char*>(addr);
  const char* ends[] = {first, length > 1 ? first + (length - 1) : first};
  std::optional<int> devices[2];
  for (int i = 0; i < 2; ++i) {
    auto device = d.DeviceOfPointer(ends[i]);
    if (!device.ok()) {
      return device.status().WithPrefix("cannot tell whether " + Hex(ends[i]) + " (region at " +
                                        Hex(addr) + ", location '" + std::string(location) +
                                        "') is " + (is_cuda ? "GPU" : "host") + " memory");
    }
    devices[i] = *device;
  }
  const std::string region = "memory at " + Hex(addr) + " (" + std::to_string(length) +
                             " bytes, location '" + std::string(location) + "')";
  if (is_cuda) {
    for (int i = 0; i < 2; ++i) {
      if (devices[i] == kind.device()) continue;
      return InvalidArgumentError(region + (i == 0 ? " starts" : " ends") + " in " +
                                  (devices[i].has_value()
                                       ? "GPU memory of cuda:" + std::to_string(*devices[i])
                                       : std::string("host memory")) +
                                  " (" + Hex(ends[i]) + "), not in GPU memory of " + kind.Name());
    }
    return kind;
  }
  // A cpu location: host memory, unless the location is automatic ("*" or
  // "") and both ends are on one device, which makes it that device's memory.
  if (!devices[0].has_value() && !devices[1].has_value()) return kind;
  if (IsAutoLocation(location) && devices[0].has_value() && devices[0] == devices[1] &&
      d.data_path()) {
    return MemoryKind::Cuda(*devices[0]);
  }
  const int dev = devices[0].has_value() ? *devices[0] : *devices[1];
  const char* p = devices[0].has_value() ? ends[0] : ends[1];
  return InvalidArgumentError(region + " is GPU memory of cuda:" + std::to_string(dev) + " (" +
                              Hex(p) + "), not host memory" +
                              (IsAutoLocation(location)
                                   ? std::string(" (and not all of it on one device)")
                                   : "; register it as cuda:" + std::to_string(dev)));
}

MemoryKind MemoryKind::FromName(std::string_view name) {
  if (name.empty() || name == "cpu") return Cpu();  // format-1 descriptors carry no kind
  if (name == kTestOpaqueName) return TestOpaque();
  if (name == kFileName) return File();
  int n = DeviceSuffix(name, "cuda:");
  if (n >= 0) return MemoryKind(Type::kCuda, n);
  return MemoryKind(Type::kUnknown, 0);
}

std::string_view MemoryKind::TypeName(Type t) {
  switch (t) {
    case Type::kCpu:
      return "cpu";
    case Type::kCuda:
      return "cuda";
    case Type::kTestOpaque:
      return kTestOpaqueName;
    case Type::kFile:
      return kFileName;
    case Type::kUnknown:
      break;
  }
  return "unknown";
}

std::string MemoryKind::Name() const {
  switch (type_) {
    case Type::kCpu:
      return "cpu";
    case Type::kCuda:
      return "cuda:" + std::to_string(device_);
    case Type::kTestOpaque:
      return std::string(kTestOpaqueName);
    case Type::kFile:
      return std::string(kFileName);
    case Type::kUnknown:
      break;
  }
  return "unknown";
}

Status CopyMemory(MemoryKind dst_kind, void* dst, MemoryKind src_kind, const void* src,
                  size_t length) {
  if (dst_kind.cpu_accessible() && src_kind.cpu_accessible()) {
    std::memmove(dst, src, length);
    return OkStatus();
  }
  using T = MemoryKind::Type;
  const bool dst_ok = dst_kind.cpu_accessible() || dst_kind.type() == T::kTestOpaque;
  const bool src_ok = src_kind.cpu_accessible() || src_kind.type() == T::kTestOpaque;
  if (!dst_ok || !src_ok) {
    return UnimplementedError("cannot copy from " + src_kind.Name() + " to " + dst_kind.Name() +
                              " memory in this build");
  }
  if (dst_kind.type() == T::kTestOpaque && src_kind.type() == T::kTestOpaque) {
    std::vector<char> bounce(length);
    FERRY_RETURN_IF_ERROR(ProcMemCopy(bounce.data(), src, length, /*to_opaque=*/false));
    return ProcMemCopy(dst, bounce.data(), length, /*to_opaque=*/true);
  }
  return ProcMemCopy(dst, src, length, /*to_opaque=*/dst_kind.type() == T::kTestOpaque);
}

}  // namespace ferry::internal
