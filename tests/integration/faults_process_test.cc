// Process faults across a restart: a peer process killed (SIGKILL) in the
// middle of a batch and started again on the same host:port. The killed
// instance's requests end (failed, by their deadline at the latest), and the
// restarted instance is reached both through the segment handle opened
// before the kill and through a segment opened again, with every byte
// verified in the new process (its CHECK command) and in reads back.
// Runs once per transport that reaches a peer process on this host.
// Every wait is bounded; no test asserts how long anything took.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
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

using ::testing::AnyOf;
using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kSize = 16 * kMiB;  // each peer's buffer, and ours
constexpr auto kTimeout = 3s;          // transfer_timeout of this process's engine
constexpr auto kWait = 120s;           // margin on every wait

std::string Checked(uint64_t seed, uint64_t off, uint64_t len) {
  return "CHECK " + std::to_string(seed) + " " + std::to_string(off) + " " + std::to_string(len);
}

::testing::Matcher<const Status&> PeerGoneError() {
  return AnyOf(StatusIs(StatusCode::kUnavailable), StatusIs(StatusCode::kDeadlineExceeded));
}

class RestartAfterKill : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }

  void SetUp() override {
    FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
    EngineOptions o;
    SetTransportOptions(GetParam(), &o);
    o.listen_host = "127.0.0.1";
    o.transfer_timeout = kTimeout;
    o.connect_timeout = 5s;
    auto e = Engine::Create(o);
    ASSERT_THAT(GetStatus(e), IsOk());
    engine_ = std::move(e).value();
    local_ = std::make_unique<AlignedBuffer>(kSize);
    ASSERT_THAT(engine_->RegisterMemory(local_->data(), kSize), IsOk());
  }

  void TearDown() override {
    if (peer_) peer_->Kill();
  }

  // Starts the peer (on `port`, 0 = any) with its buffer filled with `seed`.
  ::testing::AssertionResult StartPeer(uint64_t seed, uint16_t port) {
    if (peer_) peer_->Kill();
    peer_ = std::make_unique<PeerProcess>();
    std::vector<std::string> args = {"--size", std::to_string(kSize), "--seed",
                                     std::to_string(seed)};
    if (port != 0) {
      args.push_back("--port");
      args.push_back(std::to_string(port));
    }
    if (!FabricProviderOf(GetParam()).empty()) {
      args.insert(args.end(), {"--fabric-provider", FabricProviderOf(GetParam())});
    }
    // "shm_mapped": its buffer is shared memory, which this process maps.
    if (SharesTargetMemory(GetParam())) args.insert(args.end(), {"--shared", "1"});
    return peer_->Start(FERRY_TEST_PEER_PATH, args);
  }

  // 1 MiB writes covering our buffer, pattern `seed` at position = offset,
  // to the same offsets of the peer's buffer.
  std::vector<TransferRequest> Writes(SegmentHandle seg, uint64_t seed,
                                      uint64_t count = kSize / kMiB) {
    std::vector<TransferRequest> reqs;
    for (uint64_t i = 0; i < count; ++i) {
      const uint64_t off = i * kMiB;
      FillPattern(local_->data() + off, kMiB, seed, off);
      reqs.push_back({Opcode::kWrite, local_->data() + off, seg, peer_->buffer_addr() + off, kMiB});
    }
    return reqs;
  }

  // Every request of `batch` ended; each failed one failed as a peer that
  // went away does. Returns how many failed.
  size_t ExpectEnded(BatchId batch, size_t n) {
    (void)engine_->WaitBatch(batch, kTimeout + kWait);
    auto bs = engine_->GetBatchStatus(batch);
    EXPECT_THAT(GetStatus(bs), IsOk());
    if (!bs.ok()) return 0;
    EXPECT_EQ(bs->completed + bs->failed, n) << "requests still pending past their deadline";
    for (size_t i = 0; i < n; ++i) {
      auto ts = engine_->GetTransferStatus(batch, i);
      EXPECT_THAT(GetStatus(ts), IsOk());
      if (ts.ok() && ts->state == TransferState::kFailed) {
        EXPECT_THAT(ts->status, PeerGoneError()) << "request " << i;
      }
    }
    EXPECT_THAT(engine_->FreeBatch(batch), IsOk());
    return bs->failed;
  }

  // Through `seg`: writes the whole buffer with pattern `seed` (one batch),
  // checks it in the peer process, reads it back and checks it here.
  void WriteVerifyReadBack(SegmentHandle seg, uint64_t seed, const std::string& what) {
    const std::vector<TransferRequest> writes = Writes(seg, seed);
    EXPECT_THAT(engine_->TransferSync(writes), IsOk()) << what;
    EXPECT_EQ(peer_->Call(Checked(seed, 0, kSize)), "OK") << what << ": the peer's bytes";
    std::memset(local_->data(), 0, kSize);
    std::vector<TransferRequest> reads = writes;
    for (TransferRequest& r : reads) r.opcode = Opcode::kRead;
    EXPECT_THAT(engine_->TransferSync(reads), IsOk()) << what;
    EXPECT_EQ(DescribePatternMismatch(local_->data(), kSize, seed, 0), "") << what << ": read back";
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<AlignedBuffer> local_;
  std::unique_ptr<PeerProcess> peer_;
};

