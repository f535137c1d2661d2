// Faults on real links between hosts of our own: network namespaces joined
// by veth pairs (NetnsLab), with a Ferry engine in this process (moved into
// namespace "a") and ferry_test_peer processes started inside the others.
// Faults: packet loss by nftables, rate limits by tc tbf, links set down and
// up mid-transfer. Every request either completes with its bytes verified
// (writes: by the peer, in its own memory; reads: here) or fails with a clear
// code (UNAVAILABLE or DEADLINE_EXCEEDED, with a message) within its
// deadline; after a fault is lifted, new transfers on the same engines and
// the same opened segments succeed.
//
// Needs root and `ip netns` (skips saying why otherwise); nft and tc for the
// cases that use them. Every wait is bounded; nothing asserts how long
// anything took.

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/integration/peer_process.h"
#include "tests/netns/netns_lab.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/status_matchers.h"

#ifndef FERRY_TEST_PEER_PATH
#error "FERRY_TEST_PEER_PATH must name the ferry_test_peer executable"
#endif

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using netns::NetnsLab;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kBlock = 256 * kKiB;
// A peer's buffer: [0, 16 MiB) takes the writes under a fault, [16, 32 MiB)
// is read (it keeps the peer's own pattern), [32, 40 MiB) takes the writes
// of the clean rounds.
constexpr uint64_t kPeerSize = 40 * kMiB;
constexpr uint64_t kReadBase = 16 * kMiB;
constexpr uint64_t kCleanBase = 32 * kMiB;
// Beyond its deadline, how long a batch may take to report its end (the
// deadline checks run every 50 ms; a loaded machine is slow).
constexpr auto kGrace = 20s;

// Host a is this process; b and c run peers.
constexpr const char* kAddrA = "10.77.1.1";
constexpr const char* kAddrB = "10.77.1.2";
constexpr const char* kAddrAc = "10.77.2.1";
constexpr const char* kAddrC = "10.77.2.3";

std::string Checked(uint64_t seed, uint64_t off, uint64_t len) {
  return "CHECK " + std::to_string(seed) + " " + std::to_string(off) + " " + std::to_string(len);
}

// A peer process and the segment this process's engine opened to it.
struct Remote {
  PeerProcess* peer = nullptr;
  SegmentHandle seg;
  uint64_t seed = 0;  // the peer's buffer holds stream `seed` at position = offset
  uint64_t base() const { return peer->buffer_addr(); }
};

// How each request of one batch ended.
struct Outcomes {
  std::vector<TransferStatus> each;
  size_t completed = 0;
  size_t failed = 0;
  std::map<std::string, int> errors;  // "CODE: message" -> how many

  std::string Summary() const {
    std::string s = std::to_string(completed) + " completed, " + std::to_string(failed) + " failed";
    for (const auto& [what, n] : errors) s += "; " + std::to_string(n) + " x " + what;
    return s;
  }
};

// `count` blocks of kBlock: local block i at local + i * kBlock, remote at
// remote_off + i * kBlock of the peer's buffer.
std::vector<TransferRequest> Blocks(Opcode op, unsigned char* local, const Remote& r,
                                    uint64_t remote_off, size_t count) {
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < count; ++i) {
    reqs.push_back({op, local + i * kBlock, r.seg, r.base() + remote_off + i * kBlock, kBlock});
  }
  return reqs;
}

// Fills the sources of writes to remote_off.. with stream `seed` at
// position = remote offset (what the peer's CHECK expects).
void FillWrites(unsigned char* local, uint64_t seed, uint64_t remote_off, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    FillPattern(local + i * kBlock, kBlock, seed, remote_off + i * kBlock);
  }
}

class NetnsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }

  // Why this machine cannot run these tests ("" if it can); probed once.
  static const std::string& Unavailable() {
    static const std::string why = [] {
      std::string w = netns::Unavailable();
      if (w.empty()) {
        for (const std::string& name : netns::RemoveStale()) {
          std::printf("removed stale namespace %s (its run is gone)\n", name.c_str());
        }
      }
      return w;
    }();
    return why;
  }

  void SetUp() override {
    const std::string& why = Unavailable();
    if (!why.empty()) GTEST_SKIP() << "no network namespaces of our own: " << why;
  }

  void TearDown() override {
    engines_.clear();  // before their buffers, while still in namespace a
    buffers_.clear();
    for (auto& p : peers_) {
      if (p->running() && p->Stop(5s) != 0) p->Kill();
    }
    peers_.clear();
    for (int slot : peer_slots_) netns::ForgetProcess(slot);
    peer_slots_.clear();
    lab_.RemoveAll();
  }

  void RequireTool(const char* tool) {
    if (netns::Tool(tool).empty()) GTEST_SKIP() << "no `" << tool << "` command on this machine";
  }

  // Hosts a and b joined by one veth pair; this thread (and the engines it
  // creates) in a.
  void TwoHosts() {
    ASSERT_TRUE(lab_.AddNamespace("a"));
    ASSERT_TRUE(lab_.AddNamespace("b"));
    ASSERT_TRUE(lab_.Connect("a", "to-b", kAddrA, "b", "to-a", kAddrB));
    ASSERT_TRUE(lab_.Enter("a"));
  }

  // Starts ferry_test_peer inside namespace `tag`, listening on `addr`.
  PeerProcess* StartPeer(const std::string& tag, const std::string& addr, uint64_t seed,
                         const std::vector<std::string>& extra = {}) {
    peers_.push_back(std::make_unique<PeerProcess>());
    PeerProcess* p = peers_.back().get();
    std::vector<std::string> args = {
        "--host", addr, "--size", std::to_string(kPeerSize), "--seed", std::to_string(seed)};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::vector<std::string> argv = lab_.InNamespace(tag, FERRY_TEST_PEER_PATH, args);
    const ::testing::AssertionResult started = p->Start(netns::Tool("ip"), argv);
    EXPECT_TRUE(started);
    if (p->pid() > 0) peer_slots_.push_back(netns::RememberProcess(p->pid()));
    if (!started) return nullptr;
    // It listens on its veth address and nowhere else.
    EXPECT_EQ(p->peer_id().rfind(addr + ":", 0), 0u) << p->peer_id();
    return p;
  }

  Engine* StartEngine(const std::string& addr, std::chrono::milliseconds transfer_timeout,
                      const std::string& fabric_nics = "") {
    EngineOptions o;
    o.transport = "tcp";  // the peers share our boot id, but not our network namespace
    if (!fabric_nics.empty()) {
      o.transport = "fabric";
      o.fabric_provider = "tcp";
      o.fabric_nics = fabric_nics;
    }
    o.listen_host = addr;
    o.listen_port = 0;
    o.transfer_timeout = transfer_timeout;
    o.connect_timeout = 5s;
    auto e = Engine::Create(std::move(o));
    EXPECT_THAT(GetStatus(e), IsOk());
    if (!e.ok()) return nullptr;
    engines_.push_back(std::move(e).value());
    EXPECT_EQ(engines_.back()->PeerId().rfind(addr + ":", 0), 0u) << engines_.back()->PeerId();
    return engines_.back().get();
  }

  unsigned char* Alloc(Engine* e, size_t size) {
    buffers_.push_back(std::make_unique<AlignedBuffer>(size));
    unsigned char* p = buffers_.back()->data();
    const Status s = e->RegisterMemory(p, size);
    EXPECT_THAT(s, IsOk());
    return s.ok() ? p : nullptr;
  }

  Remote Open(Engine* e, PeerProcess* peer, uint64_t seed) {
    Remote r;
    r.peer = peer;
    r.seed = seed;
    auto seg = e->OpenSegment(peer->peer_id());
    EXPECT_THAT(GetStatus(seg), IsOk());
    if (seg.ok()) r.seg = *seg;
    return r;
  }

  // Submits `reqs` as one batch and waits until each request has ended,
  // which it must by its deadline (plus kGrace for the report).
  BatchId Submit(Engine* e, const std::vector<TransferRequest>& reqs) {
    auto batch = e->AllocateBatch(reqs.size());
    EXPECT_THAT(GetStatus(batch), IsOk());
    if (!batch.ok()) return {};
    EXPECT_THAT(e->Submit(*batch, reqs), IsOk());
    return *batch;
  }

  Outcomes Finish(Engine* e, BatchId batch, size_t n) {
    Outcomes o;
    (void)e->WaitBatch(batch, e->options().transfer_timeout + kGrace);
    for (size_t i = 0; i < n; ++i) {
      auto ts = e->GetTransferStatus(batch, i);
      EXPECT_THAT(GetStatus(ts), IsOk());
      if (!ts.ok()) continue;
      o.each.push_back(*ts);
      if (ts->state == TransferState::kCompleted) {
        ++o.completed;
      } else if (ts->state == TransferState::kFailed) {
        ++o.failed;
        const StatusCode c = ts->status.code();
        EXPECT_TRUE(c == StatusCode::kUnavailable || c == StatusCode::kDeadlineExceeded)
            << "request " << i << ": " << ts->status;
        EXPECT_FALSE(ts->status.message().empty()) << "request " << i;
        ++o.errors[ts->status.ToString()];
      } else {
        ADD_FAILURE() << "request " << i << " still pending past its deadline";
      }
    }
    EXPECT_THAT(e->FreeBatch(batch), IsOk());
    return o;
  }

  Outcomes RunBatch(Engine* e, const std::vector<TransferRequest>& reqs) {
    const BatchId b = Submit(e, reqs);
    if (b.value == 0) return {};
    return Finish(e, b, reqs.size());
  }

  // Every completed write of `o` (writes of stream `seed` to remote_off..)
  // is in the peer's memory, checked there.
  void ExpectWritesLanded(const Remote& r, const Outcomes& o, uint64_t seed, uint64_t remote_off) {
    for (size_t i = 0; i < o.each.size(); ++i) {
      if (o.each[i].state != TransferState::kCompleted) continue;
      EXPECT_EQ(r.peer->Call(Checked(seed, remote_off + i * kBlock, kBlock)), "OK")
          << "write " << i << " completed but its bytes are not in the peer";
    }
  }

  // Every completed read of `o` (from remote_off..) brought the peer's bytes.
  void ExpectReadsArrived(const Remote& r, const Outcomes& o, const unsigned char* local,
                          uint64_t remote_off) {
    for (size_t i = 0; i < o.each.size(); ++i) {
      if (o.each[i].state != TransferState::kCompleted) continue;
      EXPECT_EQ(
          DescribePatternMismatch(local + i * kBlock, kBlock, r.seed, remote_off + i * kBlock), "")
          << "read " << i;
    }
  }

  // No fault: 8 writes (stream `seed`, into the clean area) and 8 reads all
  // complete, with their bytes.
  void CleanRound(Engine* e, const Remote& r, unsigned char* src, unsigned char* dst,
                  uint64_t seed) {
    constexpr size_t kCount = 8;
    const uint64_t woff = kCleanBase + (seed % 4) * kCount * kBlock;
    FillWrites(src, seed, woff, kCount);
    const Outcomes w = RunBatch(e, Blocks(Opcode::kWrite, src, r, woff, kCount));
    EXPECT_EQ(w.completed, kCount)
        << "clean writes to " << r.peer->peer_id() << ": " << w.Summary();
    ExpectWritesLanded(r, w, seed, woff);
    std::memset(dst, 0, kCount * kBlock);
    const uint64_t roff = kReadBase + (seed % 8) * kCount * kBlock;
    const Outcomes rd = RunBatch(e, Blocks(Opcode::kRead, dst, r, roff, kCount));
    EXPECT_EQ(rd.completed, kCount)
        << "clean reads from " << r.peer->peer_id() << ": " << rd.Summary();
    ExpectReadsArrived(r, rd, dst, roff);
  }

  // Two hosts; `op` of 4 MiB, slowed to 20 mbit on the way its bytes go (a
  // write's payload to the peer, a read's replies from it), so they are
  // still in flight when the initiator's link is deleted 300 ms later (both
  // ends of the pair go: no FIN, no reset). Asked to quit, the peer must
  // unregister its buffer and exit 0, not stay stuck on the pins of what
  // will never be completed.
  void InitiatorVanishesMidTransfer(Opcode op, uint64_t seed) {
    RequireTool("tc");
    ASSERT_NO_FATAL_FAILURE(TwoHosts());
    PeerProcess* peer = StartPeer("b", kAddrB, seed);
    ASSERT_NE(peer, nullptr);
    Engine* e = StartEngine(kAddrA, 2s);
    ASSERT_NE(e, nullptr);
    constexpr size_t kCount = 16;
    unsigned char* src = Alloc(e, kCount * kBlock);
    unsigned char* dst = Alloc(e, kCount * kBlock);
    ASSERT_NE(src, nullptr);
    ASSERT_NE(dst, nullptr);
    const Remote r = Open(e, peer, seed);
    ASSERT_NO_FATAL_FAILURE(CleanRound(e, r, src, dst, seed + 1));

    const bool write = op == Opcode::kWrite;
    ASSERT_TRUE(write ? lab_.SetRate("a", "to-b", "20mbit") : lab_.SetRate("b", "to-a", "20mbit"));
    if (write) FillWrites(src, seed + 2, 0, kCount);
    const BatchId b =
        Submit(e, write ? Blocks(op, src, r, 0, kCount) : Blocks(op, dst, r, kReadBase, kCount));
    ASSERT_NE(b.value, 0u);
    std::this_thread::sleep_for(300ms);  // let part of it through
    ASSERT_TRUE(lab_.Ip("a", {"link", "del", "to-b"}));
    const Outcomes o = Finish(e, b, kCount);
    std::printf("initiator's link deleted mid-%s: %s\n", write ? "frame" : "read-reply",
                o.Summary().c_str());
    EXPECT_EQ(peer->Stop(45s), 0) << "the peer did not shut down";
  }

  NetnsLab lab_;
  std::vector<std::unique_ptr<PeerProcess>> peers_;
  std::vector<int> peer_slots_;  // the peers' entries in the signal handler's table
  std::vector<std::unique_ptr<AlignedBuffer>> buffers_;  // outlive the engines
  std::vector<std::unique_ptr<Engine>> engines_;
};

