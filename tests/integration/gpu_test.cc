// GPU memory between processes: this process's engine and ferry_test_peer
// children whose buffers are GPU memory (--gpu). The CUDA driver is the tests'
// fake (tests/testing/fake_cuda_driver.cc: device memory is PROT_NONE to the
// CPU, copies run late on stream threads, IPC handles map the same pages in
// another process), or the real one when FERRY_TEST_CUDA_DRIVER names it
// (scripts/device-check.sh: "libcuda.so.1"). Every byte is checked by copying
// it back through the driver, never by touching device memory with the CPU.
//
// Every wait is bounded; no test asserts how long anything took.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_driver.h"
#include "cuda/copy_queue.h"
#include "ferry/ferry.h"
#include "tests/integration/peer_process.h"
#include "tests/testing/fake_cuda.h"
#include "tests/testing/gpu_memory.h"
#include "tests/testing/pattern.h"
#include "tests/testing/status_matchers.h"

namespace ferry::test {
namespace {

using ::ferry::internal::CudaDriver;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

std::string Checked(uint64_t seed, uint64_t off, uint64_t len) {
  return "CHECK " + std::to_string(seed) + " " + std::to_string(off) + " " + std::to_string(len);
}

class GpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }

  void SetUp() override {
    driver_ = &CudaDriver::Load(TestCudaDriverLibrary());
    if (!driver_->data_path())
      GTEST_SKIP() << "no CUDA driver with the data paths: " << driver_->why_no_data_path();
    if (TestCudaDriverIsFake()) fake_ = std::make_unique<FakeCuda>();
    gpu_ = std::make_unique<GpuMemory>(*driver_);
  }

  void TearDown() override {
    for (auto& p : peers_) p->Kill();
    engine_.reset();
    gpu_.reset();
  }

  void CreateEngine(const std::string& transport = "auto") {
    EngineOptions o;
    o.transport = transport;
    o.listen_host = "127.0.0.1";
    o.transfer_timeout = 30s;
    o.connect_timeout = 5s;
    UseTestCudaDriver(&o);
    auto e = Engine::Create(std::move(o));
    ASSERT_OK(GetStatus(e));
    engine_ = std::move(e).value();
  }

  PeerProcess* SpawnGpuPeer(uint64_t size, uint64_t seed) {
    peers_.push_back(std::make_unique<PeerProcess>());
    PeerProcess* p = peers_.back().get();
    const ::testing::AssertionResult started =
        p->Start(FERRY_TEST_PEER_PATH, {"--size", std::to_string(size), "--seed",
                                        std::to_string(seed), "--gpu", TestCudaDriverLibrary()});
    EXPECT_TRUE(started);
    return started ? p : nullptr;
  }

  unsigned char* DeviceBuffer(uint64_t size, uint64_t seed) {
    unsigned char* p = gpu_->Allocate(size, seed);
    EXPECT_NE(p, nullptr) << "allocating " << size << " bytes of GPU memory";
    return p;
  }
  ::testing::AssertionResult DeviceHolds(const unsigned char* p, uint64_t off, uint64_t len,
                                         uint64_t seed, uint64_t pos) {
    return gpu_->Holds(p, off, len, seed, pos);
  }

  Engine& engine() { return *engine_; }

  const CudaDriver* driver_ = nullptr;
  std::unique_ptr<FakeCuda> fake_;  // when the driver is the fake
  std::unique_ptr<GpuMemory> gpu_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<PeerProcess>> peers_;
};