INSTANTIATE_TEST_SUITE_P(Transports, RestartAfterKill,
                         ::testing::Values("shm", "shm_mapped", "tcp", "fabric_tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Frozen (so the batch is surely in flight), killed, restarted on the same
// port: the old handle reaches the new instance, as does a re-opened one.
TEST_P(RestartAfterKill, PeerKilledMidBatchAndRestartedIsReachedAgain) {
  if (SharesTargetMemory(GetParam())) {
    GTEST_SKIP() << "writes to a peer's shared memory need no answer from it: a frozen peer "
                    "completes them (mapped_test.cc, CopiesNeedNoRequestToThePeer)";
  }
  ASSERT_TRUE(StartPeer(701, 0));
  const std::string peer_id = peer_->peer_id();
  const uint16_t port = peer_->port();
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine_->OpenSegment(peer_id));
  ASSERT_OK_AND_ASSIGN(SegmentInfo before, engine_->QuerySegment(seg));
  EXPECT_EQ(before.transport, TransportOf(GetParam()));
  WriteVerifyReadBack(seg, 702, "before the kill");

  const std::vector<TransferRequest> doomed = Writes(seg, 703);
  ASSERT_TRUE(peer_->Freeze());
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine_->AllocateBatch(doomed.size()));
  ASSERT_OK(engine_->Submit(batch, doomed));
  std::this_thread::sleep_for(200ms);
  peer_->Kill();
  EXPECT_EQ(ExpectEnded(batch, doomed.size()), doomed.size()) << "a frozen peer completed writes";

  ASSERT_TRUE(StartPeer(704, port)) << "could not restart the peer on port " << port;
  ASSERT_EQ(peer_->peer_id(), peer_id);
  // Nothing of the old batch reached the new process.
  EXPECT_EQ(peer_->Call(Checked(704, 0, kSize)), "OK");

  // The handle opened before the kill reaches the new instance.
  WriteVerifyReadBack(seg, 705, "through the old handle");
  ASSERT_OK_AND_ASSIGN(SegmentInfo after, engine_->QuerySegment(seg));
  EXPECT_NE(after.instance_id, before.instance_id);
  ASSERT_FALSE(after.regions.empty());
  EXPECT_EQ(after.regions[0].addr, peer_->buffer_addr());
  // So does a segment opened again after closing the old one.
  ASSERT_OK(engine_->CloseSegment(seg));
  ASSERT_OK_AND_ASSIGN(SegmentHandle again, engine_->OpenSegment(peer_id));
  WriteVerifyReadBack(again, 706, "through a re-opened segment");
  EXPECT_EQ(peer_->Stop(), 0);
}

// Killed without freezing while a batch of reads and writes runs, restarted,
// three times over: whatever the kill caught ends properly, and every
// restart is reached through the same handle with verified bytes.
TEST_P(RestartAfterKill, RepeatedKillsMidBatchAndRestarts) {
  ASSERT_TRUE(StartPeer(801, 0));
  const std::string peer_id = peer_->peer_id();
  const uint16_t port = peer_->port();
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine_->OpenSegment(peer_id));
  uint64_t seed = 802;
  size_t failed_total = 0;
  for (int cycle = 0; cycle < 3; ++cycle) {
    WriteVerifyReadBack(seg, seed++, "cycle " + std::to_string(cycle));
    // Half writes, half reads (the reads into the upper half of our buffer).
    std::vector<TransferRequest> reqs = Writes(seg, seed++, kSize / kMiB / 2);
    for (uint64_t off = kSize / 2; off < kSize; off += kMiB) {
      reqs.push_back({Opcode::kRead, local_->data() + off, seg, peer_->buffer_addr() + off, kMiB});
    }
    ASSERT_OK_AND_ASSIGN(BatchId batch, engine_->AllocateBatch(reqs.size()));
    ASSERT_OK(engine_->Submit(batch, reqs));
    peer_->Kill();
    failed_total += ExpectEnded(batch, reqs.size());
    ASSERT_TRUE(StartPeer(900 + cycle, port))
        << "cycle " << cycle << ": no restart on port " << port;
    ASSERT_EQ(peer_->peer_id(), peer_id);
    EXPECT_EQ(peer_->Call(Checked(900 + cycle, 0, kSize)), "OK")
        << "cycle " << cycle << ": bytes of the killed instance's batch reached the new one";
  }
  WriteVerifyReadBack(seg, seed, "after the last restart");
  RecordProperty("requests_failed_by_kills", static_cast<int>(failed_total));
  std::printf("[ kills ] %s: %zu of %d requests caught by the three kills failed\n",
              GetParam().c_str(), failed_total, 3 * static_cast<int>(kSize / kMiB));
  EXPECT_EQ(peer_->Stop(), 0);
}

}  // namespace
}  // namespace ferry::test
