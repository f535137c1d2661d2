// The CUDA driver loaded at run time: a library that is not there, one
// without the entry points, the fake driver (tests/testing/fake_cuda_driver.cc)
// answering like libcuda.so.1, and the process's own driver (none on a
// machine without a GPU; the cases that need one or its absence say so).
#include "common/cuda_driver.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ferry/cuda.h"
#include "tests/testing/fake_cuda.h"
#include "tests/testing/status_matchers.h"

namespace ferry::internal {
namespace {

using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

using ::ferry::test::FakeCuda;

extern "C" char** environ;

TEST(CudaDriver, ALibraryThatIsNotThereIsUnavailableNamingIt) {
  CudaDriver d("libferry-no-such-cuda-driver.so.1");
  EXPECT_FALSE(d.loaded());
  EXPECT_FALSE(d.available());
  EXPECT_THAT(d.why_unavailable(), AllOf(HasSubstr("libferry-no-such-cuda-driver.so.1 not found ("),
                                         HasSubstr("cannot open shared object file")));
  EXPECT_THAT(d.DeviceCount(),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cuDeviceGetCount"), HasSubstr("no CUDA driver"),
                             HasSubstr("libferry-no-such-cuda-driver.so.1 not found"))));
  EXPECT_THAT(d.DeviceName(0),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("cuDeviceGetName")));
  EXPECT_THAT(d.DriverVersion(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("cuDriverGetVersion")));
  int host = 0;
  EXPECT_THAT(d.DeviceOfPointer(&host),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("cuPointerGetAttribute")));
}

TEST(CudaDriver, ALibraryWithoutTheEntryPointsIsUnavailable) {
  CudaDriver d("libm.so.6");
  EXPECT_FALSE(d.loaded());
  EXPECT_FALSE(d.available());
  EXPECT_THAT(d.why_unavailable(), HasSubstr("libm.so.6 has no cuInit"));
}

TEST(CudaDriver, ALibraryWithoutTheEntryPointsHasNoDataPath) {
  CudaDriver d("libm.so.6");
  EXPECT_FALSE(d.data_path());
  EXPECT_THAT(d.PushContext(0), StatusIs(StatusCode::kFailedPrecondition,
                                         AllOf(HasSubstr("cuCtxPushCurrent"),
                                               HasSubstr("the CUDA driver cannot move GPU memory"),
                                               HasSubstr("libm.so.6 has no cuInit"))));
  EXPECT_THAT(d.AllocateDevice(4096),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("cuMemAlloc")));
  d.PopContext();  // nothing to pop, nothing called
}

TEST(CudaDriver, FakeDriverDevicesNamesVersionAndErrors) {
  FakeCuda fake;
  ASSERT_TRUE(fake.ok()) << ::dlerror();
  CudaDriver d(FERRY_FAKE_CUDA_PATH);
  ASSERT_TRUE(d.available()) << d.why_unavailable();
  EXPECT_TRUE(d.loaded());
  EXPECT_EQ(d.why_unavailable(), "");
  EXPECT_THAT(d.DriverVersion(), IsOk());
  EXPECT_EQ(d.DriverVersion().value(), 13000);
  ASSERT_THAT(d.DeviceCount(), IsOk());
  EXPECT_EQ(d.DeviceCount().value(), 2);
  ASSERT_THAT(d.DeviceName(1), IsOk());
  EXPECT_EQ(d.DeviceName(1).value(), "Ferry Fake GPU 1");
  EXPECT_THAT(d.DeviceName(2),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("cuDeviceGet(2) failed"),
                             HasSubstr("CUDA_ERROR_INVALID_DEVICE (invalid device ordinal)"))));
  EXPECT_EQ(d.ResultText(100), "CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)");
  EXPECT_EQ(d.ResultText(999), "CUresult 999");
}