// ---------------------------------------------------------------------------
// (a) Packet loss on one host.

class NetnsLossTest : public NetnsTest, public ::testing::WithParamInterface<int> {};

INSTANTIATE_TEST_SUITE_P(Percent, NetnsLossTest, ::testing::Values(2, 10),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "percent";
                         });

TEST_P(NetnsLossTest, EveryTransferEndsWithItsBytesOrAClearCode) {
  RequireTool("nft");
  ASSERT_NO_FATAL_FAILURE(TwoHosts());
  PeerProcess* peer = StartPeer("b", kAddrB, 501);
  ASSERT_NE(peer, nullptr);
  Engine* e = StartEngine(kAddrA, 20s);
  ASSERT_NE(e, nullptr);
  constexpr size_t kCount = 64;  // x 256 KiB = 16 MiB each way
  unsigned char* src = Alloc(e, kCount * kBlock);
  unsigned char* dst = Alloc(e, kCount * kBlock);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  const Remote r = Open(e, peer, 501);
  // The data streams (opened by the first transfer) come up before the loss.
  ASSERT_NO_FATAL_FAILURE(CleanRound(e, r, src, dst, 502));

  ASSERT_TRUE(lab_.SetLoss("b", GetParam()));
  constexpr uint64_t kData = 503;
  FillWrites(src, kData, 0, kCount);
  const Outcomes w = RunBatch(e, Blocks(Opcode::kWrite, src, r, 0, kCount));
  ExpectWritesLanded(r, w, kData, 0);
  const Outcomes rd = RunBatch(e, Blocks(Opcode::kRead, dst, r, kReadBase, kCount));
  ExpectReadsArrived(r, rd, dst, kReadBase);
  std::printf("%d %% loss: writes %s\n%d %% loss: reads %s\n", GetParam(), w.Summary().c_str(),
              GetParam(), rd.Summary().c_str());
  // The link still carries bytes under this much loss.
  EXPECT_GT(w.completed, 0u) << w.Summary();
  EXPECT_GT(rd.completed, 0u) << rd.Summary();

  ASSERT_TRUE(lab_.SetLoss("b", 0));
  CleanRound(e, r, src, dst, 504);
}

