// GPU copies in batches against the fake driver (tests/testing/fake_cuda_driver.cc):
// the driver's cuMemcpyBatchAsync, the copy queue that uses it (and goes one
// by one when the driver refuses it), the target's synchronous copies queued
// then waited for once, and the page-locked staging pool of a tcp target.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <vector>

#include "base/staging_pool.h"
#include "common/cuda_driver.h"
#include "cuda/copy_queue.h"
#include "cuda/sync_copies.h"
#include "tests/testing/fake_cuda.h"
#include "tests/testing/status_matchers.h"

namespace ferry::internal {
namespace {

using ::ferry::test::FakeCuda;
using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using ::testing::HasSubstr;

constexpr int kInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE

class CudaCopies : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fake_.ok());
    ASSERT_TRUE(d_.data_path()) << d_.why_no_data_path();
    fake_.SetCopyDelayUs(0);
  }

  // `n` bytes of device memory on device 0 holding `bytes` (if given).
  void* Device(size_t n, const std::vector<uint8_t>& bytes = {}) {
    CudaContextScope scope(d_, 0);
    EXPECT_THAT(scope.status(), IsOk());
    auto p = d_.AllocateDevice(n);
    EXPECT_THAT(p.status(), IsOk());
    if (!p.ok()) return nullptr;
    device_.push_back(*p);
    if (!bytes.empty()) {
      EXPECT_THAT(Sync(*p, bytes.data(), bytes.size()), IsOk());
    }
    return *p;
  }
  Status Sync(void* dst, const void* src, size_t n) {
    cuda::SyncCopies copies(d_);
    return copies.Copy(0, dst, src, n);
  }
  std::vector<uint8_t> Read(const void* dev, size_t n) {
    std::vector<uint8_t> out(n);
    EXPECT_THAT(Sync(out.data(), dev, n), IsOk());
    return out;
  }
  static std::vector<uint8_t> Pattern(size_t n, unsigned seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
    return v;
  }
  void TearDown() override {
    CudaContextScope scope(d_, 0);
    for (void* p : device_) EXPECT_THAT(d_.FreeDevice(p), IsOk());
  }

  FakeCuda fake_;
  CudaDriver d_{FERRY_FAKE_CUDA_PATH};
  std::vector<void*> device_;
};

TEST_F(CudaCopies, OneBatchCallCopiesScatteredRangesBetweenDeviceAndHost) {
  ASSERT_TRUE(d_.has_batch_copies());
  constexpr size_t kPage = 4096, kPages = 8;
  const std::vector<uint8_t> in = Pattern(kPage * kPages, 3);
  void* src = Device(kPage * kPages, in);
  void* dst = Device(kPage * kPages, std::vector<uint8_t>(kPage * kPages, 0));
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> lengths;
  for (size_t i = 0; i < kPages; ++i) {  // page i lands at page kPages - 1 - i
    dsts.push_back(static_cast<char*>(dst) + (kPages - 1 - i) * kPage);
    srcs.push_back(static_cast<char*>(src) + i * kPage);
    lengths.push_back(i == 0 ? kPage - 5 : kPage);  // one shorter
  }
  CudaContextScope scope(d_, 0);
  ASSERT_OK_AND_ASSIGN(CudaDriver::Stream s, d_.CreateStream());
  const unsigned long long calls = fake_.BatchCalls();
  ASSERT_THAT(d_.CopyBatchAsync(dsts.data(), srcs.data(), lengths.data(), kPages, s), IsOk());
  ASSERT_THAT(d_.WaitStream(s), IsOk());
  EXPECT_EQ(fake_.BatchCalls(), calls + 1);
  const std::vector<uint8_t> out = Read(dst, kPage * kPages);
  for (size_t i = 0; i < kPages; ++i) {
    const size_t n = lengths[i];
    EXPECT_EQ(0, std::memcmp(out.data() + (kPages - 1 - i) * kPage, in.data() + i * kPage, n))
        << "page " << i;
  }
  EXPECT_EQ(out[(kPages - 1) * kPage + kPage - 5], 0) << "beyond the shorter copy";
  // The driver's refusal comes back naming the call and the result.
  fake_.SetBatchResult(kInvalidValue);
  EXPECT_THAT(d_.CopyBatchAsync(dsts.data(), srcs.data(), lengths.data(), kPages, s),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cuMemcpyBatchAsync")));
  d_.DestroyStream(s);
}

TEST_F(CudaCopies, TheCopyQueueBatchesASubmissionAndGoesOneByOneIfRefused) {
  constexpr size_t kChunk = 1000, kChunks = 5;
  void* src = Device(kChunk * kChunks, Pattern(kChunk * kChunks, 9));
  void* dst = Device(kChunk * kChunks, std::vector<uint8_t>(kChunk * kChunks, 0));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<cuda::CopyQueue> q, cuda::CopyQueue::Create(d_, 0));
  auto submit = [&](unsigned) {
    std::vector<cuda::Copy> copies;
    for (size_t i = 0; i < kChunks; ++i)
      copies.push_back({static_cast<char*>(dst) + i * kChunk,
                        static_cast<const char*>(src) + i * kChunk, kChunk});
    std::promise<Status> done;
    q->Submit(copies, [&](Status s) { done.set_value(std::move(s)); });
    return done.get_future().get();
  };
  unsigned long long calls = fake_.BatchCalls();
  ASSERT_THAT(submit(0), IsOk());
  EXPECT_EQ(fake_.BatchCalls(), calls + 1) << "five copies, one driver call";
  EXPECT_EQ(Read(dst, kChunk * kChunks), Pattern(kChunk * kChunks, 9));

  // Refused: the same copies land one by one, and later submissions skip
  // the batch call.
  CudaContextScope scope(d_, 0);
  ASSERT_THAT(d_.Fill(dst, 0, kChunk * kChunks), IsOk());
  fake_.SetBatchResult(kInvalidValue);
  calls = fake_.BatchCalls();
  ASSERT_THAT(submit(1), IsOk());
  EXPECT_EQ(Read(dst, kChunk * kChunks), Pattern(kChunk * kChunks, 9));
  fake_.SetBatchResult(0);
  ASSERT_THAT(d_.Fill(dst, 0, kChunk * kChunks), IsOk());
  ASSERT_THAT(submit(2), IsOk());
  EXPECT_EQ(fake_.BatchCalls(), calls);
  EXPECT_EQ(Read(dst, kChunk * kChunks), Pattern(kChunk * kChunks, 9));
}