TEST(CudaDriver, FakeDriverTellsDeviceMemoryFromHostMemory) {
  FakeCuda fake;
  ASSERT_TRUE(fake.ok()) << ::dlerror();
  CudaDriver d(FERRY_FAKE_CUDA_PATH);
  ASSERT_TRUE(d.available()) << d.why_unavailable();
  std::vector<char> device(4096), host(64);
  fake.SetDeviceMemory(device.data(), device.size(), 1);
  auto of_host = d.DeviceOfPointer(host.data());
  ASSERT_THAT(of_host, IsOk());
  EXPECT_FALSE(of_host->has_value());
  for (const char* p : {device.data(), device.data() + 4095}) {
    auto of_device = d.DeviceOfPointer(p);
    ASSERT_THAT(of_device, IsOk());
    ASSERT_TRUE(of_device->has_value());
    EXPECT_EQ(**of_device, 1);
  }
  auto past = d.DeviceOfPointer(device.data() + 4096);
  ASSERT_THAT(past, IsOk());
  EXPECT_FALSE(past->has_value());
  // Any other answer is an error naming the call, not "host memory".
  fake.SetPointerResult(999);
  EXPECT_THAT(d.DeviceOfPointer(host.data()),
              StatusIs(StatusCode::kInternal,
                       AllOf(HasSubstr("cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE)"),
                             HasSubstr("CUresult 999"))));
}

TEST(CudaDriver, CuInitFailureIsUnavailableWithTheResult) {
  FakeCuda fake;
  ASSERT_TRUE(fake.ok()) << ::dlerror();
  fake.SetInitResult(100);
  CudaDriver d(FERRY_FAKE_CUDA_PATH);
  EXPECT_TRUE(d.loaded());
  EXPECT_FALSE(d.available());
  EXPECT_EQ(d.why_unavailable(),
            "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)");
  EXPECT_THAT(d.DriverVersion(), IsOk());  // needs only the library
  EXPECT_THAT(d.DeviceCount(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("CUDA_ERROR_NO_DEVICE")));
  int host = 0;
  EXPECT_THAT(d.DeviceOfPointer(&host), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_FALSE(d.data_path());
  EXPECT_THAT(d.CreateStream(),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cuStreamCreate"), HasSubstr("cuInit failed"))));
}

// ---- the data paths' calls, on the fake driver's CPU emulation ------------------

// The fake's device memory is not CPU-accessible: a device pointer handed to
// a system call as if it were host memory fails with EFAULT (and memcpy of it
// faults), as with a GPU.
bool CpuCanRead(const void* p, size_t n) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  const ssize_t w = ::write(fds[1], p, n);
  const int err = errno;
  ::close(fds[0]);
  ::close(fds[1]);
  if (w < 0 && err != EFAULT) ADD_FAILURE() << "write: " << std::strerror(err);
  return w == static_cast<ssize_t>(n);
}

std::vector<uint8_t> Pattern(size_t n, unsigned mul, unsigned add) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * mul + add);
  return v;
}

class CudaDriverDataPath : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok()) << ::dlerror();
    ASSERT_TRUE(d_.available()) << d_.why_unavailable();
    ASSERT_TRUE(d_.data_path()) << d_.why_no_data_path();
    fake_.ResetCopiedBytes();
    devices_ = fake_.LiveAllocations(FakeCuda::kDeviceAllocations);
  }
  void TearDown() override {
    // Every case frees what it allocated.
    EXPECT_EQ(fake_.LiveAllocations(FakeCuda::kDeviceAllocations), devices_);
  }

  FakeCuda fake_;
  CudaDriver d_{FERRY_FAKE_CUDA_PATH};
  int devices_ = 0;
};

TEST_F(CudaDriverDataPath, FakeDriverHasTheDataPath) {
  EXPECT_TRUE(d_.data_path());
  EXPECT_EQ(d_.why_no_data_path(), "");
}