// ---------------------------------------------------------------------------
// (b) A rate limit (tc tbf) on both ends of the link.

TEST_F(NetnsTest, RateLimitedTransfersCompleteAndOneThatCannotFinishFailsDeadlineExceeded) {
  RequireTool("tc");
  ASSERT_NO_FATAL_FAILURE(TwoHosts());
  PeerProcess* peer = StartPeer("b", kAddrB, 601);
  ASSERT_NE(peer, nullptr);
  Engine* patient = StartEngine(kAddrA, 30s);
  Engine* hasty = StartEngine(kAddrA, 1s);
  ASSERT_NE(patient, nullptr);
  ASSERT_NE(hasty, nullptr);
  unsigned char* src = Alloc(patient, 8 * kBlock);
  unsigned char* dst = Alloc(patient, 8 * kBlock);
  constexpr uint64_t kBig = 24 * kMiB;  // at 50 mbit: about 4 s
  unsigned char* big = Alloc(hasty, kBig);
  unsigned char* small = Alloc(hasty, kBlock);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  ASSERT_NE(big, nullptr);
  ASSERT_NE(small, nullptr);
  const Remote r = Open(patient, peer, 601);
  const Remote rh = Open(hasty, peer, 601);

  ASSERT_TRUE(lab_.SetRate("a", "to-b", "50mbit"));
  ASSERT_TRUE(lab_.SetRate("b", "to-a", "50mbit"));
  // 2 MiB each way at 50 mbit: well within 30 s.
  CleanRound(patient, r, src, dst, 602);

  // 24 MiB cannot cross 50 mbit within a 1 s deadline: it fails, saying so.
  FillPattern(big, kBig, 603, 0);
  const Outcomes late = RunBatch(hasty, {{Opcode::kWrite, big, rh.seg, rh.base(), kBig}});
  ASSERT_EQ(late.each.size(), 1u);
  EXPECT_EQ(late.each[0].state, TransferState::kFailed);
  EXPECT_THAT(late.each[0].status, StatusIs(StatusCode::kDeadlineExceeded)) << late.Summary();
  std::printf("24 MiB at 50 mbit, 1 s deadline: %s\n", late.Summary().c_str());

  // The other engine is not held up by it, still under the limit.
  CleanRound(patient, r, src, dst, 605);
  // Without the limit the hasty engine's next transfer (on new streams) succeeds.
  ASSERT_TRUE(lab_.SetRate("a", "to-b", ""));
  ASSERT_TRUE(lab_.SetRate("b", "to-a", ""));
  FillPattern(small, kBlock, 606, kCleanBase + 7 * kMiB);
  const Outcomes after =
      RunBatch(hasty, {{Opcode::kWrite, small, rh.seg, rh.base() + kCleanBase + 7 * kMiB, kBlock}});
  EXPECT_EQ(after.completed, 1u) << after.Summary();
  EXPECT_EQ(peer->Call(Checked(606, kCleanBase + 7 * kMiB, kBlock)), "OK");
}

