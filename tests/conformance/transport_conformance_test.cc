// Transport conformance: one suite every transport must pass.
//
// Each case starts two engines in this process, both forced to the transport
// under test (EngineOptions.transport), and lets the "initiator" open the
// segment of the "target". Data is checked byte for byte against patterns
// that depend on the request and on the position, and bytes outside the
// target ranges are checked to be untouched.
//
// To run the suite against another transport, add its name to kTransports.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ferry/ferry.h"
#include "tests/conformance/conformance_fixture.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/status_matchers.h"

namespace ferry::test {
namespace {

using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

// ---------------------------------------------------------------------------
// Fixtures

class TransportConformanceTest : public ::testing::TestWithParam<std::string>, public EnginePair {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Start(GetParam())); }
};

INSTANTIATE_TEST_SUITE_P(AllTransports, TransportConformanceTest, ::testing::ValuesIn(kTransports),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });
// The target's buffers in file regions (conformance_fixture.h).
INSTANTIATE_TEST_SUITE_P(FileTargets, TransportConformanceTest, ::testing::ValuesIn(kFileTargets),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// (transport, size, unaligned)
using SizeParam = std::tuple<std::string, uint64_t, bool>;

class TransferSizeConformanceTest : public ::testing::TestWithParam<SizeParam>, public EnginePair {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Start(std::get<0>(GetParam()))); }
  uint64_t size() const { return std::get<1>(GetParam()); }
  bool unaligned() const { return std::get<2>(GetParam()); }

  // One request of size() bytes; guards of 4 KiB (+ a few bytes when
  // unaligned) on either side of both the local and the remote range.
  void RunOne(Opcode op) {
    constexpr uint64_t kGuard = 4096;
    const uint64_t local_off = kGuard + (unaligned() ? 3 : 0);
    const uint64_t remote_off = kGuard + (unaligned() ? 5 : 0);
    unsigned char* local = Alloc(size() + 2 * kGuard + 8, &initiator());
    unsigned char* remote = Alloc(size() + 2 * kGuard + 8, &target());
    ASSERT_NE(local, nullptr);
    ASSERT_NE(remote, nullptr);
    ASSERT_NO_FATAL_FAILURE(RunScatter(op, local, size() + 2 * kGuard + 8, remote,
                                       size() + 2 * kGuard + 8, {{local_off, remote_off, size()}},
                                       Mix64(size() * 2 + (unaligned() ? 1 : 0)),
                                       /*submit_chunk=*/1));
  }
};

const uint64_t kSizes[] = {1, 7, 4096, 65537, 1 * kMiB, 64 * kMiB};

INSTANTIATE_TEST_SUITE_P(AllTransports, TransferSizeConformanceTest,
                         ::testing::Combine(::testing::ValuesIn(kTransports),
                                            ::testing::ValuesIn(kSizes), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<SizeParam>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "B_" +
                                  (std::get<2>(info.param) ? "unaligned" : "aligned");
                         });
// Files: below a sector, a page, an odd size, several slices.
const uint64_t kFileSizes[] = {1, 4096, 65537, 4 * kMiB};
INSTANTIATE_TEST_SUITE_P(FileTargets, TransferSizeConformanceTest,
                         ::testing::Combine(::testing::ValuesIn(kFileTargets),
                                            ::testing::ValuesIn(kFileSizes), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<SizeParam>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "B_" +
                                  (std::get<2>(info.param) ? "unaligned" : "aligned");
                         });

// The initiator's buffers in file regions of its own, moved to and from a
// peer's memory over tcp and shm (storage/file_staging.h).
INSTANTIATE_TEST_SUITE_P(LocalFiles, TransferSizeConformanceTest,
                         ::testing::Combine(::testing::ValuesIn(kLocalFiles),
                                            ::testing::ValuesIn(kFileSizes), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<SizeParam>& info) {
                           return std::get<0>(info.param) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "B_" +
                                  (std::get<2>(info.param) ? "unaligned" : "aligned");
                         });

// ---------------------------------------------------------------------------
// Data path

TEST_P(TransferSizeConformanceTest, Write) { RunOne(Opcode::kWrite); }

TEST_P(TransferSizeConformanceTest, Read) { RunOne(Opcode::kRead); }

TEST_P(TransportConformanceTest, OpenSegmentIsCachedAndDescribesPeer) {
  unsigned char* remote = Alloc(64 * kKiB, &target());
  ASSERT_NE(remote, nullptr);

  ASSERT_OK_AND_ASSIGN(SegmentHandle again, initiator().OpenSegment(target().PeerId()));
  EXPECT_EQ(again, segment());

  ASSERT_OK_AND_ASSIGN(SegmentInfo info, initiator().QuerySegment(segment()));
  EXPECT_EQ(info.peer_id, target().PeerId());
  EXPECT_EQ(info.engine_name, target().LocalName());
  EXPECT_EQ(info.transport, TransportOf(GetParam()));
  EXPECT_GE(info.wire_version, kWireVersionMin);
  EXPECT_LE(info.wire_version, kWireVersionMax);
  bool found = false;
  for (const RemoteRegion& r : info.regions) {
    if (r.addr == Addr(remote) && r.length == 64 * kKiB) found = true;
  }
  EXPECT_TRUE(found) << "QuerySegment does not list the region registered at "
                     << static_cast<void*>(remote);

  EXPECT_THAT(initiator().GetCapabilities().transports,
              ::testing::Contains(TransportOf(GetParam())));
  EXPECT_THAT(target().GetCapabilities().transports, ::testing::Contains(TransportOf(GetParam())));
  EXPECT_EQ(initiator().options().transport, TransportOf(GetParam()));
  EXPECT_EQ(target().PeerId(), "127.0.0.1:" + std::to_string(target().RpcPort()));
  EXPECT_NE(target().RpcPort(), 0);
  EXPECT_NE(target().RpcPort(), initiator().RpcPort());
  EXPECT_EQ(target().LocalName(), target().PeerId()) << "local_name defaults to the peer id";
}