TEST_F(CudaDriverDataPath, CallsNeedACurrentContext) {
  const auto no_context = [](const char* call) {
    return StatusIs(
        StatusCode::kInternal,
        AllOf(HasSubstr(call), HasSubstr("CUDA_ERROR_INVALID_CONTEXT (invalid device context)")));
  };
  EXPECT_THAT(d_.AllocateDevice(4096), no_context("cuMemAlloc(4096) failed"));
  EXPECT_THAT(d_.AllocateHost(4096), no_context("cuMemHostAlloc(4096) failed"));
  EXPECT_THAT(d_.CreateStream(), no_context("cuStreamCreate failed"));
  EXPECT_THAT(d_.CreateEvent(), no_context("cuEventCreate failed"));
  std::vector<uint8_t> a(16), b(16);
  EXPECT_THAT(d_.CopyAsync(a.data(), b.data(), a.size(), nullptr),
              no_context("cuMemcpyAsync failed"));
  CudaDriver::IpcHandle h{};
  EXPECT_THAT(d_.OpenIpcHandle(h), no_context("cuIpcOpenMemHandle failed"));
  // Pushed, the calls work; popped again, they do not.
  {
    CudaContextScope scope(d_, 0);
    ASSERT_THAT(scope.status(), IsOk());
    auto p = d_.AllocateDevice(4096);
    ASSERT_THAT(p, IsOk());
    EXPECT_THAT(d_.FreeDevice(*p), IsOk());
  }
  EXPECT_THAT(d_.AllocateDevice(4096), no_context("cuMemAlloc(4096) failed"));
  EXPECT_THAT(d_.PushContext(2),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("cuDeviceGet(2)"), HasSubstr("CUDA_ERROR_INVALID_DEVICE"))));
}

TEST_F(CudaDriverDataPath, DeviceMemoryIsOnTheCurrentContextsDeviceAndNotCpuAccessible) {
  for (int ordinal : {0, 1}) {
    CudaContextScope scope(d_, ordinal);
    ASSERT_THAT(scope.status(), IsOk());
    ASSERT_OK_AND_ASSIGN(void* p, d_.AllocateDevice(10000));
    for (const char* q : {static_cast<const char*>(p), static_cast<const char*>(p) + 9999}) {
      auto of = d_.DeviceOfPointer(q);
      ASSERT_THAT(of, IsOk());
      ASSERT_TRUE(of->has_value()) << "device memory reported as host memory";
      EXPECT_EQ(**of, ordinal);
    }
    EXPECT_FALSE(CpuCanRead(p, 64)) << "a device pointer read by the CPU";
    ASSERT_OK_AND_ASSIGN(void* host, d_.AllocateHost(10000));
    auto of_host = d_.DeviceOfPointer(host);
    ASSERT_THAT(of_host, IsOk());
    EXPECT_FALSE(of_host->has_value()) << "pinned host memory reported as device memory";
    EXPECT_TRUE(CpuCanRead(host, 64));
    EXPECT_EQ(fake_.LiveAllocations(FakeCuda::kHostAllocations), 1);
    EXPECT_THAT(d_.FreeHost(host), IsOk());
    EXPECT_THAT(d_.FreeHost(host),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("cuMemFreeHost failed")));
    EXPECT_THAT(
        d_.FreeDevice(static_cast<char*>(p) + 1),
        StatusIs(StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("cuMemFree failed"), HasSubstr("CUDA_ERROR_INVALID_VALUE"))));
    EXPECT_THAT(d_.FreeDevice(p), IsOk());
    EXPECT_THAT(d_.FreeDevice(p),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("cuMemFree failed")));
    auto freed = d_.DeviceOfPointer(p);
    ASSERT_THAT(freed, IsOk());
    EXPECT_FALSE(freed->has_value());
  }
}