// ---------------------------------------------------------------------------
// (c) The link goes down mid-transfer and comes back.

// Waits (bounded) until `batch` has at least `n` requests ended.
void WaitForProgress(Engine* e, BatchId batch, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = e->GetBatchStatus(batch);
    if (!s.ok() || s->completed + s->failed >= n || s->state != TransferState::kPending) return;
    std::this_thread::sleep_for(1ms);
  }
}

TEST_F(NetnsTest, LinkDownUntilTheDeadlineThenUpAndTheSameSegmentWorksAgain) {
  RequireTool("tc");
  ASSERT_NO_FATAL_FAILURE(TwoHosts());
  PeerProcess* peer = StartPeer("b", kAddrB, 701);
  ASSERT_NE(peer, nullptr);
  Engine* e = StartEngine(kAddrA, 3s);
  ASSERT_NE(e, nullptr);
  constexpr size_t kCount = 64;
  unsigned char* src = Alloc(e, kCount * kBlock);
  unsigned char* dst = Alloc(e, kCount * kBlock);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  const Remote r = Open(e, peer, 701);
  ASSERT_NO_FATAL_FAILURE(CleanRound(e, r, src, dst, 702));

  // Slow enough (16 MiB at 100 mbit: over a second) that the link goes down
  // with most of the batch still to go.
  ASSERT_TRUE(lab_.SetRate("a", "to-b", "100mbit"));
  FillWrites(src, 703, 0, kCount);
  const BatchId b = Submit(e, Blocks(Opcode::kWrite, src, r, 0, kCount));
  ASSERT_NE(b.value, 0u);
  WaitForProgress(e, b, 2);
  ASSERT_TRUE(lab_.SetLink("a", "to-b", false));
  auto at_down = e->GetBatchStatus(b);
  ASSERT_THAT(GetStatus(at_down), IsOk());
  // Down for longer than the deadline: what was in flight ends, clearly.
  const Outcomes w = Finish(e, b, kCount);
  std::printf("link down with %zu of %zu writes ended: %s\n", at_down->completed + at_down->failed,
              size_t{kCount}, w.Summary().c_str());
  ASSERT_TRUE(lab_.SetLink("a", "to-b", true));
  ASSERT_TRUE(lab_.SetRate("a", "to-b", ""));
  ExpectWritesLanded(r, w, 703, 0);

  // Same engine, same peer process, same segment handle.
  EXPECT_EQ(peer->Call("PING"), "PONG");
  CleanRound(e, r, src, dst, 704);
  CleanRound(e, r, src, dst, 705);
}

