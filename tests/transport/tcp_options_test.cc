// The TCP transport under non-default tuning: few or many streams, tiny
// slices and frames (every request cut and striped, one entry per frame),
// one shared event loop, no spinning. The data must not care.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/conformance/conformance_fixture.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/status_matchers.h"

namespace ferry::test {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kMiB = 1024 * 1024;

struct TcpTuning {
  std::string name;
  int streams;
  int io_threads;
  uint32_t slice_size;
  uint32_t max_frame_bytes;
  uint32_t max_frame_entries;
  std::chrono::microseconds spin;
  uint32_t send_buffer = 512u << 10;  // tcp_send_buffer
};

const TcpTuning kTunings[] = {
    {"one_stream_tiny_frames", 1, 1, 4096, 4096, 1, 0us, 64u << 10},
    {"four_streams_one_loop", 4, 1, 65536, 1u << 20, 512, 50us},
    {"three_streams_odd_sizes", 3, 0, 8191, 10007, 7, 0us, 0},
    {"eight_streams_big_slices", 8, 4, 4u << 20, 4u << 20, 1024, 200us},
};

void PrintTo(const TcpTuning& t, std::ostream* os) { *os << t.name; }

class TcpTuningTest : public ::testing::TestWithParam<TcpTuning>, public EnginePair {
 protected:
  void SetUp() override {
    EngineOptions o = ConformanceOptions("tcp");
    const TcpTuning& t = GetParam();
    o.tcp_streams = t.streams;
    o.io_threads = t.io_threads;
    o.slice_size = t.slice_size;
    o.max_frame_bytes = t.max_frame_bytes;
    o.max_frame_entries = t.max_frame_entries;
    o.spin = t.spin;
    o.tcp_send_buffer = t.send_buffer;
    // Both sides tuned the same; the target's settings matter for its replies.
    ASSERT_NO_FATAL_FAILURE(Start(o, o));
  }
};

INSTANTIATE_TEST_SUITE_P(Tunings, TcpTuningTest, ::testing::ValuesIn(kTunings),
                         [](const ::testing::TestParamInfo<TcpTuning>& info) {
                           return info.param.name;
                         });

TEST_P(TcpTuningTest, LargeUnalignedWriteAndRead) {
  constexpr uint64_t kSize = 24 * kMiB + 13;
  unsigned char* local = Alloc(kSize + 8192, &initiator());
  unsigned char* remote = Alloc(kSize + 8192, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  for (Opcode op : {Opcode::kWrite, Opcode::kRead}) {
    SCOPED_TRACE(op == Opcode::kWrite ? "write" : "read");
    ASSERT_NO_FATAL_FAILURE(RunScatter(op, local, kSize + 8192, remote, kSize + 8192,
                                       {{4099, 4101, kSize}}, Mix64(static_cast<int>(op) + 90), 1));
  }
}

TEST_P(TcpTuningTest, ManySmallAndSomeLargeRequests) {
  std::vector<Piece> pieces;
  uint64_t loff = 1, roff = 2;
  for (uint64_t i = 0; i < 3000; ++i) {
    // Mostly small; every 500th request is 1..3 MiB.
    const uint64_t len = i % 500 == 499 ? 1 + Mix64(i) % (3 * kMiB) : 1 + Mix64(i) % 3000;
    pieces.push_back({loff, roff, len});
    loff += len + i % 3;
    roff += len + i % 5;
  }
  unsigned char* local = Alloc(loff + 64, &initiator());
  unsigned char* remote = Alloc(roff + 64, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  for (Opcode op : {Opcode::kWrite, Opcode::kRead}) {
    SCOPED_TRACE(op == Opcode::kWrite ? "write" : "read");
    ASSERT_NO_FATAL_FAILURE(RunScatter(op, local, loff + 64, remote, roff + 64, pieces,
                                       Mix64(static_cast<int>(op) + 91), 640));
  }
}

TEST_P(TcpTuningTest, NotificationFollowsStripedWrites) {
  constexpr uint64_t kSize = 8 * kMiB;
  unsigned char* local = Alloc(kSize, &initiator());
  unsigned char* remote = Alloc(kSize, &target());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  FillPattern(local, kSize, 93, 0);
  std::vector<TransferRequest> reqs;
  for (uint64_t off = 0; off < kSize; off += kMiB) {
    reqs.push_back(
        {Opcode::kWrite, local + off, segment(), reinterpret_cast<uintptr_t>(remote) + off, kMiB});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator().AllocateBatch(reqs.size()));
  ASSERT_OK(initiator().Submit(batch, reqs));
  ASSERT_OK(initiator().SendNotification(segment(), "done", ""));
  // Acknowledged means delivered; poll briefly in case delivery to the queue
  // trails the acknowledgement.
  std::vector<Notification> got;
  const auto deadline = std::chrono::steady_clock::now() + kWaitTimeout;
  while (got.empty() && std::chrono::steady_clock::now() < deadline) {
    got = target().GetNotifications();
    if (got.empty()) std::this_thread::sleep_for(100us);
  }
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, "done");
  // Checked on this thread right after seeing the notification.
  EXPECT_EQ(DescribePatternMismatch(remote, kSize, 93, 0), "");
  EXPECT_OK(initiator().WaitBatch(batch, kWaitTimeout));
  EXPECT_OK(initiator().FreeBatch(batch));
}

// IPv6: peer ids are "[addr]:port" and the data streams connect over ::1.
TEST(TcpIpv6Test, WriteAndReadOverLoopbackV6) {
  EngineOptions o = ConformanceOptions("tcp");
  o.listen_host = "::1";
  auto probe = Engine::Create(o);
  if (!probe.ok()) GTEST_SKIP() << "no IPv6 loopback here: " << probe.status();
  probe->reset();
  EnginePair pair;
  ASSERT_NO_FATAL_FAILURE(pair.Start(o, o));
  EXPECT_EQ(pair.target().PeerId().rfind("[::1]:", 0), 0u) << pair.target().PeerId();
  constexpr size_t kSize = 3 * kMiB + 5;
  unsigned char* local = pair.Alloc(kSize, &pair.initiator());
  unsigned char* remote = pair.Alloc(kSize, &pair.target());
  unsigned char* back = pair.Alloc(kSize, &pair.initiator());
  ASSERT_NE(local, nullptr);
  ASSERT_NE(remote, nullptr);
  ASSERT_NE(back, nullptr);
  FillPattern(local, kSize, 61, 0);
  const uint64_t raddr = reinterpret_cast<uint64_t>(remote);
  ASSERT_OK(pair.initiator().TransferSync({Opcode::kWrite, local, pair.segment(), raddr, kSize}));
  EXPECT_EQ(DescribePatternMismatch(remote, kSize, 61, 0), "");
  ASSERT_OK(pair.initiator().TransferSync({Opcode::kRead, back, pair.segment(), raddr, kSize}));
  EXPECT_EQ(DescribePatternMismatch(back, kSize, 61, 0), "");
}

TEST(EngineCreateTest, OutOfRangeTcpSendBufferIsInvalidArgument) {
  for (uint32_t bad : {1u, (64u << 10) - 1, (256u << 20) + 1}) {
    EngineOptions o = ConformanceOptions("tcp");
    o.tcp_send_buffer = bad;
    auto e = Engine::Create(o);
    EXPECT_THAT(GetStatus(e), StatusIs(StatusCode::kInvalidArgument)) << bad;
    if (!e.ok()) {
      EXPECT_NE(e.status().message().find("tcp_send_buffer"), std::string::npos) << e.status();
    }
  }
  for (uint32_t good : {0u, 64u << 10, 256u << 20}) {
    EngineOptions o = ConformanceOptions("tcp");
    o.tcp_send_buffer = good;
    EXPECT_THAT(GetStatus(Engine::Create(o)), IsOk()) << good;
  }
}

TEST(EngineCreateTest, PortInUseFails) {
  EngineOptions o = ConformanceOptions("tcp");
  auto first = Engine::Create(o);
  ASSERT_THAT(GetStatus(first), IsOk());
  o.listen_port = (*first)->RpcPort();
  EXPECT_THAT(Engine::Create(o), IsError());
}

}  // namespace
}  // namespace ferry::test