TEST_F(CudaDriverDataPath, HostToDeviceToHostThroughAStreamAndEvents) {
  CudaContextScope scope(d_, 1);
  ASSERT_THAT(scope.status(), IsOk());
  constexpr size_t kSize = 64 * 1024 + 3;
  const std::vector<uint8_t> in = Pattern(kSize, 7, 3);
  std::vector<uint8_t> out(kSize, 0);
  ASSERT_OK_AND_ASSIGN(void* dev, d_.AllocateDevice(kSize));
  ASSERT_OK_AND_ASSIGN(CudaDriver::Stream s, d_.CreateStream());
  ASSERT_OK_AND_ASSIGN(CudaDriver::Event e, d_.CreateEvent());
  auto done = d_.EventDone(e);
  ASSERT_THAT(done, IsOk());
  EXPECT_TRUE(*done) << "an event never recorded is complete";

  fake_.HoldStreams(true);  // "not done yet" is certain until released
  ASSERT_THAT(d_.CopyAsync(dev, in.data(), kSize, s), IsOk());
  ASSERT_THAT(d_.RecordEvent(e, s), IsOk());
  done = d_.EventDone(e);
  ASSERT_THAT(done, IsOk());
  EXPECT_FALSE(*done) << "the copy completed while the stream was held";
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kHostToDevice), 0u);
  fake_.HoldStreams(false);
  ASSERT_THAT(d_.WaitEvent(e), IsOk());
  done = d_.EventDone(e);
  ASSERT_THAT(done, IsOk());
  EXPECT_TRUE(*done);
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kHostToDevice), kSize);

  fake_.HoldStreams(true);
  ASSERT_THAT(d_.CopyAsync(out.data(), dev, kSize, s), IsOk());
  ASSERT_THAT(d_.RecordEvent(e, s), IsOk());
  // (`out` is not read before the event: that would be the race the delay
  // and TSan are there to catch.)
  done = d_.EventDone(e);
  ASSERT_THAT(done, IsOk());
  EXPECT_FALSE(*done);
  fake_.HoldStreams(false);
  ASSERT_THAT(d_.WaitEvent(e), IsOk());
  EXPECT_EQ(out, in);
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kDeviceToHost), kSize);
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kDeviceToDevice), 0u);
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kHostToHost), 0u);

  d_.DestroyEvent(e);
  d_.DestroyStream(s);
  EXPECT_THAT(d_.FreeDevice(dev), IsOk());
}

TEST_F(CudaDriverDataPath, TheNullStreamAndPinnedHostMemory) {
  CudaContextScope scope(d_, 0);
  ASSERT_THAT(scope.status(), IsOk());
  constexpr size_t kSize = 5000;
  ASSERT_OK_AND_ASSIGN(void* dev, d_.AllocateDevice(kSize));
  ASSERT_OK_AND_ASSIGN(void* pinned, d_.AllocateHost(kSize));
  ASSERT_OK_AND_ASSIGN(CudaDriver::Event e, d_.CreateEvent());
  const std::vector<uint8_t> in = Pattern(kSize, 11, 1);
  std::memcpy(pinned, in.data(), kSize);
  // Held, the copy cannot run before the memset, however late this thread
  // gets there (a copy delay alone lost that race on a loaded machine, and
  // TSan reported it).
  fake_.HoldStreams(true);
  ASSERT_THAT(d_.CopyAsync(dev, pinned, kSize, nullptr), IsOk());
  std::memset(pinned, 0, kSize);
  fake_.HoldStreams(false);
  ASSERT_THAT(d_.WaitStream(nullptr), IsOk());
  // The copy read the source when it ran (after the memset): zeroes.
  ASSERT_THAT(d_.CopyAsync(pinned, dev, kSize, nullptr), IsOk());
  ASSERT_THAT(d_.RecordEvent(e, nullptr), IsOk());
  ASSERT_THAT(d_.WaitEvent(e), IsOk());
  EXPECT_EQ(
      std::vector<uint8_t>(static_cast<uint8_t*>(pinned), static_cast<uint8_t*>(pinned) + kSize),
      std::vector<uint8_t>(kSize, 0));
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kHostToDevice), kSize);
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kDeviceToHost), kSize);
  d_.DestroyEvent(e);
  EXPECT_THAT(d_.FreeHost(pinned), IsOk());
  EXPECT_THAT(d_.FreeDevice(dev), IsOk());
}

