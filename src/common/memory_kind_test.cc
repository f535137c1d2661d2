// Memory kinds: what a registration's location names, how a peer's kind name
// reads back, and CopyMemory between cpu and test-opaque (PROT_NONE) memory.
#include "common/memory_kind.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "tests/testing/fake_cuda.h"
#include "tests/testing/status_matchers.h"

namespace ferry::internal {
namespace {

using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(MemoryKind, CpuLocationsAreCpu) {
  for (const char* loc : {"cpu", "cpu:0", "cpu:3", "*", ""}) {
    for (bool allow_test : {false, true}) {
      auto k = MemoryKind::FromLocation(loc, allow_test);
      ASSERT_THAT(k, IsOk()) << "'" << loc << "'";
      EXPECT_EQ(*k, MemoryKind::Cpu()) << "'" << loc << "'";
      EXPECT_TRUE(k->cpu_accessible()) << "'" << loc << "'";
      EXPECT_EQ(k->Name(), "cpu") << "'" << loc << "'";
    }
  }
}

// This process's driver: none on a machine without a GPU.
TEST(MemoryKind, CudaLocationsWithoutADriverAreFailedPreconditionNamingLibcuda) {
  const CudaDriver& driver = CudaDriver::Get();
  if (driver.available()) {
    GTEST_SKIP() << "this machine has a usable CUDA driver (" << driver.library()
                 << "); the refusal without one is checked with a missing library below";
  }
  for (const char* loc : {"cuda:0", "cuda:7", "cuda"}) {
    for (bool allow_test : {false, true}) {
      EXPECT_THAT(MemoryKind::FromLocation(loc, allow_test),
                  StatusIs(StatusCode::kFailedPrecondition,
                           AllOf(HasSubstr("GPU"), HasSubstr(std::string("'") + loc + "'"),
                                 HasSubstr("libcuda.so.1"), HasSubstr(driver.why_unavailable()))))
          << loc;
    }
  }
}

TEST(MemoryKind, CudaLocationsWithAMissingDriverLibraryNameIt) {
  CudaDriver missing("libferry-no-such-cuda-driver.so.1");
  EXPECT_THAT(MemoryKind::FromLocation("cuda:0", false, missing),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'cuda:0' is GPU memory"), HasSubstr("no CUDA driver"),
                             HasSubstr("libferry-no-such-cuda-driver.so.1 not found"))));
}

using ::ferry::test::FakeCuda;

TEST(MemoryKind, CudaLocationsWithADriverCheckTheDevice) {
  FakeCuda fake;
  ASSERT_TRUE(fake.ok()) << ::dlerror();
  CudaDriver driver(FERRY_FAKE_CUDA_PATH);
  ASSERT_TRUE(driver.available()) << driver.why_unavailable();
  ASSERT_TRUE(driver.data_path()) << driver.why_no_data_path();
  for (auto [loc, device] : {std::pair{"cuda:0", 0}, {"cuda:1", 1}, {"cuda", 0}}) {
    auto kind = MemoryKind::FromLocation(loc, false, driver);
    ASSERT_THAT(kind, IsOk()) << loc;
    EXPECT_EQ(*kind, MemoryKind::Cuda(device)) << loc;
    EXPECT_EQ(kind->Name(), "cuda:" + std::to_string(device));
    EXPECT_FALSE(kind->cpu_accessible());
  }
  for (const char* loc : {"cuda:2", "cuda:7"}) {
    EXPECT_THAT(
        MemoryKind::FromLocation(loc, true, driver),
        StatusIs(StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(std::string("'") + loc + "'"),
                       HasSubstr("CUDA device " + std::string(loc + 5) + ", which does not exist"),
                       HasSubstr("has 2 CUDA devices (cuda:0..cuda:1)"))))
        << loc;
  }
  // A driver whose cuInit failed.
  fake.SetInitResult(100);
  CudaDriver no_device(FERRY_FAKE_CUDA_PATH);
  EXPECT_THAT(MemoryKind::FromLocation("cuda:0", false, no_device),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("is not usable"),
                             HasSubstr("cuInit failed: CUDA_ERROR_NO_DEVICE"))));
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%#llx",
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

