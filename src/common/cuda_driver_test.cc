// The CUDA driver loaded at run time: a library that is not there, one
// without the entry points, the fake driver (tests/testing/fake_cuda_driver.cc)
// answering like libcuda.so.1, and the process's own driver (none on a
// machine without a GPU; the cases that need one or its absence say so).
#include "common/cuda_driver.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
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

TEST(CudaDriver, ALibraryThatIsNotThereIsUnavailableNamingIt) {
  CudaDriver d("libferry-no-such-cuda-driver.so.1");
  EXPECT_FALSE(d.loaded());
  EXPECT_FALSE(d.available());
  EXPECT_THAT(d.why_unavailable(), AllOf(HasSubstr("libferry-no-such-cuda-driver.so.1 not found ("),
                                         HasSubstr("cannot open shared object file")));
  EXPECT_THAT(d.DeviceCount(), StatusIs(StatusCode::kFailedPrecondition,
                                        AllOf(HasSubstr("cuDeviceGetCount"), HasSubstr("no CUDA driver"),
                                              HasSubstr("libferry-no-such-cuda-driver.so.1 not found"))));
  EXPECT_THAT(d.DeviceName(0), StatusIs(StatusCode::kFailedPrecondition, HasSubstr("cuDeviceGetName")));
  EXPECT_THAT(d.DriverVersion(), StatusIs(StatusCode::kFailedPrecondition, HasSubstr("cuDriverGetVersion")));
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
  EXPECT_EQ(d.why_unavailable(), "cuInit failed: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)");
  EXPECT_THAT(d.DriverVersion(), IsOk());  // needs only the library
  EXPECT_THAT(d.DeviceCount(), StatusIs(StatusCode::kFailedPrecondition, HasSubstr("CUDA_ERROR_NO_DEVICE")));
  int host = 0;
  EXPECT_THAT(d.DeviceOfPointer(&host), StatusIs(StatusCode::kFailedPrecondition));
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
    EXPECT_FALSE(of_host->has_value()) << "a stack address reported as device memory of cuda:" << **of_host;
    EXPECT_THAT(d.DeviceCount(), IsOk());
    EXPECT_TRUE(CudaDriver::LoadedInProcess());
    return;
  }
  EXPECT_NE(d.why_unavailable(), "");
  EXPECT_THAT(d.why_unavailable(), HasSubstr(d.loaded() ? "cuInit failed" : "libcuda.so.1 not found"));
  EXPECT_THAT(of_host, StatusIs(StatusCode::kFailedPrecondition,
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
