// Multi-process tests: this process runs an engine and drives one or more
// ferry_test_peer processes on 127.0.0.1 (see test_peer.cc for the protocol).
//
// Every wait is bounded; no test asserts how long anything took.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
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

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;
constexpr auto kWait = std::chrono::milliseconds(120000);

std::string Checked(uint64_t seed, uint64_t off, uint64_t len) {
  return "CHECK " + std::to_string(seed) + " " + std::to_string(off) + " " + std::to_string(len);
}

class MultiProcessBase : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }

  // EngineOptions.transport of this process's engine, and its fabric
  // provider (the peers get the same: --fabric-provider).
  virtual std::string Transport() const { return "auto"; }
  virtual std::string FabricProvider() const { return ""; }
  // Whether peers' buffers are shared memory (this process maps them).
  virtual bool SharedPeers() const { return false; }

  void TearDown() override {
    for (auto& p : peers_) p->Kill();
  }

  EngineOptions Options(std::chrono::milliseconds transfer_timeout = 30s) const {
    EngineOptions o;
    o.transport = Transport();
    o.fabric_provider = FabricProvider();
    o.listen_host = "127.0.0.1";
    o.listen_port = 0;
    o.transfer_timeout = transfer_timeout;
    o.connect_timeout = 5s;
    return o;
  }

  // Creates this process's engine.
  void CreateEngine() { CreateEngine(Options()); }
  void CreateEngine(EngineOptions o) {
    auto e = Engine::Create(std::move(o));
    ASSERT_THAT(GetStatus(e), IsOk());
    engine_ = std::move(e).value();
  }

  // Starts a peer; fatal failure if it does not come up.
  PeerProcess* SpawnPeer(uint64_t size, uint64_t seed, std::vector<std::string> extra = {}) {
    peers_.push_back(std::make_unique<PeerProcess>());
    PeerProcess* p = peers_.back().get();
    std::vector<std::string> args = {"--size", std::to_string(size), "--seed",
                                     std::to_string(seed)};
    args.insert(args.end(), extra.begin(), extra.end());
    if (!FabricProvider().empty()) args.insert(args.end(), {"--fabric-provider", FabricProvider()});
    if (SharedPeers()) args.insert(args.end(), {"--shared", "1"});
    const ::testing::AssertionResult started = p->Start(FERRY_TEST_PEER_PATH, args);
    EXPECT_TRUE(started);
    return started ? p : nullptr;
  }

  // A buffer registered with this process's engine.
  unsigned char* Alloc(size_t size) {
    buffers_.push_back(std::make_unique<AlignedBuffer>(size));
    unsigned char* p = buffers_.back()->data();
    const Status s = engine_->RegisterMemory(p, size);
    EXPECT_THAT(s, IsOk());
    return s.ok() ? p : nullptr;
  }

  Engine& engine() { return *engine_; }

  // Declared before the engine, so destroyed after it.
  std::vector<std::unique_ptr<AlignedBuffer>> buffers_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::unique_ptr<PeerProcess>> peers_;
};

// Every test of this fixture runs once per transport that reaches a peer
// process on this host ("fabric_tcp": the fabric transport on libfabric's
// tcp provider, pinned to 127.0.0.1).
class MultiProcessTest : public MultiProcessBase,
                         public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam()); }
  std::string Transport() const override { return TransportOf(GetParam()); }
  std::string FabricProvider() const override { return FabricProviderOf(GetParam()); }
  bool SharedPeers() const override { return SharesTargetMemory(GetParam()); }
};

// "shm_mapped": shm with the peers' buffers in shared memory, which this
// process maps and copies itself (docs/architecture.md, "Mapped segments").
INSTANTIATE_TEST_SUITE_P(Transports, MultiProcessTest,
                         ::testing::Values("shm", "shm_mapped", "tcp", "fabric_tcp"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Tests of tcp itself (the rpc port, the stream window) and of what happens
// before any transport is chosen.
class TcpMultiProcessTest : public MultiProcessBase {
 protected:
  std::string Transport() const override { return "tcp"; }
};

// Tests of how `auto` chooses.
class AutoMultiProcessTest : public MultiProcessBase {};

// Code of a request that failed because its peer went away.
::testing::Matcher<const Status&> PeerGoneError() {
  return AnyOf(StatusIs(StatusCode::kUnavailable), StatusIs(StatusCode::kDeadlineExceeded));
}

// ---------------------------------------------------------------------------

TEST_P(MultiProcessTest, WrittenDataIsVerifiedInPeerAndReadsBackIntact) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 8 * kMiB;
  constexpr uint64_t kPeerSeed = 101, kData = 202;
  PeerProcess* peer = SpawnPeer(kSize, kPeerSeed);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(kSize + 64);
  unsigned char* back = Alloc(kSize + 64);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(back, nullptr);

  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentInfo info, engine().QuerySegment(seg));
  EXPECT_EQ(info.peer_id, peer->peer_id());
  EXPECT_EQ(info.transport, Transport());
  bool found = false;
  for (const RemoteRegion& r : info.regions) {
    found = found || (r.addr == peer->buffer_addr() && r.length == kSize);
  }
  EXPECT_TRUE(found) << "the peer's buffer is not among the advertised regions";

  // 64 writes of 1 B..100 KiB at odd offsets; pattern position = remote offset,
  // local copies one byte further on.
  std::vector<PatternRange> written;
  std::vector<TransferRequest> reqs;
  for (uint64_t i = 0; i < 64; ++i) {
    const uint64_t off = i * 128 * kKiB + i % 7;
    const uint64_t len = 1 + Mix64(i) % (100 * kKiB);
    FillPattern(local + off + 1, len, kData, off);
    written.push_back({off, len, kData, off});
    reqs.push_back({Opcode::kWrite, local + off + 1, seg, peer->buffer_addr() + off, len});
  }
  ASSERT_OK(engine().TransferSync(reqs));

  // Verified inside the peer process: written ranges and the gaps between.
  uint64_t cursor = 0;
  for (const PatternRange& r : written) {
    EXPECT_EQ(peer->Call(Checked(kPeerSeed, cursor, r.offset - cursor)), "OK")
        << "gap before " << r.offset;
    EXPECT_EQ(peer->Call(Checked(kData, r.offset, r.length)), "OK") << "range at " << r.offset;
    cursor = r.offset + r.length;
  }
  EXPECT_EQ(peer->Call(Checked(kPeerSeed, cursor, kSize - cursor)), "OK");

  // Read everything back: 8 reads of 1 MiB into an odd offset.
  std::vector<TransferRequest> reads;
  for (uint64_t off = 0; off < kSize; off += kMiB) {
    reads.push_back({Opcode::kRead, back + 3 + off, seg, peer->buffer_addr() + off, kMiB});
  }
  ASSERT_OK(engine().TransferSync(reads));
  EXPECT_TRUE(CheckLayout(back + 3, kSize, written, kPeerSeed));

  // And the peer shuts down cleanly.
  EXPECT_EQ(peer->Stop(), 0);
}

TEST_P(MultiProcessTest, PeerExitsCleanlyOnSigterm) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  PeerProcess* peer = SpawnPeer(64 * kKiB, 121);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(4096);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  ASSERT_OK(
      engine().TransferSync(TransferRequest{Opcode::kRead, local, seg, peer->buffer_addr(), 4096}));
  peer->Signal(SIGTERM);
  EXPECT_EQ(peer->WaitForExit(30s), 0);
  // Gone: the next transfer says so.
  EXPECT_THAT(
      engine().TransferSync(TransferRequest{Opcode::kRead, local, seg, peer->buffer_addr(), 4096}),
      AnyOf(StatusIs(StatusCode::kUnavailable), StatusIs(StatusCode::kDeadlineExceeded)));
}