// The target engine goes away: transfers to it, queries and notifications
// fail (the peer is down) instead of touching its memory.
TEST_P(TransportConformanceTest, TargetEngineGoneFailsTransfers) {
  unsigned char* local = Alloc(64 * kKiB, &initiator());
  unsigned char* remote = Alloc(64 * kKiB, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_addr = Addr(remote);
  ASSERT_OK(initiator().TransferSync(
      TransferRequest{Opcode::kWrite, local, segment(), remote_addr, 64 * kKiB}));
  DestroyTarget();
  FillPattern(remote, 64 * kKiB, Mix64(71));
  FillPattern(local, 64 * kKiB, Mix64(72));
  const auto gone =
      AnyOf(StatusIs(StatusCode::kUnavailable), StatusIs(StatusCode::kDeadlineExceeded));
  EXPECT_THAT(initiator().TransferSync(
                  TransferRequest{Opcode::kWrite, local, segment(), remote_addr, 64 * kKiB}),
              gone);
  EXPECT_THAT(initiator().TransferSync(
                  TransferRequest{Opcode::kRead, local, segment(), remote_addr, 64 * kKiB}),
              gone);
  EXPECT_TRUE(CheckLayout(remote, 64 * kKiB, {}, Mix64(71))) << "wrote into a destroyed engine";
  EXPECT_TRUE(CheckLayout(local, 64 * kKiB, {}, Mix64(72))) << "read from a destroyed engine";
  EXPECT_THAT(initiator().QuerySegment(segment()), StatusIs(StatusCode::kUnavailable));
  // Unreachable, not waited for until the transfer deadline (fabric: the
  // provider refusing the message for connect_timeout fails it).
  EXPECT_THAT(initiator().SendNotification(segment(), "n", "m"),
              StatusIs(StatusCode::kUnavailable));
}

// Lays out `count` requests of 1..512 bytes: remote ranges in request order
// with small gaps, starting at an odd offset; local ranges in reverse order
// with other gaps, so a request routed to the wrong place is caught.
std::vector<Piece> ManyPieces(size_t count, uint64_t* local_size, uint64_t* remote_size) {
  std::vector<Piece> pieces(count);
  uint64_t remote = 3;
  for (size_t i = 0; i < count; ++i) {
    pieces[i].length = 1 + Mix64(i) % 512;
    pieces[i].remote_off = remote;
    remote += pieces[i].length + Mix64(i + 7) % 9;
  }
  uint64_t local = 1;
  for (size_t i = count; i-- > 0;) {
    pieces[i].local_off = local;
    local += pieces[i].length + Mix64(i + 11) % 5;
  }
  *local_size = local + 16;
  *remote_size = remote + 16;
  return pieces;
}

void RunMany(EnginePair& pair, Opcode op, size_t count, size_t submit_chunk) {
  uint64_t local_size = 0, remote_size = 0;
  const std::vector<Piece> pieces = ManyPieces(count, &local_size, &remote_size);
  unsigned char* local = pair.Alloc(local_size, &pair.initiator());
  unsigned char* remote = pair.Alloc(remote_size, &pair.target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  ASSERT_NO_FATAL_FAILURE(pair.RunScatter(op, local, local_size, remote, remote_size, pieces,
                                          Mix64(count * 31 + static_cast<int>(op)), submit_chunk));
}

TEST_P(TransportConformanceTest, WriteBatchOf1) { RunMany(*this, Opcode::kWrite, 1, 1); }
TEST_P(TransportConformanceTest, WriteBatchOf100) { RunMany(*this, Opcode::kWrite, 100, 100); }
TEST_P(TransportConformanceTest, WriteBatchOf10000) {
  RunMany(*this, Opcode::kWrite, 10000, 10000);
}
// Several Submit calls into one batch.
TEST_P(TransportConformanceTest, WriteBatchOf10000InChunks) {
  RunMany(*this, Opcode::kWrite, 10000, 777);
}
TEST_P(TransportConformanceTest, ReadBatchOf1) { RunMany(*this, Opcode::kRead, 1, 1); }
TEST_P(TransportConformanceTest, ReadBatchOf100) { RunMany(*this, Opcode::kRead, 100, 100); }
TEST_P(TransportConformanceTest, ReadBatchOf10000) { RunMany(*this, Opcode::kRead, 10000, 10000); }

// One batch with requests to two different targets, interleaved.
TEST_P(TransportConformanceTest, OneBatchToTwoTargets) {
  auto second_or = Engine::Create(ConformanceOptions(GetParam()));
  ASSERT_OK(second_or);
  std::unique_ptr<Engine> second = std::move(second_or).value();
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg2, initiator().OpenSegment(second->PeerId()));
  EXPECT_NE(seg2, segment());
  constexpr uint64_t kSize = 4 * kMiB;
  unsigned char* local = Alloc(2 * kSize, &initiator());
  unsigned char* remote1 = Alloc(kSize, &target());
  unsigned char* remote2 = Alloc(kSize, nullptr);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote1, nullptr);
  ASSERT_NE(remote2, nullptr);
  ASSERT_OK(second->RegisterMemory(remote2, kSize));
  FillPattern(local, kSize, 81, 0);
  FillPattern(local + kSize, kSize, 82, 0);
  FillPattern(remote1, kSize, 83, 0);
  FillPattern(remote2, kSize, 84, 0);
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kSize; off += 256 * kKiB) {
    reqs.push_back({Opcode::kWrite, local + off, segment(), Addr(remote1) + off, 128 * kKiB});
    reqs.push_back({Opcode::kWrite, local + kSize + off, seg2, Addr(remote2) + off, 128 * kKiB});
  }
  ASSERT_OK(initiator().TransferSync(reqs));
  std::vector<PatternRange> r1, r2;
  for (uint64_t off = 0; off < kSize; off += 256 * kKiB) {
    r1.push_back({off, 128 * kKiB, 81, off});
    r2.push_back({off, 128 * kKiB, 82, off});
  }
  EXPECT_TRUE(CheckLayout(remote1, kSize, r1, 83));
  EXPECT_TRUE(CheckLayout(remote2, kSize, r2, 84));
  // The second target's memory is not reachable through the first segment.
  EXPECT_THAT(initiator().TransferSync(
                  TransferRequest{Opcode::kWrite, local, segment(), Addr(remote2), 64}),
              IsError());
  EXPECT_TRUE(CheckLayout(remote2, kSize, r2, 84));
  ASSERT_OK(initiator().CloseSegment(seg2));
  second.reset();
}

// Writes and reads in one batch, on disjoint ranges.
TEST_P(TransportConformanceTest, MixedReadWriteBatch) {
  constexpr size_t kCount = 200;
  constexpr uint64_t kSlot = 8 * kKiB;
  unsigned char* local = Alloc(kCount * kSlot, &initiator());
  unsigned char* remote = Alloc(kCount * kSlot, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t local_bg = Mix64(101), remote_bg = Mix64(102), seed = Mix64(103);
  FillPattern(local, kCount * kSlot, local_bg);
  FillPattern(remote, kCount * kSlot, remote_bg);

  std::vector<TransferRequest> reqs(kCount);
  std::vector<PatternRange> local_expect, remote_expect;
  for (size_t i = 0; i < kCount; ++i) {
    const uint64_t len = 1 + Mix64(i) % (kSlot - 16);
    const uint64_t loff = i * kSlot + 1 + i % 7;
    const uint64_t roff = i * kSlot + 2 + i % 5;
    const bool write = i % 2 == 0;
    reqs[i] = {write ? Opcode::kWrite : Opcode::kRead, local + loff, segment(), Addr(remote) + roff,
               len};
    if (write) {
      FillPattern(local + loff, len, RequestSeed(seed, i));
      local_expect.push_back({loff, len, RequestSeed(seed, i), 0});
      remote_expect.push_back({roff, len, RequestSeed(seed, i), 0});
    } else {
      FillPattern(remote + roff, len, RequestSeed(seed, i));
      local_expect.push_back({loff, len, RequestSeed(seed, i), 0});
      remote_expect.push_back({roff, len, RequestSeed(seed, i), 0});
    }
  }
  ASSERT_OK(initiator().TransferSync(reqs));
  EXPECT_TRUE(CheckLayout(local, kCount * kSlot, local_expect, local_bg));
  EXPECT_TRUE(CheckLayout(remote, kCount * kSlot, remote_expect, remote_bg));
}

TEST_P(TransportConformanceTest, TransferSyncSingleRequest) {
  unsigned char* local = Alloc(10000, &initiator());
  unsigned char* remote = Alloc(10000, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  FillPattern(remote, 10000, Mix64(1));
  FillPattern(local, 10000, Mix64(2));
  FillPattern(local + 11, 5000, Mix64(3));
  ASSERT_OK(initiator().TransferSync(
      TransferRequest{Opcode::kWrite, local + 11, segment(), Addr(remote) + 13, 5000}));
  EXPECT_TRUE(CheckLayout(remote, 10000, {{13, 5000, Mix64(3), 0}}, Mix64(1)));
  ASSERT_OK(initiator().TransferSync(
      TransferRequest{Opcode::kRead, local + 5011, segment(), Addr(remote) + 13, 4000}));
  EXPECT_TRUE(
      CheckLayout(local, 10000, {{11, 5000, Mix64(3), 0}, {5011, 4000, Mix64(3), 0}}, Mix64(2)));
}

// 8 threads submit to the same engine at once, each into its own batches
// and to its own slice of one remote region; every round is read back.
TEST_P(TransportConformanceTest, EightThreadsSubmitAtOnce) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 12;
  constexpr size_t kPerBatch = 40;
  constexpr uint64_t kSlice = 256 * kKiB;  // per thread, remote
  unsigned char* remote = Alloc(kThreads * kSlice, &target());
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_bg = Mix64(808);
  FillPattern(remote, kThreads * kSlice, remote_bg);
  // Local buffers are registered by the threads themselves, concurrently.
  std::vector<unsigned char*> locals(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    locals[t] = Alloc(2 * kSlice, nullptr);
    ASSERT_NE(locals[t], nullptr);
  }

  // Pieces of round r of thread t: offsets inside the thread's slice.
  auto pieces_of = [&](int t, int r) {
    std::vector<Piece> pieces;
    uint64_t off = 1 + (r % 3);
    for (size_t i = 0; i < kPerBatch; ++i) {
      const uint64_t len = 1 + Mix64(t * 100000 + r * 1000 + i) % 6000;
      pieces.push_back({off, off, len});
      off += len + (i % 4);
    }
    return pieces;
  };
  auto seed_of = [](int t, int r) { return Mix64(0x5eed0000 + t * 1000 + r); };

  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      unsigned char* local = locals[t];
      unsigned char* slice = remote + t * kSlice;
      const uint64_t slice_addr = Addr(slice);
      start.arrive_and_wait();
      EXPECT_OK(initiator().RegisterMemory(local, 2 * kSlice));
      for (int r = 0; r < kRounds; ++r) {
        const std::vector<Piece> pieces = pieces_of(t, r);
        const uint64_t seed = seed_of(t, r);
        std::vector<TransferRequest> writes, reads;
        for (size_t i = 0; i < pieces.size(); ++i) {
          FillPattern(local + pieces[i].local_off, pieces[i].length, RequestSeed(seed, i));
          std::memset(local + kSlice + pieces[i].local_off, 0, pieces[i].length);
          writes.push_back({Opcode::kWrite, local + pieces[i].local_off, segment(),
                            slice_addr + pieces[i].remote_off, pieces[i].length});
          reads.push_back({Opcode::kRead, local + kSlice + pieces[i].local_off, segment(),
                           slice_addr + pieces[i].remote_off, pieces[i].length});
        }
        if (r % 3 == 2) {
          EXPECT_OK(initiator().TransferSync(writes)) << "thread " << t << " round " << r;
        } else {
          auto batch = initiator().AllocateBatch(kPerBatch);
          EXPECT_OK(batch);
          if (!batch.ok()) return;
          // Two Submit calls per batch.
          EXPECT_OK(initiator().Submit(*batch, std::span(writes).first(kPerBatch / 2)));
          EXPECT_OK(initiator().Submit(*batch, std::span(writes).subspan(kPerBatch / 2)));
          EXPECT_OK(initiator().WaitBatch(*batch, kWaitTimeout))
              << "thread " << t << " round " << r;
          auto st = initiator().GetBatchStatus(*batch);
          EXPECT_OK(st);
          if (st.ok()) {
            EXPECT_EQ(st->submitted, kPerBatch);
            EXPECT_EQ(st->completed, kPerBatch);
            EXPECT_EQ(st->failed, 0u);
          }
          EXPECT_OK(initiator().FreeBatch(*batch));
        }
        EXPECT_OK(initiator().TransferSync(reads)) << "thread " << t << " round " << r;
        for (size_t i = 0; i < pieces.size(); ++i) {
          const std::string bad = DescribePatternMismatch(local + kSlice + pieces[i].local_off,
                                                          pieces[i].length, RequestSeed(seed, i));
          EXPECT_EQ(bad, "") << "read back: thread " << t << " round " << r << " request " << i;
        }
      }
      EXPECT_OK(initiator().UnregisterMemory(local));
    });
  }
  for (std::thread& th : threads) th.join();

  // Each slice holds the last round's pieces over the earlier rounds' bytes;
  // check the last round exactly and that nothing past the slices moved.
  for (int t = 0; t < kThreads; ++t) {
    const std::vector<Piece> pieces = pieces_of(t, kRounds - 1);
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(DescribePatternMismatch(remote + t * kSlice + pieces[i].remote_off,
                                        pieces[i].length, RequestSeed(seed_of(t, kRounds - 1), i)),
                "")
          << "thread " << t << " request " << i;
    }
    // Tail of each slice (past every round's pieces) is untouched.
    uint64_t end = 0;
    for (int r = 0; r < kRounds; ++r) {
      const std::vector<Piece> p = pieces_of(t, r);
      end = std::max(end, p.back().remote_off + p.back().length);
    }
    ASSERT_LT(end, kSlice);
    EXPECT_EQ(DescribePatternMismatch(remote + t * kSlice + end, kSlice - end, remote_bg,
                                      t * kSlice + end),
              "")
        << "thread " << t << " slice tail";
  }
}

