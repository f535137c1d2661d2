// A read that failed never lands later (docs/reliability.md, "Failed and
// timed-out requests"): the peer is frozen (SIGSTOP) with reads of its memory
// queued on the streams, they fail by their deadline, then the peer runs on
// and handles what it had received. Over shm the initiator copies lent
// ranges itself (kCopyLendRead), so nothing can move once the reads have
// failed; were the target still copying reads into this process (kCopyRead),
// it would write them here after the failure. Over tcp the stream is closed
// as the reads fail, so no late reply is read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/integration/peer_process.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/same_host.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/transport_params.h"

#ifndef FERRY_TEST_PEER_PATH
#error "FERRY_TEST_PEER_PATH must name the ferry_test_peer executable"
#endif

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using ::testing::AllOf;
using ::testing::HasSubstr;
constexpr uint64_t kMiB = 1024 * 1024;

// A peer process serving `size` bytes of pattern `seed` (`peer_args` added),
// and an engine over `transport` (a transport parameter: "tcp", "fabric_tcp")
// with `timeout`, `size` bytes of its memory registered, the peer's segment
// open and one 4 KiB read done: connected, and the peer answers reads.
struct FencedPeer {
  explicit FencedPeer(uint64_t size) : local(size) {}
  void Start(const std::string& transport, const char* seed, std::chrono::milliseconds timeout,
             std::vector<std::string> peer_args = {}) {
    std::vector<std::string> args = {"--size", std::to_string(local.size()), "--seed", seed};
    args.insert(args.end(), peer_args.begin(), peer_args.end());
    ASSERT_TRUE(peer.Start(FERRY_TEST_PEER_PATH, args));
    EngineOptions o;
    SetTransportOptions(transport, &o);
    o.listen_host = "127.0.0.1";
    o.transfer_timeout = timeout;
    ASSERT_OK_AND_ASSIGN(engine, Engine::Create(o));
    ASSERT_OK(engine->RegisterMemory(local.data(), local.size()));
    ASSERT_OK_AND_ASSIGN(seg, engine->OpenSegment(peer.peer_id()));
    ASSERT_OK(engine->TransferSync(
        TransferRequest{Opcode::kRead, local.data(), seg, peer.buffer_addr(), 4096}));
  }
  PeerProcess peer;
  AlignedBuffer local;
  std::unique_ptr<Engine> engine;
  SegmentHandle seg{};
};

class ReadFenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }
  void SetUp() override {
    if (GetParam() == "shm") FERRY_SKIP_WITHOUT_SAME_HOST_COPY();
  }
};

INSTANTIATE_TEST_SUITE_P(Transports, ReadFenceTest, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST_P(ReadFenceTest, AFailedReadNeverLandsAfterItsFailureIsReported) {
  constexpr uint64_t kSize = 8 * kMiB;
  FencedPeer p(kSize);
  ASSERT_NO_FATAL_FAILURE(p.Start(GetParam(), "611", 1500ms));
  auto& [peer, local, engine, seg] = p;

  std::memset(local.data(), 0xAB, kSize);
  ASSERT_TRUE(peer.Freeze());
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kSize; off += kMiB) {
    reqs.push_back({Opcode::kRead, local.data() + off, seg, peer.buffer_addr() + off, kMiB});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine->AllocateBatch(reqs.size()));
  ASSERT_OK(engine->Submit(batch, reqs));
  EXPECT_THAT(engine->WaitBatch(batch, 60s), IsError());
  ASSERT_OK_AND_ASSIGN(BatchStatus st, engine->GetBatchStatus(batch));
  EXPECT_EQ(st.failed, reqs.size());
  EXPECT_OK(engine->FreeBatch(batch));

  // The peer runs on and handles the requests it had received.
  peer.Signal(SIGCONT);
  EXPECT_EQ(peer.Call("PING"), "PONG");
  std::this_thread::sleep_for(500ms);  // room for a late copy to happen, were one possible
  size_t changed = 0;
  for (uint64_t i = 0; i < kSize; ++i) changed += local.data()[i] != 0xAB;
  EXPECT_EQ(changed, 0u) << "bytes of failed reads landed after the failure was reported";

  // The peer is reached again, and reads work.
  ASSERT_OK(engine->TransferSync(
      TransferRequest{Opcode::kRead, local.data(), seg, peer.buffer_addr(), kMiB}));
}

