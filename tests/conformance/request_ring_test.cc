// Request rings (docs/architecture.md, "Request rings"): same-host streams
// carry their frames through shared memory. The whole conformance suite
// runs over them ("shm") and over the sockets ("shm_socket"); these are the
// cases particular to them: when they are used, and a ring the peer
// scribbled over.
#include "transport/shm/request_ring.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/conformance/conformance_fixture.h"

namespace ferry::test {
namespace {

using ::testing::Not;
constexpr size_t kLen = 64 * 1024;

// The descriptors of this process that are request rings' memfds (one per
// stream: the initiator's; the target keeps only its mapping).
std::vector<int> RingFds() {
  std::vector<int> fds;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string link = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && link.starts_with("/memfd:ferry-request-ring")) {
      fds.push_back(std::stoi(e.path().filename().string()));
    }
  }
  return fds;
}

// Writes 4 KiB to the target and reads them back; both verified.
void RoundTrip(EnginePair& pair, unsigned char* local, unsigned char* remote, uint8_t fill) {
  std::memset(local, fill, 4096);
  ASSERT_OK(pair.initiator().TransferSync(
      {Opcode::kWrite, local, pair.segment(), pair.Addr(remote), 4096}));
  ASSERT_EQ(remote[0], fill);
  ASSERT_EQ(remote[4095], fill);
  std::memset(local + 4096, 0, 4096);
  ASSERT_OK(pair.initiator().TransferSync(
      {Opcode::kRead, local + 4096, pair.segment(), pair.Addr(remote), 4096}));
  ASSERT_EQ(local[4096], fill);
  ASSERT_EQ(local[8191], fill);
}

struct Case {
  bool initiator_rings;
  bool target_rings;
};

class RequestRingUse : public ::testing::TestWithParam<Case> {};

TEST_P(RequestRingUse, StreamsUseRingsExactlyWhenBothEnginesAllow) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  const size_t before = RingFds().size();
  EngineOptions a = ConformanceOptions("shm"), b = ConformanceOptions("shm");
  a.shm_rings = GetParam().initiator_rings;
  b.shm_rings = GetParam().target_rings;
  a.tcp_streams = 2;
  EnginePair pair;
  pair.Start("shm", a, b);
  unsigned char* local = pair.Alloc(kLen, &pair.initiator());
  unsigned char* remote = pair.Alloc(kLen, &pair.target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  RoundTrip(pair, local, remote, 0x5a);
  const size_t rings = RingFds().size() - before;
  if (GetParam().initiator_rings && GetParam().target_rings) {
    EXPECT_EQ(rings, 2u) << "one per stream";
  } else {
    EXPECT_EQ(rings, 0u) << "a ring offered to a target that does not take them stays open";
  }
}

INSTANTIATE_TEST_SUITE_P(Options, RequestRingUse,
                         ::testing::Values(Case{true, true}, Case{true, false}, Case{false, true}),
                         [](const auto& info) {
                           return std::string(info.param.initiator_rings ? "Initiator" : "NoInit") +
                                  (info.param.target_rings ? "Target" : "NoTarget");
                         });

// Garbage written over the rings' positions (as a hostile or broken peer
// could) breaks the stream: its requests fail with a message, no byte lands
// outside the ranges transfers named, and the next transfer goes over a new
// stream.
TEST(RequestRings, GarbageInTheRingsBreaksTheStreamAndNothingElse) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  const size_t before = RingFds().size();
  EngineOptions o = ConformanceOptions("shm");
  o.tcp_streams = 1;
  EnginePair pair;
  pair.Start("shm", o, o);
  unsigned char* local = pair.Alloc(kLen, &pair.initiator());
  unsigned char* remote = pair.Alloc(kLen, &pair.target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  std::memset(remote, 0x11, kLen);
  RoundTrip(pair, local, remote, 0x22);
  std::vector<int> rings = RingFds();
  ASSERT_EQ(rings.size() - before, 1u);
  const size_t bytes =
      ferry::internal::shm::RingMappingBytes(ferry::internal::shm::kRingDefaultCapacity);
  for (int fd : rings) {
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(m, MAP_FAILED);
    auto* h = static_cast<ferry::internal::shm::RingHeader*>(m);
    __atomic_store_n(&h->ring[0].tail, uint64_t{0xdead'beef'0000'0000}, __ATOMIC_SEQ_CST);
    __atomic_store_n(&h->ring[1].tail, uint64_t{0xdead'beef'0000'0000}, __ATOMIC_SEQ_CST);
    munmap(m, bytes);
  }
  // The next request meets the broken stream (it fails, saying why) or a
  // new one (it completes); the one after it a new one.
  std::memset(local, 0x33, 4096);
  Status first = pair.initiator().TransferSync(
      {Opcode::kWrite, local, pair.segment(), pair.Addr(remote + 4096), 4096});
  if (!first.ok()) {
    EXPECT_THAT(first.code(), ::testing::AnyOf(StatusCode::kDataLoss, StatusCode::kUnavailable,
                                               StatusCode::kCancelled))
        << first;
    EXPECT_FALSE(first.message().empty());
  }
  RoundTrip(pair, local, remote, 0x44);
  // Only the ranges transfers named changed.
  for (size_t i = 8192; i < kLen; ++i) ASSERT_EQ(remote[i], 0x11) << "byte " << i;
  for (size_t i = 4096; i < 8192; ++i) {
    ASSERT_TRUE(remote[i] == 0x11 || remote[i] == 0x33) << "byte " << i;
  }
}

}  // namespace
}  // namespace ferry::test