// ---------------------------------------------------------------------------
// Errors

// The index of a request, as a whole number in a message.
::testing::Matcher<const std::string&> MentionsIndex(size_t index) {
  return ContainsRegex("(^|[^0-9A-Za-z])" + std::to_string(index) + "([^0-9A-Za-z]|$)");
}

TEST_P(TransportConformanceTest, RemoteRangeOutsideRegionsFailsOnlyThatRequest) {
  constexpr uint64_t kRegion = 64 * kKiB;
  unsigned char* local = Alloc(kRegion, &initiator());
  unsigned char* remote = Alloc(kRegion, &target());
  // Memory of the target process that the target did not register.
  unsigned char* unregistered = Alloc(kRegion, nullptr);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  ASSERT_NE(unregistered, nullptr);
  const uint64_t remote_addr = Addr(remote);
  const uint64_t remote_bg = Mix64(1), other_bg = Mix64(2), seed = Mix64(3);
  FillPattern(remote, kRegion, remote_bg);
  FillPattern(unregistered, kRegion, other_bg);
  for (size_t i = 0; i < 5; ++i) FillPattern(local + i * 4096, 4096, RequestSeed(seed, i));

  const uint64_t straddle = remote_addr + kRegion - 16;  // 16 bytes in, 16 out
  const uint64_t outside = Addr(unregistered) + 128;
  const std::vector<TransferRequest> reqs = {
      {Opcode::kWrite, local + 0 * 4096, segment(), remote_addr + 0, 4096},
      {Opcode::kWrite, local + 1 * 4096, segment(), remote_addr + 8192, 4096},
      {Opcode::kWrite, local + 2 * 4096, segment(), straddle, 32},
      {Opcode::kWrite, local + 3 * 4096, segment(), remote_addr + 16384, 4096},
      {Opcode::kWrite, local + 4 * 4096, segment(), outside, 4096},
  };
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(reqs.size()));
  ASSERT_OK(initiator().Submit(batch, reqs));
  EXPECT_THAT(initiator().WaitBatch(batch, kWaitTimeout), IsError());

  for (size_t i : {0, 1, 3}) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, initiator().GetTransferStatus(batch, i));
    EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kCompleted))
        << "request " << i << ": " << ts.status;
    EXPECT_OK(ts.status);
  }
  for (size_t i : {2, 4}) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, initiator().GetTransferStatus(batch, i));
    EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed))
        << "request " << i;
    EXPECT_THAT(ts.status, IsError(MentionsNumber(reqs[i].remote_addr))) << "request " << i;
    EXPECT_THAT(ts.status.code(), ::testing::Ne(StatusCode::kInternal)) << ts.status;
  }
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(TransferStateName(bs.state), TransferStateName(TransferState::kFailed));
  EXPECT_EQ(bs.submitted, 5u);
  EXPECT_EQ(bs.completed, 3u);
  EXPECT_EQ(bs.failed, 2u);
  EXPECT_THAT(bs.first_error, IsError());
  EXPECT_OK(initiator().FreeBatch(batch));

  // The good requests landed; nothing else in the region (in particular the
  // 16 in-range bytes of the straddling request) and nothing in the
  // unregistered memory changed.
  EXPECT_TRUE(CheckLayout(remote, kRegion,
                          {{0, 4096, RequestSeed(seed, 0), 0},
                           {8192, 4096, RequestSeed(seed, 1), 0},
                           {16384, 4096, RequestSeed(seed, 3), 0}},
                          remote_bg));
  EXPECT_TRUE(CheckLayout(unregistered, kRegion, {}, other_bg));
}