TEST_P(MultiProcessTest, ReadsOfManySizesMatchPeerPattern) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 16 * kMiB;
  constexpr uint64_t kPeerSeed = 111;
  PeerProcess* peer = SpawnPeer(kSize, kPeerSeed);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  const uint64_t bg = Mix64(112);
  FillPattern(local, kSize, bg);
  std::vector<PatternRange> expect;
  std::vector<TransferRequest> reads;
  uint64_t local_off = 5, remote_off = 3;
  for (uint64_t len :
       {uint64_t{1}, uint64_t{7}, uint64_t{4096}, uint64_t{65537}, kMiB, 4 * kMiB, uint64_t{3}}) {
    reads.push_back({Opcode::kRead, local + local_off, seg, peer->buffer_addr() + remote_off, len});
    expect.push_back({local_off, len, kPeerSeed, remote_off});
    local_off += len + 11;
    remote_off += len + 1001;
  }
  ASSERT_OK(engine().TransferSync(reads));
  EXPECT_TRUE(CheckLayout(local, kSize, expect, bg));
}

TEST_P(MultiProcessTest, OutOfRangeRemoteFailsOnlyThatRequestAndWritesNothing) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 1 * kMiB;
  constexpr uint64_t kPeerSeed = 301, kData = 302;
  PeerProcess* peer = SpawnPeer(kSize, kPeerSeed);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(64 * kKiB);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  const uint64_t base = peer->buffer_addr();
  FillPattern(local, 4096, kData, 0);
  FillPattern(local + 8192, 4096, kData, 8192);
  const std::vector<TransferRequest> reqs = {
      {Opcode::kWrite, local, seg, base, 4096},                             // good
      {Opcode::kWrite, local + 16384, seg, base + kSize - 100, 200},        // straddles the end
      {Opcode::kWrite, local + 16384, seg, base - 4096, 4096 + 16},         // straddles the start
      {Opcode::kWrite, local + 16384, seg, base + kSize + 64 * kMiB, 512},  // far outside
      {Opcode::kWrite, local + 8192, seg, base + 8192, 4096},               // good
  };
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine().AllocateBatch(reqs.size()));
  ASSERT_OK(engine().Submit(batch, reqs));
  EXPECT_THAT(engine().WaitBatch(batch, kWait), IsError());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, engine().GetTransferStatus(batch, i));
    if (i == 0 || i == 4) {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kCompleted))
          << "request " << i << ": " << ts.status;
    } else {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed))
          << "request " << i;
      EXPECT_THAT(ts.status, IsError(MentionsNumber(reqs[i].remote_addr))) << "request " << i;
    }
  }
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, engine().GetBatchStatus(batch));
  EXPECT_EQ(bs.completed, 2u);
  EXPECT_EQ(bs.failed, 3u);
  EXPECT_OK(engine().FreeBatch(batch));

  EXPECT_EQ(peer->Call(Checked(kData, 0, 4096)), "OK");
  EXPECT_EQ(peer->Call(Checked(kPeerSeed, 4096, 4096)), "OK");
  EXPECT_EQ(peer->Call(Checked(kData, 8192, 4096)), "OK");
  EXPECT_EQ(peer->Call(Checked(kPeerSeed, 12288, kSize - 12288)), "OK")
      << "a refused request wrote into the peer";

  // Reads outside fail too and leave the local memory alone.
  FillPattern(local + 32768, 1024, 7);
  const TransferRequest bad_read{Opcode::kRead, local + 32768, seg, base + kSize - 10, 20};
  EXPECT_THAT(engine().TransferSync(bad_read), IsError(MentionsNumber(base + kSize - 10)));
  EXPECT_EQ(DescribePatternMismatch(local + 32768, 1024, 7), "");
  EXPECT_EQ(peer->Call("PING"), "PONG");
  // The connection is still good.
  EXPECT_OK(engine().TransferSync(TransferRequest{Opcode::kWrite, local, seg, base, 4096}));
}

TEST_P(MultiProcessTest, NotificationArrivesAfterTheWritesBeforeIt) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 16 * kMiB;
  constexpr uint64_t kArea = 4 * kMiB;
  PeerProcess* peer = SpawnPeer(kSize, 401);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  std::vector<BatchId> batches;
  for (uint64_t r = 0; r < kSize / kArea; ++r) {
    const uint64_t seed = 410 + r;
    const uint64_t start = r * kArea + r;  // odd starts
    std::vector<TransferRequest> reqs;
    uint64_t off = start;
    for (uint64_t i = 0; i < 48 && off < (r + 1) * kArea - 200 * kKiB; ++i) {
      const uint64_t len = 1 + Mix64(r * 1000 + i) % (160 * kKiB);
      FillPattern(local + off, len, seed, off);
      reqs.push_back({Opcode::kWrite, local + off, seg, peer->buffer_addr() + off, len});
      off += len;
    }
    ASSERT_OK_AND_ASSIGN(BatchId batch, engine().AllocateBatch(reqs.size()));
    batches.push_back(batch);
    ASSERT_OK(engine().Submit(batch, reqs));
    // Not waited for: the notification must follow them anyway.
    ASSERT_OK(engine().SendNotification(seg, "round-" + std::to_string(r),
                                        Checked(seed, start, off - start)));
  }
  for (uint64_t r = 0; r < kSize / kArea; ++r) {
    EXPECT_EQ(peer->Call("NOTE round-" + std::to_string(r)), "NOTE OK")
        << "round " << r << ": the notification was seen before its data was in place";
  }
  for (BatchId b : batches) {
    EXPECT_OK(engine().WaitBatch(b, kWait));
    EXPECT_OK(engine().FreeBatch(b));
  }
}

// A write completes only once its bytes are in the target's memory: the
// peer's buffer is a shared mapping of a file, the peer is killed (SIGKILL)
// the moment the batch completed, and every byte of every request must be in
// the file. A transport that completed writes when they were merely sent
// (in a socket buffer, a provider's queue: fabric without delivery
// complete) loses the tail here. Many small and large writes in flight.
TEST_P(MultiProcessTest, CompletedWritesAreInTheTargetsMemoryWhenItIsKilledAtOnce) {
  constexpr uint64_t kSize = 8 * kMiB;
  const std::string file = "/dev/shm/ferry-dc-" + std::to_string(getpid()) + "-" + GetParam();
  struct Unlink {
    std::string path;
    ~Unlink() { ::unlink(path.c_str()); }
  } unlink_at_end{file};
  CreateEngine();
  PeerProcess* peer = SpawnPeer(kSize, 3101, {"--buffer-file", file});
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  constexpr uint64_t kSeed = 3102;
  FillPattern(local, kSize, kSeed, 0);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  // Sizes cycle through small (inline / inject-sized) and large ones.
  const uint64_t sizes[] = {64, 4096, 100, 60 * kKiB, 1, 256 * kKiB, 2048, kMiB, 4095, 65 * kKiB};
  std::vector<TransferRequest> reqs;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t off = 0, i = 0; off < kSize; ++i) {
    const uint64_t len = std::min(sizes[i % std::size(sizes)], kSize - off);
    reqs.push_back({Opcode::kWrite, local + off, seg, peer->buffer_addr() + off, len});
    ranges.emplace_back(off, len);
    off += len + 64;  // gaps keep the peer's own pattern
  }
  ASSERT_OK_AND_ASSIGN(BatchId b, engine().AllocateBatch(reqs.size()));
  ASSERT_OK(engine().Submit(b, reqs));
  ASSERT_OK(engine().WaitBatch(b, kWait));
  ::kill(peer->pid(), SIGKILL);
  peer->Kill();  // reaps it
  const int fd = ::open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << file;
  void* m = ::mmap(nullptr, kSize, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(m, MAP_FAILED);
  const auto* bytes = static_cast<const unsigned char*>(m);
  size_t bad = 0;
  for (size_t i = 0; i < ranges.size() && bad < 5; ++i) {
    const auto [off, len] = ranges[i];
    const std::string mismatch = DescribePatternMismatch(bytes + off, len, kSeed, off);
    if (!mismatch.empty()) {
      ADD_FAILURE() << "request " << i << " (" << len << " bytes at offset " << off
                    << ") completed but is not in the killed peer's memory: " << mismatch;
      ++bad;
    }
  }
  ::munmap(m, kSize);
  EXPECT_OK(engine().FreeBatch(b));
}

