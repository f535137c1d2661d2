// GPU memory of this engine over transports that reach only host memory
// (tcp, shm, fabric): staged through page-locked buffers (src/cuda/
// staging.h). The initiator's buffers are GPU memory of the tests' CUDA
// driver (the fake: the CPU cannot touch them, copies run late), the target's
// host memory or ("tcp_file", "shm_file") file regions; every byte is
// checked, GPU bytes by copying them back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/conformance/conformance_fixture.h"
#include "tests/testing/buffer.h"
#include "tests/testing/fake_cuda.h"
#include "tests/testing/gpu_memory.h"

namespace ferry::test {
namespace {

using ::ferry::internal::CudaDriver;
using namespace std::chrono_literals;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * 1024;

// The tests' CUDA driver, the fake's controls when it is the fake, and GPU
// memory of that driver.
class TestGpu {
 protected:
  // From SetUp: skips the test where the driver lacks the data paths.
  void StartGpu() {
    driver_ = &CudaDriver::Load(TestCudaDriverLibrary());
    if (!driver_->data_path())
      GTEST_SKIP() << "no CUDA driver with the data paths: " << driver_->why_no_data_path();
    if (TestCudaDriverIsFake()) fake_ = std::make_unique<FakeCuda>();
    gpu_ = std::make_unique<GpuMemory>(*driver_);
  }

  const CudaDriver* driver_ = nullptr;
  std::unique_ptr<FakeCuda> fake_;
  std::unique_ptr<GpuMemory> gpu_;  // destroyed before fake_
};

class GpuStagingTest : public ::testing::TestWithParam<std::string>, protected TestGpu {
 protected:
  void SetUp() override {
    FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
    StartGpu();
    if (IsSkipped()) return;
    EngineOptions a = ConformanceOptions(GetParam());
    UseTestCudaDriver(&a);
    ASSERT_NO_FATAL_FAILURE(pair_.Start(GetParam(), a, ConformanceOptions(GetParam())));
  }
  void TearDown() override { gpu_.reset(); }

