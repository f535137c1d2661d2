// Many peers per engine (docs/architecture.md, "Peer links"): running out of
// file descriptors, links closed when idle and opened again unnoticed, the
// budget of open links (max_peer_links), and a peer restarted while its link
// sat idle. Peers that must hold their own descriptors (the exhaustion test)
// or be frozen (a link kept busy) are ferry_test_peer children.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/conformance/conformance_fixture.h"
#include "tests/integration/peer_process.h"
#include "tests/testing/fake_cuda.h"
#include "tests/testing/fd_limit.h"
#include "tests/testing/gpu_memory.h"

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Polls `done` until it holds or `bound` passes (a condition, not a time:
// the bound only ends a failing test).
template <class F>
bool WaitFor(F done, std::chrono::milliseconds bound = std::chrono::seconds(20)) {
  const Clock::time_point end = Clock::now() + bound;
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Descriptors open in process `pid` (-1 if it cannot tell).
int FdsOf(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

// Sockets open in this process (-1 if it cannot tell).
int SocketsOfThisProcess() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(it->path(), link_ec).string();
    if (!link_ec && target.rfind("socket:", 0) == 0) ++n;
  }
  return ec ? -1 : n;
}

// Writes `len` bytes of pattern `seed` from `src` to `remote` and reads them
// back into `back`; both must succeed and the bytes match.
::testing::AssertionResult RoundTrip(Engine& e, SegmentHandle seg, unsigned char* src,
                                     unsigned char* back, uint64_t remote, size_t len,
                                     uint64_t seed) {
  FillPattern(src, len, seed);
  std::memset(back, 0, len);
  Status w = e.TransferSync(TransferRequest{Opcode::kWrite, src, seg, remote, len});
  if (!w.ok()) return ::testing::AssertionFailure() << "write: " << w;
  Status r = e.TransferSync(TransferRequest{Opcode::kRead, back, seg, remote, len});
  if (!r.ok()) return ::testing::AssertionFailure() << "read: " << r;
  if (std::memcmp(src, back, len) != 0) return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

class IdleLinks : public ::testing::TestWithParam<std::string> {};

// The socket transports hold descriptors per link; local holds none but
// follows the same rules.
INSTANTIATE_TEST_SUITE_P(Transports, IdleLinks, ::testing::Values("tcp", "shm", "local"),
                         [](const auto& info) { return info.param; });

TEST_P(IdleLinks, ClosedWhenIdleAndReopenedUnnoticed) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  EngineOptions i = ConformanceOptions(GetParam());
  i.idle_link_timeout = std::chrono::milliseconds(20);
  EnginePair pair;
  pair.Start(GetParam(), i, ConformanceOptions(GetParam()));
  if (HasFatalFailure()) return;
  constexpr size_t kLen = 256 * 1024;
  unsigned char* src = pair.Alloc(kLen, &pair.initiator());
  unsigned char* back = pair.Alloc(kLen, &pair.initiator());
  unsigned char* dst = pair.Alloc(kLen, &pair.target());
  ASSERT_NE(src, nullptr);
  ASSERT_NE(back, nullptr);
  ASSERT_NE(dst, nullptr);
  const uint64_t remote = reinterpret_cast<uintptr_t>(dst);
  // A prepared transfer made on the first link is posted on a later one.
  ASSERT_OK(pair.initiator().QuerySegment(pair.segment()));  // learns the target's region
  const DescRow local_row{reinterpret_cast<uintptr_t>(src), kLen};
  const DescRow remote_row{remote, kLen};
  ASSERT_OK_AND_ASSIGN(DescListHandle local_list,
                       pair.initiator().PrepareLocalList(std::span(&local_row, 1)));
  ASSERT_OK_AND_ASSIGN(DescListHandle remote_list, pair.initiator().PrepareRemoteList(
                                                       pair.segment(), std::span(&remote_row, 1)));
  const uint32_t zero = 0;
  ASSERT_OK_AND_ASSIGN(TransferHandle t, pair.initiator().MakeTransfer(
                                             Opcode::kWrite, local_list, std::span(&zero, 1),
                                             remote_list, std::span(&zero, 1)));

  // Each round's link closes (counted from before the round: it may close
  // as soon as the round ends), then the next round opens another.
  uint64_t closed = pair.initiator().GetMetrics().links_closed_idle;
  ASSERT_TRUE(RoundTrip(pair.initiator(), pair.segment(), src, back, remote, kLen, 1));
  for (uint64_t round = 2; round < 5; ++round) {
    ASSERT_TRUE(WaitFor([&] { return pair.initiator().GetMetrics().links_closed_idle > closed; }))
        << "the idle link was never closed";
    EXPECT_EQ(pair.initiator().GetMetrics().peer_links_open, 0u);
    closed = pair.initiator().GetMetrics().links_closed_idle;
    ASSERT_TRUE(RoundTrip(pair.initiator(), pair.segment(), src, back, remote, kLen, round));
  }
  ASSERT_TRUE(WaitFor([&] { return pair.initiator().GetMetrics().links_closed_idle > closed; }));
  FillPattern(src, kLen, Mix64(9));
  ASSERT_OK(pair.initiator().PostTransfer(t));
  ASSERT_OK(pair.initiator().WaitTransfer(t, kWaitTimeout));
  EXPECT_EQ(std::memcmp(src, dst, kLen), 0);
  const EngineMetrics m = pair.initiator().GetMetrics();
  EXPECT_EQ(m.links_opened, m.links_closed_idle + m.peer_links_open);
  EXPECT_GE(m.links_opened, 5u);
}

// Posts from many threads while links close after 1 ms without a request —
// closed by the initiator (its idle_link_timeout) or at the target's request
// (the target's: kGoAway): a post that races a close goes on a new link, and
// no request fails. The threads post in bursts; between bursts all of them
// pause for 0 to 2.1 ms, so the link goes idle and is closed around the time
// the next burst begins. What is asserted is that every request succeeded
// with its bytes, not how many links closed.
void RaceClosesWithPosts(const std::string& transport, std::chrono::milliseconds initiator_timeout,
                         std::chrono::milliseconds target_timeout) {
  EngineOptions i = ConformanceOptions(transport);
  i.idle_link_timeout = initiator_timeout;
  EngineOptions t = ConformanceOptions(transport);
  t.idle_link_timeout = target_timeout;
  EnginePair pair;
  pair.Start(transport, i, t);
  if (::testing::Test::HasFatalFailure()) return;
  constexpr int kThreads = 6, kRounds = 80;
  constexpr size_t kSlot = 16 * 1024;
  unsigned char* src = pair.Alloc(kThreads * kSlot, &pair.initiator());
  unsigned char* back = pair.Alloc(kThreads * kSlot, &pair.initiator());
  unsigned char* dst = pair.Alloc(kThreads * kSlot, &pair.target());
  ASSERT_NE(src, nullptr);
  ASSERT_NE(back, nullptr);
  ASSERT_NE(dst, nullptr);
  std::atomic<int> failures{0};
  int round = 0;
  std::barrier burst(kThreads, [&]() noexcept {
    std::this_thread::sleep_for(std::chrono::microseconds(700 * (round++ % 4)));
  });
  std::vector<std::thread> threads;
  for (int k = 0; k < kThreads; ++k) {
    threads.emplace_back([&, k] {
      for (int r = 0; r < kRounds; ++r) {
        auto ok =
            RoundTrip(pair.initiator(), pair.segment(), src + k * kSlot, back + k * kSlot,
                      reinterpret_cast<uintptr_t>(dst) + k * kSlot, kSlot, Mix64(k * 1000 + r));
        if (!ok) {
          ADD_FAILURE() << "thread " << k << " round " << r << ": " << ok.message();
          failures.fetch_add(1);
        }
        burst.arrive_and_wait();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  // At least one close happened (here, after the threads: bounded wait).
  ASSERT_TRUE(WaitFor([&] { return pair.initiator().GetMetrics().links_closed_idle > 0; }));
  const EngineMetrics m = pair.initiator().GetMetrics();
  EXPECT_EQ(m.links_opened, m.links_closed_idle + m.peer_links_open);
  std::printf("[ info ] %s: %llu links opened, %llu closed idle\n", transport.c_str(),
              static_cast<unsigned long long>(m.links_opened),
              static_cast<unsigned long long>(m.links_closed_idle));
}

TEST_P(IdleLinks, CloseRacingPostsLosesNoRequest) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  RaceClosesWithPosts(GetParam(), std::chrono::milliseconds(1), std::chrono::milliseconds(0));
}

TEST_P(IdleLinks, ClosesTheTargetAsksForRacingPostsLoseNoRequest) {
  if (GetParam() == "local") GTEST_SKIP() << "a local link has no stream for the target to close";
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  RaceClosesWithPosts(GetParam(), std::chrono::milliseconds(0), std::chrono::milliseconds(1));
}

// The target closes idle links too: an initiator that never closes one
// itself (idle_link_timeout 0) is asked to by the target after the target's
// timeout (kGoAway), closes it (the sweeper, within a second), both ends'
// descriptors are released, and the next request opens a new link unnoticed.
TEST_P(IdleLinks, TargetAsksAnInitiatorThatNeverClosesToClose) {
  if (GetParam() == "local") GTEST_SKIP() << "a local link has no stream for the target to close";
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  EngineOptions i = ConformanceOptions(GetParam());
  i.idle_link_timeout = std::chrono::milliseconds(0);
  EngineOptions t = ConformanceOptions(GetParam());
  t.idle_link_timeout = std::chrono::milliseconds(20);
  EnginePair pair;
  pair.Start(GetParam(), i, t);
  if (HasFatalFailure()) return;
  constexpr size_t kLen = 64 * 1024;
  unsigned char* src = pair.Alloc(kLen, &pair.initiator());
  unsigned char* back = pair.Alloc(kLen, &pair.initiator());
  unsigned char* dst = pair.Alloc(kLen, &pair.target());
  ASSERT_NE(src, nullptr);
  ASSERT_NE(back, nullptr);
  ASSERT_NE(dst, nullptr);
  const uint64_t remote = reinterpret_cast<uintptr_t>(dst);
  // Both engines live in this process: its sockets before any link, and
  // after each link closed (both ends).
  const int no_link = SocketsOfThisProcess();
  ASSERT_GT(no_link, 0);
  for (uint64_t round = 1; round <= 2; ++round) {
    ASSERT_TRUE(RoundTrip(pair.initiator(), pair.segment(), src, back, remote, kLen, round));
    ASSERT_TRUE(WaitFor([&] { return pair.initiator().GetMetrics().links_closed_idle == round; }))
        << "round " << round << ": the link the target asked to close is still open";
    EXPECT_EQ(pair.initiator().GetMetrics().peer_links_open, 0u);
    EXPECT_TRUE(WaitFor([&] { return SocketsOfThisProcess() <= no_link; }))
        << "round " << round << ": " << SocketsOfThisProcess() << " sockets open, " << no_link
        << " before the link";
  }
  ASSERT_TRUE(RoundTrip(pair.initiator(), pair.segment(), src, back, remote, kLen, 3));
  EXPECT_EQ(pair.initiator().GetMetrics().links_opened, 3u);
}

// GPU memory of the initiator, staged through page-locked buffers (the
// tests' fake CUDA driver: copies finish late): a link is not idle while a
// staged slice still waits for its copy, so closes after 1 ms of idleness
// never cut one off. Every byte is checked.
TEST_P(IdleLinks, StagedGpuTransfersRacingIdleCloses) {
  if (GetParam() == "local") GTEST_SKIP() << "local copies GPU memory itself (no staging)";
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  const internal::CudaDriver& driver = internal::CudaDriver::Load(TestCudaDriverLibrary());
  if (!driver.data_path()) GTEST_SKIP() << "no CUDA driver: " << driver.why_no_data_path();
  std::unique_ptr<FakeCuda> fake;
  if (TestCudaDriverIsFake()) fake = std::make_unique<FakeCuda>();
  GpuMemory gpu(driver);
  EngineOptions i = ConformanceOptions(GetParam());
  UseTestCudaDriver(&i);
  i.idle_link_timeout = std::chrono::milliseconds(1);
  EnginePair pair;
  pair.Start(GetParam(), i, ConformanceOptions(GetParam()));
  if (HasFatalFailure()) return;
  constexpr uint64_t kSize = 4 << 20;
  unsigned char* dev = gpu.Allocate(kSize, 31);
  ASSERT_NE(dev, nullptr);
  ASSERT_OK(pair.initiator().RegisterMemory(dev, kSize, "cuda:0"));
  unsigned char* host = pair.Alloc(kSize, &pair.target());
  ASSERT_NE(host, nullptr);
  const uint64_t remote = reinterpret_cast<uintptr_t>(host);
  for (uint64_t round = 0; round < 6; ++round) {
    // Counted before the round: its link may close as soon as it ends.
    const uint64_t closed = pair.initiator().GetMetrics().links_closed_idle;
    // GPU -> host in 64 KiB pieces (more slices than staging buffers), then
    // host (refilled) -> GPU, each checked.
    std::vector<TransferRequest> writes;
    for (uint64_t off = 0; off < kSize; off += 64 << 10) {
      writes.push_back({Opcode::kWrite, dev + off, pair.segment(), remote + off, 64 << 10});
    }
    ASSERT_OK(pair.initiator().TransferSync(writes)) << "round " << round;
    ASSERT_EQ(CheckPattern(host, kSize, 31 + round, 0), std::nullopt) << "round " << round;
    FillPattern(host, kSize, 32 + round, 0);
    std::vector<TransferRequest> reads;
    for (uint64_t off = 0; off < kSize; off += 64 << 10) {
      reads.push_back({Opcode::kRead, dev + off, pair.segment(), remote + off, 64 << 10});
    }
    ASSERT_OK(pair.initiator().TransferSync(reads)) << "round " << round;
    ASSERT_TRUE(gpu.Holds(dev, 0, kSize, 32 + round, 0)) << "round " << round;
    ASSERT_TRUE(WaitFor([&] { return pair.initiator().GetMetrics().links_closed_idle > closed; }));
  }
}

// Four target engines, links to at most two of them: each new peer closes
// the least recently used idle link.
TEST(LinkBudget, LeastRecentlyUsedIdleLinkMakesRoom) {
  EngineOptions i = ConformanceOptions("tcp");
  i.max_peer_links = 2;
  i.idle_link_timeout = std::chrono::milliseconds(0);
  // Buffers before engines: the engines (their threads, which read and
  // write them) are gone before the buffers are freed.
  constexpr size_t kLen = 64 * 1024;
  AlignedBuffer src(kLen), back(kLen);
  ASSERT_OK_AND_ASSIGN(auto initiator, Engine::Create(i));
  ASSERT_OK(initiator->RegisterMemory(src.data(), kLen));
  ASSERT_OK(initiator->RegisterMemory(back.data(), kLen));
  std::vector<std::unique_ptr<AlignedBuffer>> dst;  // outlives the targets
  std::vector<std::unique_ptr<Engine>> targets;
  std::vector<SegmentHandle> seg;
  for (int k = 0; k < 4; ++k) {
    ASSERT_OK_AND_ASSIGN(auto t, Engine::Create(ConformanceOptions("tcp")));
    dst.push_back(std::make_unique<AlignedBuffer>(kLen));
    ASSERT_OK(t->RegisterMemory(dst.back()->data(), kLen));
    ASSERT_OK_AND_ASSIGN(SegmentHandle h, initiator->OpenSegment(t->PeerId()));
    seg.push_back(h);
    targets.push_back(std::move(t));
  }
  uint64_t seed = 100;
  auto use = [&](int k) {
    return RoundTrip(*initiator, seg[k], src.data(), back.data(),
                     reinterpret_cast<uintptr_t>(dst[k]->data()), kLen, ++seed);
  };
  auto metrics = [&] { return initiator->GetMetrics(); };
  enum { A, B, C, D };
  ASSERT_TRUE(use(A));
  ASSERT_TRUE(use(B));
  EXPECT_EQ(metrics().links_evicted, 0u);
  ASSERT_TRUE(use(C));  // A is the least recently used: closed
  EXPECT_EQ(metrics().links_evicted, 1u);
  EXPECT_EQ(metrics().peer_links_open, 2u);
  ASSERT_TRUE(use(D));  // then B
  EXPECT_EQ(metrics().links_evicted, 2u);
  EXPECT_EQ(metrics().links_opened, 4u);
  ASSERT_TRUE(use(C));  // C's link is still open
  EXPECT_EQ(metrics().links_opened, 4u);
  ASSERT_TRUE(use(A));  // A again: D (used before C) makes room
  EXPECT_EQ(metrics().links_opened, 5u);
  EXPECT_EQ(metrics().links_evicted, 3u);
  ASSERT_TRUE(use(C));
  EXPECT_EQ(metrics().links_opened, 5u);
  EXPECT_EQ(metrics().peer_links_open, 2u);
}

// With every link busy (a write in flight to a frozen peer process), a new
// peer waits for room until connect_timeout and then fails naming the
// budget; once the frozen peer answers, its link is idle and makes room.
TEST(LinkBudget, AllLinksBusyWaitsThenResourceExhausted) {
  PeerProcess frozen;
  ASSERT_TRUE(frozen.Start(FERRY_TEST_PEER_PATH, {"--size", "65536"}));
  EngineOptions i = ConformanceOptions("tcp");
  i.max_peer_links = 1;
  i.idle_link_timeout = std::chrono::milliseconds(0);
  i.connect_timeout = std::chrono::milliseconds(300);
  // Buffers before engines: the engines (their threads, which read and
  // write them) are gone before the buffers are freed.
  constexpr size_t kLen = 64 * 1024;
  AlignedBuffer src(kLen), back(kLen), dst(kLen);
  ASSERT_OK_AND_ASSIGN(auto initiator, Engine::Create(i));
  ASSERT_OK_AND_ASSIGN(auto target, Engine::Create(ConformanceOptions("tcp")));
  ASSERT_OK(initiator->RegisterMemory(src.data(), kLen));
  ASSERT_OK(initiator->RegisterMemory(back.data(), kLen));
  ASSERT_OK(target->RegisterMemory(dst.data(), kLen));
  ASSERT_OK_AND_ASSIGN(SegmentHandle busy, initiator->OpenSegment(frozen.peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle other, initiator->OpenSegment(target->PeerId()));
  ASSERT_TRUE(RoundTrip(*initiator, busy, src.data(), back.data(), frozen.buffer_addr(), kLen, 1));

  ASSERT_TRUE(frozen.Freeze());
  ASSERT_OK_AND_ASSIGN(BatchId b, initiator->AllocateBatch(1));
  FillPattern(src.data(), kLen, 2);
  const TransferRequest held{Opcode::kWrite, src.data(), busy, frozen.buffer_addr(), kLen};
  ASSERT_OK(initiator->Submit(b, std::span(&held, 1)));
  Status s = initiator->TransferSync(TransferRequest{
      Opcode::kWrite, src.data(), other, reinterpret_cast<uintptr_t>(dst.data()), kLen});
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted, HasSubstr("max_peer_links = 1")));
  EXPECT_THAT(s, IsError(HasSubstr(target->PeerId())));

  frozen.Signal(SIGCONT);
  ASSERT_OK(initiator->WaitBatch(b, kWaitTimeout));
  ASSERT_OK(initiator->FreeBatch(b));
  ASSERT_TRUE(RoundTrip(*initiator, other, src.data(), back.data(),
                        reinterpret_cast<uintptr_t>(dst.data()), kLen, 3));
  EXPECT_EQ(initiator->GetMetrics().links_evicted, 1u);
  // The frozen peer's write landed before its link was closed.
  EXPECT_EQ(frozen.Call("CHECK 2"), "OK");
}

// A target restarted (same address, new instance) while the initiator's link
// to it sat idle and was closed: the next request reaches the new instance.
TEST(IdleLinkRestart, TargetRestartedWhileIdleIsReachedAtItsNewInstance) {
  EngineOptions i = ConformanceOptions("tcp");
  i.idle_link_timeout = std::chrono::milliseconds(20);
  // Buffers before engines: the engines (their threads, which read and
  // write them) are gone before the buffers are freed.
  constexpr size_t kLen = 64 * 1024;
  AlignedBuffer src(kLen), back(kLen), dst(kLen);
  ASSERT_OK_AND_ASSIGN(auto initiator, Engine::Create(i));
  ASSERT_OK(initiator->RegisterMemory(src.data(), kLen));
  ASSERT_OK(initiator->RegisterMemory(back.data(), kLen));
  ASSERT_OK_AND_ASSIGN(auto target, Engine::Create(ConformanceOptions("tcp")));
  ASSERT_OK(target->RegisterMemory(dst.data(), kLen));
  const uint16_t port = target->RpcPort();
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, initiator->OpenSegment(target->PeerId()));
  const uint64_t remote = reinterpret_cast<uintptr_t>(dst.data());
  ASSERT_TRUE(RoundTrip(*initiator, seg, src.data(), back.data(), remote, kLen, 1));
  ASSERT_OK_AND_ASSIGN(SegmentInfo before, initiator->DescribeSegment(seg));
  ASSERT_TRUE(WaitFor([&] { return initiator->GetMetrics().links_closed_idle > 0; }));

  target.reset();
  EngineOptions again = ConformanceOptions("tcp");
  again.listen_port = port;
  ASSERT_OK_AND_ASSIGN(target, Engine::Create(again));
  ASSERT_OK(target->RegisterMemory(dst.data(), kLen));
  ASSERT_TRUE(RoundTrip(*initiator, seg, src.data(), back.data(), remote, kLen, 2));
  ASSERT_OK_AND_ASSIGN(SegmentInfo after, initiator->DescribeSegment(seg));
  EXPECT_NE(after.instance_id, before.instance_id);
}

// The target's end of an idle link closes too: it sees the initiator's
// close (end of stream) and drops its streams.
TEST(IdleLinkRestart, TargetClosesItsEndWhenTheInitiatorClosesAnIdleLink) {
  PeerProcess peer;
  ASSERT_TRUE(peer.Start(FERRY_TEST_PEER_PATH, {"--size", "65536"}));
  EngineOptions i = ConformanceOptions("tcp");
  i.idle_link_timeout = std::chrono::milliseconds(50);
  i.tcp_streams = 2;
  // Buffers before engines: the engines (their threads, which read and
  // write them) are gone before the buffers are freed.
  constexpr size_t kLen = 64 * 1024;
  AlignedBuffer src(kLen), back(kLen);
  ASSERT_OK_AND_ASSIGN(auto initiator, Engine::Create(i));
  ASSERT_OK(initiator->RegisterMemory(src.data(), kLen));
  ASSERT_OK(initiator->RegisterMemory(back.data(), kLen));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, initiator->OpenSegment(peer.peer_id()));
  const int idle_fds = FdsOf(peer.pid());
  ASSERT_GT(idle_fds, 0);
  ASSERT_TRUE(RoundTrip(*initiator, seg, src.data(), back.data(), peer.buffer_addr(), kLen, 1));
  ASSERT_TRUE(WaitFor([&] { return initiator->GetMetrics().links_closed_idle > 0; }));
  EXPECT_TRUE(WaitFor([&] { return FdsOf(peer.pid()) <= idle_fds; }))
      << "the target still holds " << FdsOf(peer.pid()) << " descriptors, " << idle_fds
      << " before the link";
  ASSERT_TRUE(RoundTrip(*initiator, seg, src.data(), back.data(), peer.buffer_addr(), kLen, 2));
}

// Out of descriptors: a new link fails with RESOURCE_EXHAUSTED naming the
// limit (not UNAVAILABLE), the links already open keep working, and once
// the limit is raised the new link opens. The targets are other processes,
// so only this process's descriptors count; the limit is restored at the end.
TEST(FdLimit, ExhaustionIsResourceExhaustedAndLeavesOtherLinksWorking) {
  PeerProcess a, b;
  ASSERT_TRUE(a.Start(FERRY_TEST_PEER_PATH, {"--size", "65536"}));
  ASSERT_TRUE(b.Start(FERRY_TEST_PEER_PATH, {"--size", "65536"}));
  EngineOptions i = ConformanceOptions("tcp");
  i.raise_fd_limit = false;
  // Buffers before engines: the engines (their threads, which read and
  // write them) are gone before the buffers are freed.
  constexpr size_t kLen = 64 * 1024;
  AlignedBuffer src(kLen), back(kLen);
  ASSERT_OK_AND_ASSIGN(auto initiator, Engine::Create(i));
  ASSERT_OK(initiator->RegisterMemory(src.data(), kLen));
  ASSERT_OK(initiator->RegisterMemory(back.data(), kLen));
  ASSERT_OK_AND_ASSIGN(SegmentHandle sa, initiator->OpenSegment(a.peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle sb, initiator->OpenSegment(b.peer_id()));
  ASSERT_TRUE(RoundTrip(*initiator, sa, src.data(), back.data(), a.buffer_addr(), kLen, 1));

  OutOfDescriptors out;
  ASSERT_TRUE(out.lowered());
  Status s = initiator->TransferSync(
      TransferRequest{Opcode::kWrite, src.data(), sb, b.buffer_addr(), kLen});
  // The open link still moves bytes.
  const bool open_link_moves =
      RoundTrip(*initiator, sa, src.data(), back.data(), a.buffer_addr(), kLen, 2);
  ASSERT_TRUE(out.Restore());
  // Checked once the limit is back (OutOfDescriptors: UBSan's vptr check).
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted, HasSubstr("RLIMIT_NOFILE")));
  EXPECT_THAT(s, IsError(HasSubstr("soft limit RLIMIT_NOFILE = " + std::to_string(out.limit()))));
  EXPECT_THAT(s, IsError(HasSubstr("raise")));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("retry")));
  EXPECT_TRUE(open_link_moves);
  EXPECT_TRUE(RoundTrip(*initiator, sb, src.data(), back.data(), b.buffer_addr(), kLen, 3));
}

}  // namespace
}  // namespace ferry::test