// Builds `count` 1 MiB writes to `peer` (pattern position = remote offset).
std::vector<TransferRequest> MiBWrites(unsigned char* local, SegmentHandle seg,
                                       const PeerProcess& peer, uint64_t count, uint64_t seed) {
  std::vector<TransferRequest> reqs;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t off = i * kMiB;
    FillPattern(local + off, kMiB, seed, off);
    reqs.push_back({Opcode::kWrite, local + off, seg, peer.buffer_addr() + off, kMiB});
  }
  return reqs;
}

// The peer is frozen (SIGSTOP) so its requests are surely in flight, then
// killed: they fail with kUnavailable or kDeadlineExceeded by their deadline,
// while the requests to a live peer in the same batch complete.
TEST_P(MultiProcessTest, PeerKilledMidBatchFailsOnlyItsRequests) {
  if (SharesTargetMemory(GetParam())) {
    GTEST_SKIP() << "writes to a peer's shared memory need no answer from it: a frozen peer "
                    "completes them (mapped_test.cc, CopiesNeedNoRequestToThePeer)";
  }
  constexpr auto kTimeout = 3s;
  ASSERT_NO_FATAL_FAILURE(CreateEngine(Options(kTimeout)));
  constexpr uint64_t kSize = 16 * kMiB;
  PeerProcess* doomed = SpawnPeer(kSize, 501);
  PeerProcess* live = SpawnPeer(kSize, 502);
  ASSERT_NE(doomed, nullptr);
  ASSERT_NE(live, nullptr);
  unsigned char* to_doomed = Alloc(kSize);
  unsigned char* to_live = Alloc(kSize);
  ASSERT_NE(to_doomed, nullptr);
  ASSERT_NE(to_live, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle doomed_seg, engine().OpenSegment(doomed->peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle live_seg, engine().OpenSegment(live->peer_id()));
  // Warm up: data connections to both exist.
  const std::vector<TransferRequest> warm = {
      {Opcode::kRead, to_doomed, doomed_seg, doomed->buffer_addr(), 4096},
      {Opcode::kRead, to_live, live_seg, live->buffer_addr(), 4096}};
  ASSERT_OK(engine().TransferSync(warm));

  const std::vector<TransferRequest> a = MiBWrites(to_doomed, doomed_seg, *doomed, 16, 503);
  const std::vector<TransferRequest> b = MiBWrites(to_live, live_seg, *live, 16, 504);
  std::vector<TransferRequest> reqs;  // interleaved: even -> doomed, odd -> live
  for (size_t i = 0; i < a.size(); ++i) {
    reqs.push_back(a[i]);
    reqs.push_back(b[i]);
  }
  ASSERT_TRUE(doomed->Freeze());
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine().AllocateBatch(reqs.size()));
  ASSERT_OK(engine().Submit(batch, reqs));
  std::this_thread::sleep_for(200ms);
  doomed->Kill();

  EXPECT_THAT(engine().WaitBatch(batch, kTimeout + kWait), IsError());
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, engine().GetBatchStatus(batch));
  EXPECT_EQ(bs.submitted, reqs.size());
  EXPECT_EQ(bs.completed + bs.failed, reqs.size()) << "requests still pending past their deadline";
  EXPECT_EQ(bs.failed, a.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, engine().GetTransferStatus(batch, i));
    if (i % 2 == 0) {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed))
          << "request " << i << " to the killed peer";
      EXPECT_THAT(ts.status, PeerGoneError()) << "request " << i;
    } else {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kCompleted))
          << "request " << i << " to the live peer: " << ts.status;
    }
  }
  EXPECT_OK(engine().FreeBatch(batch));
  EXPECT_EQ(live->Call(Checked(504, 0, 16 * kMiB)), "OK");

  // Afterwards: the live peer still works, the dead one is reported as such.
  EXPECT_OK(engine().TransferSync(b[3]));
  EXPECT_THAT(engine().TransferSync(a[3]), PeerGoneError());
}

// Killed right after Submit, without freezing first: each of its requests
// either completed or failed with kUnavailable/kDeadlineExceeded.
TEST_P(MultiProcessTest, PeerKilledRightAfterSubmit) {
  constexpr auto kTimeout = 3s;
  ASSERT_NO_FATAL_FAILURE(CreateEngine(Options(kTimeout)));
  constexpr uint64_t kSize = 32 * kMiB;
  PeerProcess* doomed = SpawnPeer(kSize, 511);
  PeerProcess* live = SpawnPeer(kSize, 512);
  ASSERT_NE(doomed, nullptr);
  ASSERT_NE(live, nullptr);
  unsigned char* to_doomed = Alloc(kSize);
  unsigned char* to_live = Alloc(kSize);
  ASSERT_NE(to_doomed, nullptr);
  ASSERT_NE(to_live, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle doomed_seg, engine().OpenSegment(doomed->peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle live_seg, engine().OpenSegment(live->peer_id()));
  const std::vector<TransferRequest> a = MiBWrites(to_doomed, doomed_seg, *doomed, 32, 513);
  const std::vector<TransferRequest> b = MiBWrites(to_live, live_seg, *live, 32, 514);

  ASSERT_OK_AND_ASSIGN(BatchId batch_a, engine().AllocateBatch(a.size()));
  ASSERT_OK_AND_ASSIGN(BatchId batch_b, engine().AllocateBatch(b.size()));
  ASSERT_OK(engine().Submit(batch_a, a));
  ASSERT_OK(engine().Submit(batch_b, b));
  doomed->Kill();

  // The live peer's batch finishes in full.
  EXPECT_OK(engine().WaitBatch(batch_b, kTimeout + kWait));
  EXPECT_EQ(live->Call(Checked(514, 0, kSize)), "OK");
  // The killed peer's batch ends; whatever did not complete failed properly.
  (void)engine().WaitBatch(batch_a, kTimeout + kWait);
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, engine().GetBatchStatus(batch_a));
  EXPECT_EQ(bs.completed + bs.failed, a.size()) << "requests still pending past their deadline";
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, engine().GetTransferStatus(batch_a, i));
    if (ts.state == TransferState::kFailed) {
      EXPECT_THAT(ts.status, PeerGoneError()) << "request " << i;
    } else {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kCompleted))
          << "request " << i;
    }
  }
  RecordProperty("killed_peer_requests_failed", static_cast<int>(bs.failed));
  EXPECT_OK(engine().FreeBatch(batch_a));
  EXPECT_OK(engine().FreeBatch(batch_b));
  EXPECT_OK(engine().TransferSync(b[0]));
}

