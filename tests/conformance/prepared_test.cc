// Prepared lists and transfers, cancellation, notifications, agent metadata
// and telemetry, over every transport (conformance_fixture.h).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/conformance/conformance_fixture.h"

namespace ferry::test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;

class PreparedTest : public ::testing::TestWithParam<std::string>, public EnginePair {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(Start(GetParam())); }

  // Rows of `n` entries of `len` bytes, `stride` apart, from `base`.
  std::vector<DescRow> Rows(const void* base, size_t n, uint64_t len, uint64_t stride) {
    std::vector<DescRow> rows;
    for (size_t i = 0; i < n; ++i) rows.push_back({Addr(base) + i * stride, len, 0, 1});
    return rows;
  }
  static std::vector<uint32_t> Iota(size_t n, bool reversed = false) {
    std::vector<uint32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(reversed ? n - 1 - i : i);
    return v;
  }
  Status Wait(TransferHandle t) { return initiator().WaitTransfer(t, kWaitTimeout); }
  // Remote lists are checked against the descriptor of the last handshake:
  // fetch it again once the target registered its memory.
  void Refresh() { ASSERT_OK(GetStatus(initiator().QuerySegment(segment()))); }
};

INSTANTIATE_TEST_SUITE_P(AllTransports, PreparedTest, ::testing::ValuesIn(kTransports),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });
INSTANTIATE_TEST_SUITE_P(FileTargets, PreparedTest, ::testing::ValuesIn(kFileTargets),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// Scattered writes and reads through prepared lists: a local list of plain
// rows and a remote list of one strided row, paired in reverse order.
TEST_P(PreparedTest, ScatteredWritesAndReadsLandWhereTheIndicesSay) {
  constexpr size_t kN = 256;
  constexpr uint64_t kLen = 4 * kKiB;
  unsigned char* local = Alloc(kN * kLen, &initiator());
  unsigned char* back = Alloc(kN * kLen, &initiator());
  unsigned char* remote = Alloc(2 * kN * kLen, &target());
  ASSERT_TRUE(local && back && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  for (size_t i = 0; i < kN; ++i) FillPattern(local + i * kLen, kLen, RequestSeed(7, i));
  FillPattern(remote, 2 * kN * kLen, 99);

  ASSERT_OK_AND_ASSIGN(DescListHandle l, initiator().PrepareLocalList(Rows(local, kN, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(DescListHandle lb, initiator().PrepareLocalList(Rows(back, kN, kLen, kLen)));
  const DescRow strided{Addr(remote), kLen, 2 * kLen, kN};  // every other 4 KiB page
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       initiator().PrepareRemoteList(segment(), std::span(&strided, 1)));
  ASSERT_OK_AND_ASSIGN(size_t entries, initiator().DescListEntries(r));
  EXPECT_EQ(entries, kN);

  const auto fwd = Iota(kN), rev = Iota(kN, true);
  ASSERT_OK_AND_ASSIGN(TransferHandle w, initiator().MakeTransfer(Opcode::kWrite, l, fwd, r, rev));
  ASSERT_OK(initiator().PostTransfer(w));
  ASSERT_OK(Wait(w));
  ASSERT_OK_AND_ASSIGN(TransferStatus ws, initiator().GetTransferStatus(w));
  EXPECT_EQ(ws.state, TransferState::kCompleted);
  for (size_t i = 0; i < kN; ++i) {
    const size_t page = kN - 1 - i;
    EXPECT_EQ(DescribePatternMismatch(remote + 2 * page * kLen, kLen, RequestSeed(7, i)), "")
        << "entry " << i;
    // The pages between the strided entries are untouched.
    EXPECT_EQ(
        DescribePatternMismatch(remote + (2 * page + 1) * kLen, kLen, 99, (2 * page + 1) * kLen),
        "");
  }

  ASSERT_OK_AND_ASSIGN(TransferHandle rd, initiator().MakeTransfer(Opcode::kRead, lb, rev, r, fwd));
  ASSERT_OK(initiator().PostTransfer(rd));
  ASSERT_OK(Wait(rd));
  // back[k] = remote entry k... paired: local rev[k] <- remote k = local[kN-1-k]'s data.
  for (size_t k = 0; k < kN; ++k) {
    EXPECT_EQ(DescribePatternMismatch(back + (kN - 1 - k) * kLen, kLen, RequestSeed(7, kN - 1 - k)),
              "")
        << "read back entry " << k;
  }
  EXPECT_OK(initiator().ReleaseTransfer(w));
  EXPECT_OK(initiator().ReleaseTransfer(rd));
  EXPECT_OK(initiator().ReleaseDescList(l));
  EXPECT_OK(initiator().ReleaseDescList(lb));
  EXPECT_OK(initiator().ReleaseDescList(r));
  EXPECT_THAT(initiator().ReleaseDescList(r), StatusIs(StatusCode::kInvalidArgument));
}

TEST_P(PreparedTest, AdjacentPairsMergeAndTelemetryCountsThem) {
  constexpr size_t kN = 64;
  constexpr uint64_t kLen = 4 * kKiB;
  unsigned char* local = Alloc(kN * kLen, &initiator());
  unsigned char* remote = Alloc(kN * kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  FillPattern(local, kN * kLen, 5);
  ASSERT_OK_AND_ASSIGN(DescListHandle l, initiator().PrepareLocalList(Rows(local, kN, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       initiator().PrepareRemoteList(segment(), Rows(remote, kN, kLen, kLen)));
  // Pairs 0..31 are contiguous on both sides (one entry); 63, 62 ... are not.
  std::vector<uint32_t> idx = Iota(32);
  idx.push_back(63);
  idx.push_back(40);
  ASSERT_OK_AND_ASSIGN(TransferHandle t, initiator().MakeTransfer(Opcode::kWrite, l, idx, r, idx));
  EXPECT_THAT(GetStatus(initiator().GetTransferTelemetry(t)),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(GetStatus(initiator().GetTransferStatus(t)),
              StatusIs(StatusCode::kFailedPrecondition));
  const uint64_t before = std::chrono::duration_cast<std::chrono::microseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
  ASSERT_OK(initiator().PostTransfer(t));
  ASSERT_OK(Wait(t));
  ASSERT_OK_AND_ASSIGN(TransferTelemetry tel, initiator().GetTransferTelemetry(t));
  EXPECT_EQ(tel.entries, 3u);
  EXPECT_EQ(tel.bytes, 34 * kLen);
  EXPECT_GE(tel.start_us, before);
  EXPECT_LE(tel.post_us, tel.transfer_us + tel.post_us);  // both measured
  EXPECT_EQ(DescribePatternMismatch(remote, 32 * kLen, 5), "");
  EXPECT_EQ(DescribePatternMismatch(remote + 63 * kLen, kLen, 5, 63 * kLen), "");
  EXPECT_EQ(DescribePatternMismatch(remote + 40 * kLen, kLen, 5, 40 * kLen), "");
  for (uint64_t i = 32; i < 63; ++i) {
    if (i == 40) continue;
    EXPECT_EQ(remote[i * kLen], 0) << "page " << i << " was not part of the transfer";
  }
}

TEST_P(PreparedTest, ATransferIsPostedAgainOnceDone) {
  constexpr uint64_t kLen = 256 * kKiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  ASSERT_OK_AND_ASSIGN(DescListHandle l, initiator().PrepareLocalList(Rows(local, 1, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       initiator().PrepareRemoteList(segment(), Rows(remote, 1, kLen, kLen)));
  const std::vector<uint32_t> zero = {0};
  ASSERT_OK_AND_ASSIGN(TransferHandle t,
                       initiator().MakeTransfer(Opcode::kWrite, l, zero, r, zero));
  for (uint64_t round = 0; round < 3; ++round) {
    FillPattern(local, kLen, 100 + round);
    ASSERT_OK(initiator().PostTransfer(t)) << "round " << round;
    ASSERT_OK(Wait(t));
    EXPECT_EQ(DescribePatternMismatch(remote, kLen, 100 + round), "") << "round " << round;
  }
}

TEST_P(PreparedTest, RepostingWhileInFlightIsRefused) {
  if (GetParam() == "local" || GetParam() == "shm_mapped") {
    GTEST_SKIP() << GetParam() << " posts complete within the post call";
  }
  constexpr uint64_t kLen = 64 * kMiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  ASSERT_OK_AND_ASSIGN(DescListHandle l,
                       initiator().PrepareLocalList(Rows(local, 1024, 64 * kKiB, 64 * kKiB)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r, initiator().PrepareRemoteList(
                                             segment(), Rows(remote, 1024, 64 * kKiB, 64 * kKiB)));
  const auto idx = Iota(1024, true);  // reversed: nothing merges, 1024 entries
  ASSERT_OK_AND_ASSIGN(TransferHandle t, initiator().MakeTransfer(Opcode::kWrite, l, idx, r, idx));
  // A 64 MiB transfer of 1024 entries is in flight right after its post
  // (if a round finished first, it is simply posted again; bounded).
  bool refused = false;
  for (int round = 0; round < 20 && !refused; ++round) {
    ASSERT_OK(initiator().PostTransfer(t));
    const Status again = initiator().PostTransfer(t);
    if (!again.ok()) {
      EXPECT_THAT(again, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("still in flight")));
      refused = true;
    }
    ASSERT_OK(Wait(t));
  }
  EXPECT_TRUE(refused) << "never caught the transfer in flight";
}

TEST_P(PreparedTest, BadListsAndPairsAreRefusedWithTheReason) {
  constexpr uint64_t kLen = 64 * kKiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  std::vector<DescRow> empty;
  EXPECT_THAT(GetStatus(initiator().PrepareLocalList(empty)),
              StatusIs(StatusCode::kInvalidArgument));
  const DescRow zero_len{Addr(local), 0, 0, 1};
  EXPECT_THAT(GetStatus(initiator().PrepareLocalList(std::span(&zero_len, 1))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("row 0")));
  // A strided row whose 5th entry leaves the region.
  const DescRow past{Addr(local), 4 * kKiB, 16 * kKiB, 5};
  EXPECT_THAT(GetStatus(initiator().PrepareLocalList(std::span(&past, 1))),
              StatusIs(StatusCode::kNotFound, HasSubstr("entry 4")));
  const DescRow outside{Addr(remote) + kLen - 100, 4096, 0, 1};
  std::vector<DescRow> rrows = Rows(remote, 4, 4096, 4096);
  rrows.push_back(outside);
  EXPECT_THAT(GetStatus(initiator().PrepareRemoteList(segment(), rrows)),
              StatusIs(StatusCode::kNotFound, HasSubstr("row 4")));
  const DescRow wraps{~uint64_t{0} - 10, 4096, 0, 1};
  EXPECT_THAT(GetStatus(initiator().PrepareRemoteList(segment(), std::span(&wraps, 1))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("wraps")));

  std::vector<DescRow> lrows = Rows(local, 4, 4096, 4096);
  lrows.push_back({Addr(local) + 16 * kKiB, 8192, 0, 1});
  ASSERT_OK_AND_ASSIGN(DescListHandle l, initiator().PrepareLocalList(lrows));
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       initiator().PrepareRemoteList(segment(), Rows(remote, 4, 4096, 4096)));
  const std::vector<uint32_t> a = {0, 1}, b = {0}, big = {0, 9}, mismatch = {4}, one = {1};
  EXPECT_THAT(GetStatus(initiator().MakeTransfer(Opcode::kWrite, l, a, r, b)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("2 local indices but 1 remote")));
  EXPECT_THAT(GetStatus(initiator().MakeTransfer(Opcode::kWrite, l, a, r, big)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("remote index 9 is out of range")));
  EXPECT_THAT(GetStatus(initiator().MakeTransfer(Opcode::kWrite, l, mismatch, r, one)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("8192 bytes")));
  EXPECT_THAT(GetStatus(initiator().MakeTransfer(Opcode::kWrite, r, b, l, b)),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(GetStatus(initiator().MakeTransfer(Opcode::kWrite, l, {}, r, {})),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(GetStatus(initiator().MakeTransfer(Opcode::kWrite, DescListHandle{12345}, b, r, b)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("not prepared")));
  EXPECT_THAT(initiator().PostTransfer(TransferHandle{777}),
              StatusIs(StatusCode::kInvalidArgument));

  // The local memory of a list was unregistered: its transfers are refused.
  ASSERT_OK_AND_ASSIGN(TransferHandle t, initiator().MakeTransfer(Opcode::kWrite, l, b, r, b));
  ASSERT_OK(initiator().UnregisterMemory(local));
  EXPECT_THAT(initiator().PostTransfer(t),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("unregistered")));
}

// Cancelling a read in flight: once CancelTransfer returns, nothing of it
// lands in local memory. A follow-up read over the same streams (a stream
// answers in order) shows the transport has handled what it had received.
TEST_P(PreparedTest, NothingOfACancelledReadLandsAfterTheCancelReturns) {
  constexpr size_t kN = 2048;
  constexpr uint64_t kLen = 16 * kKiB;
  unsigned char* local = Alloc(kN * kLen, &initiator());
  unsigned char* other = Alloc(4 * kMiB, &initiator());
  unsigned char* remote = Alloc(kN * kLen, &target());
  ASSERT_TRUE(local && other && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  FillPattern(remote, kN * kLen, 31);
  ASSERT_OK_AND_ASSIGN(DescListHandle l, initiator().PrepareLocalList(Rows(local, kN, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       initiator().PrepareRemoteList(segment(), Rows(remote, kN, kLen, kLen)));
  const auto idx = Iota(kN, true);
  ASSERT_OK_AND_ASSIGN(TransferHandle t, initiator().MakeTransfer(Opcode::kRead, l, idx, r, idx));
  for (int round = 0; round < 5; ++round) {
    std::memset(local, 0xEE, kN * kLen);
    ASSERT_OK(initiator().PostTransfer(t));
    ASSERT_OK(initiator().CancelTransfer(t));
    std::vector<unsigned char> snapshot(local, local + kN * kLen);
    ASSERT_OK_AND_ASSIGN(TransferStatus s, initiator().GetTransferStatus(t));
    EXPECT_NE(s.state, TransferState::kPending);
    if (s.state == TransferState::kFailed) {
      EXPECT_THAT(s.status, StatusIs(StatusCode::kCancelled));
    }
    // Reads spread over every stream, after the cancelled ones.
    std::vector<TransferRequest> follow;
    for (uint64_t off = 0; off < 4 * kMiB; off += 64 * kKiB) {
      follow.push_back({Opcode::kRead, other + off, segment(), Addr(remote) + off, 64 * kKiB});
    }
    ASSERT_OK(initiator().TransferSync(follow));
    EXPECT_EQ(std::memcmp(snapshot.data(), local, kN * kLen), 0)
        << "round " << round
        << ": bytes of the cancelled read landed after CancelTransfer returned";
    // The transfer can be posted again, and then completes in full.
  }
  ASSERT_OK(initiator().PostTransfer(t));
  ASSERT_OK(Wait(t));
  EXPECT_EQ(DescribePatternMismatch(local, kN * kLen, 31), "");
}

TEST_P(PreparedTest, CancelBatchFailsWhatIsPendingAndFreesTheBatch) {
  constexpr uint64_t kLen = 32 * kMiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kLen; off += 64 * kKiB) {
    reqs.push_back({Opcode::kRead, local + off, segment(), Addr(remote) + off, 64 * kKiB});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(reqs.size() + 1));
  ASSERT_OK(initiator().Submit(batch, reqs));
  ASSERT_OK(initiator().CancelBatch(batch));
  ASSERT_OK_AND_ASSIGN(BatchStatus st, initiator().GetBatchStatus(batch));
  EXPECT_NE(st.state, TransferState::kPending);
  EXPECT_EQ(st.completed + st.failed, reqs.size());
  if (st.failed > 0) {
    EXPECT_THAT(st.first_error, StatusIs(StatusCode::kCancelled));
  }
  // A submit to a cancelled batch is refused and nothing moves.
  const TransferRequest late{Opcode::kRead, local, segment(), Addr(remote), 4096};
  EXPECT_THAT(initiator().Submit(batch, std::span(&late, 1)), StatusIs(StatusCode::kCancelled));
  EXPECT_OK(initiator().FreeBatch(batch));
}

TEST_P(PreparedTest, ATransfersNotificationArrivesAfterItsData) {
  constexpr uint64_t kLen = 1 * kMiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  FillPattern(local, kLen, 77);
  ASSERT_OK_AND_ASSIGN(DescListHandle l,
                       initiator().PrepareLocalList(Rows(local, 16, 64 * kKiB, 64 * kKiB)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r, initiator().PrepareRemoteList(
                                             segment(), Rows(remote, 16, 64 * kKiB, 64 * kKiB)));
  const auto idx = Iota(16, true);
  ASSERT_OK_AND_ASSIGN(TransferHandle w,
                       initiator().MakeTransfer(Opcode::kWrite, l, idx, r, idx,
                                                Notification{"", "agent-a", "written"}));
  ASSERT_OK(initiator().PostTransfer(w));
  ASSERT_OK(Wait(w));
  // Complete means the target had the notification, after the data.
  auto notes = target().GetNotifications();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].name, "agent-a");
  EXPECT_EQ(notes[0].message, "written");
  EXPECT_EQ(notes[0].sender, initiator().PeerId());
  EXPECT_EQ(DescribePatternMismatch(remote, kLen, 77), "");
  // A read notifies the owner of the data once it was read; a post may
  // replace the notification.
  ASSERT_OK_AND_ASSIGN(TransferHandle rd,
                       initiator().MakeTransfer(Opcode::kRead, l, idx, r, idx,
                                                Notification{"", "agent-a", "first"}));
  std::memset(local, 0, kLen);
  ASSERT_OK(initiator().PostTransfer(rd, Notification{"", "agent-a", "read:1"}));
  ASSERT_OK(Wait(rd));
  EXPECT_EQ(DescribePatternMismatch(local, kLen, 77), "");
  notes = target().GetNotifications();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].message, "read:1");
  EXPECT_EQ(initiator().GetMetrics().notifications_sent, 2u);
  EXPECT_EQ(target().GetMetrics().notifications_received, 2u);
}

// The initiator destroyed while prepared transfers with notifications are
// in flight (their data posted, or their notifications queued behind it):
// its destructor returns, every completion and notification job ends
// before the engine is gone, and the target serves a new initiator.
TEST_P(PreparedTest, AnInitiatorDestroyedWithTransfersInFlightLeavesTheTargetServing) {
  constexpr size_t kN = 64;
  constexpr uint64_t kLen = 16 * kKiB;
  unsigned char* local = Alloc(kN * kLen, &initiator());
  unsigned char* remote = Alloc(kN * kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  ASSERT_OK_AND_ASSIGN(DescListHandle l, initiator().PrepareLocalList(Rows(local, kN, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       initiator().PrepareRemoteList(segment(), Rows(remote, kN, kLen, kLen)));
  // Eight transfers of eight rows each, none touching another's rows:
  // four writes, then four reads.
  for (uint32_t k = 0; k < 8; ++k) {
    std::vector<uint32_t> idx;
    for (uint32_t i = 0; i < kN / 8; ++i) idx.push_back(k * (kN / 8) + i);
    ASSERT_OK_AND_ASSIGN(
        TransferHandle t,
        initiator().MakeTransfer(k < 4 ? Opcode::kWrite : Opcode::kRead, l, idx, r, idx,
                                 Notification{"", "n" + std::to_string(k), "m"}));
    ASSERT_OK(initiator().PostTransfer(t));
  }
  DestroyInitiator();
  ExpectTargetServesANewEngine(ConformanceOptions(GetParam()), remote);
}

TEST_P(PreparedTest, NotificationsOfOneMebibyteArriveWhole) {
  std::string big(kMaxNotificationMessage, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(PatternByte(3, i));
  ASSERT_OK(initiator().SendNotification(segment(), "big", big));
  ASSERT_OK(initiator().SendNotification(segment(), "small", "after"));
  auto notes = target().GetNotifications();
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0].name, "big");
  EXPECT_TRUE(notes[0].message == big);
  EXPECT_EQ(notes[1].message, "after");
  EXPECT_THAT(initiator().SendNotification(segment(), "too big", big + "x"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("at most 1048576")));
}

// A peer of a build before "notify-1m" takes messages of at most
// kMaxNotificationMessageV1 bytes: a longer one is refused up front, naming
// the peer and both sizes, by SendNotification, MakeTransfer and a post's
// replacement notification alike; one of the old limit still arrives.
TEST(PreparedOldPeerTest, LongNotificationsToAnOlderPeerAreRefusedUpFront) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("tcp");
  EngineOptions old_peer = ConformanceOptions("tcp");
  old_peer.testing.omit_features = {"notify-1m"};
  EnginePair p;
  ASSERT_NO_FATAL_FAILURE(p.Start(ConformanceOptions("tcp"), old_peer));
  const std::string fits(kMaxNotificationMessageV1, 'a');
  const std::string longer = fits + "b";
  const auto refused =
      StatusIs(StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("takes notification messages of at most " +
                               std::to_string(kMaxNotificationMessageV1) + " bytes"),
                     HasSubstr("this one has " + std::to_string(longer.size()))));
  EXPECT_THAT(p.initiator().SendNotification(p.segment(), "n", longer), refused);

  constexpr uint64_t kLen = 4 * kKiB;
  unsigned char* local = p.Alloc(kLen, &p.initiator());
  unsigned char* remote = p.Alloc(kLen, &p.target());
  ASSERT_TRUE(local && remote);
  ASSERT_OK(GetStatus(p.initiator().QuerySegment(p.segment())));
  const std::vector<DescRow> local_rows = {{reinterpret_cast<uintptr_t>(local), kLen, 0, 1}};
  const std::vector<DescRow> remote_rows = {{reinterpret_cast<uintptr_t>(remote), kLen, 0, 1}};
  ASSERT_OK_AND_ASSIGN(DescListHandle l, p.initiator().PrepareLocalList(local_rows));
  ASSERT_OK_AND_ASSIGN(DescListHandle r, p.initiator().PrepareRemoteList(p.segment(), remote_rows));
  const std::vector<uint32_t> zero = {0};
  EXPECT_THAT(GetStatus(p.initiator().MakeTransfer(Opcode::kWrite, l, zero, r, zero,
                                                   Notification{"", "n", longer})),
              refused);
  ASSERT_OK_AND_ASSIGN(TransferHandle t,
                       p.initiator().MakeTransfer(Opcode::kWrite, l, zero, r, zero));
  EXPECT_THAT(p.initiator().PostTransfer(t, Notification{"", "n", longer}), refused);
  EXPECT_TRUE(p.target().GetNotifications().empty());

  FillPattern(local, kLen, 9);
  ASSERT_OK(p.initiator().PostTransfer(t, Notification{"", "n", fits}));
  ASSERT_OK(p.initiator().WaitTransfer(t, kWaitTimeout));
  EXPECT_EQ(DescribePatternMismatch(remote, kLen, 9), "");
  ASSERT_OK(p.initiator().SendNotification(p.segment(), "m", fits));
  auto notes = p.target().GetNotifications();
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_TRUE(notes[0].message == fits);
  EXPECT_EQ(notes[1].name, "m");
}

TEST_P(PreparedTest, ARemoteListOfARestartedPeerIsRefused) {
  constexpr uint64_t kLen = 64 * kKiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, nullptr);
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  ASSERT_OK(target().RegisterMemory(remote, kLen));
  ASSERT_NO_FATAL_FAILURE(Refresh());
  ASSERT_OK_AND_ASSIGN(DescListHandle l, initiator().PrepareLocalList(Rows(local, 1, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       initiator().PrepareRemoteList(segment(), Rows(remote, 1, kLen, kLen)));
  const std::vector<uint32_t> zero = {0};
  ASSERT_OK_AND_ASSIGN(TransferHandle t,
                       initiator().MakeTransfer(Opcode::kWrite, l, zero, r, zero));
  ASSERT_OK(initiator().PostTransfer(t));
  ASSERT_OK(Wait(t));

  ASSERT_OK_AND_ASSIGN(SegmentInfo before, initiator().QuerySegment(segment()));
  // The peer restarts on the same port with the same memory registered.
  EngineOptions o = ConformanceOptions(GetParam());
  o.listen_port = target().RpcPort();
  DestroyTarget();
  ASSERT_OK_AND_ASSIGN(auto again, Engine::Create(o));
  ASSERT_OK(again->RegisterMemory(remote, kLen));
  std::memset(remote, 0, kLen);
  FillPattern(local, kLen, 4);
  Status refused = initiator().PostTransfer(t);
  if (refused.ok()) {
    // The engine learns of the restart from the old link breaking, and
    // that is asynchronous: reliable datagrams (fabric) have no connection
    // that closes, and a stream's end of file may not have been read yet
    // when this post comes. Then the post goes to the old instance, which
    // answers no more, and fails; the next post re-learns the peer and is
    // refused. Either way nothing reaches the new instance.
    EXPECT_THAT(Wait(t), StatusIs(StatusCode::kUnavailable));
    refused = initiator().PostTransfer(t);
  }
  EXPECT_THAT(refused, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("restarted")));
  EXPECT_EQ(remote[0], 0) << "nothing was written into the new instance";
  // Prepared again against the new instance, it works.
  ASSERT_OK_AND_ASSIGN(SegmentInfo info, initiator().QuerySegment(segment()));
  EXPECT_NE(info.instance_id, before.instance_id);
  ASSERT_OK_AND_ASSIGN(DescListHandle r2,
                       initiator().PrepareRemoteList(segment(), Rows(remote, 1, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(TransferHandle t2,
                       initiator().MakeTransfer(Opcode::kWrite, l, zero, r2, zero));
  ASSERT_OK(initiator().PostTransfer(t2));
  ASSERT_OK(Wait(t2));
  EXPECT_EQ(DescribePatternMismatch(remote, kLen, 4), "");
}

TEST_P(PreparedTest, ImportedMetadataOpensTheSegmentWithoutAHandshake) {
  constexpr uint64_t kLen = 128 * kKiB;
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  FillPattern(remote, kLen, 12);
  auto third = Engine::Create(ConformanceOptions(GetParam()));
  ASSERT_OK(GetStatus(third));
  unsigned char* local = Alloc(kLen, third->get());
  ASSERT_TRUE(local);
  const std::string md = target().ExportMetadata();
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, (*third)->ImportMetadata(md));
  ASSERT_OK_AND_ASSIGN(SegmentHandle same, (*third)->ImportMetadata(md));
  EXPECT_EQ(seg.value, same.value);
  ASSERT_OK_AND_ASSIGN(SegmentInfo known, (*third)->DescribeSegment(seg));  // no round trip
  EXPECT_EQ(known.peer_id, target().PeerId());
  EXPECT_EQ(known.regions.size(), 1u);
  ASSERT_OK_AND_ASSIGN(DescListHandle l, (*third)->PrepareLocalList(Rows(local, 1, kLen, kLen)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r,
                       (*third)->PrepareRemoteList(seg, Rows(remote, 1, kLen, kLen)));
  const std::vector<uint32_t> zero = {0};
  ASSERT_OK_AND_ASSIGN(TransferHandle t, (*third)->MakeTransfer(Opcode::kRead, l, zero, r, zero));
  ASSERT_OK((*third)->PostTransfer(t));
  ASSERT_OK((*third)->WaitTransfer(t, kWaitTimeout));
  EXPECT_EQ(DescribePatternMismatch(local, kLen, 12), "");

  // Memory the peer registers later is seen after importing again.
  unsigned char* later = Alloc(kLen, &target());
  ASSERT_TRUE(later);
  EXPECT_THAT(GetStatus((*third)->PrepareRemoteList(seg, Rows(later, 1, kLen, kLen))),
              StatusIs(StatusCode::kNotFound));
  ASSERT_OK((*third)->ImportMetadata(target().ExportMetadata()));
  EXPECT_OK(GetStatus((*third)->PrepareRemoteList(seg, Rows(later, 1, kLen, kLen))));

  EXPECT_THAT(GetStatus((*third)->ImportMetadata("garbage")),
              StatusIs(StatusCode::kInvalidArgument));
  std::string cut = md.substr(0, md.size() / 2);
  EXPECT_THAT(GetStatus((*third)->ImportMetadata(cut)), StatusIs(StatusCode::kInvalidArgument));
}

// GET /metrics on the endpoint, over loopback.
std::string HttpGet(const std::string& address, const std::string& path) {
  const uint16_t port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(0x7f000001);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST_P(PreparedTest, MetricsCountBytesByPeerTransportAndOutcome) {
  constexpr uint64_t kLen = 512 * kKiB;
  EngineOptions o = ConformanceOptions(GetParam());
  o.metrics_address = "127.0.0.1:0";
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(o));
  unsigned char* local = Alloc(kLen, engine.get());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine->OpenSegment(target().PeerId()));
  ASSERT_OK(engine->TransferSync(TransferRequest{Opcode::kWrite, local, seg, Addr(remote), kLen}));
  ASSERT_OK(
      engine->TransferSync(TransferRequest{Opcode::kRead, local, seg, Addr(remote), kLen / 2}));
  // Outside the peer's memory: a failed request.
  EXPECT_THAT(
      engine->TransferSync(TransferRequest{Opcode::kWrite, local, seg, Addr(remote) + kLen, 4096}),
      IsError());
  // A batch's latency is observed when it goes idle, just after its last
  // completion wakes the waiter: wait (bounded) for the third.
  EngineMetrics m = engine->GetMetrics();
  for (int i = 0; i < 1000 && m.transfer_latency.count < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = engine->GetMetrics();
  }
  uint64_t written = 0, read = 0, failed = 0;
  for (const RouteMetrics& r : m.routes) {
    EXPECT_EQ(r.peer, target().PeerId());
    EXPECT_EQ(r.transport, TransportOf(GetParam()));
    (r.opcode == Opcode::kWrite ? written : read) += r.bytes_completed;
    failed += r.requests_failed;
  }
  EXPECT_EQ(written, kLen);
  EXPECT_EQ(read, kLen / 2);
  EXPECT_EQ(failed, 1u);
  EXPECT_EQ(m.transfer_latency.count, 3u);
  const std::string text = engine->MetricsText();
  EXPECT_THAT(text, HasSubstr("ferry_bytes_total{peer=\"" + target().PeerId() + "\",transport=\"" +
                              TransportOf(GetParam()) + "\",op=\"write\",outcome=\"completed\"} " +
                              std::to_string(kLen)));
  EXPECT_THAT(text, HasSubstr("ferry_transfer_latency_seconds_count 3"));
  // TransferSync frees its batches; one allocated is open until freed.
  EXPECT_EQ(m.batches_open, 0u);
  ASSERT_OK_AND_ASSIGN(BatchId batch, engine->AllocateBatch(1));
  EXPECT_EQ(engine->GetMetrics().batches_open, 1u);
  EXPECT_THAT(engine->MetricsText(), HasSubstr("ferry_batches_open 1\n"));
  ASSERT_OK(engine->FreeBatch(batch));
  EXPECT_EQ(engine->GetMetrics().batches_open, 0u);
  ASSERT_FALSE(engine->MetricsAddress().empty());
  const std::string got = HttpGet(engine->MetricsAddress(), "/metrics");
  EXPECT_THAT(got, HasSubstr("200 OK"));
  EXPECT_THAT(got, HasSubstr("ferry_requests_total{"));
  EXPECT_THAT(HttpGet(engine->MetricsAddress(), "/other"), HasSubstr("404"));
  EXPECT_TRUE(initiator().MetricsAddress().empty());  // off by default
}

// ---- Engine::CompletionFd ------------------------------------------------------

// Whether `fd` is readable now (timeout 0) or within `timeout`.
bool Readable(int fd, std::chrono::milliseconds timeout = 0ms) {
  pollfd p{fd, POLLIN, 0};
  const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
  return n == 1 && (p.revents & POLLIN) != 0;
}

// Reads (and so resets) the eventfd's counter; 0 if it was 0.
uint64_t ReadCount(int fd) {
  uint64_t count = 0;
  return ::read(fd, &count, sizeof(count)) == sizeof(count) ? count : 0;
}

// A finished batch and a finished prepared transfer each make the fd
// readable (waited for with poll: the write follows the status update); one
// read resets it.
TEST_P(PreparedTest, CompletionFdBecomesReadableWhenABatchOrATransferFinishes) {
  constexpr uint64_t kLen = 256 * kKiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  const int fd = initiator().CompletionFd();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(initiator().CompletionFd(), fd);  // one descriptor per engine
  EXPECT_NE(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
  EXPECT_NE(::fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
  EXPECT_FALSE(Readable(fd)) << "readable before anything finished";
  (void)initiator().TakeFinished();  // what earlier tests on this engine left

  FillPattern(local, kLen, 41);
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kLen; off += 64 * kKiB) {
    reqs.push_back({Opcode::kWrite, local + off, segment(), Addr(remote) + off, 64 * kKiB});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(reqs.size()));
  ASSERT_OK(initiator().Submit(batch, reqs));
  ASSERT_TRUE(Readable(fd, kWaitTimeout)) << "no wake-up for a finished batch";
  ASSERT_OK_AND_ASSIGN(BatchStatus st, initiator().GetBatchStatus(batch));
  EXPECT_EQ(st.state, TransferState::kCompleted);
  EXPECT_EQ(st.completed, reqs.size());
  EXPECT_EQ(ReadCount(fd), 1u) << "one write per batch, not per request";
  EXPECT_FALSE(Readable(fd)) << "still readable after the read";
  EXPECT_EQ(DescribePatternMismatch(remote, kLen, 41), "");
  // What woke the reader: that batch, recorded once.
  FinishedWork done = initiator().TakeFinished();
  EXPECT_THAT(done.batches, ElementsAre(batch));
  EXPECT_TRUE(done.transfers.empty());
  EXPECT_FALSE(done.overflowed);
  EXPECT_TRUE(initiator().TakeFinished().batches.empty()) << "taken twice";
  EXPECT_OK(initiator().FreeBatch(batch));

  ASSERT_OK_AND_ASSIGN(DescListHandle l,
                       initiator().PrepareLocalList(Rows(local, 4, kLen / 4, kLen / 4)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r, initiator().PrepareRemoteList(
                                             segment(), Rows(remote, 4, kLen / 4, kLen / 4)));
  const auto idx = Iota(4, true);
  ASSERT_OK_AND_ASSIGN(TransferHandle t, initiator().MakeTransfer(Opcode::kRead, l, idx, r, idx));
  std::memset(local, 0, kLen);
  ASSERT_OK(initiator().PostTransfer(t));
  ASSERT_TRUE(Readable(fd, kWaitTimeout)) << "no wake-up for a finished transfer";
  ASSERT_OK_AND_ASSIGN(TransferStatus ts, initiator().GetTransferStatus(t));
  EXPECT_EQ(ts.state, TransferState::kCompleted);
  EXPECT_EQ(ReadCount(fd), 1u);
  EXPECT_EQ(DescribePatternMismatch(local, kLen, 41), "");
  done = initiator().TakeFinished();
  EXPECT_THAT(done.transfers, ElementsAre(t));
  EXPECT_TRUE(done.batches.empty());
  EXPECT_OK(initiator().ReleaseTransfer(t));
}

// SpinBatch (what an event loop calls before it waits on the descriptor)
// returns as soon as the batch ended: with a spin longer than any request
// lives (each ends by its transfer deadline) it reports the batch final,
// whichever thread moved it (a same-host ring's replies are read by the
// spinning caller itself); spin 0 is GetBatchStatus.
TEST_P(PreparedTest, SpinBatchReturnsOnceTheBatchEnded) {
  constexpr uint64_t kLen = 64 * kKiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  for (const Opcode op : {Opcode::kWrite, Opcode::kRead}) {
    FillPattern(op == Opcode::kWrite ? local : remote, kLen, op == Opcode::kWrite ? 51 : 52);
    ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(1));
    const TransferRequest req{op, local, segment(), Addr(remote), kLen};
    ASSERT_OK(initiator().Submit(batch, std::span(&req, 1)));
    ASSERT_OK_AND_ASSIGN(BatchStatus st, initiator().SpinBatch(batch, kWaitTimeout));
    EXPECT_EQ(st.state, TransferState::kCompleted) << st.first_error;
    EXPECT_EQ(st.completed, 1u);
    EXPECT_EQ(DescribePatternMismatch(op == Opcode::kWrite ? remote : local, kLen,
                                      op == Opcode::kWrite ? 51 : 52),
              "");
    ASSERT_OK_AND_ASSIGN(st, initiator().SpinBatch(batch, 0us));
    EXPECT_EQ(st.state, TransferState::kCompleted);
    EXPECT_OK(initiator().FreeBatch(batch));
    EXPECT_THAT(initiator().SpinBatch(batch, 1ms),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("not allocated")));
  }
}

// SpinTransfer, the same for a prepared transfer: with a spin longer than
// the post lives it returns once the post finished, its notification
// included (delivered before it reports completed).
TEST_P(PreparedTest, SpinTransferReturnsOnceThePostAndItsNotificationEnded) {
  constexpr uint64_t kLen = 256 * kKiB;
  unsigned char* local = Alloc(kLen, &initiator());
  unsigned char* remote = Alloc(kLen, &target());
  ASSERT_TRUE(local && remote);
  ASSERT_NO_FATAL_FAILURE(Refresh());
  FillPattern(local, kLen, 53);
  ASSERT_OK_AND_ASSIGN(DescListHandle l,
                       initiator().PrepareLocalList(Rows(local, 4, kLen / 4, kLen / 4)));
  ASSERT_OK_AND_ASSIGN(DescListHandle r, initiator().PrepareRemoteList(
                                             segment(), Rows(remote, 4, kLen / 4, kLen / 4)));
  const auto idx = Iota(4, true);
  ASSERT_OK_AND_ASSIGN(TransferHandle t,
                       initiator().MakeTransfer(Opcode::kWrite, l, idx, r, idx,
                                                Notification{"", "agent-s", "spun"}));
  EXPECT_THAT(initiator().SpinTransfer(t, 1ms),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("never posted")));
  (void)target().GetNotifications();  // what earlier tests on this engine left
  ASSERT_OK(initiator().PostTransfer(t));
  ASSERT_OK_AND_ASSIGN(TransferStatus st, initiator().SpinTransfer(t, kWaitTimeout));
  EXPECT_EQ(st.state, TransferState::kCompleted) << st.status;
  EXPECT_EQ(DescribePatternMismatch(remote, kLen, 53), "");
  const auto notes = target().GetNotifications();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0].message, "spun");
  ASSERT_OK_AND_ASSIGN(st, initiator().SpinTransfer(t, 0us));
  EXPECT_EQ(st.state, TransferState::kCompleted);
  EXPECT_OK(initiator().ReleaseTransfer(t));
}

// Engines whose every slice is dropped (never answered: it fails at the
// transfer timeout, long after the checks right after submitting) or failed
// at once: what is pending stays pending, so readability is observed
// exactly. (Shutting down waits for dropped slices' deadlines: keep it short.)
EngineOptions FaultyOptions(int drop_percent, int fail_percent) {
  EngineOptions o = ConformanceOptions("tcp");
  o.transfer_timeout = std::chrono::milliseconds(5000);
  o.testing.link_faults.seed = 1;
  o.testing.link_faults.drop_percent = drop_percent;
  o.testing.link_faults.fail_percent = fail_percent;
  return o;
}

// Such a pair over tcp, 64 KiB on each side, the segment queried.
void StartFaulty(EnginePair& pair, int drop_percent, int fail_percent, unsigned char** local,
                 unsigned char** remote) {
  ASSERT_NO_FATAL_FAILURE(
      pair.Start(FaultyOptions(drop_percent, fail_percent), ConformanceOptions("tcp")));
  *local = pair.Alloc(64 * kKiB, &pair.initiator());
  *remote = pair.Alloc(64 * kKiB, &pair.target());
  ASSERT_TRUE(*local && *remote);
  ASSERT_OK(GetStatus(pair.initiator().QuerySegment(pair.segment())));
}

// Not readable while requests are pending; two batches that finish (here
// cancelled: CancelBatch finishes them on this thread) give one read of 2,
// after which it is not readable.
TEST(CompletionFd, NotReadableWhilePendingAndTwoFinishesAreOneRead) {
  EnginePair pair;
  unsigned char* local = nullptr;
  unsigned char* remote = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartFaulty(pair, 100, 0, &local, &remote));
  Engine& e = pair.initiator();
  const int fd = e.CompletionFd();
  BatchId batches[2];
  for (BatchId& b : batches) {
    ASSERT_OK_AND_ASSIGN(b, e.AllocateBatch(1));
    const TransferRequest req{Opcode::kRead, local, pair.segment(),
                              reinterpret_cast<uintptr_t>(remote), 4 * kKiB};
    ASSERT_OK(e.Submit(b, std::span(&req, 1)));
  }
  EXPECT_FALSE(Readable(fd)) << "readable while both batches are pending";
  ASSERT_OK_AND_ASSIGN(BatchStatus st, e.GetBatchStatus(batches[0]));
  EXPECT_EQ(st.state, TransferState::kPending);
  ASSERT_OK(e.CancelBatch(batches[0]));
  ASSERT_OK(e.CancelBatch(batches[1]));
  ASSERT_TRUE(Readable(fd));
  EXPECT_EQ(ReadCount(fd), 2u);
  EXPECT_FALSE(Readable(fd));
  for (BatchId b : batches) {
    ASSERT_OK_AND_ASSIGN(BatchStatus s, e.GetBatchStatus(b));
    EXPECT_EQ(s.state, TransferState::kFailed);
    EXPECT_THAT(s.first_error, StatusIs(StatusCode::kCancelled));
    EXPECT_OK(e.FreeBatch(b));
  }
  // A prepared transfer: pending, then cancelled, is one finish.
  ASSERT_OK_AND_ASSIGN(DescListHandle l,
                       e.PrepareLocalList(std::vector<DescRow>{
                           {reinterpret_cast<uintptr_t>(local), 4 * kKiB, 0, 1}}));
  ASSERT_OK_AND_ASSIGN(
      DescListHandle r,
      e.PrepareRemoteList(pair.segment(), std::vector<DescRow>{{reinterpret_cast<uintptr_t>(remote),
                                                                4 * kKiB, 0, 1}}));
  const std::vector<uint32_t> zero = {0};
  ASSERT_OK_AND_ASSIGN(TransferHandle t, e.MakeTransfer(Opcode::kRead, l, zero, r, zero));
  ASSERT_OK(e.PostTransfer(t));
  EXPECT_FALSE(Readable(fd)) << "readable while the transfer is pending";
  ASSERT_OK(e.CancelTransfer(t));
  ASSERT_TRUE(Readable(fd));
  EXPECT_EQ(ReadCount(fd), 1u);
  ASSERT_OK_AND_ASSIGN(TransferStatus ts, e.GetTransferStatus(t));
  EXPECT_EQ(ts.state, TransferState::kFailed);
}

// SpinBatch never blocks: a batch whose request is never answered (it fails
// at its 5 s deadline) is reported pending once the spin is over; after a
// cancel it reports the end at once.
TEST(SpinBatch, ReportsABatchStillPendingWhenItsSpinIsOver) {
  EnginePair pair;
  unsigned char* local = nullptr;
  unsigned char* remote = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartFaulty(pair, 100, 0, &local, &remote));
  Engine& e = pair.initiator();
  ASSERT_OK_AND_ASSIGN(BatchId b, e.AllocateBatch(1));
  const TransferRequest req{Opcode::kRead, local, pair.segment(),
                            reinterpret_cast<uintptr_t>(remote), 4 * kKiB};
  ASSERT_OK(e.Submit(b, std::span(&req, 1)));
  ASSERT_OK_AND_ASSIGN(BatchStatus st, e.SpinBatch(b, 2ms));
  EXPECT_EQ(st.state, TransferState::kPending) << "it waited for the batch's end";
  EXPECT_EQ(st.completed + st.failed, 0u);
  ASSERT_OK(e.CancelBatch(b));
  ASSERT_OK_AND_ASSIGN(st, e.SpinBatch(b, 0us));
  EXPECT_EQ(st.state, TransferState::kFailed);
  EXPECT_THAT(st.first_error, StatusIs(StatusCode::kCancelled));
  EXPECT_OK(e.FreeBatch(b));
}

// Failed requests finish a batch or a transfer too.
TEST(CompletionFd, FailedBatchesAndTransfersWakeTheWaiter) {
  EnginePair pair;
  unsigned char* local = nullptr;
  unsigned char* remote = nullptr;
  ASSERT_NO_FATAL_FAILURE(StartFaulty(pair, 0, 100, &local, &remote));
  Engine& e = pair.initiator();
  const int fd = e.CompletionFd();
  ASSERT_OK_AND_ASSIGN(BatchId b, e.AllocateBatch(1));
  const TransferRequest req{Opcode::kWrite, local, pair.segment(),
                            reinterpret_cast<uintptr_t>(remote), 4 * kKiB};
  ASSERT_OK(e.Submit(b, std::span(&req, 1)));
  ASSERT_TRUE(Readable(fd, kWaitTimeout)) << "no wake-up for a failed batch";
  EXPECT_EQ(ReadCount(fd), 1u);
  ASSERT_OK_AND_ASSIGN(BatchStatus st, e.GetBatchStatus(b));
  EXPECT_EQ(st.state, TransferState::kFailed);
  EXPECT_THAT(st.first_error, StatusIs(StatusCode::kUnavailable, HasSubstr("fault injected")));
  EXPECT_OK(e.FreeBatch(b));

  ASSERT_OK_AND_ASSIGN(DescListHandle l,
                       e.PrepareLocalList(std::vector<DescRow>{
                           {reinterpret_cast<uintptr_t>(local), 4 * kKiB, 0, 1}}));
  ASSERT_OK_AND_ASSIGN(
      DescListHandle r,
      e.PrepareRemoteList(pair.segment(), std::vector<DescRow>{{reinterpret_cast<uintptr_t>(remote),
                                                                4 * kKiB, 0, 1}}));
  const std::vector<uint32_t> zero = {0};
  ASSERT_OK_AND_ASSIGN(TransferHandle t, e.MakeTransfer(Opcode::kWrite, l, zero, r, zero));
  ASSERT_OK(e.PostTransfer(t));
  ASSERT_TRUE(Readable(fd, kWaitTimeout)) << "no wake-up for a failed transfer";
  EXPECT_EQ(ReadCount(fd), 1u);
  ASSERT_OK_AND_ASSIGN(TransferStatus ts, e.GetTransferStatus(t));
  EXPECT_EQ(ts.state, TransferState::kFailed);
}

// Completions before the first CompletionFd() write nothing; the engine's
// destructor writes once more and closes the descriptor (a dup() stays the
// caller's). The finishes here are cancellations, which notify on this
// thread before CancelBatch returns: a completion by a transport thread
// writes just after its state becomes visible (engine.h), so one that
// finished "before arming" could still write after it.
TEST(CompletionFd, ArmedByTheFirstCallAndClosedByTheEngine) {
  auto owned = std::make_unique<EnginePair>();
  EnginePair& pair = *owned;
  ASSERT_NO_FATAL_FAILURE(pair.Start(FaultyOptions(100, 0), ConformanceOptions("tcp")));
  unsigned char* local = pair.Alloc(64 * kKiB, &pair.initiator());
  unsigned char* remote = pair.Alloc(64 * kKiB, &pair.target());
  ASSERT_TRUE(local && remote);
  ASSERT_OK(GetStatus(pair.initiator().QuerySegment(pair.segment())));
  Engine& e = pair.initiator();
  const TransferRequest req{Opcode::kWrite, local, pair.segment(),
                            reinterpret_cast<uintptr_t>(remote), 4 * kKiB};
  BatchId last;
  auto submit_and_cancel = [&] {
    ASSERT_OK_AND_ASSIGN(BatchId b, e.AllocateBatch(1));
    ASSERT_OK(e.Submit(b, std::span(&req, 1)));
    ASSERT_OK(e.CancelBatch(b));  // finished (failed) on this thread
    ASSERT_OK(e.FreeBatch(b));
    last = b;
  };
  ASSERT_NO_FATAL_FAILURE(submit_and_cancel());  // before arming: no write
  const int fd = e.CompletionFd();
  EXPECT_FALSE(Readable(fd)) << "a finish before the first call wrote";
  EXPECT_TRUE(e.TakeFinished().batches.empty()) << "a finish before the first call was recorded";
  ASSERT_NO_FATAL_FAILURE(submit_and_cancel());
  EXPECT_TRUE(Readable(fd));
  EXPECT_EQ(ReadCount(fd), 1u);
  EXPECT_THAT(e.TakeFinished().batches, ElementsAre(last));

  const int mine = ::dup(fd);
  ASSERT_GE(mine, 0);
  EXPECT_FALSE(Readable(mine));
  owned.reset();  // destroys both engines
  EXPECT_TRUE(Readable(mine)) << "the destructor's last write";
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << "the engine's descriptor is still open";
  ::close(mine);
}

}  // namespace
}  // namespace ferry::test