TEST_P(TransportConformanceTest, ReadOutsideRegionsFailsAndLeavesLocalUntouched) {
  constexpr uint64_t kRegion = 64 * kKiB;
  unsigned char* local = Alloc(kRegion, &initiator());
  unsigned char* remote = Alloc(kRegion, &target());
  unsigned char* unregistered = Alloc(kRegion, nullptr);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  ASSERT_NE(unregistered, nullptr);
  const uint64_t remote_addr = Addr(remote);
  const uint64_t local_bg = Mix64(11), seed = Mix64(12);
  FillPattern(local, kRegion, local_bg);
  FillPattern(remote, kRegion, seed);
  FillPattern(unregistered, kRegion, seed);
  const std::vector<TransferRequest> reqs = {
      {Opcode::kRead, local + 100, segment(), remote_addr + kRegion - 100, 200},  // straddles
      {Opcode::kRead, local + 1000, segment(), Addr(unregistered), 512},
      {Opcode::kRead, local + 5000, segment(), remote_addr + 5000, 3000},  // fine
  };
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(reqs.size()));
  ASSERT_OK(initiator().Submit(batch, reqs));
  EXPECT_THAT(initiator().WaitBatch(batch, kWaitTimeout), IsError());
  for (size_t i : {0, 1}) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, initiator().GetTransferStatus(batch, i));
    EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed))
        << "request " << i;
    EXPECT_THAT(ts.status, IsError(MentionsNumber(reqs[i].remote_addr))) << "request " << i;
  }
  ASSERT_OK_AND_ASSIGN(TransferStatus good, initiator().GetTransferStatus(batch, 2));
  EXPECT_EQ(TransferStateName(good.state), TransferStateName(TransferState::kCompleted))
      << good.status;
  EXPECT_OK(initiator().FreeBatch(batch));
  EXPECT_TRUE(CheckLayout(local, kRegion, {{5000, 3000, seed, 5000}}, local_bg));
}

// TCP reads frame headers, entry lists and payloads under 8 KiB through an
// 8 KiB read-ahead buffer and longer payloads straight into place: frames
// whose parts end just before, at and just after that size, and one whose
// entry list alone (700 entries) is longer than it, in both directions.
TEST_P(TransportConformanceTest, FramesAroundTheReadAheadSize) {
  const uint64_t kSizes[] = {1, 8151, 8152, 8153, 8191, 8192, 8193, 16383, 16384, 16385, 24000};
  uint64_t total = 8192;
  std::vector<Piece> pieces;
  for (uint64_t n : kSizes) {
    pieces.push_back({total - 8192 + 3, total - 8192 + 5, n});
    total += n + 64;
  }
  // 700 one-byte entries in one frame: a 8,404-byte entry list.
  std::vector<Piece> tiny;
  for (uint64_t i = 0; i < 700; ++i) tiny.push_back({i * 3, i * 5 + 1, 1});
  for (Opcode op : {Opcode::kWrite, Opcode::kRead}) {
    SCOPED_TRACE(op == Opcode::kWrite ? "write" : "read");
    // Fresh buffers for every round: memory a peer sent from is not
    // rewritten by the test (ThreadSanitizer cannot see that a socket
    // ordered the two).
    unsigned char* local = Alloc(total, &initiator());
    unsigned char* remote = Alloc(total, &target());
    ASSERT_NE(local, nullptr);
    ASSERT_NE(remote, nullptr);
    // One Submit per request: one frame each, back to back on the streams.
    ASSERT_NO_FATAL_FAILURE(RunScatter(op, local, total, remote, total, pieces,
                                       Mix64(300 + static_cast<int>(op)), /*submit_chunk=*/1));
    local = Alloc(total, &initiator());
    remote = Alloc(total, &target());
    ASSERT_NE(local, nullptr);
    ASSERT_NE(remote, nullptr);
    ASSERT_NO_FATAL_FAILURE(RunScatter(op, local, total, remote, total, tiny,
                                       Mix64(310 + static_cast<int>(op)), /*submit_chunk=*/700));
  }
}

// The engine may send a batch's requests in any order (it groups them by
// opcode and source address); every request must still report its own
// outcome and land its own bytes. Requests in shuffled order on both sides,
// reads and writes alternating, three of them out of range. 20,000 requests:
// Submit slices and posts them in chunks of 8,192.
TEST_P(TransportConformanceTest, ShuffledMixedBatchReportsEachRequestByIndex) {
  constexpr size_t kCount = 20000;
  constexpr uint64_t kSlot = 256;
  unsigned char* local = Alloc(kCount * kSlot, &initiator());
  unsigned char* remote = Alloc(kCount * kSlot, &target());
  unsigned char* unregistered = Alloc(4 * kSlot, nullptr);  // target memory, not registered
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  ASSERT_NE(unregistered, nullptr);
  const uint64_t remote_addr = Addr(remote);
  const uint64_t local_bg = Mix64(201), remote_bg = Mix64(202), seed = Mix64(203);
  FillPattern(local, kCount * kSlot, local_bg);
  FillPattern(remote, kCount * kSlot, remote_bg);

  std::vector<size_t> local_slot(kCount), remote_slot(kCount);
  for (size_t i = 0; i < kCount; ++i) {  // 389 and 577 are primes other than 2 and 5: permutations
    local_slot[i] = (i * 389) % kCount;
    remote_slot[i] = (i * 577) % kCount;
  }
  const std::vector<size_t> bad = {137, 420, 19999};  // a write, a read, a write in the last chunk
  std::vector<TransferRequest> reqs(kCount);
  std::vector<PatternRange> local_expect, remote_expect;
  for (size_t i = 0; i < kCount; ++i) {
    const bool write = i % 2 == 1;
    const uint64_t len = kSlot - (i % 3);
    const uint64_t loff = local_slot[i] * kSlot, roff = remote_slot[i] * kSlot;
    const bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
    const uint64_t raddr = is_bad ? Addr(unregistered) + i % 2 * kSlot : remote_addr + roff;
    reqs[i] = {write ? Opcode::kWrite : Opcode::kRead, local + loff, segment(), raddr, len};
    if (write) {
      FillPattern(local + loff, len, RequestSeed(seed, i));
      local_expect.push_back({loff, len, RequestSeed(seed, i), 0});
      if (!is_bad) remote_expect.push_back({roff, len, RequestSeed(seed, i), 0});
    } else if (!is_bad) {
      FillPattern(remote + roff, len, RequestSeed(seed, i));
      local_expect.push_back({loff, len, RequestSeed(seed, i), 0});
      remote_expect.push_back({roff, len, RequestSeed(seed, i), 0});
    }
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(kCount));
  ASSERT_OK(initiator().Submit(batch, reqs));
  EXPECT_THAT(initiator().WaitBatch(batch, kWaitTimeout), IsError());
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, initiator().GetTransferStatus(batch, i));
    const bool is_bad = std::find(bad.begin(), bad.end(), i) != bad.end();
    if (is_bad) {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed))
          << "request " << i;
      EXPECT_THAT(ts.status, IsError(MentionsNumber(reqs[i].remote_addr))) << "request " << i;
    } else {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kCompleted))
          << "request " << i << ": " << ts.status;
    }
  }
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.completed, kCount - bad.size());
  EXPECT_EQ(bs.failed, bad.size());
  EXPECT_OK(initiator().FreeBatch(batch));
  EXPECT_TRUE(CheckLayout(local, kCount * kSlot, local_expect, local_bg)) << "local";
  EXPECT_TRUE(CheckLayout(remote, kCount * kSlot, remote_expect, remote_bg)) << "remote";
}

// A range whose end overflows 64 bits is refused, either by Submit or by
// failing the request.
TEST_P(TransportConformanceTest, RemoteRangeWrappingAroundIsRefused) {
  unsigned char* local = Alloc(4096, &initiator());
  ASSERT_NE(local, nullptr);
  const TransferRequest req{Opcode::kWrite, local, segment(), ~uint64_t{0} - 10, 100};
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(1));
  const Status submitted = initiator().Submit(batch, {&req, 1});
  if (submitted.ok()) {
    EXPECT_THAT(initiator().WaitBatch(batch, kWaitTimeout), IsError());
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, initiator().GetTransferStatus(batch, 0));
    EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed));
  } else {
    EXPECT_THAT(submitted, StatusIs(StatusCode::kInvalidArgument));
  }
  EXPECT_OK(initiator().FreeBatch(batch));
}