// A frozen (not dead) peer: its requests end at their deadline; once it
// resumes, it can be used again.
TEST_P(MultiProcessTest, HungPeerRequestsEndAtTheirDeadline) {
  if (SharesTargetMemory(GetParam())) {
    GTEST_SKIP() << "writes to a peer's shared memory need no answer from it: a frozen peer "
                    "completes them (mapped_test.cc, CopiesNeedNoRequestToThePeer)";
  }
  constexpr auto kTimeout = 5s;  // ample time for the in-flight checks below
  ASSERT_NO_FATAL_FAILURE(CreateEngine(Options(kTimeout)));
  constexpr uint64_t kSize = 4 * kMiB;
  PeerProcess* hung = SpawnPeer(kSize, 521);
  PeerProcess* live = SpawnPeer(kSize, 522);
  ASSERT_NE(hung, nullptr);
  ASSERT_NE(live, nullptr);
  unsigned char* to_hung = Alloc(kSize);
  unsigned char* to_live = Alloc(kSize);
  ASSERT_NE(to_hung, nullptr);
  ASSERT_NE(to_live, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle hung_seg, engine().OpenSegment(hung->peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle live_seg, engine().OpenSegment(live->peer_id()));
  ASSERT_OK(engine().TransferSync(
      TransferRequest{Opcode::kRead, to_hung, hung_seg, hung->buffer_addr(), 4096}));

  const std::vector<TransferRequest> a = MiBWrites(to_hung, hung_seg, *hung, 2, 523);
  const std::vector<TransferRequest> b = MiBWrites(to_live, live_seg, *live, 2, 524);
  std::vector<TransferRequest> reqs = {a[0], b[0], a[1], b[1]};
  ASSERT_TRUE(hung->Freeze());
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine().AllocateBatch(reqs.size()));
  ASSERT_OK(engine().Submit(batch, reqs));
  // The frozen peer cannot have acknowledged anything yet: the batch is
  // surely in flight.
  EXPECT_THAT(engine().WaitBatch(batch, 10ms), StatusIs(StatusCode::kDeadlineExceeded));
  {
    ASSERT_OK_AND_ASSIGN(BatchStatus pending, engine().GetBatchStatus(batch));
    EXPECT_EQ(TransferStateName(pending.state), TransferStateName(TransferState::kPending));
    EXPECT_EQ(pending.submitted, reqs.size());
    EXPECT_LE(pending.completed, 2u);
    EXPECT_EQ(pending.failed, 0u);
    ASSERT_OK_AND_ASSIGN(TransferStatus first, engine().GetTransferStatus(batch, 0));
    EXPECT_EQ(TransferStateName(first.state), TransferStateName(TransferState::kPending));
    EXPECT_OK(first.status);
  }
  EXPECT_THAT(engine().FreeBatch(batch), StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(engine().WaitBatch(batch, kTimeout + kWait), IsError());
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, engine().GetTransferStatus(batch, i));
    if (i % 2 == 0) {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed))
          << "request " << i << " to the frozen peer";
      EXPECT_THAT(ts.status, PeerGoneError()) << "request " << i;
    } else {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kCompleted))
          << "request " << i << ": " << ts.status;
    }
  }
  EXPECT_OK(engine().FreeBatch(batch));
  EXPECT_EQ(live->Call(Checked(524, 0, 2 * kMiB)), "OK");

  hung->Signal(SIGCONT);
  EXPECT_EQ(hung->Call("PING"), "PONG");
  // A later transfer reaches it (to a range the late writes do not touch).
  FillPattern(to_hung + 3 * kMiB, 4096, 525, 3 * kMiB);
  EXPECT_OK(engine().TransferSync(TransferRequest{Opcode::kWrite, to_hung + 3 * kMiB, hung_seg,
                                                  hung->buffer_addr() + 3 * kMiB, 4096}));
  EXPECT_EQ(hung->Call(Checked(525, 3 * kMiB, 4096)), "OK");
}

// A frozen peer and a batch much larger than what the link puts on its
// streams at once: the frames still waiting to be sent end at the deadline
// too (kDeadlineExceeded, naming the peer), as do those in flight, and the
// batch never outlives its deadline by more than the wait margin.
TEST_F(TcpMultiProcessTest, HungPeerWithABacklogEndsAtTheDeadline) {
  constexpr auto kTimeout = 2s;
  ASSERT_NO_FATAL_FAILURE(CreateEngine(Options(kTimeout)));
  constexpr uint64_t kSize = 24 * kMiB;
  PeerProcess* hung = SpawnPeer(kSize, 531);
  ASSERT_NE(hung, nullptr);
  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(hung->peer_id()));
  ASSERT_OK(
      engine().TransferSync(TransferRequest{Opcode::kRead, local, seg, hung->buffer_addr(), 4096}));

  const std::vector<TransferRequest> reqs = MiBWrites(local, seg, *hung, 24, 533);
  ASSERT_TRUE(hung->Freeze());
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine().AllocateBatch(reqs.size()));
  ASSERT_OK(engine().Submit(batch, reqs));
  EXPECT_THAT(engine().WaitBatch(batch, kTimeout + kWait), IsError());
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, engine().GetBatchStatus(batch));
  EXPECT_EQ(bs.failed, reqs.size()) << "requests to a frozen peer cannot complete";
  size_t never_sent = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, engine().GetTransferStatus(batch, i));
    EXPECT_THAT(ts.status, PeerGoneError()) << "request " << i;
    if (ts.status.message().find("had room") != std::string::npos) {
      ++never_sent;
      EXPECT_NE(ts.status.message().find(hung->peer_id()), std::string::npos) << ts.status;
    }
  }
  // 24 MiB cannot all be on the wire to a frozen peer: some waited in the link.
  EXPECT_GT(never_sent, 0u);
  RecordProperty("requests_never_sent", static_cast<int>(never_sent));
  EXPECT_OK(engine().FreeBatch(batch));

  hung->Signal(SIGCONT);
  EXPECT_EQ(hung->Call("PING"), "PONG");
  FillPattern(local, 4096, 535, 0);
  EXPECT_OK(engine().TransferSync(
      TransferRequest{Opcode::kWrite, local, seg, hung->buffer_addr(), 4096}));
  EXPECT_EQ(hung->Call(Checked(535, 0, 4096)), "OK");
}

// ---------------------------------------------------------------------------
// How `auto` chooses for a peer process on this host.

// Writes `len` bytes of pattern `seed` to the peer's buffer and checks them
// there, then reads them back.
void WriteCheckReadBack(Engine& e, SegmentHandle seg, PeerProcess& peer, unsigned char* local,
                        uint64_t len, uint64_t seed) {
  FillPattern(local, len, seed, 0);
  ASSERT_OK(e.TransferSync(TransferRequest{Opcode::kWrite, local, seg, peer.buffer_addr(), len}));
  EXPECT_EQ(peer.Call(Checked(seed, 0, len)), "OK");
  std::memset(local, 0, len);
  ASSERT_OK(e.TransferSync(TransferRequest{Opcode::kRead, local, seg, peer.buffer_addr(), len}));
  EXPECT_EQ(CheckPattern(local, len, seed, 0), std::nullopt) << "read-back differs";
}

TEST_F(AutoMultiProcessTest, PeerProcessOnThisHostIsReachedThroughShm) {
  FERRY_SKIP_WITHOUT_SAME_HOST_COPY();
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  PeerProcess* peer = SpawnPeer(4 * kMiB, 901);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(4 * kMiB);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  ASSERT_NO_FATAL_FAILURE(WriteCheckReadBack(engine(), seg, *peer, local, 3 * kMiB + 5, 903));
  ASSERT_OK_AND_ASSIGN(SegmentInfo info, engine().QuerySegment(seg));
  EXPECT_EQ(info.transport, "shm");
}