TEST_F(CudaCopies, CopiesBetweenGpuMemoryGoInOneKernelLaunch) {
  // Pages of 4 KiB, one odd-sized and unaligned, and one longer than a
  // kernel task (cut in three): all in one launch, every byte in place.
  constexpr size_t kBig = 2 * cuda::CopyQueue::kTaskBytes + 12345;
  constexpr size_t kSize = kBig + 64 * 4096;
  const std::vector<uint8_t> in = Pattern(kSize, 11);
  void* src = Device(kSize, in);
  void* dst = Device(kSize, std::vector<uint8_t>(kSize, 0));
  CudaContextScope scope(d_, 0);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<cuda::CopyQueue> q, cuda::CopyQueue::Create(d_, 0));
  ASSERT_TRUE(q->has_kernel());
  auto at = [](void* p, size_t off) { return static_cast<char*>(p) + off; };
  std::vector<cuda::Copy> copies;
  for (size_t i = 0; i < 64; ++i)  // page i to page 63 - i
    copies.push_back({at(dst, (63 - i) * 4096), at(src, i * 4096), 4096});
  copies[5] = {at(dst, 58 * 4096 + 3), at(src, 5 * 4096 + 1), 4000};
  copies.push_back({at(dst, 64 * 4096), at(src, 64 * 4096), kBig});
  const unsigned long long launches = fake_.KernelLaunches();
  const unsigned long long batches = fake_.BatchCalls();
  std::promise<Status> done;
  q->Submit(
      copies, [&](Status s) { done.set_value(std::move(s)); }, /*on_device=*/true);
  ASSERT_THAT(done.get_future().get(), IsOk());
  EXPECT_EQ(fake_.KernelLaunches(), launches + 1);
  EXPECT_EQ(fake_.BatchCalls(), batches);
  std::vector<uint8_t> want(kSize, 0);
  for (const cuda::Copy& c : copies) {
    std::memcpy(want.data() + (static_cast<char*>(c.dst) - static_cast<char*>(dst)),
                in.data() + (static_cast<const char*>(c.src) - static_cast<char*>(src)), c.length);
  }
  EXPECT_TRUE(Read(dst, kSize) == want);

  // Not all GPU memory (on_device false): no launch.
  std::promise<Status> again;
  q->Submit(copies, [&](Status s) { again.set_value(std::move(s)); });
  ASSERT_THAT(again.get_future().get(), IsOk());
  EXPECT_EQ(fake_.KernelLaunches(), launches + 1);

  // A longer task list than the queue had room for (it grows): 4,000
  // copies of 16 bytes, word i to word 3999 - i.
  ASSERT_THAT(d_.Fill(dst, 0, kSize), IsOk());
  std::vector<cuda::Copy> words;
  for (size_t i = 0; i < 4000; ++i)
    words.push_back({at(dst, (3999 - i) * 16), at(src, i * 16), 16});
  std::promise<Status> many;
  q->Submit(
      words, [&](Status s) { many.set_value(std::move(s)); }, /*on_device=*/true);
  ASSERT_THAT(many.get_future().get(), IsOk());
  EXPECT_EQ(fake_.KernelLaunches(), launches + 2);
  const std::vector<uint8_t> out = Read(dst, 4000 * 16);
  for (size_t i = 0; i < 4000; ++i)
    ASSERT_EQ(0, std::memcmp(out.data() + (3999 - i) * 16, in.data() + i * 16, 16)) << i;
}