TEST_P(TransportConformanceTest, UnregisteredLocalMemoryIsInvalidArgumentAndSubmitsNothing) {
  unsigned char* local = Alloc(8192, &initiator());
  unsigned char* unregistered = Alloc(8192, nullptr);
  unsigned char* remote = Alloc(8192, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(unregistered, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_addr = Addr(remote);
  const uint64_t remote_bg = Mix64(21);
  FillPattern(remote, 8192, remote_bg);
  FillPattern(local, 8192, Mix64(22));

  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(4));
  // A good request followed by one whose local memory is not registered.
  const std::vector<TransferRequest> bad = {
      {Opcode::kWrite, local, segment(), remote_addr, 1024},
      {Opcode::kWrite, unregistered + 64, segment(), remote_addr + 2048, 1024},
  };
  EXPECT_THAT(initiator().Submit(batch, bad),
              StatusIs(StatusCode::kInvalidArgument, MentionsAddress(unregistered + 64)));
  // Straddles the end of the registered local region.
  const TransferRequest straddle{Opcode::kWrite, local + 8192 - 8, segment(), remote_addr, 16};
  EXPECT_THAT(initiator().Submit(batch, {&straddle, 1}),
              StatusIs(StatusCode::kInvalidArgument, MentionsAddress(local + 8192 - 8)));
  const TransferRequest read_bad{Opcode::kRead, unregistered, segment(), remote_addr, 16};
  EXPECT_THAT(initiator().Submit(batch, {&read_bad, 1}),
              StatusIs(StatusCode::kInvalidArgument, MentionsAddress(unregistered)));

  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.submitted, 0u) << "a rejected Submit must submit nothing";
  EXPECT_THAT(initiator().GetTransferStatus(batch, 0), IsError());
  // The rejected calls consumed no capacity: 4 good requests still fit.
  std::vector<TransferRequest> good;
  for (int i = 0; i < 4; ++i) {
    good.push_back({Opcode::kWrite, local + i * 2048, segment(), remote_addr + i * 2048, 2048});
  }
  ASSERT_OK(initiator().Submit(batch, good));
  ASSERT_OK(initiator().WaitBatch(batch, kWaitTimeout));
  EXPECT_OK(initiator().FreeBatch(batch));
  EXPECT_TRUE(CheckLayout(remote, 8192, {{0, 8192, Mix64(22), 0}}, remote_bg));

  // TransferSync validates the same way.
  EXPECT_THAT(initiator().TransferSync(bad[1]),
              StatusIs(StatusCode::kInvalidArgument, MentionsAddress(unregistered + 64)));
}