TEST_F(AutoMultiProcessTest, PeerRefusingShmIsReachedThroughTcp) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  PeerProcess* peer = SpawnPeer(4 * kMiB, 911, {"--refuse-same-host-copy", "1"});
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(4 * kMiB);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  ASSERT_NO_FATAL_FAILURE(WriteCheckReadBack(engine(), seg, *peer, local, 3 * kMiB + 5, 913));
  ASSERT_OK_AND_ASSIGN(SegmentInfo info, engine().QuerySegment(seg));
  EXPECT_EQ(info.transport, "tcp") << "shm was refused: auto must have fallen back";
  // Later transfers stay on tcp (no new attempt per transfer).
  ASSERT_NO_FATAL_FAILURE(WriteCheckReadBack(engine(), seg, *peer, local, 4096, 915));
  ASSERT_OK_AND_ASSIGN(info, engine().QuerySegment(seg));
  EXPECT_EQ(info.transport, "tcp");
}

// shm: an entry whose bytes in the initiator the kernel cannot reach (a page
// the initiator registered, then made unreadable or read-only) fails alone;
// the entries around it in the same frame (and the same merged range) move.
TEST_F(AutoMultiProcessTest, ShmEntryTheKernelCannotReachFailsAloneInItsFrame) {
  FERRY_SKIP_WITHOUT_SAME_HOST_COPY();
  EngineOptions o = Options();
  o.transport = "shm";
  ASSERT_NO_FATAL_FAILURE(CreateEngine(o));
  constexpr uint64_t kPage = 4096;
  PeerProcess* peer = SpawnPeer(8 * kPage, 931);
  ASSERT_NE(peer, nullptr);
  void* m = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* local = static_cast<unsigned char*>(m);
  ASSERT_OK(engine().RegisterMemory(local, 3 * kPage));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  auto run = [&](Opcode op, uint64_t remote_first_page) -> std::vector<Status> {
    std::vector<TransferRequest> reqs;
    for (uint64_t i = 0; i < 3; ++i) {
      reqs.push_back({op, local + i * kPage, seg,
                      peer->buffer_addr() + (remote_first_page + i) * kPage, kPage});
    }
    std::vector<Status> out;
    auto batch = engine().AllocateBatch(reqs.size());
    if (!batch.ok()) return {batch.status()};
    Status s = engine().Submit(*batch, reqs);
    if (s.ok()) (void)engine().WaitBatch(*batch, kWait);
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto ts = engine().GetTransferStatus(*batch, i);
      out.push_back(ts.ok() ? ts->status : ts.status());
    }
    EXPECT_OK(engine().FreeBatch(*batch));
    return out;
  };

  // Writes: the middle source page is unreadable.
  FillPattern(local, 3 * kPage, 933, 0);
  ASSERT_EQ(mprotect(local + kPage, kPage, PROT_NONE), 0);
  std::vector<Status> w = run(Opcode::kWrite, 0);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_OK(w[0]);
  EXPECT_THAT(w[1], StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(w[1].message(), HasSubstr("could not be copied"));
  EXPECT_OK(w[2]);
  EXPECT_EQ(peer->Call(Checked(933, 0, kPage)), "OK");
  EXPECT_EQ(peer->Call("CHECK 931 " + std::to_string(kPage) + " " + std::to_string(kPage)), "OK")
      << "the failed entry's destination was written";
  EXPECT_EQ(peer->Call(Checked(933, 2 * kPage, kPage)), "OK");

  // Reads: the middle destination page is read-only.
  ASSERT_EQ(mprotect(local + kPage, kPage, PROT_READ), 0);
  std::memset(local, 0, kPage);
  std::memset(local + 2 * kPage, 0, kPage);
  std::vector<Status> r = run(Opcode::kRead, 4);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_OK(r[0]);
  EXPECT_THAT(r[1], StatusIs(StatusCode::kInvalidArgument));
  EXPECT_OK(r[2]);
  EXPECT_EQ(CheckPattern(local, kPage, 931, 4 * kPage), std::nullopt);
  EXPECT_EQ(CheckPattern(local + 2 * kPage, kPage, 931, 6 * kPage), std::nullopt);
  EXPECT_EQ(CheckPattern(local + kPage, kPage, 933, kPage), std::nullopt)
      << "the read-only page changed";
  ASSERT_OK(engine().UnregisterMemory(local));
  munmap(m, 3 * kPage);
}

TEST_F(AutoMultiProcessTest, ForcedShmToAPeerRefusingItFailsWithTheReason) {
  EngineOptions o = Options();
  o.transport = "shm";
  ASSERT_NO_FATAL_FAILURE(CreateEngine(o));
  PeerProcess* peer = SpawnPeer(1 * kMiB, 921, {"--refuse-same-host-copy", "1"});
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(1 * kMiB);
  ASSERT_NE(local, nullptr);
  auto seg = engine().OpenSegment(peer->peer_id());
  Status s = seg.ok() ? engine().TransferSync(
                            TransferRequest{Opcode::kWrite, local, *seg, peer->buffer_addr(), 4096})
                      : seg.status();
  EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(s.message(), AllOf(HasSubstr("same-host"), HasSubstr("refuses")));
  EXPECT_EQ(peer->Call(Checked(921, 0, 1 * kMiB)), "OK") << "nothing may have been written";
}

// A peer restarted on the same host:port: the next transfer through the same
// segment handle reaches the new instance and succeeds.
TEST_P(MultiProcessTest, PeerRestartedOnSamePortIsReachedByTheNextTransfer) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 4 * kMiB;
  PeerProcess* first = SpawnPeer(kSize, 601);
  ASSERT_NE(first, nullptr);
  const std::string peer_id = first->peer_id();
  const uint16_t port = first->port();
  ASSERT_NE(port, 0);
  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer_id));
  ASSERT_OK_AND_ASSIGN(SegmentInfo before, engine().QuerySegment(seg));
  FillPattern(local, kSize, 602, 0);
  ASSERT_OK(engine().TransferSync(
      TransferRequest{Opcode::kWrite, local, seg, first->buffer_addr(), kSize}));
  EXPECT_EQ(first->Call(Checked(602, 0, kSize)), "OK");

  first->Kill();
  PeerProcess* second = SpawnPeer(kSize, 603, {"--port", std::to_string(port)});
  ASSERT_NE(second, nullptr) << "could not restart the peer on port " << port;
  ASSERT_EQ(second->peer_id(), peer_id);

  // The very next transfer, through the old handle, to the new instance's buffer.
  FillPattern(local, kSize, 604, 0);
  EXPECT_OK(engine().TransferSync(
      TransferRequest{Opcode::kWrite, local + 17, seg, second->buffer_addr() + 17, kSize - 17}));
  EXPECT_EQ(second->Call(Checked(604, 17, kSize - 17)), "OK");
  EXPECT_EQ(second->Call(Checked(603, 0, 17)), "OK");

  ASSERT_OK_AND_ASSIGN(SegmentInfo after, engine().QuerySegment(seg));
  EXPECT_NE(after.instance_id, before.instance_id);
  bool found = false;
  for (const RemoteRegion& r : after.regions) found = found || r.addr == second->buffer_addr();
  EXPECT_TRUE(found) << "QuerySegment does not show the new instance's buffer";
  // Reads reach it too; opening the peer again gives a working handle.
  ASSERT_OK_AND_ASSIGN(SegmentHandle again, engine().OpenSegment(peer_id));
  EXPECT_OK(engine().TransferSync(
      TransferRequest{Opcode::kRead, local, again, second->buffer_addr(), 17}));
  EXPECT_EQ(DescribePatternMismatch(local, 17, 603, 0), "");
}

// Both sides' version ranges must appear in the refusal.
::testing::Matcher<const std::string&> NamesVersions(const std::vector<std::string>& numbers) {
  std::vector<::testing::Matcher<const std::string&>> all;
  for (const std::string& n : numbers) all.push_back(HasSubstr(n));
  return ::testing::AllOfArray(all);
}