  EnginePair pair_;
};

// One engine or two made by the test itself.
class GpuTest : public ::testing::Test, protected TestGpu {
 protected:
  void SetUp() override { StartGpu(); }
};
class GpuAndOwnFile : public GpuTest {};
class GpuStagingLateRead : public GpuTest {};

TEST_P(GpuStagingTest, WritesAndReadsOfManySizesBetweenGpuAndHostMemoryEveryByte) {
  constexpr uint64_t kSize = 16 * kMiB, kHalf = kSize / 2, kGpuSeed = 21, kHostSeed = 22;
  unsigned char* gpu = gpu_->Allocate(kSize, kGpuSeed);
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK(pair_.initiator().RegisterMemory(gpu, kSize, "cuda:0"));
  unsigned char* host = pair_.Alloc(kSize, &pair_.target());
  ASSERT_NE(host, nullptr);
  FillPattern(host, kSize, kHostSeed, 0);
  if (fake_) fake_->ResetCopiedBytes();
  const uint64_t remote = pair_.Addr(host);

  // The first half in pieces of 1 B .. 2.5 MiB (several slices each, more
  // slices than staging buffers), at the same offsets on both sides.
  std::vector<TransferRequest> writes;
  for (uint64_t off = 0, i = 0; off < kHalf; ++i) {
    const uint64_t len = std::min<uint64_t>(kHalf - off, 1 + Mix64(i) % (5 * kMiB / 2));
    writes.push_back({Opcode::kWrite, gpu + off, pair_.segment(), remote + off, len});
    off += len;
  }
  ASSERT_OK(pair_.initiator().TransferSync(writes));
  EXPECT_EQ(CheckPattern(host, kHalf, kGpuSeed, 0), std::nullopt);
  EXPECT_EQ(CheckPattern(host + kHalf, kHalf, kHostSeed, kHalf), std::nullopt)
      << "bytes past the writes changed";

  // The second half read back into GPU memory, in odd pieces.
  std::vector<TransferRequest> reads;
  for (uint64_t off = kHalf, i = 0; off < kSize; ++i) {
    const uint64_t len = std::min<uint64_t>(kSize - off, 1 + Mix64(i + 99) % (3 * kMiB / 2));
    reads.push_back({Opcode::kRead, gpu + off, pair_.segment(), remote + off, len});
    off += len;
  }
  ASSERT_OK(pair_.initiator().TransferSync(reads));
  EXPECT_TRUE(gpu_->Holds(gpu, 0, kHalf, kGpuSeed, 0));
  EXPECT_TRUE(gpu_->Holds(gpu, kHalf, kHalf, kHostSeed, kHalf));
  if (fake_) {
    EXPECT_GE(fake_->CopiedBytes(FakeCuda::kDeviceToHost), kHalf)
        << "the writes did not come off the GPU";
    EXPECT_GE(fake_->CopiedBytes(FakeCuda::kHostToDevice), kHalf)
        << "the reads did not go onto the GPU";
  }
}

// A notification sent right after staged writes (not waited for) arrives
// after all of them, though each still had to come off the GPU first.
TEST_P(GpuStagingTest, NotificationSentRightAfterStagedWritesSeesThemAll) {
  constexpr uint64_t kSize = 8 * kMiB, kGpuSeed = 5;
  unsigned char* gpu = gpu_->Allocate(kSize, kGpuSeed);
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK(pair_.initiator().RegisterMemory(gpu, kSize, "*"));  // the kind from the pointer
  unsigned char* host = pair_.Alloc(kSize, &pair_.target());
  ASSERT_NE(host, nullptr);
  ASSERT_OK_AND_ASSIGN(BatchId batch, pair_.initiator().AllocateBatch(64));
  std::vector<TransferRequest> writes;
  for (uint64_t off = 0; off < kSize; off += 256 * kKiB) {
    writes.push_back(
        {Opcode::kWrite, gpu + off, pair_.segment(), pair_.Addr(host) + off, 256 * kKiB});
  }
  ASSERT_OK(pair_.initiator().Submit(batch, writes));
  ASSERT_OK(pair_.initiator().SendNotification(pair_.segment(), "staged", "done"));
  // The target checks its memory the moment it sees the notification.
  std::optional<size_t> bad_at_arrival;
  bool seen = false;
  for (auto until = std::chrono::steady_clock::now() + 60s;
       !seen && std::chrono::steady_clock::now() < until;) {
    for (const Notification& n : pair_.target().GetNotifications()) {
      if (n.name != "staged") continue;
      seen = true;
      bad_at_arrival = CheckPattern(host, kSize, kGpuSeed, 0);
    }
    if (!seen) std::this_thread::sleep_for(100us);
  }
  ASSERT_TRUE(seen) << "no notification";
  EXPECT_EQ(bad_at_arrival, std::nullopt) << "the notification arrived before the writes' bytes";
  ASSERT_OK(pair_.initiator().WaitBatch(batch, 60000ms));
  ASSERT_OK(pair_.initiator().FreeBatch(batch));
}

// GPU memory on the target's side: tcp's target stages it (host memory or
// GPU memory here, every byte both ways); shm and fabric cannot reach it and
// refuse naming the kinds.
TEST_P(GpuStagingTest, GpuMemoryOfTheTargetIsStagedByTcpAndRefusedByTheOthers) {
  if (TargetsFiles(GetParam())) GTEST_SKIP() << "about the target's GPU memory, not its files";
  constexpr uint64_t kSize = 2 * kMiB;
  unsigned char* host = pair_.Alloc(kSize, &pair_.initiator());
  ASSERT_NE(host, nullptr);
  FillPattern(host, kSize, 7, 0);
  unsigned char* local_gpu = gpu_->Allocate(kSize, 8);
  ASSERT_NE(local_gpu, nullptr);
  ASSERT_OK(pair_.initiator().RegisterMemory(local_gpu, kSize, "cuda:0"));
  EngineOptions b = ConformanceOptions(GetParam());
  UseTestCudaDriver(&b);
  auto target = Engine::Create(b);
  ASSERT_OK(GetStatus(target));
  unsigned char* gpu = gpu_->Allocate(2 * kSize, 1);
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK((*target)->RegisterMemory(gpu, 2 * kSize, "cuda:0"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, pair_.initiator().OpenSegment((*target)->PeerId()));
  const uint64_t remote = reinterpret_cast<uintptr_t>(gpu);
  const TransferRequest from_host{Opcode::kWrite, host, seg, remote, kSize};
  if (GetParam() != "tcp") {
    EXPECT_THAT(pair_.initiator().TransferSync(from_host),
                StatusIs(StatusCode::kFailedPrecondition,
                         ::testing::HasSubstr("and cuda:0 memory of peer")));
    EXPECT_TRUE(gpu_->Holds(gpu, 0, 2 * kSize, 1, 0))
        << "a refused write changed the target's memory";
    return;
  }
  // Host memory -> the target's GPU memory; GPU memory -> the rest of it.
  std::vector<TransferRequest> writes = {from_host};
  for (uint64_t o = 0; o < kSize; o += 300 * kKiB) {
    writes.push_back({Opcode::kWrite, local_gpu + o, seg, remote + kSize + o,
                      std::min<uint64_t>(300 * kKiB, kSize - o)});
  }
  ASSERT_OK(pair_.initiator().TransferSync(writes));
  EXPECT_TRUE(gpu_->Holds(gpu, 0, kSize, 7, 0));
  std::vector<unsigned char> shifted(kSize);  // the GPU source's pattern is at its own offsets
  ASSERT_OK(gpu_->Copy(shifted.data(), gpu + kSize, kSize));
  EXPECT_EQ(CheckPattern(shifted.data(), kSize, 8, 0), std::nullopt);
  // And back: the target's GPU memory read into host memory and GPU memory here.
  std::vector<unsigned char> back(kSize);
  ASSERT_OK(pair_.initiator().RegisterMemory(back.data(), kSize, "cpu"));
  ASSERT_OK(pair_.initiator().TransferSync(
      TransferRequest{Opcode::kRead, back.data(), seg, remote + kSize, kSize}));
  EXPECT_EQ(CheckPattern(back.data(), kSize, 8, 0), std::nullopt);
  ASSERT_OK(pair_.initiator().TransferSync(
      TransferRequest{Opcode::kRead, local_gpu, seg, remote, kSize}));
  EXPECT_TRUE(gpu_->Holds(local_gpu, 0, kSize, 7, 0));
}

// GPU memory to and from this engine's own file region (the local
// transport, through its own segment): staged through host memory, every
// byte checked in the file and back on the GPU; a read of a cancelled batch
// puts nothing on the GPU.
TEST_F(GpuAndOwnFile, WritesAndReadsBetweenGpuMemoryAndAFileOfThisEngine) {
  constexpr uint64_t kSize = 4 * kMiB, kSeed = 33;
  EngineOptions o = ConformanceOptions("local");
  UseTestCudaDriver(&o);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> e, Engine::Create(o));
  FileBuffer file(kSize);  // its bytes seen through a shared mapping
  FileRegion region;
  region.fd = file.fd();
  region.length = kSize;
  ASSERT_OK_AND_ASSIGN(void* base, e->RegisterFile(region));
  const uint64_t file_addr = reinterpret_cast<uint64_t>(base);
  unsigned char* gpu = gpu_->Allocate(kSize, kSeed);
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK(e->RegisterMemory(gpu, kSize, "cuda:0"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle self, e->OpenSegment(e->PeerId()));
  const int host_before = fake_ ? fake_->LiveAllocations(FakeCuda::kHostAllocations) : 0;
  // GPU -> file: odd pieces, several of them unaligned.
  std::vector<TransferRequest> writes;
  for (uint64_t off = 0, i = 0; off < kSize; ++i) {
    const uint64_t len = std::min<uint64_t>(kSize - off, 1 + Mix64(i) % (700 * kKiB));
    writes.push_back({Opcode::kWrite, gpu + off, self, file_addr + off, len});
    off += len;
  }
  ASSERT_OK(e->TransferSync(writes));
  EXPECT_EQ(CheckPattern(file.data(), kSize, kSeed, 0), std::nullopt) << "the file";
  if (fake_) {
    EXPECT_GT(fake_->LiveAllocations(FakeCuda::kHostAllocations), host_before)
        << "the slices are staged in the driver's page-locked memory, kept for reuse";
  }
  // file -> GPU: the file's new bytes, read back over the GPU's.
  FillPattern(file.data(), kSize, kSeed + 1, 0);
  std::vector<TransferRequest> reads;
  for (uint64_t off = 0; off < kSize; off += kMiB) {
    reads.push_back({Opcode::kRead, gpu + off, self, file_addr + off, kMiB});
  }
  ASSERT_OK(e->TransferSync(reads));
  EXPECT_TRUE(gpu_->Holds(gpu, 0, kSize, kSeed + 1, 0)) << "the GPU memory";
  // A cancelled batch of reads: nothing lands on the GPU after the cancel.
  FillPattern(file.data(), kSize, kSeed + 2, 0);
  ASSERT_OK_AND_ASSIGN(BatchId batch, e->AllocateBatch(reads.size()));
  ASSERT_OK(e->Submit(batch, reads));
  ASSERT_OK(e->CancelBatch(batch));
  std::vector<unsigned char> after(kSize);
  ASSERT_OK(gpu_->Copy(after.data(), gpu, kSize));
  // Unregistering the file waits for every op still on its ring (each holds
  // the region until it is done), so whatever could land has landed.
  ASSERT_OK(e->UnregisterMemory(base));
  std::vector<unsigned char> later(kSize);
  ASSERT_OK(gpu_->Copy(later.data(), gpu, kSize));
  EXPECT_EQ(after, later) << "bytes of a cancelled read reached the GPU after the cancel";
  e.reset();
  if (fake_) {
    EXPECT_EQ(fake_->LiveAllocations(FakeCuda::kHostAllocations), host_before)
        << "the engine gave its page-locked staging back";
  }
}

// A staged read into GPU memory that fails while its bytes still land
// later (the fabric provider keeps a read past its deadline in flight;
// played by the fault link under the stagers, over tcp) does not hand its
// page-locked buffer to the next slice: that write from GPU memory sends
// the GPU's bytes (with the buffer reused, the late read's), and the buffer
// goes back to the driver once the late bytes landed. Nothing of the failed
// read reaches the GPU.
TEST_F(GpuStagingLateRead, AReadLandingAfterItFailedDoesNotReachAnotherSlicesBuffer) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("tcp");
  constexpr uint64_t kLen = 64 * kKiB;
  EngineOptions faulty = ConformanceOptions("tcp");
  UseTestCudaDriver(&faulty);
  faulty.testing.link_faults.seed = 1;
  faulty.testing.link_faults.late_read_percent = 100;
  faulty.testing.link_faults.under_staging = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> initiator, Engine::Create(faulty));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> target, Engine::Create(ConformanceOptions("tcp")));
  unsigned char* gpu = gpu_->Allocate(2 * kLen, 41);
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK(initiator->RegisterMemory(gpu, 2 * kLen, "cuda:0"));
  AlignedBuffer host(2 * kLen);
  FillPattern(host.data(), kLen, 42, 0);
  std::memset(host.data() + kLen, 0, kLen);
  ASSERT_OK(target->RegisterMemory(host.data(), 2 * kLen, "cpu"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, initiator->OpenSegment(target->PeerId()));
  const uint64_t remote = reinterpret_cast<uint64_t>(host.data());
  const int host_before = fake_ ? fake_->LiveAllocations(FakeCuda::kHostAllocations) : 0;

  const std::vector<TransferRequest> read_req = {{Opcode::kRead, gpu, seg, remote, kLen}};
  const Status read = initiator->TransferSync(read_req);
  EXPECT_EQ(read.code(), StatusCode::kDeadlineExceeded) << read;
  // The late read lands in its buffer just before this write is posted.
  const std::vector<TransferRequest> write_req = {
      {Opcode::kWrite, gpu + kLen, seg, remote + kLen, kLen}};
  ASSERT_OK(initiator->TransferSync(write_req));
  EXPECT_EQ(CheckPattern(host.data() + kLen, kLen, 41, kLen), std::nullopt)
      << "the write sent other bytes than the GPU's (the late read's, through a shared buffer)";
  EXPECT_TRUE(gpu_->Holds(gpu, 0, kLen, 41, 0)) << "the failed read's bytes reached the GPU";
  if (fake_) {
    EXPECT_EQ(fake_->LiveAllocations(FakeCuda::kHostAllocations), host_before + 1)
        << "the write's buffer, kept for reuse; the retired one went back to the driver once "
           "its late bytes landed";
  }
  initiator.reset();
  ASSERT_OK(target->UnregisterMemory(host.data()));
}

// The initiator destroyed while staged GPU slices of both directions are
// in flight (device copies, inner posts): its destructor ends them and
// returns (the inner transport fails what it holds; nothing is posted to a
// link that was shut down), and the target serves another initiator.
TEST_P(GpuStagingTest, EngineDestroyedWithStagedSlicesInFlight) {
  constexpr uint64_t kSize = 16 * kMiB, kChunk = 256 * kKiB;
  unsigned char* gpu = gpu_->Allocate(kSize, 7);
  ASSERT_NE(gpu, nullptr);
  ASSERT_OK(pair_.initiator().RegisterMemory(gpu, kSize, "cuda:0"));
  unsigned char* host = pair_.Alloc(kSize, &pair_.target());
  ASSERT_NE(host, nullptr);
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kSize; off += kChunk) {
    reqs.push_back({(off / kChunk) % 2 == 0 ? Opcode::kWrite : Opcode::kRead, gpu + off,
                    pair_.segment(), pair_.Addr(host) + off, kChunk});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, pair_.initiator().AllocateBatch(reqs.size()));
  ASSERT_OK(pair_.initiator().Submit(batch, reqs));
  pair_.DestroyInitiator();  // with the batch in flight
  pair_.ExpectTargetServesANewEngine(ConformanceOptions(GetParam()), host);
}

INSTANTIATE_TEST_SUITE_P(HostTransports, GpuStagingTest,
                         ::testing::Values("tcp", "shm", "fabric_tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });
// GPU memory of this engine to and from a peer's file regions (issue 30).
INSTANTIATE_TEST_SUITE_P(FileTargets, GpuStagingTest, ::testing::Values("tcp_file", "shm_file"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ferry::test