TEST_F(CudaDriverDataPath, FillAndDeviceToDevice) {
  CudaContextScope scope(d_, 0);
  ASSERT_THAT(scope.status(), IsOk());
  constexpr size_t kSize = 3 * 4096;
  ASSERT_OK_AND_ASSIGN(void* a, d_.AllocateDevice(kSize));
  ASSERT_OK_AND_ASSIGN(void* b, d_.AllocateDevice(kSize));
  ASSERT_OK_AND_ASSIGN(CudaDriver::Stream s, d_.CreateStream());
  ASSERT_THAT(d_.Fill(a, 0xab, kSize), IsOk());
  ASSERT_THAT(d_.Fill(b, 0x00, kSize), IsOk());
  ASSERT_THAT(d_.Fill(static_cast<char*>(a) + 100, 0xcd, 10), IsOk());
  ASSERT_THAT(d_.CopyAsync(b, a, kSize, s), IsOk());
  std::vector<uint8_t> out(kSize);
  ASSERT_THAT(d_.CopyAsync(out.data(), b, kSize, s), IsOk());
  ASSERT_THAT(d_.WaitStream(s), IsOk());
  std::vector<uint8_t> want(kSize, 0xab);
  std::memset(want.data() + 100, 0xcd, 10);
  EXPECT_EQ(out, want);
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kDeviceToDevice), kSize);
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kDeviceToHost), kSize);
  // Fill is of device memory, within one allocation.
  EXPECT_THAT(d_.Fill(static_cast<char*>(a) + kSize - 10, 0, 11),
              StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("cuMemsetD8 failed"),
                                                           HasSubstr("CUDA_ERROR_INVALID_VALUE"))));
  EXPECT_THAT(d_.Fill(out.data(), 0, 16),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cuMemsetD8")));
  d_.DestroyStream(s);
  EXPECT_THAT(d_.FreeDevice(a), IsOk());
  EXPECT_THAT(d_.FreeDevice(b), IsOk());
}

TEST_F(CudaDriverDataPath, CopiesMustLieInOneAllocation) {
  CudaContextScope scope(d_, 0);
  ASSERT_THAT(scope.status(), IsOk());
  constexpr size_t kSize = 4096;
  ASSERT_OK_AND_ASSIGN(void* dev, d_.AllocateDevice(kSize));
  ASSERT_OK_AND_ASSIGN(CudaDriver::Stream s, d_.CreateStream());
  std::vector<uint8_t> host(2 * kSize);
  char* end = static_cast<char*>(dev) + kSize;
  EXPECT_THAT(d_.CopyAsync(end - 10, host.data(), 20, s),
              StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("cuMemcpyAsync failed"),
                                                           HasSubstr("CUDA_ERROR_INVALID_VALUE"))));
  EXPECT_THAT(d_.CopyAsync(host.data(), end - 10, 11, s), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(d_.CopyAsync(host.data(), dev, kSize + 1, s), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(d_.CopyAsync(host.data(), end - 10, 10, s), IsOk());  // exactly to the end
  // A stream the driver does not know.
  int not_a_stream = 0;
  EXPECT_THAT(d_.CopyAsync(host.data(), dev, 16, &not_a_stream),
              StatusIs(StatusCode::kInternal,
                       HasSubstr("CUDA_ERROR_INVALID_HANDLE (invalid resource handle)")));
  ASSERT_THAT(d_.WaitStream(s), IsOk());
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kDeviceToHost), 10u);
  d_.DestroyStream(s);
  EXPECT_THAT(d_.FreeDevice(dev), IsOk());
}