TEST_P(MultiProcessTest, PeerSpeakingOnlyANewerWireVersionIsRefused) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  static_assert(kWireVersionMax < 2, "update the version-skew tests");
  PeerProcess* newer = SpawnPeer(64 * kKiB, 701, {"--wire-min", "2", "--wire-max", "2"});
  ASSERT_NE(newer, nullptr);
  EXPECT_THAT(engine().OpenSegment(newer->peer_id()),
              StatusIs(StatusCode::kFailedPrecondition,
                       NamesVersions({std::to_string(kWireVersionMin), "2"})));
  PeerProcess* range = SpawnPeer(64 * kKiB, 702, {"--wire-min", "2", "--wire-max", "9"});
  ASSERT_NE(range, nullptr);
  EXPECT_THAT(engine().OpenSegment(range->peer_id()),
              StatusIs(StatusCode::kFailedPrecondition,
                       NamesVersions({std::to_string(kWireVersionMin), "2", "9"})));
  // Refusing did not hurt either process.
  EXPECT_EQ(newer->Call("PING"), "PONG");
  EXPECT_EQ(range->Call("PING"), "PONG");
}

TEST_P(MultiProcessTest, LocalEngineSpeakingOnlyANewerWireVersionIsRefused) {
  EngineOptions o = Options();
  o.testing.wire_version_min = 2;
  o.testing.wire_version_max = 2;
  ASSERT_NO_FATAL_FAILURE(CreateEngine(o));
  PeerProcess* peer = SpawnPeer(64 * kKiB, 711);
  ASSERT_NE(peer, nullptr);
  EXPECT_THAT(engine().OpenSegment(peer->peer_id()),
              StatusIs(StatusCode::kFailedPrecondition,
                       NamesVersions({std::to_string(kWireVersionMin), "2"})));
  EXPECT_EQ(peer->Call("PING"), "PONG");
  // An engine with the real versions still gets in.
  auto normal = Engine::Create(Options());
  ASSERT_THAT(GetStatus(normal), IsOk());
  EXPECT_OK((*normal)->OpenSegment(peer->peer_id()));
}

// Overlapping ranges agree on the common version; 0..0 means the real range.
TEST_P(MultiProcessTest, OverlappingWireVersionRangesAgree) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  unsigned char* local = Alloc(4096);
  ASSERT_NE(local, nullptr);
  const std::vector<std::vector<std::string>> variants = {
      {"--wire-min", std::to_string(kWireVersionMin), "--wire-max", "7"},
      {"--wire-min", "0", "--wire-max", "0"},
  };
  for (const auto& flags : variants) {
    SCOPED_TRACE(flags[1] + ".." + flags[3]);
    PeerProcess* peer = SpawnPeer(64 * kKiB, 721, flags);
    ASSERT_NE(peer, nullptr);
    ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
    ASSERT_OK_AND_ASSIGN(SegmentInfo info, engine().QuerySegment(seg));
    EXPECT_EQ(info.wire_version, kWireVersionMax);
    FillPattern(local, 4096, 722, 100);
    EXPECT_OK(engine().TransferSync(
        TransferRequest{Opcode::kWrite, local, seg, peer->buffer_addr() + 100, 4096}));
    EXPECT_EQ(peer->Call(Checked(722, 100, 4096)), "OK");
  }
}

TEST_F(TcpMultiProcessTest, UnknownPeerIsUnavailable) {
  EngineOptions o = Options();
  o.connect_timeout = 3s;
  ASSERT_NO_FATAL_FAILURE(CreateEngine(o));
  // A port that is bound but not listening: connections are refused, and no
  // one else can take it meanwhile.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string peer_id = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  EXPECT_THAT(engine().OpenSegment(peer_id),
              StatusIs(StatusCode::kUnavailable, HasSubstr(peer_id)));
  // Not cached as a success.
  EXPECT_THAT(engine().OpenSegment(peer_id), StatusIs(StatusCode::kUnavailable));
  close(fd);
}

// 50 connections that never say anything and one that sends garbage do not
// keep a real engine from opening the peer and moving data.
TEST_F(TcpMultiProcessTest, IdleAndGarbageClientsDoNotBlockThePeer) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr uint64_t kSize = 2 * kMiB;
  // A long handshake timeout keeps the idle connections open throughout.
  PeerProcess* peer = SpawnPeer(kSize, 801, {"--handshake-timeout-ms", "120000"});
  ASSERT_NE(peer, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 50; ++i) {
    const int fd = ConnectRaw(peer->port());
    EXPECT_GE(fd, 0) << "connection " << i;
    if (fd >= 0) idle.push_back(fd);
  }
  const int garbage = ConnectRaw(peer->port());
  ASSERT_GE(garbage, 0);
  std::vector<unsigned char> junk(64 * kKiB);
  FillPattern(junk.data(), junk.size(), 802);
  // Errors are fine: the peer may hang up on it part-way.
  (void)send(garbage, "GET / HTTP/1.1\r\n\r\n", 18, MSG_NOSIGNAL);
  (void)send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);

  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  FillPattern(local, kSize, 803, 0);
  EXPECT_OK(engine().TransferSync(
      TransferRequest{Opcode::kWrite, local, seg, peer->buffer_addr(), kSize}));
  EXPECT_EQ(peer->Call(Checked(803, 0, kSize)), "OK");
  EXPECT_OK(engine().TransferSync(
      TransferRequest{Opcode::kRead, local + 5, seg, peer->buffer_addr() + 1000, 5000}));
  EXPECT_EQ(DescribePatternMismatch(local + 5, 5000, 803, 1000), "");

  // A second, fresh engine gets in as well.
  auto other = Engine::Create(Options());
  ASSERT_THAT(GetStatus(other), IsOk());
  EXPECT_OK((*other)->OpenSegment(peer->peer_id()));

  for (int fd : idle) close(fd);
  close(garbage);
  EXPECT_EQ(peer->Call("PING"), "PONG");
  other->reset();
  engine_.reset();
  EXPECT_EQ(peer->Stop(), 0) << "the peer did not shut down cleanly";
}

// Connections that do not say hello within handshake_timeout are closed.
TEST_F(TcpMultiProcessTest, IdleClientsAreDisconnectedAfterTheHandshakeTimeout) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  PeerProcess* peer = SpawnPeer(64 * kKiB, 811, {"--handshake-timeout-ms", "2000"});
  ASSERT_NE(peer, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 5; ++i) {
    const int fd = ConnectRaw(peer->port());
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (size_t i = 0; i < idle.size(); ++i) {
    EXPECT_TRUE(WaitForClose(idle[i], deadline)) << "idle connection " << i << " still open";
    close(idle[i]);
  }
  EXPECT_OK(engine().OpenSegment(peer->peer_id()));
}

// After a failed attempt while the peer is down, a restarted peer on the same
// port is reached again.
TEST_P(MultiProcessTest, PeerRestartedAfterAFailedAttemptIsReachedAgain) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine(Options(5s)));
  constexpr uint64_t kSize = 1 * kMiB;
  PeerProcess* first = SpawnPeer(kSize, 611);
  ASSERT_NE(first, nullptr);
  const uint16_t port = first->port();
  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(first->peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentInfo before, engine().QuerySegment(seg));
  ASSERT_OK(engine().TransferSync(
      TransferRequest{Opcode::kRead, local, seg, first->buffer_addr(), kSize}));
  const uint64_t old_addr = first->buffer_addr();
  first->Kill();
  EXPECT_THAT(engine().TransferSync(TransferRequest{Opcode::kRead, local, seg, old_addr, 4096}),
              PeerGoneError());
  EXPECT_THAT(engine().QuerySegment(seg), StatusIs(StatusCode::kUnavailable));

  PeerProcess* second = SpawnPeer(kSize, 612, {"--port", std::to_string(port)});
  ASSERT_NE(second, nullptr);
  // Re-handshake first this time, then move data.
  ASSERT_OK_AND_ASSIGN(SegmentInfo after, engine().QuerySegment(seg));
  EXPECT_NE(after.instance_id, before.instance_id);
  ASSERT_OK(engine().TransferSync(
      TransferRequest{Opcode::kRead, local, seg, second->buffer_addr(), kSize}));
  EXPECT_EQ(DescribePatternMismatch(local, kSize, 612, 0), "");
}