TEST(KindOfRegistration, DeviceMemoryRegisteredAsCpuIsRefusedNamingAddressAndLocation) {
  FakeCuda fake;
  ASSERT_TRUE(fake.ok()) << ::dlerror();
  CudaDriver driver(FERRY_FAKE_CUDA_PATH);
  ASSERT_TRUE(driver.available()) << driver.why_unavailable();
  // One buffer: its second half is "device memory" to the fake driver.
  std::vector<char> buffer(3 * 4096);
  char* const host = buffer.data();
  char* const device = buffer.data() + 4096;
  fake.SetDeviceMemory(device, 2 * 4096, 1);
  for (const char* loc : {"cpu", "cpu:0"}) {
    EXPECT_THAT(
        KindOfRegistration(loc, device, 4096, false, &driver),
        StatusIs(StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(Hex(device)), HasSubstr(std::string("location '") + loc + "'"),
                       HasSubstr("GPU memory of cuda:1"), HasSubstr("not host memory"),
                       HasSubstr("register it as cuda:1"))))
        << "'" << loc << "'";
  }
  // An automatic location takes the device's kind from the pointer.
  for (const char* loc : {"*", ""}) {
    auto k = KindOfRegistration(loc, device, 4096, false, &driver);
    ASSERT_THAT(k, IsOk()) << "'" << loc << "'";
    EXPECT_EQ(*k, MemoryKind::Cuda(1));
  }
  // Only the last byte in device memory: refused too, automatic or not.
  EXPECT_THAT(KindOfRegistration("cpu", device - 16, 32, false, &driver),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(Hex(device - 16)), HasSubstr(Hex(device + 15)))));
  EXPECT_THAT(KindOfRegistration("*", device - 16, 32, false, &driver),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("not all of it on one device")));
  // cuda:N must be memory of device N at both ends.
  auto on_1 = KindOfRegistration("cuda:1", device, 4096, false, &driver);
  ASSERT_THAT(on_1, IsOk());
  EXPECT_EQ(*on_1, MemoryKind::Cuda(1));
  EXPECT_THAT(
      KindOfRegistration("cuda:0", device, 4096, false, &driver),
      StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("starts in GPU memory of cuda:1"),
                                                   HasSubstr("not in GPU memory of cuda:0"))));
  EXPECT_THAT(KindOfRegistration("cuda:1", host, 4096, false, &driver),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(Hex(host)), HasSubstr("starts in host memory"))));
  EXPECT_THAT(KindOfRegistration("cuda:1", device + 4096, 8192, false, &driver),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("ends in host memory")));
  // Host memory next to it is host memory.
  auto k = KindOfRegistration("cpu", host, 4096, false, &driver);
  ASSERT_THAT(k, IsOk());
  EXPECT_EQ(*k, MemoryKind::Cpu());
  // The test kind is not asked about.
  EXPECT_THAT(KindOfRegistration("test-opaque", device, 4096, true, &driver), IsOk());
  EXPECT_THAT(KindOfRegistration("bogus", host, 64, false, &driver),
              StatusIs(StatusCode::kInvalidArgument));
  // A driver that cannot tell: refused with its error, naming the address.
  fake.SetPointerResult(999);
  EXPECT_THAT(KindOfRegistration("cpu", host, 4096, false, &driver),
              StatusIs(StatusCode::kInternal,
                       AllOf(HasSubstr("cannot tell whether"), HasSubstr(Hex(host)),
                             HasSubstr("location 'cpu'"), HasSubstr("CUresult 999"))));
}

TEST(KindOfRegistration, WithoutAUsableDriverCpuIsHostMemory) {
  FakeCuda fake;
  ASSERT_TRUE(fake.ok()) << ::dlerror();
  std::vector<char> buf(4096);
  auto k = KindOfRegistration("cpu", buf.data(), buf.size(), false, nullptr);
  ASSERT_THAT(k, IsOk());
  EXPECT_EQ(*k, MemoryKind::Cpu());
  fake.SetInitResult(100);
  fake.SetDeviceMemory(buf.data(), buf.size(), 0);
  CudaDriver no_device(FERRY_FAKE_CUDA_PATH);
  ASSERT_FALSE(no_device.available());
  EXPECT_THAT(KindOfRegistration("*", buf.data(), buf.size(), false, &no_device), IsOk());
}

TEST(KindOfRegistration, TheProcessDriverIsAskedOnlyIfTheProcessLoadedIt) {
  EXPECT_EQ(CudaDriverForRegistrations() != nullptr, CudaDriver::LoadedInProcess());
  if (CudaDriverForRegistrations() != nullptr) {
    EXPECT_EQ(CudaDriverForRegistrations(), &CudaDriver::Get());
  }
}

