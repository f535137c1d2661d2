// The fabric transport with several rails (fabric_nics): two endpoints per
// engine on loopback (127.0.0.1 and 127.0.0.2, both `lo`), so striping runs
// here and under the sanitizers; the netns suite shows the bytes really
// split between two NICs. Skips where libfabric's tcp provider is missing.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/conformance/conformance_fixture.h"

namespace ferry::test {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr const char* kTwoRails = "127.0.0.1,127.0.0.2";

EngineOptions RailOptions(const std::string& nics) {
  EngineOptions o = ConformanceOptions("fabric_tcp");
  o.fabric_nics = nics;
  return o;
}

class FabricRailsTest : public ::testing::Test, public EnginePair {
 protected:
  void SetUp() override {
    FERRY_SKIP_UNLESS_TRANSPORT_WORKS("fabric_tcp");
    Start(RailOptions(kTwoRails), RailOptions(kTwoRails));
  }
};

// Requests from 1 byte to 3 MiB (stripes of 256 KiB, and small ones dealt
// out whole), written then read, every byte checked, untouched bytes too.
TEST_F(FabricRailsTest, MixedSizesStripedOverTwoRailsArriveWhole) {
  constexpr uint64_t kSize = 48 * kMiB;
  unsigned char* local = Alloc(kSize, &initiator());
  unsigned char* remote = Alloc(kSize, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  std::vector<Piece> pieces;
  uint64_t off = 0;
  for (size_t i = 0; off < kSize - 4 * kMiB; ++i) {
    const uint64_t len = i % 7 == 0 ? 3 * kMiB + 17 : 1 + Mix64(i) % (600 * kKiB);
    pieces.push_back({off, kSize - off - len, len});  // reversed on the remote side
    off += len + (i % 3);
  }
  RunScatter(Opcode::kWrite, local, kSize, remote, kSize, pieces, 7101, pieces.size());
  RunScatter(Opcode::kRead, local, kSize, remote, kSize, pieces, 7102, 5);
}

// A notification sent right after writes striped over both rails is seen
// only once every one of them landed. (On loopback both rails finish
// together, so this catches a notification that waits for no writes, not
// one that waits for rail 0's only; that is
// NetnsTest.FabricNotificationWaitsForTheWritesOfASlowRail, with one NIC
// rate-limited.)
TEST_F(FabricRailsTest, NotificationFollowsTheWritesOfEveryRail) {
  constexpr int kRounds = 6;
  constexpr uint64_t kArea = 4 * kMiB;
  unsigned char* local = Alloc(kRounds * kArea, &initiator());
  unsigned char* remote = Alloc(kRounds * kArea, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  const uint64_t remote_addr = reinterpret_cast<uintptr_t>(remote);
  const uint64_t seed = Mix64(7103);
  FillPattern(local, kRounds * kArea, seed);
  for (int r = 0; r < kRounds; ++r) {
    // Two requests of 2 MiB: four stripes, two per rail.
    std::vector<TransferRequest> reqs;
    for (uint64_t k = 0; k < 2; ++k) {
      const uint64_t at = r * kArea + k * 2 * kMiB;
      reqs.push_back({Opcode::kWrite, local + at, segment(), remote_addr + at, 2 * kMiB});
    }
    auto batch = initiator().AllocateBatch(reqs.size());
    ASSERT_THAT(GetStatus(batch), IsOk());
    ASSERT_THAT(initiator().Submit(*batch, reqs), IsOk());
    // At once: the writes may still be in flight on either rail.
    ASSERT_THAT(initiator().SendNotification(segment(), "round-" + std::to_string(r), "x"), IsOk());
    std::vector<Notification> got;
    const auto deadline = std::chrono::steady_clock::now() + kWaitTimeout;
    while (got.empty() && std::chrono::steady_clock::now() < deadline) {
      got = target().GetNotifications();
      if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(got.size(), 1u) << "round " << r;
    EXPECT_EQ(got[0].name, "round-" + std::to_string(r));
    // Seen: every byte of this round (and the earlier ones) is in place.
    const std::string check = DescribePatternMismatch(remote, (r + 1) * kArea, seed, 0);
    EXPECT_EQ(check, "") << "round " << r
                         << ": the notification arrived before the data it follows";
    ASSERT_THAT(initiator().WaitBatch(*batch, kWaitTimeout), IsOk());
    ASSERT_THAT(initiator().FreeBatch(*batch), IsOk());
  }
}

// The same engines with one rail each reach two-rail peers and back
// (rail i posts to the peer's rail i modulo its count).
TEST(FabricRails, OneRailAndTwoRailEnginesTalk) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("fabric_tcp");
  for (const auto& [a, b] :
       std::vector<std::pair<std::string, std::string>>{{"", kTwoRails}, {kTwoRails, ""}}) {
    EnginePair pair;
    pair.Start(RailOptions(a), RailOptions(b));
    if (::testing::Test::HasFatalFailure()) return;
    unsigned char* local = pair.Alloc(8 * kMiB, &pair.initiator());
    unsigned char* remote = pair.Alloc(8 * kMiB, &pair.target());
    ASSERT_NE(local, nullptr);
    ASSERT_NE(remote, nullptr);
    const std::vector<Piece> pieces = {
        {0, 0, 3 * kMiB}, {3 * kMiB, 4 * kMiB, 100}, {4 * kMiB, 5 * kMiB, 2 * kMiB}};
    SCOPED_TRACE("initiator nics '" + a + "', target nics '" + b + "'");
    pair.RunScatter(Opcode::kWrite, local, 8 * kMiB, remote, 8 * kMiB, pieces, 7104, 3);
    pair.RunScatter(Opcode::kRead, local, 8 * kMiB, remote, 8 * kMiB, pieces, 7105, 3);
  }
}

// A peer that went away does not hold up messages to the others: its
// notification stays with the provider (refused while it reconnects, until
// connect_timeout) after the sender gave up on it, and a notification to a
// live peer sent next goes out and is acknowledged. Before, every message
// waited behind it: with a transfer deadline shorter than connect_timeout
// the live peer's notification failed DEADLINE_EXCEEDED.
TEST(FabricMessages, AGonePeersNotificationDoesNotHoldUpAnotherPeers) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("fabric_tcp");
  EngineOptions o = ConformanceOptions("fabric_tcp");
  o.connect_timeout = std::chrono::milliseconds(60000);
  o.transfer_timeout = std::chrono::milliseconds(2000);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> a, Engine::Create(o));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> live, Engine::Create(o));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> gone, Engine::Create(o));
  ASSERT_OK_AND_ASSIGN(SegmentHandle to_live, a->OpenSegment(live->PeerId()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle to_gone, a->OpenSegment(gone->PeerId()));
  ASSERT_OK(a->SendNotification(to_live, "first", "1"));
  // Gone before this engine's provider ever connected to it: its connect
  // is refused, and the message with it while the provider tries again;
  // the sender gives up at its deadline, the message stays queued.
  gone.reset();
  const Status lost = a->SendNotification(to_gone, "lost", "2");
  ASSERT_EQ(lost.code(), StatusCode::kDeadlineExceeded) << lost;
  EXPECT_OK(a->SendNotification(to_live, "second", "3"));
  std::vector<std::string> names;
  for (const Notification& n : live->GetNotifications()) names.push_back(n.name);
  EXPECT_THAT(names, ::testing::ElementsAre("first", "second"));
}