// One batch spread over eight peer processes.
TEST_P(MultiProcessTest, OneBatchAcrossEightPeers) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  constexpr int kPeers = 8;
  constexpr uint64_t kSize = 2 * kMiB;
  std::vector<PeerProcess*> peers;
  std::vector<SegmentHandle> segs;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(SpawnPeer(kSize, 900 + i));
    ASSERT_NE(peers.back(), nullptr);
    ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peers.back()->peer_id()));
    segs.push_back(seg);
  }
  unsigned char* local = Alloc(kPeers * kSize);
  unsigned char* back = Alloc(kPeers * kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(back, nullptr);
  std::vector<TransferRequest> writes, reads;
  for (uint64_t off = 0; off < kSize; off += 64 * kKiB) {
    for (int i = 0; i < kPeers; ++i) {
      unsigned char* src = local + i * kSize + off;
      FillPattern(src, 64 * kKiB, 950 + i, off);
      writes.push_back({Opcode::kWrite, src, segs[i], peers[i]->buffer_addr() + off, 64 * kKiB});
      reads.push_back({Opcode::kRead, back + i * kSize + off, segs[i],
                       peers[i]->buffer_addr() + off, 64 * kKiB});
    }
  }
  ASSERT_OK(engine().TransferSync(writes));
  for (int i = 0; i < kPeers; ++i) {
    EXPECT_EQ(peers[i]->Call(Checked(950 + i, 0, kSize)), "OK") << "peer " << i;
  }
  ASSERT_OK(engine().TransferSync(reads));
  for (int i = 0; i < kPeers; ++i) {
    EXPECT_EQ(DescribePatternMismatch(back + i * kSize, kSize, 950 + i, 0), "") << "peer " << i;
  }
}

// The initiating engine is destroyed while its requests to a frozen peer are
// in flight: it shuts down, and the peer is unharmed and serves others.
TEST_P(MultiProcessTest, EngineDestroyedWithRequestsInFlight) {
  ASSERT_NO_FATAL_FAILURE(CreateEngine(Options(10s)));
  constexpr uint64_t kSize = 8 * kMiB;
  PeerProcess* peer = SpawnPeer(kSize, 1001);
  ASSERT_NE(peer, nullptr);
  unsigned char* local = Alloc(kSize);
  ASSERT_NE(local, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine().OpenSegment(peer->peer_id()));
  ASSERT_OK(
      engine().TransferSync(TransferRequest{Opcode::kRead, local, seg, peer->buffer_addr(), 4096}));
  const std::vector<TransferRequest> reqs = MiBWrites(local, seg, *peer, 8, 1002);
  ASSERT_TRUE(peer->Freeze());
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine().AllocateBatch(reqs.size()));
  ASSERT_OK(engine().Submit(batch, reqs));
  (void)batch;
  engine_.reset();  // must not crash or hang; the batch dies with it
  peer->Signal(SIGCONT);
  EXPECT_EQ(peer->Call("PING"), "PONG");
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  unsigned char* again = Alloc(4096);
  ASSERT_NE(again, nullptr);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg2, engine().OpenSegment(peer->peer_id()));
  FillPattern(again, 4096, 1003, 0);
  EXPECT_OK(engine().TransferSync(
      TransferRequest{Opcode::kWrite, again, seg2, peer->buffer_addr(), 4096}));
  EXPECT_EQ(peer->Call(Checked(1003, 0, 4096)), "OK");
  EXPECT_EQ(peer->Stop(), 0);
}

// Raw frames built from docs/wire-format.md (little-endian).
std::string FrameHeaderBytes(uint8_t version, uint8_t type, uint32_t body_len, uint32_t payload_len,
                             uint64_t seq) {
  std::string h;
  auto put = [&h](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) h.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  h += "FRRY";
  put(version, 1);
  put(type, 1);
  put(0, 2);
  put(body_len, 4);
  put(payload_len, 4);
  put(seq, 8);
  return h;
}

bool SendAll(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// A Write frame on a connection that never said StreamHello is refused: the
// connection is closed and nothing is written.
TEST_F(TcpMultiProcessTest, WriteFrameWithoutStreamHelloIsRefused) {
  constexpr uint64_t kSize = 64 * kKiB;
  PeerProcess* peer = SpawnPeer(kSize, 1101, {"--handshake-timeout-ms", "120000"});
  ASSERT_NE(peer, nullptr);
  const int fd = ConnectRaw(peer->port());
  ASSERT_GE(fd, 0);
  std::string frame = FrameHeaderBytes(kWireVersionMax, 10, 16, 4096, 1);
  auto put = [&frame](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) frame.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(1, 4);                    // count
  put(peer->buffer_addr(), 8);  // remote_addr
  put(4096, 4);                 // length
  frame += std::string(4096, '\x5a');
  (void)SendAll(fd, frame);  // the peer may hang up part-way
  EXPECT_TRUE(WaitForClose(fd, std::chrono::steady_clock::now() + 60s))
      << "the peer kept a connection that skipped the hello";
  close(fd);
  EXPECT_EQ(peer->Call(Checked(1101, 0, kSize)), "OK") << "an unauthenticated frame wrote data";
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  EXPECT_OK(engine().OpenSegment(peer->peer_id()));
}

// ---------------------------------------------------------------------------
// Same-host streams, raw: the peer's abstract unix socket, found in
// /proc/net/unix ("@ferry-shm-<pid>-<instance id, hex>").

// The name of the peer's shm socket (without the leading NUL), or "".
std::string ShmSocketOf(pid_t pid) {
  std::ifstream in("/proc/net/unix");
  const std::string prefix = "@ferry-shm-" + std::to_string(pid) + "-";
  std::string line;
  while (std::getline(in, line)) {
    const size_t at = line.find(prefix);
    if (at != std::string::npos) return line.substr(at + 1);
  }
  return "";
}

int SocketUnix() { return socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); }

bool ConnectUnixRaw(int fd, const std::string& name) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  return connect(fd, reinterpret_cast<sockaddr*>(&addr),
                 static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size())) == 0;
}