// Writes of many sizes from GPU memory here to GPU memory of another process,
// then reads back into GPU memory: cuda_ipc, every byte checked in both.
TEST_F(GpuTest, GpuToGpuAcrossProcessesEveryByteBothWays) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 8 * kMiB, kPeerSeed = 31, kData = 47;
  PeerProcess* peer = SpawnGpuPeer(kSize, kPeerSeed);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = DeviceBuffer(kSize, kData);
  unsigned char* back = DeviceBuffer(kSize, 5);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(back, nullptr);
  ASSERT_OK(engine().RegisterMemory(local, kSize, "cuda:0"));
  ASSERT_OK(engine().RegisterMemory(back, kSize, "*"));  // the kind from the pointer
  if (fake_) fake_->ResetCopiedBytes();
  const unsigned long long launches = fake_ ? fake_->KernelLaunches() : 0;

  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentInfo info, engine().QuerySegment(seg));
  bool gpu_region = false;
  for (const RemoteRegion& r : info.regions)
    gpu_region = gpu_region || (r.addr == peer->buffer_addr() && r.kind == "cuda:0");
  EXPECT_TRUE(gpu_region) << "the peer's GPU buffer is not advertised as cuda:0";

  // The first 4 MiB in pieces of 1 B .. 300 KiB (local offset = remote offset).
  std::vector<TransferRequest> writes;
  uint64_t off = 0;
  for (uint64_t i = 0; off < 4 * kMiB; ++i) {
    const uint64_t len = std::min<uint64_t>(4 * kMiB - off, 1 + Mix64(i) % (300 * kKiB));
    writes.push_back({Opcode::kWrite, local + off, seg, peer->buffer_addr() + off, len});
    off += len;
  }
  ASSERT_OK(engine().TransferSync(writes));
  EXPECT_EQ(peer->Call(Checked(kData, 0, 4 * kMiB)), "OK");
  EXPECT_EQ(peer->Call(Checked(kPeerSeed, 4 * kMiB, 4 * kMiB)), "OK")
      << "bytes past the writes changed";

  // Read all of it back in 1 MiB pieces.
  std::vector<TransferRequest> reads;
  for (uint64_t o = 0; o < kSize; o += kMiB)
    reads.push_back({Opcode::kRead, back + o, seg, peer->buffer_addr() + o, kMiB});
  ASSERT_OK(engine().TransferSync(reads));
  EXPECT_TRUE(DeviceHolds(back, 0, 4 * kMiB, kData, 0));
  EXPECT_TRUE(DeviceHolds(back, 4 * kMiB, 4 * kMiB, kPeerSeed, 4 * kMiB));
  if (fake_) {
    // Device to device, by this process's streams (the peer's CPU never saw them).
    EXPECT_GE(fake_->CopiedBytes(FakeCuda::kDeviceToDevice), 12 * kMiB);
    // Each batch of several GPU ranges went as launches of the copy kernel.
    EXPECT_GE(fake_->KernelLaunches() - launches, 2u);
  }
  EXPECT_EQ(peer->Stop(), 0);
}