TEST(MemoryKind, TestOpaqueOnlyWhenAllowed) {
  auto k = MemoryKind::FromLocation("test-opaque", /*allow_test=*/true);
  ASSERT_THAT(k, IsOk());
  EXPECT_EQ(*k, MemoryKind::TestOpaque());
  EXPECT_EQ(k->type(), MemoryKind::Type::kTestOpaque);
  EXPECT_FALSE(k->cpu_accessible());
  EXPECT_THAT(MemoryKind::FromLocation("test-opaque", /*allow_test=*/false),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("test-opaque")));
}

TEST(MemoryKind, UnknownLocationsAreInvalidArgumentNamingThem) {
  EXPECT_THAT(MemoryKind::FromLocation("bogus", false),
              StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr("bogus"), HasSubstr("cpu"))));
  EXPECT_THAT(MemoryKind::FromLocation("bogus", true),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("bogus")));
  for (const char* loc : {"cpu:", "cpu:x", "cpu:-1", "cpu:1x", "CPU", "cuda:x", "gpu:0", "**"}) {
    EXPECT_THAT(MemoryKind::FromLocation(loc, true),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(loc)))
        << loc;
  }
}

TEST(MemoryKind, NameAndFromNameRoundTrip) {
  const MemoryKind kinds[] = {MemoryKind::Cpu(), MemoryKind::TestOpaque(),
                              MemoryKind::FromName("cuda:0"), MemoryKind::FromName("cuda:7")};
  for (const MemoryKind& k : kinds) {
    EXPECT_EQ(MemoryKind::FromName(k.Name()), k) << k.Name();
  }
  EXPECT_EQ(MemoryKind::Cpu().Name(), "cpu");
  EXPECT_EQ(MemoryKind::TestOpaque().Name(), "test-opaque");
  const MemoryKind cuda = MemoryKind::FromName("cuda:7");
  EXPECT_EQ(cuda.type(), MemoryKind::Type::kCuda);
  EXPECT_EQ(cuda.device(), 7);
  EXPECT_EQ(cuda.Name(), "cuda:7");
  EXPECT_FALSE(cuda.cpu_accessible());
  EXPECT_NE(MemoryKind::FromName("cuda:0"), MemoryKind::FromName("cuda:1"));
  // A format-1 descriptor carries no kind: cpu.
  EXPECT_EQ(MemoryKind::FromName(""), MemoryKind::Cpu());
  // File regions (Engine::RegisterFile): a kind of its own, never host memory.
  EXPECT_EQ(MemoryKind::FromName("file"), MemoryKind::File());
  EXPECT_EQ(MemoryKind::File().Name(), "file");
  EXPECT_FALSE(MemoryKind::File().cpu_accessible());
  EXPECT_FALSE(MemoryKind::FromLocation("file", /*allow_test=*/true).ok())
      << "only RegisterFile makes file regions";
  // Names this build does not know.
  for (const char* name : {"martian", "cuda:", "cuda:x", "unknown"}) {
    const MemoryKind k = MemoryKind::FromName(name);
    EXPECT_EQ(k.type(), MemoryKind::Type::kUnknown) << name;
    EXPECT_EQ(k.Name(), "unknown") << name;
    EXPECT_FALSE(k.cpu_accessible()) << name;
  }
}

// Pages the CPU must not touch: mapped PROT_NONE.
class OpaquePages {
 public:
  explicit OpaquePages(size_t pages) : size_(pages * static_cast<size_t>(::sysconf(_SC_PAGESIZE))) {
    void* p = ::mmap(nullptr, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    base_ = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~OpaquePages() {
    if (base_ != nullptr) ::munmap(base_, size_);
  }
  char* base() const { return base_; }
  size_t size() const { return size_; }
  // The protection /proc/self/maps shows for the mapping ("---p" for PROT_NONE).
  std::string Perms() const {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    const uintptr_t a = reinterpret_cast<uintptr_t>(base_);
    while (std::getline(maps, line)) {
      unsigned long lo = 0, hi = 0;
      char perms[5] = {};
      if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) == 3 && a >= lo && a < hi)
        return perms;
    }
    return "?";
  }
  bool Protect(int prot) { return ::mprotect(base_, size_, prot) == 0; }

 private:
  size_t size_;
  char* base_ = nullptr;
};

std::vector<char> Pattern(size_t n, unsigned seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
  return v;
}