TEST_F(NetnsTest, LinkDownBrieflyMidTransferEveryRequestEndsClearlyAndLaterOnesSucceed) {
  RequireTool("tc");
  ASSERT_NO_FATAL_FAILURE(TwoHosts());
  PeerProcess* peer = StartPeer("b", kAddrB, 711);
  ASSERT_NE(peer, nullptr);
  Engine* e = StartEngine(kAddrA, 15s);
  ASSERT_NE(e, nullptr);
  constexpr size_t kCount = 64;
  unsigned char* src = Alloc(e, kCount * kBlock);
  unsigned char* dst = Alloc(e, kCount * kBlock);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  const Remote r = Open(e, peer, 711);
  ASSERT_NO_FATAL_FAILURE(CleanRound(e, r, src, dst, 712));

  // Reads this time: the peer's replies are what the outage cuts.
  ASSERT_TRUE(lab_.SetRate("b", "to-a", "100mbit"));
  const BatchId b = Submit(e, Blocks(Opcode::kRead, dst, r, kReadBase, kCount));
  ASSERT_NE(b.value, 0u);
  WaitForProgress(e, b, 2);
  ASSERT_TRUE(lab_.SetLink("b", "to-a", false));
  std::this_thread::sleep_for(1s);  // an outage shorter than the deadline
  ASSERT_TRUE(lab_.SetLink("b", "to-a", true));
  const Outcomes rd = Finish(e, b, kCount);
  std::printf("link down for 1 s mid-read: %s\n", rd.Summary().c_str());
  ExpectReadsArrived(r, rd, dst, kReadBase);
  ASSERT_TRUE(lab_.SetRate("b", "to-a", ""));
  CleanRound(e, r, src, dst, 713);
}

// The initiator's host vanishes (its link deleted) while the peer has a
// frame half received: no FIN, no reset will ever come. The peer must still
// notice, release what that frame pinned, and shut down when asked (its
// UnregisterMemory waits for the pins).
TEST_F(NetnsTest, APeerWhoseInitiatorVanishesMidFrameStillShutsDown) {
  InitiatorVanishesMidTransfer(Opcode::kWrite, 721);
}

// The same, for reads: the initiator's host vanishes while the peer is still
// sending it read replies. Those bytes stay unacknowledged, so keepalive
// never probes (it runs only on an idle connection) and the kernel would
// retransmit for about 15 minutes (tcp_retries2) with the replied ranges
// pinned. TCP_USER_TIMEOUT (10 s) fails the stream instead; the peer then
// releases them and shuts down when asked.
TEST_F(NetnsTest, APeerWhoseInitiatorVanishesMidReadReplyStillShutsDown) {
  InitiatorVanishesMidTransfer(Opcode::kRead, 731);
}

// ---------------------------------------------------------------------------
// (d) Three hosts: one peer's link down does not disturb the other peer.

TEST_F(NetnsTest, OnePeersLinkDownDoesNotDisturbTransfersWithTheOther) {
  ASSERT_TRUE(lab_.AddNamespace("a"));
  ASSERT_TRUE(lab_.AddNamespace("b"));
  ASSERT_TRUE(lab_.AddNamespace("c"));
  ASSERT_TRUE(lab_.Connect("a", "to-b", kAddrA, "b", "to-a", kAddrB));
  ASSERT_TRUE(lab_.Connect("a", "to-c", kAddrAc, "c", "to-a", kAddrC));
  ASSERT_TRUE(lab_.Enter("a"));
  PeerProcess* pb = StartPeer("b", kAddrB, 801);
  PeerProcess* pc = StartPeer("c", kAddrC, 802);
  ASSERT_NE(pb, nullptr);
  ASSERT_NE(pc, nullptr);
  Engine* e = StartEngine(kAddrA, 4s);
  ASSERT_NE(e, nullptr);
  constexpr size_t kCount = 16;
  unsigned char* src = Alloc(e, kCount * kBlock);
  unsigned char* dst = Alloc(e, kCount * kBlock);
  unsigned char* to_c = Alloc(e, kCount * kBlock);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  ASSERT_NE(to_c, nullptr);
  const Remote rb = Open(e, pb, 801);
  const Remote rc = Open(e, pc, 802);
  ASSERT_NO_FATAL_FAILURE(CleanRound(e, rb, src, dst, 803));
  ASSERT_NO_FATAL_FAILURE(CleanRound(e, rc, src, dst, 804));

  // c's side of its link goes down; a batch to c is stuck until its deadline.
  ASSERT_TRUE(lab_.SetLink("c", "to-a", false));
  FillWrites(to_c, 805, 0, kCount);
  const BatchId stuck = Submit(e, Blocks(Opcode::kWrite, to_c, rc, 0, kCount));
  ASSERT_NE(stuck.value, 0u);

  // Meanwhile b is served as usual: rounds while c's batch is pending (at
  // least 3, at most 200), every one complete with its bytes.
  int rounds = 0, rounds_while_stuck = 0;
  for (; rounds < 200; ++rounds) {
    auto s = e->GetBatchStatus(stuck);
    ASSERT_THAT(GetStatus(s), IsOk());
    const bool pending = s->state == TransferState::kPending;
    if (!pending && rounds >= 3) break;
    rounds_while_stuck += pending ? 1 : 0;
    ASSERT_NO_FATAL_FAILURE(CleanRound(e, rb, src, dst, 810 + rounds));
    if (HasFailure()) break;
  }
  const Outcomes c = Finish(e, stuck, kCount);
  std::printf("to b: %d clean rounds, %d while c's batch was stuck; to c (link down): %s\n", rounds,
              rounds_while_stuck, c.Summary().c_str());
  // Nothing crosses a link that is down.
  EXPECT_EQ(c.failed, size_t{kCount}) << c.Summary();

  // c comes back: the same segment works again, and b's still does.
  ASSERT_TRUE(lab_.SetLink("c", "to-a", true));
  CleanRound(e, rc, src, dst, 806);
  CleanRound(e, rb, src, dst, 807);
}