// A bad fabric_nics fails Engine::Create naming what is wrong.
TEST(FabricRails, BadNicListsAreRefusedNamingTheEntry) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("fabric_tcp");
  struct Case {
    std::string nics, says;
  };
  for (const Case& c :
       std::vector<Case>{{"127.0.0.1,,127.0.0.2", "entry 1"},
                         {"127.0.0.1,127.0.0.1", "names 127.0.0.1 twice"},
                         {"127.0.0.1, 127.0.0.2", "entry 1"},
                         {"127.0.0.1,192.0.2.77", "fabric_nics entry 1 (192.0.2.77)"}}) {
    auto e = Engine::Create(RailOptions(c.nics));
    ASSERT_FALSE(e.ok()) << c.nics;
    EXPECT_THAT(e.status().message(), HasSubstr(c.says)) << c.nics << ": " << e.status();
  }
}

// The conformance suite has no "fabric_shm": libfabric before 1.18 lists an
// shm provider that Ferry refuses, saying why, instead of running on it.
TEST(FabricProviders, LibfabricShmBefore118IsRefusedWithTheReason) {
  const FabricInfo f = DescribeFabric("shm", "127.0.0.1");
  const bool listed =
      std::any_of(f.domains.begin(), f.domains.end(),
                  [](const FabricDomainInfo& d) { return d.provider.starts_with("shm"); });
  if (!listed) GTEST_SKIP() << "libfabric lists no shm provider here (" << f.library << ")";
  int major = 0, minor = 0;
  ASSERT_EQ(std::sscanf(f.library.c_str(), "libfabric %d.%d", &major, &minor), 2) << f.library;
  if (major > 1 || minor >= 18) GTEST_SKIP() << f.library << ": its shm provider is not refused";
  EXPECT_EQ(f.chosen, "");
  EXPECT_THAT(f.why_none, HasSubstr("shm provider is refused"));
  EngineOptions o;
  o.transport = "fabric";
  o.fabric_provider = "shm";
  o.listen_host = "127.0.0.1";
  auto e = Engine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_THAT(e.status().message(), HasSubstr("shm provider is refused"));
}

}  // namespace
}  // namespace ferry::test
