// StagingPool: the target's host buffers for staged entries — carved from
// 2 MiB slabs advised for huge pages, reused, counted by the gauge.
#include "base/staging_pool.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/target.h"
#include "common/cuda_driver.h"
#include "tests/testing/fake_cuda.h"

namespace ferry::internal {
namespace {

constexpr uintptr_t kSlab = uintptr_t{2} << 20;

uintptr_t Addr(const std::shared_ptr<char>& p) { return reinterpret_cast<uintptr_t>(p.get()); }

// Whether the kernel gives transparent huge pages at all (enabled is not
// [never]).
bool HugePagesOffered() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return !s.empty() && s.find("[never]") == std::string::npos;
}

// The THPeligible value of /proc/self/smaps for the mapping holding `addr`
// (-1: not found).
int ThpEligible(uintptr_t addr) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo, hi;
    char dash;
    std::istringstream head(line);
    if (line.find(':') > line.find(' ') && (head >> std::hex >> lo >> dash >> hi) && dash == '-') {
      inside = addr >= lo && addr < hi;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) return std::stoi(line.substr(12));
  }
  return -1;
}

TEST(StagingPoolTest, SmallBuffersAreCarvedFromOneHugePageAlignedSlabWithoutOverlap) {
  auto gauge = std::make_shared<StagingGauge>();
  auto pool = std::make_shared<StagingPool>(gauge);
  const std::vector<size_t> sizes = {1, 4096, 5000, 64 << 10, 1 << 20};
  std::vector<std::shared_ptr<char>> held;
  uint64_t counted = 0;
  for (size_t n : sizes) {
    held.push_back(pool->Get(n));
    counted += (n + 4095) / 4096 * 4096;
  }
  const uintptr_t slab = Addr(held[0]) / kSlab * kSlab;
  EXPECT_EQ(Addr(held[0]), slab) << "the first buffer starts the slab";
  for (size_t k = 0; k < held.size(); ++k) {
    EXPECT_EQ(Addr(held[k]) % 4096, 0u) << "buffer " << k << " is page-aligned (O_DIRECT)";
    EXPECT_EQ(Addr(held[k]) / kSlab * kSlab, slab) << "buffer " << k << " is in the same slab";
    std::memset(held[k].get(), static_cast<int>(k + 1), sizes[k]);
  }
  for (size_t k = 0; k < held.size(); ++k) {
    for (size_t i = 0; i < sizes[k]; ++i) {
      ASSERT_EQ(held[k].get()[i], static_cast<char>(k + 1)) << "buffer " << k << " byte " << i;
    }
  }
  EXPECT_EQ(gauge->in_use(), counted);
  if (HugePagesOffered()) {
    EXPECT_EQ(ThpEligible(slab), 1) << "advised for huge pages";
  }
  held.clear();
  EXPECT_EQ(gauge->in_use(), 0u);
  EXPECT_EQ(gauge->peak(), counted);
  // Nothing of it held: the slab serves again from its start.
  EXPECT_EQ(Addr(pool->Get(8192)), slab);
}

TEST(StagingPoolTest, AFullSlabWithBuffersHeldGivesWayToAnotherAndIsReusedOnceLetGo) {
  auto pool = std::make_shared<StagingPool>(nullptr);
  auto a = pool->Get(1 << 20);
  auto b = pool->Get(1 << 20);  // the first slab is now full
  auto c = pool->Get(1 << 20);  // so this one opens a second
  const uintptr_t first = Addr(a) / kSlab * kSlab;
  const uintptr_t second = Addr(c) / kSlab * kSlab;
  EXPECT_EQ(Addr(b), first + (1 << 20));
  EXPECT_NE(second, first);
  EXPECT_EQ(Addr(c), second);
  std::memset(a.get(), 'a', 1 << 20);
  std::memset(b.get(), 'b', 1 << 20);
  std::memset(c.get(), 'c', 1 << 20);
  EXPECT_EQ(a.get()[(1 << 20) - 1], 'a');
  EXPECT_EQ(b.get()[0], 'b');
  // Letting go of the first slab's buffers parks it; the second fills up
  // and the next buffer comes from the parked one.
  a.reset();
  b.reset();
  auto d = pool->Get(1 << 20);
  EXPECT_EQ(Addr(d) / kSlab * kSlab, second);
  auto e = pool->Get(4096);
  EXPECT_EQ(Addr(e), first) << "the parked slab serves again";
  EXPECT_EQ(c.get()[0], 'c');
}

TEST(StagingPoolTest, LargeBuffersAreMappingsOfTheirOwnReusedAfterTheyAreLetGo) {
  auto gauge = std::make_shared<StagingGauge>();
  auto pool = std::make_shared<StagingPool>(gauge);
  const size_t n = (3 << 20) + 100;  // more than a slab
  uintptr_t where;
  {
    auto big = pool->Get(n);
    where = Addr(big);
    EXPECT_EQ(where % kSlab, 0u) << "on a huge-page boundary";
    std::memset(big.get(), 7, n);
    EXPECT_EQ(big.get()[n - 1], 7);
    EXPECT_EQ(gauge->in_use(), 4u << 20) << "the whole mapping counts";
    if (HugePagesOffered()) {
      EXPECT_EQ(ThpEligible(where), 1) << "advised for huge pages";
    }
  }
  EXPECT_EQ(gauge->in_use(), 0u);
  EXPECT_EQ(Addr(pool->Get(n)), where) << "kept idle and handed out again";
}

