// Request rings (docs/architecture.md, "Request rings"): same-host streams
// carry their frames through shared memory. The whole conformance suite
// runs over them ("shm") and over the sockets ("shm_socket"); these are the
// cases particular to them: when they are used, and a ring the peer
// scribbled over.
#include "transport/shm/request_ring.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
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

// Starts `pair` over shm with options `a` (initiator) and `b` (target) and
// allocates a buffer of kLen on each side.
struct Buffers {
  unsigned char* local = nullptr;
  unsigned char* remote = nullptr;
};
void StartWithBuffers(EnginePair& pair, const EngineOptions& a, const EngineOptions& b,
                      Buffers* out) {
  pair.Start("shm", a, b);
  out->local = pair.Alloc(kLen, &pair.initiator());
  out->remote = pair.Alloc(kLen, &pair.target());
  ASSERT_NE(out->local, nullptr);
  ASSERT_NE(out->remote, nullptr);
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
  Buffers buf;
  ASSERT_NO_FATAL_FAILURE(StartWithBuffers(pair, a, b, &buf));
  RoundTrip(pair, buf.local, buf.remote, 0x5a);
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
  Buffers buf;
  ASSERT_NO_FATAL_FAILURE(StartWithBuffers(pair, o, o, &buf));
  unsigned char* local = buf.local;
  unsigned char* remote = buf.remote;
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

// A caller waiting for its transfer reads the reply from the ring itself
// while it spins, and leaves it to its loop (asleep: the ring armed again,
// or its eventfd written) when it stops. With the shortest spins on both
// sides every request takes the hand-over paths; a lost wake-up would leave
// a request hanging until its deadline.
TEST(RequestRings, EveryReplyArrivesWhenCallersAndLoopsStopPollingEarly) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  EngineOptions o = ConformanceOptions("shm");
  o.tcp_streams = 1;
  o.spin = std::chrono::microseconds(0);
  o.wait_spin = std::chrono::microseconds(1);
  o.transfer_timeout = std::chrono::milliseconds(20000);
  EnginePair pair;
  Buffers buf;
  ASSERT_NO_FATAL_FAILURE(StartWithBuffers(pair, o, o, &buf));
  constexpr int kThreads = 3, kEach = 400;
  static_assert(kThreads * 8192 <= kLen);
  unsigned char* local = buf.local;
  unsigned char* remote = buf.remote;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      unsigned char* mine = local + t * 8192;
      for (int i = 0; i < kEach && errors[t].empty(); ++i) {
        const uint8_t fill = static_cast<uint8_t>(t * 50 + i);
        std::memset(mine, fill, 4096);
        Status w = pair.initiator().TransferSync(
            {Opcode::kWrite, mine, pair.segment(), pair.Addr(remote + t * 4096), 4096});
        Status r = pair.initiator().TransferSync(
            {Opcode::kRead, mine + 4096, pair.segment(), pair.Addr(remote + t * 4096), 4096});
        if (!w.ok() || !r.ok()) {
          errors[t] = "request " + std::to_string(i) + ": " + w.ToString() + " / " + r.ToString();
        } else if (mine[4096] != fill || mine[8191] != fill) {
          errors[t] = "request " + std::to_string(i) + ": read back the wrong bytes";
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

// CPU time this process used, user + system.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// Idle engines whose streams go through rings use no CPU: their loops sleep
// (armed) once nothing happens, instead of polling the rings.
TEST(RequestRings, IdleEnginesSleep) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  EngineOptions o = ConformanceOptions("shm");
  EnginePair pair;
  Buffers buf;
  ASSERT_NO_FATAL_FAILURE(StartWithBuffers(pair, o, o, &buf));
  for (int i = 0; i < 100; ++i) RoundTrip(pair, buf.local, buf.remote, static_cast<uint8_t>(i));
  // Two seconds idle, the first of which the loops still tick (every 50 ms)
  // to watch deadlines. A loop that kept polling would use about a second
  // of CPU per second.
  const double before = CpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double used = CpuSeconds() - before;
  EXPECT_LT(used, 0.2) << "CPU seconds used by two idle engines in 2 s";
}

}  // namespace
}  // namespace ferry::test