TEST_F(CudaDriverDataPath, AllocationOfAnInteriorPointer) {
  CudaContextScope scope(d_, 1);
  ASSERT_THAT(scope.status(), IsOk());
  ASSERT_OK_AND_ASSIGN(void* dev, d_.AllocateDevice(12345));
  auto a = d_.AllocationOf(static_cast<char*>(dev) + 12000);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->base, reinterpret_cast<uintptr_t>(dev));
  EXPECT_EQ(a->size, 12345u);
  int host = 0;
  EXPECT_THAT(d_.AllocationOf(&host),
              StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("cuMemGetAddressRange failed"),
                                                           HasSubstr("CUDA_ERROR_INVALID_VALUE"))));
  EXPECT_THAT(d_.AllocationOf(static_cast<char*>(dev) + 12345),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(d_.FreeDevice(dev), IsOk());
  EXPECT_THAT(d_.AllocationOf(dev), StatusIs(StatusCode::kInvalidArgument));
}

std::string Hex(const CudaDriver::IpcHandle& h) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : h) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

bool FromHex(const char* s, CudaDriver::IpcHandle* h) {
  if (s == nullptr || std::strlen(s) != 2 * h->size()) return false;
  for (size_t i = 0; i < h->size(); ++i) {
    unsigned v = 0;
    if (std::sscanf(s + 2 * i, "%2x", &v) != 1) return false;
    (*h)[i] = static_cast<uint8_t>(v);
  }
  return true;
}

constexpr size_t kIpcSize = 1024 * 1024 + 5;
constexpr const char* kIpcHandleVar = "FERRY_FAKE_CUDA_IPC_HANDLE";
constexpr const char* kIpcStaleHandleVar = "FERRY_FAKE_CUDA_IPC_STALE_HANDLE";

// The other process of IpcBetweenProcesses (this binary, run again with only
// this case): opens the parent's handle, checks the parent's pattern, writes
// its own. Disabled: it runs only when that case starts it.
TEST(CudaDriverIpcChild, DISABLED_OpensTheParentsHandle) {
  CudaDriver::IpcHandle handle{}, stale{};
  ASSERT_TRUE(FromHex(std::getenv(kIpcHandleVar), &handle)) << "run by IpcBetweenProcesses only";
  ASSERT_TRUE(FromHex(std::getenv(kIpcStaleHandleVar), &stale));
  CudaDriver d(FERRY_FAKE_CUDA_PATH);
  ASSERT_TRUE(d.data_path()) << d.why_no_data_path();
  CudaContextScope scope(d, 0);
  ASSERT_THAT(scope.status(), IsOk());
  // A handle of memory the parent freed opens nothing.
  EXPECT_THAT(d.OpenIpcHandle(stale),
              StatusIs(StatusCode::kInternal, HasSubstr("CUDA_ERROR_INVALID_HANDLE")));
  ASSERT_OK_AND_ASSIGN(void* mapped, d.OpenIpcHandle(handle));
  auto of = d.DeviceOfPointer(mapped);
  ASSERT_THAT(of, IsOk());
  ASSERT_TRUE(of->has_value());
  EXPECT_EQ(**of, 1);  // the exporter's device
  auto a = d.AllocationOf(static_cast<char*>(mapped) + 10);
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->base, reinterpret_cast<uintptr_t>(mapped));
  EXPECT_EQ(a->size, kIpcSize);
  EXPECT_FALSE(CpuCanRead(mapped, 64)) << "an imported device pointer read by the CPU";
  EXPECT_THAT(d.FreeDevice(mapped), StatusIs(StatusCode::kInvalidArgument));  // closed, not freed
  ASSERT_OK_AND_ASSIGN(CudaDriver::Stream s, d.CreateStream());
  std::vector<uint8_t> got(kIpcSize);
  ASSERT_THAT(d.CopyAsync(got.data(), mapped, kIpcSize, s), IsOk());
  ASSERT_THAT(d.WaitStream(s), IsOk());
  EXPECT_TRUE(got == Pattern(kIpcSize, 7, 3)) << "the child does not see the parent's bytes";
  const std::vector<uint8_t> put = Pattern(kIpcSize, 13, 5);
  ASSERT_THAT(d.CopyAsync(mapped, put.data(), kIpcSize, s), IsOk());
  ASSERT_THAT(d.WaitStream(s), IsOk());
  d.DestroyStream(s);
  EXPECT_THAT(d.CloseIpcHandle(mapped), IsOk());
  EXPECT_THAT(d.CloseIpcHandle(mapped),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cuIpcCloseMemHandle")));
}