TEST_P(TransportConformanceTest, UnregisteredLocalAfterUnregisterMemory) {
  unsigned char* local = Alloc(4096, &initiator());
  unsigned char* remote = Alloc(4096, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const TransferRequest req{Opcode::kWrite, local, segment(), Addr(remote), 4096};
  ASSERT_OK(initiator().TransferSync(req));
  ASSERT_OK(initiator().UnregisterMemory(local));
  EXPECT_THAT(initiator().TransferSync(req),
              StatusIs(StatusCode::kInvalidArgument, MentionsAddress(local)));
  EXPECT_THAT(initiator().UnregisterMemory(local), StatusIs(StatusCode::kNotFound));
}

TEST_P(TransportConformanceTest, ZeroLengthAndNullAreInvalidArgument) {
  unsigned char* local = Alloc(4096, &initiator());
  unsigned char* remote = Alloc(4096, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_addr = Addr(remote);
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(8));
  const TransferRequest zero{Opcode::kWrite, local, segment(), remote_addr, 0};
  EXPECT_THAT(initiator().Submit(batch, {&zero, 1}), StatusIs(StatusCode::kInvalidArgument));
  const TransferRequest zero_read{Opcode::kRead, local, segment(), remote_addr, 0};
  EXPECT_THAT(initiator().Submit(batch, {&zero_read, 1}), StatusIs(StatusCode::kInvalidArgument));
  const TransferRequest null_local{Opcode::kWrite, nullptr, segment(), remote_addr, 16};
  EXPECT_THAT(initiator().Submit(batch, {&null_local, 1}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(initiator().TransferSync(zero), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(initiator().TransferSync(null_local), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.submitted, 0u);
  EXPECT_OK(initiator().FreeBatch(batch));
}

TEST_P(TransportConformanceTest, RegisterMemoryErrors) {
  unsigned char* a = Alloc(16 * kKiB, nullptr);
  unsigned char* b = Alloc(16 * kKiB, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_THAT(initiator().RegisterMemory(nullptr, 4096), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(initiator().RegisterMemory(a, 0), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK(initiator().RegisterMemory(a, 8 * kKiB));
  // Overlaps: inside, straddling the end, covering.
  EXPECT_THAT(initiator().RegisterMemory(a + 100, 10), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(initiator().RegisterMemory(a + 8 * kKiB - 1, 10),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(initiator().RegisterMemory(a, 16 * kKiB), StatusIs(StatusCode::kAlreadyExists));
  // Adjacent is fine.
  EXPECT_OK(initiator().RegisterMemory(a + 8 * kKiB, 8 * kKiB));
  // Not the start of a region.
  EXPECT_THAT(initiator().UnregisterMemory(a + 1), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(initiator().UnregisterMemory(b), StatusIs(StatusCode::kNotFound));

  // The list form is all or nothing: b would register, a overlaps.
  const std::vector<MemoryRegion> list = {{b, 4096, "*"}, {a, 4096, "*"}};
  EXPECT_THAT(initiator().RegisterMemory(list), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_OK(initiator().RegisterMemory(b, 4096)) << "b stayed registered after a failed list";
  void* const both[] = {a, a + 8 * kKiB, b};
  EXPECT_OK(initiator().UnregisterMemory(both));
  void* const again[] = {a, b};
  EXPECT_THAT(initiator().UnregisterMemory(again), StatusIs(StatusCode::kNotFound));
}

TEST_P(TransportConformanceTest, StaleAndForgedBatchIdsAreInvalidArgument) {
  ASSERT_OK_AND_ASSIGN(BatchId stale, initiator().AllocateBatch(4));
  EXPECT_NE(stale.value, 0u) << "a valid BatchId is never 0";
  ASSERT_OK(initiator().FreeBatch(stale));
  // Likely reuses the slot; the old id must stay invalid.
  ASSERT_OK_AND_ASSIGN(BatchId live, initiator().AllocateBatch(4));
  EXPECT_NE(live, stale);

  unsigned char* local = Alloc(4096, &initiator());
  unsigned char* remote = Alloc(4096, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const TransferRequest req{Opcode::kWrite, local, segment(), Addr(remote), 64};

  std::vector<BatchId> bad = {stale,
                              BatchId{0},
                              BatchId{~uint64_t{0}},
                              BatchId{stale.value ^ (uint64_t{1} << 63)},
                              BatchId{live.value ^ (uint64_t{0xffff} << 32)},
                              BatchId{0x123456789abcdefull}};
  for (const BatchId id : bad) {
    if (id == live) continue;
    SCOPED_TRACE("BatchId " + std::to_string(id.value));
    EXPECT_THAT(initiator().Submit(id, {&req, 1}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().GetBatchStatus(id), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().GetTransferStatus(id, 0), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().WaitBatch(id, 10ms), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().FreeBatch(id), StatusIs(StatusCode::kInvalidArgument));
  }
  // The live batch is unaffected.
  ASSERT_OK(initiator().Submit(live, {&req, 1}));
  EXPECT_OK(initiator().WaitBatch(live, kWaitTimeout));
  EXPECT_OK(initiator().FreeBatch(live));
  EXPECT_THAT(initiator().FreeBatch(live), StatusIs(StatusCode::kInvalidArgument));
}

// Closing a segment does not drop what was already submitted through it:
// a batch far larger than what a transport keeps in flight per stream
// (48 MiB of writes, then 16 MiB of reads) completes byte for byte, and
// only later use of the handle is refused.
TEST_P(TransportConformanceTest, CloseSegmentLetsSubmittedTransfersFinish) {
  constexpr size_t kWrites = 48, kReads = 16;
  constexpr uint64_t kBlock = kMiB, kSize = (kWrites + kReads) * kBlock;
  unsigned char* local = Alloc(kSize, &initiator());
  unsigned char* remote = Alloc(kSize, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  FillPattern(local, kWrites * kBlock, 95, 0);
  FillPattern(remote, kSize, 96, 0);
  const uint64_t remote_addr = Addr(remote);
  std::vector<TransferRequest> reqs;
  for (size_t i = 0; i < kWrites + kReads; ++i) {
    reqs.push_back({i < kWrites ? Opcode::kWrite : Opcode::kRead, local + i * kBlock, segment(),
                    remote_addr + i * kBlock, kBlock});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(reqs.size()));
  ASSERT_OK(initiator().Submit(batch, reqs));
  const SegmentHandle closed = segment();
  ASSERT_OK(initiator().CloseSegment(closed));
  EXPECT_OK(initiator().WaitBatch(batch, kWaitTimeout));
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.completed, reqs.size());
  EXPECT_OK(initiator().FreeBatch(batch));
  EXPECT_EQ(DescribePatternMismatch(remote, kWrites * kBlock, 95, 0), "") << "writes landed";
  EXPECT_EQ(
      DescribePatternMismatch(remote + kWrites * kBlock, kReads * kBlock, 96, kWrites * kBlock), "")
      << "read ranges untouched on the target";
  EXPECT_EQ(
      DescribePatternMismatch(local + kWrites * kBlock, kReads * kBlock, 96, kWrites * kBlock), "")
      << "reads landed";
  EXPECT_THAT(initiator().TransferSync(reqs[0]), StatusIs(StatusCode::kInvalidArgument));
}

TEST_P(TransportConformanceTest, StaleAndForgedSegmentHandlesAreInvalidArgument) {
  unsigned char* local = Alloc(4096, &initiator());
  unsigned char* remote = Alloc(4096, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_addr = Addr(remote);
  const SegmentHandle stale = segment();
  ASSERT_OK(initiator().CloseSegment(stale));
  // Reopening gives a working handle; the closed one stays invalid.
  ASSERT_OK_AND_ASSIGN(SegmentHandle fresh, initiator().OpenSegment(target().PeerId()));
  EXPECT_NE(fresh, stale);
  ASSERT_OK(
      initiator().TransferSync(TransferRequest{Opcode::kWrite, local, fresh, remote_addr, 64}));

  const std::vector<SegmentHandle> bad = {stale, SegmentHandle{0}, SegmentHandle{~uint64_t{0}},
                                          SegmentHandle{stale.value ^ (uint64_t{1} << 63)},
                                          SegmentHandle{0x0badc0ffee0ddf00ull}};
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(4));
  for (const SegmentHandle h : bad) {
    if (h == fresh) continue;
    SCOPED_TRACE("SegmentHandle " + std::to_string(h.value));
    const TransferRequest req{Opcode::kWrite, local, h, remote_addr, 64};
    EXPECT_THAT(initiator().Submit(batch, {&req, 1}), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().TransferSync(req), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().QuerySegment(h), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().SendNotification(h, "n", "m"), StatusIs(StatusCode::kInvalidArgument));
    EXPECT_THAT(initiator().CloseSegment(h), StatusIs(StatusCode::kInvalidArgument));
  }
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.submitted, 0u);
  EXPECT_OK(initiator().FreeBatch(batch));
}

TEST_P(TransportConformanceTest, OverCapacityIsResourceExhausted) {
  EXPECT_THAT(initiator().AllocateBatch(0), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(initiator().AllocateBatch((size_t{1} << 24) + 1),
              StatusIs(StatusCode::kInvalidArgument));
  unsigned char* local = Alloc(4096, &initiator());
  unsigned char* remote = Alloc(4096, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  std::vector<TransferRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back({Opcode::kWrite, local + i * 100, segment(), Addr(remote) + i * 100, 100});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(4));
  EXPECT_THAT(initiator().Submit(batch, reqs), StatusIs(StatusCode::kResourceExhausted));
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.submitted, 0u);
  ASSERT_OK(initiator().Submit(batch, std::span(reqs).first(3)));
  EXPECT_THAT(initiator().Submit(batch, std::span(reqs).subspan(3, 2)),
              StatusIs(StatusCode::kResourceExhausted));
  ASSERT_OK(initiator().Submit(batch, std::span(reqs).subspan(3, 1)));
  EXPECT_THAT(initiator().Submit(batch, std::span(reqs).subspan(4, 1)),
              StatusIs(StatusCode::kResourceExhausted));
  ASSERT_OK(initiator().WaitBatch(batch, kWaitTimeout));
  ASSERT_OK_AND_ASSIGN(bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.submitted, 4u);
  EXPECT_EQ(bs.completed, 4u);
  // Completion does not give capacity back.
  EXPECT_THAT(initiator().Submit(batch, std::span(reqs).subspan(4, 1)),
              StatusIs(StatusCode::kResourceExhausted));
  EXPECT_OK(initiator().FreeBatch(batch));
}

TEST_P(TransportConformanceTest, FreeBatchInFlightIsRejectedOrItIsDone) {
  constexpr uint64_t kSize = 32 * kMiB;
  unsigned char* local = Alloc(kSize, &initiator());
  unsigned char* remote = Alloc(kSize, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  FillPattern(local, kSize, Mix64(31));
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kSize; off += 2 * kMiB) {
    reqs.push_back({Opcode::kWrite, local + off, segment(), Addr(remote) + off, 2 * kMiB});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(reqs.size()));
  ASSERT_OK(initiator().Submit(batch, reqs));
  const Status freed = initiator().FreeBatch(batch);
  if (freed.ok()) {
    // Then it was done: the data is there and the id is gone.
    RecordProperty("free_path", "freed");
    EXPECT_THAT(initiator().GetBatchStatus(batch), StatusIs(StatusCode::kInvalidArgument));
  } else {
    RecordProperty("free_path", "rejected");
    EXPECT_THAT(freed, StatusIs(StatusCode::kFailedPrecondition));
    // Still a valid batch.
    EXPECT_OK(initiator().GetBatchStatus(batch));
    ASSERT_OK(initiator().WaitBatch(batch, kWaitTimeout));
    ASSERT_OK(initiator().FreeBatch(batch));
  }
  EXPECT_THAT(initiator().FreeBatch(batch), StatusIs(StatusCode::kInvalidArgument));
  // Either way every byte arrived.
  EXPECT_TRUE(CheckLayout(remote, kSize, {{0, kSize, Mix64(31), 0}}, 0));
}

TEST_P(TransportConformanceTest, FreeBatchAfterFailureIsOk) {
  unsigned char* local = Alloc(4096, &initiator());
  ASSERT_NE(local, nullptr);
  unsigned char* unregistered = Alloc(4096, nullptr);
  ASSERT_NE(unregistered, nullptr);
  const TransferRequest req{Opcode::kWrite, local, segment(), Addr(unregistered), 64};
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(1));
  ASSERT_OK(initiator().Submit(batch, {&req, 1}));
  EXPECT_THAT(initiator().WaitBatch(batch, kWaitTimeout), IsError());
  EXPECT_OK(initiator().FreeBatch(batch));
  EXPECT_THAT(initiator().TransferSync(req), IsError());
}

TEST_P(TransportConformanceTest, GetBatchStatusCounts) {
  unsigned char* local = Alloc(64 * kKiB, &initiator());
  unsigned char* remote = Alloc(64 * kKiB, &target());
  unsigned char* unregistered = Alloc(4096, nullptr);
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  ASSERT_NE(unregistered, nullptr);
  const uint64_t remote_addr = Addr(remote);
  auto write = [&](size_t i) {
    return TransferRequest{Opcode::kWrite, local + i * 1024, segment(), remote_addr + i * 1024,
                           1024};
  };
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(50));
  ASSERT_OK_AND_ASSIGN(BatchStatus bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(bs.submitted, 0u);
  EXPECT_EQ(bs.completed, 0u);
  EXPECT_EQ(bs.failed, 0u);
  // Nothing submitted: nothing to wait for.
  EXPECT_OK(initiator().WaitBatch(batch, kWaitTimeout));

  std::vector<TransferRequest> first = {write(0), write(1), write(2)};
  ASSERT_OK(initiator().Submit(batch, first));
  ASSERT_OK(initiator().WaitBatch(batch, kWaitTimeout));
  ASSERT_OK_AND_ASSIGN(bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(TransferStateName(bs.state), TransferStateName(TransferState::kCompleted));
  EXPECT_EQ(bs.submitted, 3u);
  EXPECT_EQ(bs.completed, 3u);
  EXPECT_EQ(bs.failed, 0u);
  EXPECT_OK(bs.first_error);

  // 47 more: a failing one at index 37 (the 35th of this call).
  std::vector<TransferRequest> second;
  for (size_t i = 3; i < 50; ++i) second.push_back(write(i % 60));
  second[37 - 3] = {Opcode::kWrite, local, segment(), Addr(unregistered), 256};
  ASSERT_OK(initiator().Submit(batch, second));
  EXPECT_THAT(initiator().WaitBatch(batch, kWaitTimeout),
              IsError(MentionsNumber(Addr(unregistered))));
  ASSERT_OK_AND_ASSIGN(bs, initiator().GetBatchStatus(batch));
  EXPECT_EQ(TransferStateName(bs.state), TransferStateName(TransferState::kFailed));
  EXPECT_EQ(bs.submitted, 50u);
  EXPECT_EQ(bs.completed, 49u);
  EXPECT_EQ(bs.failed, 1u);
  EXPECT_THAT(bs.first_error, IsError(MentionsIndex(37)));
  for (size_t i = 0; i < 50; ++i) {
    ASSERT_OK_AND_ASSIGN(TransferStatus ts, initiator().GetTransferStatus(batch, i));
    if (i == 37) {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kFailed));
      EXPECT_THAT(ts.status, IsError());
    } else {
      EXPECT_EQ(TransferStateName(ts.state), TransferStateName(TransferState::kCompleted))
          << "request " << i << ": " << ts.status;
      EXPECT_OK(ts.status);
    }
  }
  // An index past what was submitted.
  EXPECT_THAT(initiator().GetTransferStatus(batch, 50), IsError());
  EXPECT_THAT(initiator().GetTransferStatus(batch, 1000000), IsError());
  EXPECT_OK(initiator().FreeBatch(batch));
}

TEST_P(TransportConformanceTest, TargetUnregisteringARegionMakesItUnwritable) {
  unsigned char* local = Alloc(8192, &initiator());
  unsigned char* remote = Alloc(8192, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_addr = Addr(remote);
  FillPattern(local, 8192, Mix64(41));
  ASSERT_OK(initiator().TransferSync(
      TransferRequest{Opcode::kWrite, local, segment(), remote_addr, 4096}));
  ASSERT_OK(target().UnregisterMemory(reinterpret_cast<void*>(remote_addr)));
  FillPattern(remote, 8192, Mix64(42));
  EXPECT_THAT(initiator().TransferSync(
                  TransferRequest{Opcode::kWrite, local, segment(), remote_addr, 4096}),
              IsError());
  EXPECT_TRUE(CheckLayout(remote, 8192, {}, Mix64(42)));
}

// The peer checks remote ranges against what it has registered now, so a
// region registered after the segment was opened is usable at once.
TEST_P(TransportConformanceTest, RegionRegisteredAfterOpenIsWritable) {
  unsigned char* local = Alloc(8192, &initiator());
  ASSERT_NE(local, nullptr);
  // (A file region is registered with the target by Alloc, after the open
  // too.)
  unsigned char* late = Alloc(8192, TargetFiles() ? &target() : nullptr);
  ASSERT_NE(late, nullptr);
  if (!TargetFiles()) {
    ASSERT_OK(target().RegisterMemory(late, 8192));
  }
  FillPattern(local, 8192, Mix64(51));
  EXPECT_OK(initiator().TransferSync(
      TransferRequest{Opcode::kWrite, local, segment(), Addr(late), 8192}));
  EXPECT_TRUE(CheckLayout(late, 8192, {{0, 8192, Mix64(51), 0}}, 0));
  ASSERT_OK_AND_ASSIGN(SegmentInfo info, initiator().QuerySegment(segment()));
  bool found = false;
  for (const RemoteRegion& r : info.regions) {
    if (r.addr == Addr(late)) found = r.length == 8192;
  }
  EXPECT_TRUE(found);
}

// A region registered for local use only (MemoryRegion::exported = false) is
// missing from the descriptor peers see and refused to their requests, with
// the reason; its owner uses it as the source and destination of its own
// transfers as usual.
TEST_P(TransportConformanceTest, LocalOnlyRegionIsHiddenFromPeersAndRefused) {
  constexpr uint64_t kLen = 16 * kKiB;
  unsigned char* exported = Alloc(kLen, &target());
  unsigned char* hidden = Alloc(kLen, &target(), /*exported=*/false);
  unsigned char* mine = Alloc(kLen, nullptr);  // the initiator's, local-only
  ASSERT_NE(exported, nullptr);
  ASSERT_NE(hidden, nullptr);
  ASSERT_NE(mine, nullptr);
  ASSERT_OK(initiator().RegisterMemory(std::vector<MemoryRegion>{{mine, kLen, "cpu", false}}));
  const uint64_t hidden_addr = Addr(hidden);
  const uint64_t exported_addr = Addr(exported);

  ASSERT_OK_AND_ASSIGN(SegmentInfo info, initiator().QuerySegment(segment()));
  bool saw_exported = false;
  for (const RemoteRegion& r : info.regions) {
    EXPECT_FALSE(r.addr == hidden_addr) << "a local-only region is in the peer's descriptor";
    saw_exported = saw_exported || r.addr == exported_addr;
  }
  EXPECT_TRUE(saw_exported);

  // The owner's own memory works both ways: write from it, read into it.
  FillPattern(mine, kLen, Mix64(61));
  ASSERT_OK(initiator().TransferSync(
      TransferRequest{Opcode::kWrite, mine, segment(), exported_addr, kLen}));
  EXPECT_TRUE(CheckLayout(exported, kLen, {{0, kLen, Mix64(61), 0}}, 0));
  FillPattern(exported, kLen, Mix64(62));
  ASSERT_OK(initiator().TransferSync(
      TransferRequest{Opcode::kRead, mine, segment(), exported_addr, kLen}));
  EXPECT_TRUE(CheckLayout(mine, kLen, {{0, kLen, Mix64(62), 0}}, 0));

  // Peers' requests into the hidden region: refused, nothing moved.
  FillPattern(hidden, kLen, Mix64(63));
  FillPattern(mine, kLen, Mix64(64));
  for (Opcode op : {Opcode::kWrite, Opcode::kRead}) {
    Status s =
        initiator().TransferSync(TransferRequest{op, mine, segment(), hidden_addr + 4096, 4096});
    EXPECT_THAT(s, IsError(HasSubstr("not exported"))) << static_cast<int>(op);
    EXPECT_THAT(s, IsError(MentionsNumber(hidden_addr + 4096)));
  }
  EXPECT_TRUE(CheckLayout(hidden, kLen, {}, Mix64(63)));
  EXPECT_TRUE(CheckLayout(mine, kLen, {}, Mix64(64)));
}

// ---------------------------------------------------------------------------
// Notifications

// N writes are submitted (not waited for), then a notification is sent; the
// target drains notifications in a tight loop on another thread and checks,
// at the moment each one is seen, that the data of the writes before it is
// already in place.
TEST_P(TransportConformanceTest, NotificationArrivesAfterPrecedingWrites) {
  constexpr int kRounds = 8;
  constexpr size_t kWrites = 24;
  constexpr uint64_t kArea = 2 * kMiB;  // per round, local and remote
  unsigned char* local = Alloc(kRounds * kArea, &initiator());
  unsigned char* remote = Alloc(kRounds * kArea, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_addr = Addr(remote);
  FillPattern(remote, kRounds * kArea, Mix64(61));

  // Round r's writes tile [r*kArea, r*kArea + used) in pieces of 1 B..80 KiB;
  // the pattern position is the offset in the buffer.
  std::vector<std::vector<Piece>> rounds(kRounds);
  for (int r = 0; r < kRounds; ++r) {
    uint64_t off = r * kArea + (r % 5);
    for (size_t i = 0; i < kWrites; ++i) {
      const uint64_t len = 1 + Mix64(r * 100 + i) % (80 * kKiB);
      rounds[r].push_back({off, off, len});
      off += len;
    }
  }
  const uint64_t data_seed = Mix64(62);

  struct Seen {
    Notification note;
    std::string check;  // "" if the data was in place when it was seen
  };
  std::vector<Seen> seen;
  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    const auto deadline = std::chrono::steady_clock::now() + kWaitTimeout;
    while (!stop.load() && static_cast<int>(seen.size()) < kRounds &&
           std::chrono::steady_clock::now() < deadline) {
      std::vector<Notification> got = target().GetNotifications();
      for (Notification& n : got) {
        std::string check;
        const size_t dash = n.name.rfind('-');
        const int r = dash == std::string::npos ? -1 : std::atoi(n.name.c_str() + dash + 1);
        if (r < 0 || r >= kRounds) {
          check = "unexpected notification name";
        } else {
          // This round and every earlier one must be complete.
          for (int q = 0; q <= r && check.empty(); ++q) {
            for (const Piece& p : rounds[q]) {
              check =
                  DescribePatternMismatch(remote + p.remote_off, p.length, data_seed, p.remote_off);
              if (!check.empty()) {
                check = "round " + std::to_string(q) + " at remote offset " +
                        std::to_string(p.remote_off) + ": " + check;
                break;
              }
            }
          }
        }
        seen.push_back({std::move(n), std::move(check)});
      }
      if (got.empty()) std::this_thread::sleep_for(50us);
    }
  });

  std::vector<BatchId> batches;
  bool all_sent = true;
  for (int r = 0; r < kRounds; ++r) {
    std::vector<TransferRequest> reqs;
    for (const Piece& p : rounds[r]) {
      FillPattern(local + p.local_off, p.length, data_seed, p.remote_off);
      reqs.push_back(
          {Opcode::kWrite, local + p.local_off, segment(), remote_addr + p.remote_off, p.length});
    }
    auto batch = initiator().AllocateBatch(reqs.size());
    EXPECT_OK(batch);
    all_sent = batch.ok();
    if (!all_sent) break;
    batches.push_back(*batch);
    EXPECT_OK(initiator().Submit(*batch, reqs));
    const Status sent = initiator().SendNotification(segment(), "round-" + std::to_string(r),
                                                     "message of round " + std::to_string(r));
    EXPECT_OK(sent);
    all_sent = sent.ok();
    if (!all_sent) break;
  }
  if (!all_sent) stop = true;  // don't wait for notifications that were never sent
  for (BatchId b : batches) {
    EXPECT_OK(initiator().WaitBatch(b, kWaitTimeout));
    EXPECT_OK(initiator().FreeBatch(b));
  }
  watcher.join();

  ASSERT_EQ(seen.size(), static_cast<size_t>(kRounds));
  for (int r = 0; r < kRounds; ++r) {
    EXPECT_EQ(seen[r].note.name, "round-" + std::to_string(r)) << "notifications out of order";
    EXPECT_EQ(seen[r].note.message, "message of round " + std::to_string(r));
    EXPECT_EQ(seen[r].note.sender, initiator().PeerId());
    EXPECT_EQ(seen[r].check, "") << "notification " << seen[r].note.name
                                 << " arrived before the data it follows";
  }
  EXPECT_THAT(target().GetNotifications(), ::testing::IsEmpty());
}

// A target destroyed the moment its acknowledgement of a notification
// reached the initiator: its answer may still be in its transport's hands
// (fabric: a send posted to the provider whose completion the progress
// thread has not read). Destroying it must release that answer; what is
// left behind shows as a leak under the sanitizer pass. What this case
// keeps under the sanitizers is the shutdown path, not a sure reproduction:
// the fabric endpoint once leaked such an ack buffer in a full ASan run, and
// this case, 36 times under ASan before the fix, never hit that window.
TEST_P(TransportConformanceTest,
       ATargetDestroyedRightAfterAcknowledgingANotificationLeavesNothing) {
  for (int i = 0; i < 12; ++i) {
    if (i > 0) {
      ASSERT_NO_FATAL_FAILURE(Start(GetParam()));
    }
    ASSERT_THAT(initiator().SendNotification(segment(), "n" + std::to_string(i), "bye"), IsOk());
    DestroyTarget();
  }
}

// The destroy-in-flight cases: kInFlight requests of 16 KiB, writes and
// reads in turn, submitted as one batch; the buffers in *local and *remote.
constexpr size_t kInFlight = 256;
void SubmitWritesAndReads(EnginePair& pair, unsigned char** local, unsigned char** remote,
                          BatchId* batch) {
  constexpr uint64_t kLen = 16 * kKiB;
  *local = pair.Alloc(kInFlight * kLen, &pair.initiator());
  *remote = pair.Alloc(kInFlight * kLen, &pair.target());
  ASSERT_NE(*local, nullptr);
  ASSERT_NE(*remote, nullptr);
  const std::vector<TransferRequest> reqs = pair.WritesAndReads(*local, *remote, kInFlight, kLen);
  ASSERT_OK_AND_ASSIGN(*batch, pair.initiator().AllocateBatch(kInFlight));
  ASSERT_OK(pair.initiator().Submit(*batch, reqs));
}

// The initiator destroyed with a batch of writes and reads in flight: its
// destructor returns (every transport, and every wrapper around one, fails
// or finishes what it still holds; nothing waits for an answer no thread
// will read), and the target serves a new initiator.
TEST_P(TransportConformanceTest, AnInitiatorDestroyedWithABatchInFlightLeavesTheTargetServing) {
  unsigned char *local = nullptr, *remote = nullptr;
  BatchId batch;
  ASSERT_NO_FATAL_FAILURE(SubmitWritesAndReads(*this, &local, &remote, &batch));
  DestroyInitiator();
  ExpectTargetServesANewEngine(ConformanceOptions(GetParam()), remote);
}

// The target destroyed with a batch of the initiator's writes and reads in
// flight: every request of the batch finishes (completed, or failed naming
// what went), none waits past the destroy, and the initiator goes on.
TEST_P(TransportConformanceTest, ATargetDestroyedWithABatchInFlightFinishesEveryRequest) {
  unsigned char *local = nullptr, *remote = nullptr;
  BatchId batch;
  ASSERT_NO_FATAL_FAILURE(SubmitWritesAndReads(*this, &local, &remote, &batch));
  DestroyTarget();
  // Bounded by the transfer deadline: a request nobody answers fails by it.
  (void)initiator().WaitBatch(batch, kWaitTimeout);
  for (size_t k = 0; k < kInFlight; ++k) {
    ASSERT_OK_AND_ASSIGN(TransferStatus st, initiator().GetTransferStatus(batch, k));
    ASSERT_NE(st.state, TransferState::kPending) << "request " << k;
    if (st.state == TransferState::kFailed) {
      EXPECT_FALSE(st.status.message().empty()) << k;
    }
  }
  EXPECT_OK(initiator().FreeBatch(batch));
  // The initiator still works: its own memory, through a new engine.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> other,
                       Engine::Create(ConformanceOptions(GetParam())));
  AlignedBuffer buf(4096);
  ASSERT_OK(other->RegisterMemory(buf.data(), 4096, "cpu"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, initiator().OpenSegment(other->PeerId()));
  EXPECT_OK(initiator().TransferSync({Opcode::kWrite, reinterpret_cast<void*>(Addr(local)), seg,
                                      reinterpret_cast<uint64_t>(buf.data()), 4096}));
}

TEST_P(TransportConformanceTest, NotificationsArriveInOrderWithExactPayload) {
  EXPECT_THAT(target().GetNotifications(), ::testing::IsEmpty());
  std::vector<std::pair<std::string, std::string>> sent;
  for (int i = 0; i < 20; ++i) {
    std::string message = "payload " + std::to_string(i);
    if (i == 3) message = std::string("embedded\0nul", 12);
    if (i == 7) message = std::string(4096, 'x') + "end";
    sent.emplace_back("note-" + std::to_string(i), message);
    ASSERT_OK(initiator().SendNotification(segment(), sent.back().first, sent.back().second));
  }
  std::vector<Notification> got;
  const auto deadline = std::chrono::steady_clock::now() + kWaitTimeout;
  while (got.size() < sent.size() && std::chrono::steady_clock::now() < deadline) {
    for (Notification& n : target().GetNotifications()) got.push_back(std::move(n));
    if (got.size() < sent.size()) std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(got[i].name, sent[i].first);
    EXPECT_EQ(got[i].message, sent[i].second) << "notification " << i;
    EXPECT_EQ(got[i].sender, initiator().PeerId());
  }
  EXPECT_THAT(initiator().GetNotifications(), ::testing::IsEmpty());
}

}  // namespace
}  // namespace ferry::test