// The same fence for a cancellation (Engine::CancelBatch, CancelTransfer):
// reads of a frozen peer's memory are cancelled while they wait for it; the
// peer then runs on and answers them (tcp: replies arrive on a stream that
// stays open; shm: the lent ranges reach the initiator), and none of their
// bytes may land after the cancel returned.
TEST_P(ReadFenceTest, ACancelledReadNeverLandsAfterTheCancelReturns) {
  constexpr uint64_t kSize = 8 * kMiB;
  FencedPeer p(kSize);
  ASSERT_NO_FATAL_FAILURE(p.Start(GetParam(), "612", 60s));  // cancelled, not timed out
  auto& [peer, local, engine, seg] = p;
  AlignedBuffer later(kSize);
  ASSERT_OK(engine->RegisterMemory(later.data(), kSize));

  // One batch of plain reads and one prepared transfer, both cancelled.
  std::memset(local.data(), 0xAB, kSize);
  ASSERT_TRUE(peer.Freeze());
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kSize / 2; off += kMiB) {
    reqs.push_back({Opcode::kRead, local.data() + off, seg, peer.buffer_addr() + off, kMiB});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine->AllocateBatch(reqs.size()));
  ASSERT_OK(engine->Submit(batch, reqs));
  const DescRow lrow{reinterpret_cast<uintptr_t>(local.data()) + kSize / 2, 64 * 1024, 64 * 1024,
                     64};
  const DescRow rrow{peer.buffer_addr() + kSize / 2, 64 * 1024, 64 * 1024, 64};
  ASSERT_OK_AND_ASSIGN(DescListHandle l, engine->PrepareLocalList(std::span(&lrow, 1)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r, engine->PrepareRemoteList(seg, std::span(&rrow, 1)));
  std::vector<uint32_t> idx(64);
  for (uint32_t i = 0; i < 64; ++i) idx[i] = 63 - i;  // reversed: 64 entries, none merged
  ASSERT_OK_AND_ASSIGN(TransferHandle t, engine->MakeTransfer(Opcode::kRead, l, idx, r, idx));
  ASSERT_OK(engine->PostTransfer(t));
  std::this_thread::sleep_for(200ms);  // the requests reach the frozen peer's socket
  ASSERT_OK(engine->CancelBatch(batch));
  ASSERT_OK(engine->CancelTransfer(t));
  ASSERT_OK_AND_ASSIGN(BatchStatus st, engine->GetBatchStatus(batch));
  EXPECT_EQ(st.failed, reqs.size());
  EXPECT_THAT(st.first_error, StatusIs(StatusCode::kCancelled));
  ASSERT_OK_AND_ASSIGN(TransferStatus ts, engine->GetTransferStatus(t));
  EXPECT_THAT(ts.status, StatusIs(StatusCode::kCancelled));
  EXPECT_OK(engine->FreeBatch(batch));

  // The peer runs on and answers what it had received; then reads over the
  // same streams, which come after the cancelled ones on each stream.
  peer.Signal(SIGCONT);
  EXPECT_EQ(peer.Call("PING"), "PONG");
  std::vector<TransferRequest> after;
  for (uint64_t off = 0; off < kSize; off += 256 * 1024) {
    after.push_back({Opcode::kRead, later.data() + off, seg, peer.buffer_addr() + off, 256 * 1024});
  }
  ASSERT_OK(engine->TransferSync(after));
  size_t changed = 0;
  for (uint64_t i = 0; i < kSize; ++i) changed += local.data()[i] != 0xAB;
  EXPECT_EQ(changed, 0u) << "bytes of cancelled reads landed after the cancel returned";
  // The cancelled transfer runs again, in full.
  ASSERT_OK(engine->PostTransfer(t));
  ASSERT_OK(engine->WaitTransfer(t, 60s));
  EXPECT_EQ(std::memcmp(local.data() + kSize / 2, later.data() + kSize / 2, kSize / 2), 0);
}

// fabric: a read past its deadline fails, but the provider keeps it (it is
// not recalled) and its bytes may still land (docs/reliability.md,
// "Cancelled transfers"). So UnregisterMemory of its memory waits for the
// provider to let go of it, at most transfer_timeout; then it refuses, and
// the region stays registered, rather than let the caller free memory the
// provider may still write.
TEST(FabricLateRead, UnregisterMemoryWaitsForAReadThatFailedAtItsDeadline) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("fabric_tcp");
  constexpr uint64_t kSize = kMiB;
  FencedPeer p(kSize);
  ASSERT_NO_FATAL_FAILURE(p.Start("fabric_tcp", "613", 1500ms, {"--fabric-provider", "tcp"}));
  auto& [peer, local, engine, seg] = p;
  ASSERT_EQ(engine->QuerySegment(seg)->transport, "fabric");

  std::memset(local.data(), 0xAB, kSize);
  ASSERT_TRUE(peer.Freeze());
  EXPECT_THAT(engine->TransferSync(
                  TransferRequest{Opcode::kRead, local.data(), seg, peer.buffer_addr(), kSize}),
              StatusIs(StatusCode::kDeadlineExceeded));
  // Failed, and still with the provider: the region stays registered.
  EXPECT_THAT(engine->UnregisterMemory(local.data()),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("failed at its deadline"), HasSubstr("store into"))));
  EXPECT_THAT(engine->RegisterMemory(local.data(), kSize), IsError()) << "no longer registered";

  // The peer runs on and answers; once the provider completed the read the
  // region goes (UnregisterMemory waits for that), and the read's bytes
  // landed after its failure: what the refusal kept from freed memory.
  peer.Signal(SIGCONT);
  EXPECT_OK(engine->UnregisterMemory(local.data()));
  EXPECT_EQ(DescribePatternMismatch(local.data(), kSize, 613), "");
}

}  // namespace
}  // namespace ferry::test