TEST(StagingPoolTest, ABufferOutlivingItsPoolsLastOwnerReturnsSafely) {
  auto gauge = std::make_shared<StagingGauge>();
  std::shared_ptr<char> small, big;
  {
    auto pool = std::make_shared<StagingPool>(gauge);
    small = pool->Get(4096);
    big = pool->Get(5 << 20);
  }
  std::memset(small.get(), 1, 4096);
  std::memset(big.get(), 2, 5 << 20);
  small.reset();
  big.reset();  // the last holder: the pool and its mappings go with it
  EXPECT_EQ(gauge->in_use(), 0u);
}

// What it keeps unused is its working set: 8 buffers of 16 MiB let go
// together all serve again (a fixed 32 MiB kept two, and mapped six afresh);
// past kMaxFreeBytes (256 MiB) what comes back is unmapped; once the pool
// went unused for two windows (kWindow, 1 s, each) it keeps kMinFreeBytes
// (32 MiB) again. A buffer served again still holds the mark written into
// it (a new mapping reads zero; the kernel may well give a new mapping the
// old address, so addresses say nothing). One page of each is touched.
TEST(StagingPoolTest, KeepsItsRecentWorkingSetUnusedWithinBounds) {
  constexpr size_t kBuf = size_t{16} << 20;
  auto pool = std::make_shared<StagingPool>(nullptr);
  // Takes `count` buffers at once, counts those holding the mark, marks all.
  auto round = [&](size_t count) {
    std::vector<std::shared_ptr<char>> held;
    size_t marked = 0;
    for (size_t k = 0; k < count; ++k) {
      held.push_back(pool->Get(kBuf));
      marked += held.back().get()[0] == 'm';
    }
    for (const auto& p : held) p.get()[0] = 'm';
    return marked;
  };
  EXPECT_EQ(round(8), 0u);
  EXPECT_EQ(round(8), 8u) << "the working set (128 MiB) was kept";
  round(20);  // 320 MiB at once (8 of them marked before)
  EXPECT_EQ(round(20), 16u) << "256 MiB kept, the rest unmapped";
  // Two windows without use: the next return keeps 32 MiB, two buffers.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  pool->Get(4096).reset();
  EXPECT_EQ(round(20), 2u) << "an idle pool shrinks to 32 MiB";
}

// With a CUDA driver the buffers are page-locked memory of the driver; once
// it refuses (out of memory), host memory serves from then on: small buffers
// carved from the slabs (not a 2 MiB mapping each), large ones mappings of
// their own; what the driver gave is given back to it.
TEST(StagingPoolTest, PageLockedMemoryOfTheDriverUntilItRefusesThenHostMemory) {
  test::FakeCuda fake;
  ASSERT_TRUE(fake.ok()) << ::dlerror();
  CudaDriver driver(FERRY_FAKE_CUDA_PATH);
  ASSERT_TRUE(driver.available()) << driver.why_unavailable();
  const int before = fake.LiveAllocations(test::FakeCuda::kHostAllocations);
  auto gauge = std::make_shared<StagingGauge>();
  {
    auto pool = std::make_shared<StagingPool>(gauge, &driver);
    auto pinned = pool->Get(64 << 10);
    EXPECT_EQ(fake.LiveAllocations(test::FakeCuda::kHostAllocations), before + 1)
        << "the driver's page-locked memory";
    std::memset(pinned.get(), 1, 64 << 10);
    fake.SetHostAllocResult(2);  // CUDA_ERROR_OUT_OF_MEMORY
    auto a = pool->Get(64 << 10);
    auto b = pool->Get(64 << 10);
    auto big = pool->Get(3 << 20);
    EXPECT_EQ(fake.LiveAllocations(test::FakeCuda::kHostAllocations), before + 1)
        << "nothing more from the driver once it refused";
    EXPECT_EQ(Addr(a) % kSlab, 0u) << "the first carved buffer starts a slab";
    EXPECT_EQ(Addr(b), Addr(a) + (64 << 10)) << "the next is carved from the same slab";
    EXPECT_EQ(Addr(big) % kSlab, 0u) << "a large one is a mapping of its own";
    std::memset(a.get(), 2, 64 << 10);
    std::memset(b.get(), 3, 64 << 10);
    std::memset(big.get(), 4, 3 << 20);
    EXPECT_EQ(a.get()[(64 << 10) - 1], 2);
    EXPECT_EQ(pinned.get()[0], 1);
    // The refusal is remembered: host memory even once the driver would give.
    fake.SetHostAllocResult(0);
    auto c = pool->Get(4 << 20);
    EXPECT_EQ(fake.LiveAllocations(test::FakeCuda::kHostAllocations), before + 1);
    EXPECT_EQ(gauge->in_use(), (64u << 10) * 3 + (4u << 20) + (4u << 20));
  }
  EXPECT_EQ(gauge->in_use(), 0u);
  EXPECT_EQ(fake.LiveAllocations(test::FakeCuda::kHostAllocations), before)
      << "the page-locked buffer went back to the driver with the pool";
}

}  // namespace
}  // namespace ferry::internal
