// The limits of docs/reliability.md ("Limits") that one process can show:
// a full notification inbox refuses the next notification with a status the
// sender sees (every transport), and a flood of connections from one source
// address is closed at once without keeping a peer at another address out
// (tcp). The per-peer request budget is exercised at the link in
// src/transport/stream/stream_test.cc (a peer that answers nothing) and
// under load by the conformance suite with small limits below.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/conformance/conformance_fixture.h"

namespace ferry::test {
namespace {

using ::testing::HasSubstr;

class LimitsTest : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(AllTransports, LimitsTest, ::testing::ValuesIn(kTransports),
                         [](const auto& info) { return info.param; });

TEST_P(LimitsTest, FullNotificationInboxRefusesTheNextOneUntilDrained) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  EngineOptions t = ConformanceOptions(GetParam());
  t.notify_inbox_bytes = 64 * 1024;
  EnginePair pair;
  pair.Start(GetParam(), ConformanceOptions(GetParam()), t);
  if (HasFatalFailure()) return;
  const std::string big(30000, 'n');
  EXPECT_OK(pair.initiator().SendNotification(pair.segment(), "a", big));
  EXPECT_OK(pair.initiator().SendNotification(pair.segment(), "b", big));
  // 60,000+ bytes held: the third would pass 64 KiB.
  Status third = pair.initiator().SendNotification(pair.segment(), "c", big);
  EXPECT_THAT(third, StatusIs(StatusCode::kResourceExhausted));
  EXPECT_THAT(third, IsError(HasSubstr("notify_inbox_bytes")));
  std::vector<Notification> got = pair.target().GetNotifications();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].name, "a");
  EXPECT_EQ(got[1].name, "b");
  EXPECT_EQ(got[1].message, big);
  // Drained: room again, and the link still works.
  EXPECT_OK(pair.initiator().SendNotification(pair.segment(), "d", big));
  got = pair.target().GetNotifications();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, "d");
}

// Thousands of small requests under a budget of a few slices and bytes:
// back-pressure only delays them; every byte lands.
TEST_P(LimitsTest, SmallPeerBudgetDelaysButLosesNothing) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  EngineOptions i = ConformanceOptions(GetParam());
  i.peer_max_requests = 16;
  i.peer_max_bytes = 1 << 20;
  EnginePair pair;
  pair.Start(GetParam(), i, ConformanceOptions(GetParam()));
  if (HasFatalFailure()) return;
  constexpr size_t kN = 4000, kLen = 1024;
  unsigned char* src = pair.Alloc(kN * kLen, &pair.initiator());
  unsigned char* dst = pair.Alloc(kN * kLen, &pair.target());
  ASSERT_NE(src, nullptr);
  ASSERT_NE(dst, nullptr);
  FillPattern(src, kN * kLen, Mix64(71));
  std::vector<TransferRequest> reqs;
  for (size_t k = 0; k < kN; ++k) {
    // Scattered: entry k to slot (k * 7) mod kN, so frames hold many entries.
    const size_t slot = (k * 7) % kN;
    reqs.push_back({Opcode::kWrite, src + k * kLen, pair.segment(),
                    reinterpret_cast<uintptr_t>(dst) + slot * kLen, kLen});
  }
  ASSERT_OK(pair.initiator().TransferSync(reqs));
  for (size_t k = 0; k < kN; ++k) {
    ASSERT_EQ(std::memcmp(dst + ((k * 7) % kN) * kLen, src + k * kLen, kLen), 0) << "request " << k;
  }
  // One large request sliced under a 1 MiB byte budget, read back.
  std::vector<unsigned char> back(kN * kLen);
  unsigned char* into = pair.Alloc(kN * kLen, &pair.initiator());
  ASSERT_NE(into, nullptr);
  ASSERT_OK(pair.initiator().TransferSync(TransferRequest{
      Opcode::kRead, into, pair.segment(), reinterpret_cast<uintptr_t>(dst), kN * kLen}));
  EXPECT_EQ(std::memcmp(into, dst, kN * kLen), 0);
}

// A socket to `port` on 127.0.0.1 from the address `from` (any 127/8
// address is this host's).
int ConnectFrom(const char* from, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True once the peer closed `fd` (EOF or reset), waiting up to `bound`.
bool ClosedByPeer(int fd, std::chrono::milliseconds bound) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(bound.count())) <= 0) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

TEST(SourceLimits, ConnectionFloodFromOneAddressIsCutAndOtherPeersStillGetIn) {
  EngineOptions t = ConformanceOptions("tcp");
  t.max_handshakes_per_source = 8;
  t.handshake_timeout = std::chrono::milliseconds(60000);  // the flood is not timed out meanwhile
  ASSERT_OK_AND_ASSIGN(auto target, Engine::Create(t));
  std::vector<int> flood;
  for (int k = 0; k < 40; ++k) {
    int fd = ConnectFrom("127.0.0.5", target->RpcPort());
    ASSERT_GE(fd, 0) << "cannot connect from 127.0.0.5: " << std::strerror(errno);
    flood.push_back(fd);
  }
  // Past the first 8 silent connections, the target closes new ones at once.
  int closed = 0;
  for (size_t k = 8; k < flood.size(); ++k)
    closed += ClosedByPeer(flood[k], std::chrono::milliseconds(5000));
  EXPECT_EQ(closed, 32);
  // The first 8 are still open (their hello time has not run out).
  int open = 0;
  for (size_t k = 0; k < 8; ++k) open += !ClosedByPeer(flood[k], std::chrono::milliseconds(0));
  EXPECT_EQ(open, 8);

  // A real peer (from 127.0.0.1) opens the segment and moves bytes.
  ASSERT_OK_AND_ASSIGN(auto initiator, Engine::Create(ConformanceOptions("tcp")));
  AlignedBuffer src(64 * 1024), dst(64 * 1024);
  FillPattern(src.data(), src.size(), Mix64(81));
  ASSERT_OK(initiator->RegisterMemory(src.data(), src.size()));
  ASSERT_OK(target->RegisterMemory(dst.data(), dst.size()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, initiator->OpenSegment(target->PeerId()));
  ASSERT_OK(initiator->TransferSync(TransferRequest{
      Opcode::kWrite, src.data(), seg, reinterpret_cast<uintptr_t>(dst.data()), src.size()}));
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);

  // Once the flood's connections are gone, that address gets in again.
  for (int fd : flood) ::close(fd);
  bool readmitted = false;
  for (int attempt = 0; attempt < 100 && !readmitted; ++attempt) {
    int fd = ConnectFrom("127.0.0.5", target->RpcPort());
    ASSERT_GE(fd, 0);
    readmitted = !ClosedByPeer(fd, std::chrono::milliseconds(200));
    ::close(fd);
  }
  EXPECT_TRUE(readmitted);
}

}  // namespace
}  // namespace ferry::test