TEST_F(CudaDriverDataPath, IpcBetweenProcesses) {
  CudaContextScope scope(d_, 1);
  ASSERT_THAT(scope.status(), IsOk());
  ASSERT_OK_AND_ASSIGN(void* dev, d_.AllocateDevice(kIpcSize));
  ASSERT_OK_AND_ASSIGN(CudaDriver::Stream s, d_.CreateStream());
  const std::vector<uint8_t> mine = Pattern(kIpcSize, 7, 3);
  ASSERT_THAT(d_.CopyAsync(dev, mine.data(), kIpcSize, s), IsOk());
  ASSERT_THAT(d_.WaitStream(s), IsOk());
  ASSERT_OK_AND_ASSIGN(CudaDriver::IpcHandle handle, d_.GetIpcHandle(dev));
  EXPECT_THAT(d_.GetIpcHandle(static_cast<char*>(dev) + 4096),
              StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("cuIpcGetMemHandle failed"),
                                                           HasSubstr("CUDA_ERROR_INVALID_VALUE"))));
  // The exporting process cannot open its own handle (CUDA refuses it too).
  EXPECT_THAT(d_.OpenIpcHandle(handle),
              StatusIs(StatusCode::kInternal, AllOf(HasSubstr("cuIpcOpenMemHandle failed"),
                                                    HasSubstr("CUDA_ERROR_INVALID_CONTEXT"))));
  CudaDriver::IpcHandle corrupt = handle;
  corrupt[0] ^= 0xff;
  EXPECT_THAT(d_.OpenIpcHandle(corrupt),
              StatusIs(StatusCode::kInternal,
                       AllOf(HasSubstr("cuIpcOpenMemHandle failed"),
                             HasSubstr("CUDA_ERROR_INVALID_HANDLE (invalid resource handle)"))));
  fake_.SetIpcOpenResult(205);  // CUDA_ERROR_MAP_FAILED: what a fallback must survive
  EXPECT_THAT(d_.OpenIpcHandle(handle),
              StatusIs(StatusCode::kInternal, HasSubstr("CUDA_ERROR_MAP_FAILED")));
  fake_.SetIpcOpenResult(0);
  // A handle of an allocation freed before the other process opens it.
  ASSERT_OK_AND_ASSIGN(void* gone, d_.AllocateDevice(4096));
  ASSERT_OK_AND_ASSIGN(CudaDriver::IpcHandle stale, d_.GetIpcHandle(gone));
  ASSERT_THAT(d_.FreeDevice(gone), IsOk());

  // The other process: this binary, running only DISABLED_OpensTheParentsHandle,
  // with no sharding or output settings of this run's.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "GTEST_", 6) != 0) env.emplace_back(*e);
  }
  env.push_back(std::string(kIpcHandleVar) + "=" + Hex(handle));
  env.push_back(std::string(kIpcStaleHandleVar) + "=" + Hex(stale));
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  std::string filter = "--gtest_filter=CudaDriverIpcChild.DISABLED_OpensTheParentsHandle";
  std::string disabled = "--gtest_also_run_disabled_tests";
  char* argv[] = {exe.data(), filter.data(), disabled.data(), nullptr};
  pid_t child = 0;
  ASSERT_EQ(::posix_spawn(&child, exe.c_str(), nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's checks failed (its output is above)";

  // What the child wrote is in this process's allocation.
  std::vector<uint8_t> got(kIpcSize);
  ASSERT_THAT(d_.CopyAsync(got.data(), dev, kIpcSize, s), IsOk());
  ASSERT_THAT(d_.WaitStream(s), IsOk());
  EXPECT_TRUE(got == Pattern(kIpcSize, 13, 5))
      << "the child's bytes did not reach the parent's allocation";
  d_.DestroyStream(s);
  EXPECT_THAT(d_.FreeDevice(dev), IsOk());
}

// Several threads, each with its own context, streams, events and memory.
TEST_F(CudaDriverDataPath, ConcurrentUse) {
  fake_.SetCopyDelayUs(10);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      CudaContextScope scope(d_, t % 2);
      if (!scope.status().ok()) return;
      auto dev = d_.AllocateDevice(8192);
      auto s = d_.CreateStream();
      auto e = d_.CreateEvent();
      if (!dev.ok() || !s.ok() || !e.ok()) return;
      const std::vector<uint8_t> in = Pattern(8192, 3 + t, t);
      std::vector<uint8_t> out(8192);
      bool good = true;
      for (int i = 0; i < 20 && good; ++i) {
        good = d_.CopyAsync(*dev, in.data(), in.size(), *s).ok() &&
               d_.CopyAsync(out.data(), *dev, out.size(), *s).ok() && d_.RecordEvent(*e, *s).ok() &&
               d_.WaitEvent(*e).ok() && out == in;
        std::fill(out.begin(), out.end(), 0);
      }
      d_.DestroyEvent(*e);
      d_.DestroyStream(*s);
      ok[t] = good && d_.FreeDevice(*dev).ok();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

// The process's driver: on a machine without one, every query says why; on
// a GPU machine, host memory is not device memory.
TEST(CudaDriver, ProcessDriverOnHostMemory) {
  const CudaDriver& d = CudaDriver::Get();
  EXPECT_EQ(&d, &CudaDriver::Get());  // loaded once
  EXPECT_EQ(d.library(), "libcuda.so.1");
  int host = 0;
  auto of_host = d.DeviceOfPointer(&host);
  if (d.available()) {
    ASSERT_THAT(of_host, IsOk());
    EXPECT_FALSE(of_host->has_value())
        << "a stack address reported as device memory of cuda:" << **of_host;
    EXPECT_THAT(d.DeviceCount(), IsOk());
    EXPECT_TRUE(CudaDriver::LoadedInProcess());
    return;
  }
  EXPECT_NE(d.why_unavailable(), "");
  EXPECT_THAT(d.why_unavailable(),
              HasSubstr(d.loaded() ? "cuInit failed" : "libcuda.so.1 not found"));
  EXPECT_THAT(of_host,
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("no CUDA driver"), HasSubstr(d.why_unavailable()))));
  if (!d.loaded()) {
    EXPECT_FALSE(CudaDriver::LoadedInProcess());
  }
}

TEST(CudaDriver, DescribeCudaMatchesTheProcessDriver) {
  const CudaDriver& d = CudaDriver::Get();
  const CudaInfo info = DescribeCuda();
  EXPECT_EQ(info.library, "libcuda.so.1");
  EXPECT_EQ(info.loaded, d.loaded());
  EXPECT_EQ(info.available, d.available());
  EXPECT_EQ(info.why_unavailable, d.why_unavailable());
  if (!d.loaded()) {
    EXPECT_EQ(info.driver_version, 0);
    EXPECT_TRUE(info.devices.empty());
  }
  if (d.available()) {
    auto n = d.DeviceCount();
    ASSERT_THAT(n, IsOk());
    EXPECT_EQ(info.devices.size(), static_cast<size_t>(*n));
    EXPECT_GT(info.driver_version, 0);
  }
}

}  // namespace
}  // namespace ferry::internal