// Reads exactly n bytes (blocking); false on EOF or error.
bool RecvExact(int fd, std::string* out, size_t n) {
  out->assign(n, '\0');
  size_t done = 0;
  while (done < n) {
    const ssize_t got = recv(fd, out->data() + done, n - done, 0);
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

void PutLE(std::string* s, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A CopyHello frame for the peer instance `instance`, with `probe` (16 bytes
// at `probe_addr` in the sender's memory).
std::string CopyHelloFrame(uint64_t instance, uint64_t probe_addr, const std::string& probe) {
  std::string body;
  PutLE(&body, 77, 8);        // initiator instance
  PutLE(&body, instance, 8);  // target instance
  PutLE(&body, kWireVersionMax, 2);
  PutLE(&body, 0, 2);  // stream index
  const std::string id = "raw-test";
  PutLE(&body, id.size(), 2);
  body += id;
  PutLE(&body, probe_addr, 8);
  PutLE(&body, probe.size(), 2);
  body += probe;
  return FrameHeaderBytes(0, 5, static_cast<uint32_t>(body.size()), 0, 1) + body;
}

// A CopyRead frame: `length` bytes at `remote` in the peer go to `local` in
// the sender's memory.
std::string CopyReadFrame(uint64_t remote, uint32_t length, uint64_t local) {
  std::string body;
  PutLE(&body, 1, 4);
  PutLE(&body, remote, 8);
  PutLE(&body, length, 4);
  PutLE(&body, local, 8);
  return FrameHeaderBytes(kWireVersionMax, 14, static_cast<uint32_t>(body.size()), 0, 1) + body;
}

// A same-host stream outlives the process that opened it (its socket passed
// on, here kept by the parent of a child that said the hello and exited):
// the peer must not copy to or from whatever process now has that pid; it
// closes the stream. The same frames from a live process are served
// (control, so the frames themselves are right).
TEST_F(AutoMultiProcessTest, SameHostStreamOfAnExitedProcessIsClosed) {
  FERRY_SKIP_WITHOUT_SAME_HOST_COPY();
  constexpr uint64_t kSize = 64 * kKiB;
  PeerProcess* peer = SpawnPeer(kSize, 1301);
  ASSERT_NE(peer, nullptr);
  const std::string name = ShmSocketOf(peer->pid());
  ASSERT_FALSE(name.empty()) << "no ferry-shm socket of pid " << peer->pid()
                             << " in /proc/net/unix";
  const uint64_t instance = std::stoull(name.substr(name.rfind('-') + 1), nullptr, 16);
  alignas(16) static char probe[16] = "ferry-raw-probe";
  const std::string hello = CopyHelloFrame(instance, reinterpret_cast<uint64_t>(probe),
                                           std::string(probe, sizeof(probe)));
  std::vector<unsigned char> local(4096, 0);
  const std::string read_frame =
      CopyReadFrame(peer->buffer_addr(), 4096, reinterpret_cast<uint64_t>(local.data()));

  // Control: this (live) process says the hello and reads 4 KiB.
  {
    const int fd = SocketUnix();
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(ConnectUnixRaw(fd, name)) << strerror(errno);
    ASSERT_TRUE(SendAll(fd, hello));
    std::string head, body;
    ASSERT_TRUE(RecvExact(fd, &head, 24));
    EXPECT_EQ(head[5], 4) << "StreamHelloAck expected";
    ASSERT_TRUE(
        RecvExact(fd, &body, static_cast<uint8_t>(head[8]) | (static_cast<uint8_t>(head[9]) << 8)));
    ASSERT_EQ(body[0], 0) << "hello refused: " << body.substr(3);
    ASSERT_TRUE(SendAll(fd, read_frame));
    ASSERT_TRUE(RecvExact(fd, &head, 24));
    EXPECT_EQ(head[5], 20) << "Ack expected";
    ASSERT_TRUE(
        RecvExact(fd, &body, static_cast<uint8_t>(head[8]) | (static_cast<uint8_t>(head[9]) << 8)));
    EXPECT_EQ(CheckPattern(local.data(), 4096, 1301, 0), std::nullopt)
        << "the control read did not land";
    close(fd);
  }

  // The child connects and says the hello on a socket this process shares.
  std::fill(local.begin(), local.end(), 0);
  const int fd = SocketUnix();
  ASSERT_GE(fd, 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    bool ok = ConnectUnixRaw(fd, name) && SendAll(fd, hello);
    char ack[64];
    ok = ok && recv(fd, ack, sizeof(ack), 0) >= 26 && ack[5] == 4 && ack[24] == 0;
    _exit(ok ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << "the child's hello failed";
  // The child is gone; its stream is not.
  ASSERT_TRUE(SendAll(fd, read_frame));
  std::string head;
  EXPECT_FALSE(RecvExact(fd, &head, 24)) << "the peer answered a frame of an exited process";
  close(fd);
  EXPECT_EQ(std::count(local.begin(), local.end(), 0), 4096) << "bytes reached this process";
  EXPECT_EQ(peer->Call("PING"), "PONG");
}

// A same-host hello on the tcp port (no peer process known) is refused with a
// reason, and the connection is not served.
TEST_F(TcpMultiProcessTest, SameHostHelloOverTcpIsRefusedWithTheReason) {
  constexpr uint64_t kSize = 64 * kKiB;
  PeerProcess* peer = SpawnPeer(kSize, 1401);
  ASSERT_NE(peer, nullptr);
  const std::string name = ShmSocketOf(peer->pid());
  ASSERT_FALSE(name.empty());
  const uint64_t instance = std::stoull(name.substr(name.rfind('-') + 1), nullptr, 16);
  alignas(16) static char probe[16] = "ferry-tcp-probe";
  const int fd = ConnectRaw(peer->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, CopyHelloFrame(instance, reinterpret_cast<uint64_t>(probe),
                                         std::string(probe, sizeof(probe)))));
  std::string head, body;
  ASSERT_TRUE(RecvExact(fd, &head, 24));
  EXPECT_EQ(head[5], 4) << "StreamHelloAck expected";
  ASSERT_TRUE(
      RecvExact(fd, &body, static_cast<uint8_t>(head[8]) | (static_cast<uint8_t>(head[9]) << 8)));
  EXPECT_EQ(body[0], 9) << "FAILED_PRECONDITION expected";
  EXPECT_THAT(body, HasSubstr("cannot tell which process"));
  // Not a stream now: a copy frame on it closes the connection.
  std::vector<unsigned char> local(4096, 0);
  (void)SendAll(fd,
                CopyReadFrame(peer->buffer_addr(), 4096, reinterpret_cast<uint64_t>(local.data())));
  EXPECT_TRUE(WaitForClose(fd, std::chrono::steady_clock::now() + 60s));
  close(fd);
  EXPECT_EQ(std::count(local.begin(), local.end(), 0), 4096);
  EXPECT_EQ(peer->Call("PING"), "PONG");
}

// Frame headers with oversized lengths are refused before any allocation: the
// connection is closed and the peer carries on.
TEST_F(TcpMultiProcessTest, OversizedFrameHeadersAreRefused) {
  constexpr uint64_t kSize = 64 * kKiB;
  PeerProcess* peer = SpawnPeer(kSize, 1201, {"--handshake-timeout-ms", "120000"});
  ASSERT_NE(peer, nullptr);
  const std::vector<std::string> headers = {
      FrameHeaderBytes(0, 1, 0xffffffffu, 0, 1),                  // huge handshake body
      FrameHeaderBytes(0, 1, (16u << 20) + 1, 0, 1),              // just over the handshake limit
      FrameHeaderBytes(kWireVersionMax, 10, 16, 0xffffffffu, 1),  // huge payload
      FrameHeaderBytes(0, 99, 0, 0, 1),                           // unknown type
  };
  for (size_t i = 0; i < headers.size(); ++i) {
    const int fd = ConnectRaw(peer->port());
    ASSERT_GE(fd, 0);
    (void)SendAll(fd, headers[i]);
    EXPECT_TRUE(WaitForClose(fd, std::chrono::steady_clock::now() + 60s)) << "header " << i;
    close(fd);
  }
  EXPECT_EQ(peer->Call("PING"), "PONG");
  EXPECT_EQ(peer->Call(Checked(1201, 0, kSize)), "OK");
  ASSERT_NO_FATAL_FAILURE(CreateEngine());
  EXPECT_OK(engine().OpenSegment(peer->peer_id()));
  EXPECT_EQ(peer->Stop(), 0);
}

}  // namespace
}  // namespace ferry::test