TEST_F(CudaCopies, ADriverThatCannotLoadTheKernelBatchesInstead) {
  fake_.SetModuleResult(218);  // CUDA_ERROR_INVALID_PTX
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<cuda::CopyQueue> q, cuda::CopyQueue::Create(d_, 0));
  EXPECT_FALSE(q->has_kernel());
  void* src = Device(8192, Pattern(8192, 4));
  void* dst = Device(8192, std::vector<uint8_t>(8192, 0));
  const std::vector<cuda::Copy> copies = {{static_cast<char*>(dst) + 4096, src, 4096},
                                          {dst, static_cast<char*>(src) + 4096, 4096}};
  const unsigned long long launches = fake_.KernelLaunches();
  std::promise<Status> done;
  q->Submit(
      copies, [&](Status s) { done.set_value(std::move(s)); }, /*on_device=*/true);
  ASSERT_THAT(done.get_future().get(), IsOk());
  EXPECT_EQ(fake_.KernelLaunches(), launches);
  const std::vector<uint8_t> in = Pattern(8192, 4), out = Read(dst, 8192);
  EXPECT_EQ(0, std::memcmp(out.data(), in.data() + 4096, 4096));
  EXPECT_EQ(0, std::memcmp(out.data() + 4096, in.data(), 4096));
}

TEST_F(CudaCopies, SyncCopiesQueuedThenWaitedForOnce) {
  constexpr size_t kSize = 3000;
  const std::vector<uint8_t> in = Pattern(2 * kSize, 5);
  void* dev = Device(2 * kSize);
  cuda::SyncCopies copies(d_);
  fake_.HoldStreams(true);  // nothing runs before WaitAll is called
  ASSERT_THAT(copies.Queue(0, dev, in.data(), kSize), IsOk());
  ASSERT_THAT(copies.Queue(0, static_cast<char*>(dev) + kSize, in.data() + kSize, kSize), IsOk());
  EXPECT_EQ(fake_.CopiedBytes(FakeCuda::kHostToDevice), 0u);
  fake_.HoldStreams(false);
  const std::map<int, Status> waited = copies.WaitAll();
  ASSERT_EQ(waited.size(), 1u);
  EXPECT_THAT(waited.at(0), IsOk());
  EXPECT_EQ(Read(dev, 2 * kSize), in);
  EXPECT_TRUE(copies.WaitAll().empty()) << "nothing queued since";
  // A copy the driver refuses fails at Queue, naming why.
  EXPECT_THAT(copies.Queue(0, static_cast<char*>(dev) + kSize, in.data(), 2 * kSize),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cuMemcpyAsync")));
}

TEST_F(CudaCopies, GpuStagingBuffersArePageLockedAndReused) {
  const int before = fake_.LiveAllocations(FakeCuda::kHostAllocations);
  {
    auto pool = std::make_shared<StagingPool>(nullptr, &d_);
    char* first;
    {
      std::shared_ptr<char> b = pool->Get(10000);
      first = b.get();
      EXPECT_EQ(fake_.LiveAllocations(FakeCuda::kHostAllocations), before + 1);
      std::memset(b.get(), 7, 10000);  // host memory: the CPU writes it
    }
    std::shared_ptr<char> again = pool->Get(9000);
    EXPECT_EQ(again.get(), first) << "the buffer let go is reused";
    std::shared_ptr<char> other = pool->Get(10000);
    EXPECT_EQ(fake_.LiveAllocations(FakeCuda::kHostAllocations), before + 2);
    pool.reset();  // the buffers still held keep the pool
    other.reset();
    EXPECT_EQ(fake_.LiveAllocations(FakeCuda::kHostAllocations), before + 2);
  }
  EXPECT_EQ(fake_.LiveAllocations(FakeCuda::kHostAllocations), before)
      << "the last buffer let go freed the pool, and the pool its buffers";
}

}  // namespace
}  // namespace ferry::internal