// GPU memory here on another device than the peer's: the copy kernel runs
// on one device (and would need peer access to touch the other), so these
// copies go through the driver; every byte in place. The fake's second
// device (a real machine with one GPU skips).
TEST_F(GpuTest, GpuToGpuOfAnotherDeviceGoesThroughTheDriver) {
  if (!fake_) GTEST_SKIP() << "needs the stand-in driver's second device";
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = kMiB, kPeerSeed = 61, kData = 62;
  PeerProcess* peer = SpawnGpuPeer(kSize, kPeerSeed);  // its buffer is on cuda:0
  ASSERT_NE(peer, nullptr);
  void* local = nullptr;
  {
    internal::CudaContextScope scope(*driver_, 1);
    ASSERT_OK(scope.status());
    ASSERT_OK_AND_ASSIGN(local, driver_->AllocateDevice(kSize));
  }
  std::vector<unsigned char> host(kSize);
  FillPattern(host.data(), kSize, kData, 0);
  ASSERT_OK(gpu_->Copy(local, host.data(), kSize));
  ASSERT_OK(engine().RegisterMemory(local, kSize, "cuda:1"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  const unsigned long long launches = fake_->KernelLaunches();
  std::vector<TransferRequest> writes;
  for (uint64_t o = 0; o < kSize; o += 64 * kKiB)
    writes.push_back(
        {Opcode::kWrite, static_cast<char*>(local) + o, seg, peer->buffer_addr() + o, 64 * kKiB});
  ASSERT_OK(engine().TransferSync(writes));
  EXPECT_EQ(peer->Call(Checked(kData, 0, kSize)), "OK");
  EXPECT_EQ(fake_->KernelLaunches(), launches) << "a kernel on one device touched another's memory";
  ASSERT_OK(engine().UnregisterMemory(local));
  internal::CudaContextScope scope(*driver_, 1);
  EXPECT_OK(driver_->FreeDevice(local));
}

// Host memory here, GPU memory there: host to device and back.
TEST_F(GpuTest, HostMemoryToGpuMemoryOfAnotherProcessAndBack) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 2 * kMiB, kPeerSeed = 8, kData = 9;
  PeerProcess* peer = SpawnGpuPeer(kSize, kPeerSeed);
  ASSERT_NE(peer, nullptr);
  std::vector<unsigned char> host(kSize), back(kSize);
  FillPattern(host.data(), kSize, kData, 0);
  ASSERT_OK(engine().RegisterMemory(host.data(), kSize, "cpu"));
  ASSERT_OK(engine().RegisterMemory(back.data(), kSize, "cpu"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  if (fake_) fake_->ResetCopiedBytes();
  std::vector<TransferRequest> writes;
  for (uint64_t o = 0; o < kSize / 2; o += 64 * kKiB + 1) {
    const uint64_t len = std::min<uint64_t>(kSize / 2 - o, 64 * kKiB + 1);
    writes.push_back({Opcode::kWrite, host.data() + o, seg, peer->buffer_addr() + o, len});
  }
  ASSERT_OK(engine().TransferSync(writes));
  EXPECT_EQ(peer->Call(Checked(kData, 0, kSize / 2)), "OK");
  EXPECT_EQ(peer->Call(Checked(kPeerSeed, kSize / 2, kSize / 2)), "OK");
  ASSERT_OK(engine().TransferSync(
      TransferRequest{Opcode::kRead, back.data(), seg, peer->buffer_addr(), kSize}));
  EXPECT_EQ(CheckPattern(back.data(), kSize / 2, kData, 0), std::nullopt);
  EXPECT_EQ(CheckPattern(back.data() + kSize / 2, kSize / 2, kPeerSeed, kSize / 2), std::nullopt);
  if (fake_) {
    EXPECT_GE(fake_->CopiedBytes(FakeCuda::kHostToDevice), kSize / 2);
    EXPECT_GE(fake_->CopiedBytes(FakeCuda::kDeviceToHost), kSize);
  }
}

// A notification sent right after GPU writes (not waited for) sees them all:
// they go on cuda_ipc, the notification on the cpu route, and the engine
// waits for the copies before it sends (the fake runs each copy late).
TEST_F(GpuTest, NotificationSentRightAfterGpuWritesSeesThemAll) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 4 * kMiB, kPeerSeed = 12, kData = 13;
  PeerProcess* peer = SpawnGpuPeer(kSize, kPeerSeed);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = DeviceBuffer(kSize, kData);
  ASSERT_NE(local, nullptr);
  ASSERT_OK(engine().RegisterMemory(local, kSize, "cuda:0"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine().AllocateBatch(64));
  std::vector<TransferRequest> writes;
  for (uint64_t o = 0; o < kSize; o += 64 * kKiB)
    writes.push_back({Opcode::kWrite, local + o, seg, peer->buffer_addr() + o, 64 * kKiB});
  ASSERT_OK(engine().Submit(batch, writes));
  ASSERT_OK(engine().SendNotification(seg, "gpu-done", Checked(kData, 0, kSize)));
  EXPECT_EQ(peer->Call("NOTE gpu-done"), "NOTE OK");
  ASSERT_OK(engine().WaitBatch(batch, 30000ms));
  ASSERT_OK(engine().FreeBatch(batch));
}

// A handle this process cannot open (another container, a GPU it cannot
// see): cuda_ipc fails to connect, naming why, and `auto` falls back to tcp,
// whose target stages its GPU memory; every byte still arrives, and this
// process made no GPU copy (cuda_ipc stays unused for that peer).
TEST_F(GpuTest, AnIpcHandleThisProcessCannotOpenFallsBackToTcpStaging) {
  if (!fake_) GTEST_SKIP() << "needs the fake driver to refuse the handle";
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  PeerProcess* peer = SpawnGpuPeer(kMiB, 3);
  ASSERT_NE(peer, nullptr);
  std::vector<unsigned char> host(kMiB), back(kMiB);
  FillPattern(host.data(), kMiB, 4, 0);
  ASSERT_OK(engine().RegisterMemory(host.data(), kMiB, "cpu"));
  ASSERT_OK(engine().RegisterMemory(back.data(), kMiB, "cpu"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  fake_->SetIpcOpenResult(400);  // CUDA_ERROR_INVALID_HANDLE
  fake_->ResetCopiedBytes();
  ASSERT_OK(engine().TransferSync(
      TransferRequest{Opcode::kWrite, host.data(), seg, peer->buffer_addr(), kMiB}));
  EXPECT_EQ(peer->Call(Checked(4, 0, kMiB)), "OK");
  fake_->SetIpcOpenResult(0);
  ASSERT_OK(engine().TransferSync(
      TransferRequest{Opcode::kRead, back.data(), seg, peer->buffer_addr(), kMiB}));
  EXPECT_EQ(CheckPattern(back.data(), kMiB, 4, 0), std::nullopt);
  for (auto d : {FakeCuda::kHostToDevice, FakeCuda::kDeviceToHost, FakeCuda::kDeviceToDevice}) {
    EXPECT_EQ(fake_->CopiedBytes(d), 0u) << "direction " << d << ": cuda_ipc was used after all";
  }
}

// GPU memory on both sides over tcp (another host, as far as Ferry knows):
// staged by the initiator and by the target, every byte both ways.
TEST_F(GpuTest, GpuToGpuOverTcpIsStagedOnBothSides) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine("tcp"));
  constexpr uint64_t kSize = 4 * kMiB, kPeerSeed = 3, kData = 6;
  PeerProcess* peer = SpawnGpuPeer(kSize, kPeerSeed);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = DeviceBuffer(kSize, kData);
  unsigned char* back = DeviceBuffer(kSize, 0);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(back, nullptr);
  ASSERT_OK(engine().RegisterMemory(local, kSize, "cuda:0"));
  ASSERT_OK(engine().RegisterMemory(back, kSize, "cuda:0"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  std::vector<TransferRequest> writes;
  for (uint64_t o = 0, i = 0; o < kSize / 2; ++i) {
    const uint64_t len = std::min<uint64_t>(kSize / 2 - o, 1 + Mix64(i) % (700 * kKiB));
    writes.push_back({Opcode::kWrite, local + o, seg, peer->buffer_addr() + o, len});
    o += len;
  }
  ASSERT_OK(engine().TransferSync(writes));
  EXPECT_EQ(peer->Call(Checked(kData, 0, kSize / 2)), "OK");
  EXPECT_EQ(peer->Call(Checked(kPeerSeed, kSize / 2, kSize / 2)), "OK");
  ASSERT_OK(
      engine().TransferSync(TransferRequest{Opcode::kRead, back, seg, peer->buffer_addr(), kSize}));
  EXPECT_TRUE(DeviceHolds(back, 0, kSize / 2, kData, 0));
  EXPECT_TRUE(DeviceHolds(back, kSize / 2, kSize / 2, kPeerSeed, kSize / 2));
}

// A peer that dies: transfers to its GPU memory fail as unavailable (its
// process is gone), not success into memory nobody reads.
TEST_F(GpuTest, APeerThatDiedFailsItsGpuTransfers) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  PeerProcess* peer = SpawnGpuPeer(kMiB, 3);
  ASSERT_NE(peer, nullptr);
  std::vector<unsigned char> host(kMiB);
  ASSERT_OK(engine().RegisterMemory(host.data(), kMiB, "cpu"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  const TransferRequest w{Opcode::kWrite, host.data(), seg, peer->buffer_addr(), kMiB};
  ASSERT_OK(engine().TransferSync(w));
  peer->Kill();
  EXPECT_THAT(engine().TransferSync(w),
              AnyOf(StatusIs(StatusCode::kUnavailable), StatusIs(StatusCode::kDeadlineExceeded)));
}

// ---------------------------------------------------------------------------
// Figures for scripts/device-check.sh (disabled: run with
// --gtest_also_run_disabled_tests). It prints throughput and ratios measured
// in this one run and asserts only that every transfer succeeded; speed is
// judged by whoever reads the figures (docs/benchmarks.md), never by a test.
class GpuBench : public GpuTest {
 protected:
  static double Seconds(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  }

  // GB/s of `bytes` moved per round of `round` over about `duration`.
  template <typename Round>
  double Measure(uint64_t bytes, std::chrono::milliseconds duration, Round round) {
    EXPECT_OK(round());  // warm-up: connections, IPC mappings, staging buffers
    uint64_t moved = 0;
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - start < duration) {
      const Status s = round();
      EXPECT_OK(s);
      if (!s.ok()) return 0;
      moved += bytes;
    }
    return static_cast<double>(moved) / Seconds(start) / 1e9;
  }

  // The rows `rounds` measured in turn, kPasses times over (A B C, A B C,
  // ...), each for kPass: the medians, so that a drift of the GPU's clocks
  // over the run reaches every row alike.
  struct Round {
    std::string name;
    std::function<Status()> run;
  };
  std::vector<double> Interleaved(uint64_t bytes, const std::vector<Round>& rounds) {
    constexpr int kPasses = 5;
    constexpr auto kPass = std::chrono::milliseconds(250);
    std::vector<std::vector<double>> got(rounds.size());
    for (int p = 0; p < kPasses; ++p) {
      for (size_t i = 0; i < rounds.size(); ++i)
        got[i].push_back(Measure(bytes, kPass, rounds[i].run));
    }
    std::vector<double> medians;
    for (auto& g : got) {
      std::sort(g.begin(), g.end());
      medians.push_back(g[g.size() / 2]);
    }
    return medians;
  }

  // Ferry's copy queue alone, in this process (one submission of `copies`,
  // waited for): the engine's share of a row is the difference.
  static Status QueueRound(internal::cuda::CopyQueue& q,
                           const std::vector<internal::cuda::Copy>& copies) {
    std::promise<Status> done;
    q.Submit(
        copies, [&](Status st) { done.set_value(std::move(st)); }, /*on_device=*/true);
    return done.get_future().get();
  }

  // Writes [0, size) of `local` to the peer's buffer in requests of `chunk`.
  Status WriteAll(SegmentHandle seg, unsigned char* local, uint64_t remote, uint64_t size,
                  uint64_t chunk = kMiB, Opcode op = Opcode::kWrite) {
    std::vector<TransferRequest> reqs;
    for (uint64_t o = 0; o < size; o += chunk)
      reqs.push_back({op, local + o, seg, remote + o, std::min(chunk, size - o)});
    return engine().TransferSync(reqs);
  }

  static void Row(const std::string& what, double gbs, const std::string& vs = "") {
    std::printf("gpu-bench %-52s %9.2f GB/s%s\n", what.c_str(), gbs, vs.c_str());
    std::fflush(stdout);
  }
  static std::string Ratio(double x, double base, const std::string& of) {
    char b[96];
    std::snprintf(b, sizeof(b), "  %5.2fx %s", base > 0 ? x / base : 0.0, of.c_str());
    return b;
  }
};

// The figures of issue 32, each against a baseline measured in this run
// (the rows of each part measured in turn, five times over: medians):
// 1. GPU -> GPU of another process through cuda_ipc, requests of 32 KiB,
//    1 MiB and 64 MiB, against the driver's own device-to-device copies of
//    the same sizes (cuMemcpyAsync each, and one cuMemcpyBatchAsync);
// 2. the KV page-16 preset (Llama-8B, 4K tokens: 16,384 pages of 32 KiB,
//    scattered on both sides) GPU -> GPU of another process, against the
//    same copies made by the driver in this process;
// 3. GPU -> a peer's host memory over tcp and shm (staged through this
//    side's page-locked buffers), against the same transfer from host memory;
// 4. host memory -> a peer's GPU memory over tcp (staged by the target),
//    with the target's staging page-locked and pageable (the older build).
TEST_F(GpuBench, DISABLED_Figures) {
  constexpr uint64_t kSize = 64 * kMiB;
  if (fake_) fake_->SetCopyDelayUs(0);
  std::printf("gpu-bench driver %s, batch copies %s\n", TestCudaDriverLibrary().c_str(),
              driver_->has_batch_copies() ? "yes" : "no");
  unsigned char* a = DeviceBuffer(kSize, 1);
  unsigned char* b = DeviceBuffer(kSize, 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);

  // 1. Device to device, by request size.
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  PeerProcess* gpu_peer = SpawnGpuPeer(kSize, 3);
  ASSERT_NE(gpu_peer, nullptr);
  ASSERT_OK(engine().RegisterMemory(a, kSize, "cuda:0"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle gseg, engine().OpenSegment(gpu_peer->peer_id()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<internal::cuda::CopyQueue> queue,
                       internal::cuda::CopyQueue::Create(*driver_, 0));
  const std::string kernel = queue->has_kernel() ? "" : " (no kernel)";
  for (uint64_t chunk : {32 * kKiB, kMiB, 64 * kMiB}) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> lengths;
    std::vector<internal::cuda::Copy> copies;
    for (uint64_t o = 0; o < kSize; o += chunk) {
      dsts.push_back(b + o);
      srcs.push_back(a + o);
      lengths.push_back(chunk);
      copies.push_back({b + o, a + o, chunk});
    }
    const std::string size = std::to_string(chunk / kKiB) + " KiB";
    std::vector<Round> rounds = {
        {"cuMemcpyAsync each (baseline)",
         [&] { return gpu_->CopyMany(dsts, srcs, lengths, false); }},
        {"Ferry's copy queue in-process" + kernel, [&] { return QueueRound(*queue, copies); }},
        {"Ferry cuda_ipc to another process",
         [&] { return WriteAll(gseg, a, gpu_peer->buffer_addr(), kSize, chunk); }}};
    if (driver_->has_batch_copies()) {
      rounds.insert(rounds.begin() + 1, {"cuMemcpyBatchAsync", [&] {
                                           return gpu_->CopyMany(dsts, srcs, lengths, true);
                                         }});
    }
    const std::vector<double> got = Interleaved(kSize, rounds);
    for (size_t i = 0; i < rounds.size(); ++i) {
      const bool ferry = i + 1 == rounds.size();
      Row("DtoD " + size + ": " + rounds[i].name, got[i],
          i == 0 ? "" : Ratio(got[i], got[0], ferry ? "each (goal >= 0.9)" : "each"));
    }
  }
  queue.reset();
  engine_.reset();

  // 2. The KV page-16 preset.
  {
    constexpr uint64_t kPage = 32 * kKiB, kPages = 16384, kKv = kPage * kPages;
    unsigned char* kv = DeviceBuffer(kKv, 5);
    unsigned char* kv2 = DeviceBuffer(kKv, 6);
    ASSERT_NE(kv, nullptr);
    ASSERT_NE(kv2, nullptr);
    ASSERT_NO_FATAL_FAILURE(CreateEngine());
    PeerProcess* kv_peer = SpawnGpuPeer(kKv, 7);
    ASSERT_NE(kv_peer, nullptr);
    ASSERT_OK(engine().RegisterMemory(kv, kKv, "cuda:0"));
    ASSERT_OK(engine().RegisterMemory(kv2, kKv, "cuda:0"));
    ASSERT_OK_AND_ASSIGN(SegmentHandle kseg, engine().OpenSegment(kv_peer->peer_id()));
    std::vector<uint64_t> from(kPages), to(kPages);
    for (uint64_t i = 0; i < kPages; ++i) from[i] = to[i] = i;
    std::mt19937_64 rng(16);
    std::shuffle(from.begin(), from.end(), rng);
    std::shuffle(to.begin(), to.end(), rng);
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> lengths(kPages, kPage);
    std::vector<TransferRequest> reqs;
    for (uint64_t i = 0; i < kPages; ++i) {
      dsts.push_back(kv2 + to[i] * kPage);
      srcs.push_back(kv + from[i] * kPage);
      reqs.push_back({Opcode::kWrite, kv + from[i] * kPage, kseg,
                      kv_peer->buffer_addr() + to[i] * kPage, kPage});
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<internal::cuda::CopyQueue> q,
                         internal::cuda::CopyQueue::Create(*driver_, 0));
    std::vector<internal::cuda::Copy> copies;
    for (uint64_t i = 0; i < kPages; ++i) copies.push_back({dsts[i], srcs[i], kPage});
    // The same as a prepared transfer (NIXL's way: lists made once, indices).
    const DescRow local_rows[] = {{reinterpret_cast<uint64_t>(kv), kPage, kPage, kPages}};
    const DescRow remote_rows[] = {{kv_peer->buffer_addr(), kPage, kPage, kPages}};
    ASSERT_OK_AND_ASSIGN(DescListHandle ll, engine().PrepareLocalList(local_rows));
    ASSERT_OK_AND_ASSIGN(DescListHandle rl, engine().PrepareRemoteList(kseg, remote_rows));
    std::vector<uint32_t> li(from.begin(), from.end()), ri(to.begin(), to.end());
    ASSERT_OK_AND_ASSIGN(TransferHandle xfer,
                         engine().MakeTransfer(Opcode::kWrite, ll, li, rl, ri));
    std::vector<Round> rounds = {
        {"cuMemcpyAsync each (baseline)",
         [&] { return gpu_->CopyMany(dsts, srcs, lengths, false); }},
        {"Ferry's copy queue in-process" + std::string(q->has_kernel() ? "" : " (no kernel)"),
         [&] { return QueueRound(*q, copies); }},
        {"Ferry cuda_ipc to another process", [&] { return engine().TransferSync(reqs); }},
        {"Ferry cuda_ipc, a prepared transfer", [&] {
           Status posted = engine().PostTransfer(xfer);
           return posted.ok() ? engine().WaitTransfer(xfer, std::chrono::seconds(30)) : posted;
         }}};
    if (driver_->has_batch_copies()) {
      rounds.insert(rounds.begin() + 1, {"cuMemcpyBatchAsync", [&] {
                                           return gpu_->CopyMany(dsts, srcs, lengths, true);
                                         }});
    }
    const std::vector<double> got = Interleaved(kKv, rounds);
    for (size_t i = 0; i < rounds.size(); ++i) {
      Row("KV page-16 (16,384 x 32 KiB): " + rounds[i].name, got[i],
          i == 0 ? "" : Ratio(got[i], got[0], "each"));
    }
    ASSERT_OK(engine().ReleaseTransfer(xfer));
    // Every byte of one write of new contents checked: page to[i] of the
    // peer is page from[i] here.
    std::vector<unsigned char> mine(kKv);
    FillPattern(mine.data(), kKv, 9, 0);
    ASSERT_OK(gpu_->Copy(kv, mine.data(), kKv));
    ASSERT_OK(engine().TransferSync(reqs));
    ASSERT_OK(engine().TransferSync(
        std::vector<TransferRequest>{{Opcode::kRead, kv2, kseg, kv_peer->buffer_addr(), kKv}}));
    std::vector<unsigned char> theirs(kKv);
    ASSERT_OK(gpu_->Copy(theirs.data(), kv2, kKv));
    for (uint64_t i = 0; i < kPages; ++i) {
      ASSERT_EQ(0, std::memcmp(theirs.data() + to[i] * kPage, mine.data() + from[i] * kPage, kPage))
          << "page " << i;
    }
    engine_.reset();
  }

  // 3. From GPU memory to a peer's host memory, staged here.
  peers_.push_back(std::make_unique<PeerProcess>());
  PeerProcess* host_peer = peers_.back().get();
  ASSERT_TRUE(
      host_peer->Start(FERRY_TEST_PEER_PATH, {"--size", std::to_string(kSize), "--seed", "4"}));
  std::vector<unsigned char> host(kSize);
  for (const char* transport : {"tcp", "shm"}) {
    ASSERT_NO_FATAL_FAILURE(CreateEngine(transport));
    ASSERT_OK(engine().RegisterMemory(host.data(), kSize, "cpu"));
    ASSERT_OK(engine().RegisterMemory(b, kSize, "cuda:0"));
    ASSERT_OK_AND_ASSIGN(SegmentHandle hseg, engine().OpenSegment(host_peer->peer_id()));
    const std::string t = transport;
    const uint64_t remote = host_peer->buffer_addr();
    const std::vector<Round> rounds = {
        {"host -> peer host (baseline), 1 MiB requests",
         [&] { return WriteAll(hseg, host.data(), remote, kSize); }},
        {"GPU -> peer host (staged here)", [&] { return WriteAll(hseg, b, remote, kSize); }},
        {"peer host -> host (baseline, reads)",
         [&] { return WriteAll(hseg, host.data(), remote, kSize, kMiB, Opcode::kRead); }},
        {"peer host -> GPU (staged here, reads)",
         [&] { return WriteAll(hseg, b, remote, kSize, kMiB, Opcode::kRead); }}};
    const std::vector<double> got = Interleaved(kSize, rounds);
    for (size_t i = 0; i < rounds.size(); ++i) {
      Row(t + " " + rounds[i].name, got[i],
          i % 2 == 0 ? "" : Ratio(got[i], got[i - 1], "host (goal >= 0.8)"));
    }
    engine_.reset();
  }

  // 4. Host memory to and from a peer's GPU memory over tcp: the target
  // stages, through page-locked and through pageable memory.
  ASSERT_NO_FATAL_FAILURE(CreateEngine("tcp"));
  ASSERT_OK(engine().RegisterMemory(host.data(), kSize, "cpu"));
  std::vector<Round> rounds;
  std::vector<SegmentHandle> segs;
  for (bool pageable : {false, true}) {
    peers_.push_back(std::make_unique<PeerProcess>());
    PeerProcess* p = peers_.back().get();
    ASSERT_TRUE(p->Start(FERRY_TEST_PEER_PATH, {"--size", std::to_string(kSize), "--seed", "8",
                                                "--gpu", TestCudaDriverLibrary(),
                                                "--pageable-gpu-staging", pageable ? "1" : "0"}));
    ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(p->peer_id()));
    const std::string how = pageable ? "pageable" : "page-locked";
    const uint64_t remote = p->buffer_addr();
    rounds.push_back({"tcp host -> peer GPU, target stages " + how,
                      [&, seg, remote] { return WriteAll(seg, host.data(), remote, kSize); }});
    rounds.push_back({"tcp peer GPU -> host (reads), target stages " + how, [&, seg, remote] {
                        return WriteAll(seg, host.data(), remote, kSize, kMiB, Opcode::kRead);
                      }});
  }
  const std::vector<double> got = Interleaved(kSize, rounds);
  for (size_t i = 0; i < rounds.size(); ++i) {
    Row(rounds[i].name, got[i], i < 2 ? "" : Ratio(got[i], got[i - 2], "page-locked"));
  }
}

}  // namespace
}  // namespace ferry::test