// ---------------------------------------------------------------------------
// (e) Striping: the fabric transport with two NICs (two veth pairs between
// the same two hosts, one domain and endpoint each) spreads large requests
// over both; every byte still arrives.

// This thread's network namespace's counters of `dev`: bytes sent and
// received (/proc/thread-self/net/dev is the namespace of the reading
// thread, which Enter moved into a).
struct DevBytes {
  uint64_t rx = 0, tx = 0;
};
DevBytes ReadDev(const std::string& dev) {
  std::ifstream in("/proc/thread-self/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != dev) continue;
    std::istringstream fields(line.substr(colon + 1));
    std::vector<uint64_t> v;
    uint64_t x = 0;
    while (fields >> x) v.push_back(x);
    // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes ...
    if (v.size() >= 9) return {v[0], v[8]};
  }
  ADD_FAILURE() << "no counters for " << dev << " in /proc/thread-self/net/dev";
  return {};
}

constexpr const char* kAddrA2 = "10.77.3.1";
constexpr const char* kAddrB2 = "10.77.3.2";

TEST_F(NetnsTest, FabricWithTwoNicsStripesLargeRequestsAcrossBothAndEveryByteArrives) {
  ASSERT_TRUE(lab_.AddNamespace("a"));
  ASSERT_TRUE(lab_.AddNamespace("b"));
  ASSERT_TRUE(lab_.Connect("a", "to-b", kAddrA, "b", "to-a", kAddrB));
  ASSERT_TRUE(lab_.Connect("a", "to-b2", kAddrA2, "b", "to-a2", kAddrB2));
  ASSERT_TRUE(lab_.Enter("a"));
  const std::string nics_b = std::string(kAddrB) + "," + kAddrB2;
  PeerProcess* pb =
      StartPeer("b", kAddrB, 901, {"--fabric-provider", "tcp", "--fabric-nics", nics_b});
  ASSERT_NE(pb, nullptr);
  Engine* e = StartEngine(kAddrA, 20s, std::string(kAddrA) + "," + kAddrA2);
  if (e == nullptr) return;  // the failure says why
  constexpr uint64_t kReq = kMiB;
  constexpr size_t kCount = 16;
  unsigned char* src = Alloc(e, kCount * kReq);
  unsigned char* dst = Alloc(e, kCount * kReq);
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  const Remote r = Open(e, pb, 901);
  ASSERT_NE(r.seg.value, 0u);
  // (The engine's transport is forced to fabric: no tcp fallback.)

  const DevBytes before1 = ReadDev("to-b"), before2 = ReadDev("to-b2");
  // Writes: 16 requests of 1 MiB (stripes of 512 KiB), checked in the peer.
  std::vector<TransferRequest> writes;
  for (size_t i = 0; i < kCount; ++i) {
    FillPattern(src + i * kReq, kReq, 902, i * kReq);
    writes.push_back({Opcode::kWrite, src + i * kReq, r.seg, r.base() + i * kReq, kReq});
  }
  const Outcomes w = RunBatch(e, writes);
  EXPECT_EQ(w.completed, kCount) << w.Summary();
  for (size_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(pb->Call(Checked(902, i * kReq, kReq)), "OK") << "write " << i;
  }
  const DevBytes mid1 = ReadDev("to-b"), mid2 = ReadDev("to-b2");
  // Reads: from the peer's own pattern, checked here.
  std::vector<TransferRequest> reads;
  for (size_t i = 0; i < kCount; ++i) {
    reads.push_back({Opcode::kRead, dst + i * kReq, r.seg, r.base() + kReadBase + i * kReq, kReq});
  }
  const Outcomes rd = RunBatch(e, reads);
  EXPECT_EQ(rd.completed, kCount) << rd.Summary();
  for (size_t i = 0; i < kCount; ++i) {
    EXPECT_EQ(DescribePatternMismatch(dst + i * kReq, kReq, 901, kReadBase + i * kReq), "")
        << "read " << i;
  }
  const DevBytes after1 = ReadDev("to-b"), after2 = ReadDev("to-b2");

  // Each NIC carried a fair part of the data both ways (an even split is
  // half; a quarter leaves room for the dealing's rounding).
  const uint64_t total = kCount * kReq, quarter = total / 4;
  const uint64_t sent1 = mid1.tx - before1.tx, sent2 = mid2.tx - before2.tx;
  const uint64_t got1 = after1.rx - mid1.rx, got2 = after2.rx - mid2.rx;
  std::printf(
      "writes of %llu bytes: to-b sent %llu, to-b2 sent %llu; reads: to-b received %llu, to-b2 "
      "%llu\n",
      static_cast<unsigned long long>(total), static_cast<unsigned long long>(sent1),
      static_cast<unsigned long long>(sent2), static_cast<unsigned long long>(got1),
      static_cast<unsigned long long>(got2));
  EXPECT_GE(sent1, quarter);
  EXPECT_GE(sent2, quarter);
  EXPECT_GE(got1, quarter);
  EXPECT_GE(got2, quarter);
  // And nothing went anywhere else: the two NICs together carried no more
  // than the data and its headers (an eighth more at most).
  EXPECT_LE(sent1 + sent2, total + total / 8);
  EXPECT_LE(got1 + got2, total + total / 8);
}