TEST(CopyMemory, CpuToOpaqueToCpuAndTheBytesAreInTheProtNonePages) {
  OpaquePages pages(3);
  ASSERT_NE(pages.base(), nullptr);
  ASSERT_EQ(pages.Perms(), "---p");
  const size_t page = pages.size() / 3;
  // Crosses a page boundary, starts unaligned.
  const size_t offset = page - 100;
  const size_t n = page + 300;
  const std::vector<char> src = Pattern(n, 1);
  const MemoryKind cpu = MemoryKind::Cpu(), opaque = MemoryKind::TestOpaque();

  ASSERT_THAT(CopyMemory(opaque, pages.base() + offset, cpu, src.data(), n), IsOk());
  std::vector<char> back(n, 0);
  ASSERT_THAT(CopyMemory(cpu, back.data(), opaque, pages.base() + offset, n), IsOk());
  EXPECT_EQ(back, src);

  // Opaque to opaque (another place in the same pages).
  const size_t offset2 = offset + n + 300;  // after the first copy
  const size_t n2 = 512;
  ASSERT_LE(offset2 + n2, pages.size());
  ASSERT_THAT(CopyMemory(opaque, pages.base() + offset2, opaque, pages.base() + offset, n2),
              IsOk());

  // The copies left the pages PROT_NONE, and the bytes are really in them.
  EXPECT_EQ(pages.Perms(), "---p");
  ASSERT_TRUE(pages.Protect(PROT_READ));
  EXPECT_EQ(std::memcmp(pages.base() + offset, src.data(), n), 0);
  EXPECT_EQ(std::memcmp(pages.base() + offset2, src.data(), n2), 0);
  // Around the copies: untouched zero pages.
  EXPECT_EQ(std::vector<char>(pages.base(), pages.base() + offset), std::vector<char>(offset, 0));
  EXPECT_EQ(std::vector<char>(pages.base() + offset + n, pages.base() + offset2),
            std::vector<char>(offset2 - offset - n, 0));
  EXPECT_EQ(std::vector<char>(pages.base() + offset2 + n2, pages.base() + pages.size()),
            std::vector<char>(pages.size() - offset2 - n2, 0));
}

TEST(CopyMemory, OpaqueToCpuReadsWhatWasPutThereDirectly) {
  OpaquePages pages(1);
  ASSERT_NE(pages.base(), nullptr);
  const std::vector<char> want = Pattern(pages.size(), 2);
  // Fill the page with plain stores, then take it away from the CPU.
  ASSERT_TRUE(pages.Protect(PROT_READ | PROT_WRITE));
  std::memcpy(pages.base(), want.data(), want.size());
  ASSERT_TRUE(pages.Protect(PROT_NONE));
  std::vector<char> got(want.size(), 0);
  ASSERT_THAT(
      CopyMemory(MemoryKind::Cpu(), got.data(), MemoryKind::TestOpaque(), pages.base(), got.size()),
      IsOk());
  EXPECT_EQ(got, want);
}

TEST(CopyMemory, CpuToCpuIsAMemmove) {
  std::vector<char> v = Pattern(64, 3);
  const std::vector<char> orig = v;
  ASSERT_THAT(CopyMemory(MemoryKind::Cpu(), v.data() + 8, MemoryKind::Cpu(), v.data(), 32), IsOk());
  EXPECT_TRUE(std::equal(orig.begin(), orig.begin() + 32, v.begin() + 8));  // overlapping copy
  EXPECT_TRUE(std::equal(orig.begin(), orig.begin() + 8, v.begin()));
}

TEST(CopyMemory, KindsThisBuildCannotCopyAreUnimplemented) {
  char a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {};
  const MemoryKind cuda = MemoryKind::FromName("cuda:0"), unknown = MemoryKind::FromName("martian");
  EXPECT_THAT(CopyMemory(cuda, b, MemoryKind::Cpu(), a, 8),
              StatusIs(StatusCode::kUnimplemented, HasSubstr("cuda:0")));
  EXPECT_THAT(CopyMemory(MemoryKind::Cpu(), b, unknown, a, 8),
              StatusIs(StatusCode::kUnimplemented));
  EXPECT_THAT(CopyMemory(MemoryKind::TestOpaque(), b, cuda, a, 8),
              StatusIs(StatusCode::kUnimplemented));
  EXPECT_EQ(std::vector<char>(b, b + 8), std::vector<char>(8, 0));  // nothing copied
}

}  // namespace
}  // namespace ferry::internal