// Striping over a slow rail: the second NIC is limited to 40 Mbit/s (tc tbf),
// so its half of each request lands long after the first NIC's. A
// notification sent right after the writes (not waited for) must still
// arrive after all of them: the fabric link waits for every rail's writes
// before it sends on rail 0. The peer checks its memory the moment it sees
// the notification. (On loopback both rails are equally fast and a wait on
// rail 0 alone could not be caught; here it arrives ~0.5 s early.)
TEST_F(NetnsTest, FabricNotificationWaitsForTheWritesOfASlowRail) {
  ASSERT_TRUE(lab_.AddNamespace("a"));
  ASSERT_TRUE(lab_.AddNamespace("b"));
  ASSERT_TRUE(lab_.Connect("a", "to-b", kAddrA, "b", "to-a", kAddrB));
  ASSERT_TRUE(lab_.Connect("a", "to-b2", kAddrA2, "b", "to-a2", kAddrB2));
  ASSERT_TRUE(lab_.SetRate("a", "to-b2", "40mbit"));
  ASSERT_TRUE(lab_.Enter("a"));
  const std::string nics_b = std::string(kAddrB) + "," + kAddrB2;
  PeerProcess* pb =
      StartPeer("b", kAddrB, 911, {"--fabric-provider", "tcp", "--fabric-nics", nics_b});
  ASSERT_NE(pb, nullptr);
  Engine* e = StartEngine(kAddrA, 30s, std::string(kAddrA) + "," + kAddrA2);
  if (e == nullptr) return;  // the failure says why
  constexpr uint64_t kReq = kMiB;
  constexpr size_t kCount = 4;  // 2 MiB over the slow rail: about 0.4 s
  unsigned char* src = Alloc(e, kCount * kReq);
  ASSERT_NE(src, nullptr);
  const Remote r = Open(e, pb, 911);
  ASSERT_NE(r.seg.value, 0u);
  std::vector<TransferRequest> writes;
  for (size_t i = 0; i < kCount; ++i) {
    FillPattern(src + i * kReq, kReq, 912, i * kReq);
    writes.push_back({Opcode::kWrite, src + i * kReq, r.seg, r.base() + i * kReq, kReq});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, e->AllocateBatch(kCount));
  ASSERT_OK(e->Submit(batch, writes));
  ASSERT_OK(e->SendNotification(r.seg, "slow-rail", Checked(912, 0, kCount * kReq)));
  EXPECT_EQ(pb->Call("NOTE slow-rail"), "NOTE OK")
      << "the notification overtook the slow rail's writes";
  ASSERT_OK(e->WaitBatch(batch, 30000ms));
  ASSERT_OK(e->FreeBatch(batch));
  EXPECT_EQ(pb->Call(Checked(912, 0, kCount * kReq)), "OK");
}

}  // namespace
}  // namespace ferry::test
