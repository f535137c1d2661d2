// Every transport under injected faults (EngineOptions::testing.link_faults):
// each request either completes with its bytes in place or fails with a
// status that says a fault was injected; nothing hangs, nothing is written
// twice or half-reported; the same seed gives the same outcomes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/conformance/conformance_fixture.h"

namespace ferry::test {
namespace {

constexpr size_t kRequests = 400;
constexpr size_t kBlock = 4096;

EngineOptions Faulty(const std::string& transport, uint32_t seed) {
  EngineOptions o = ConformanceOptions(transport);
  // Dropped replies fail by then; long enough that no undisturbed request
  // misses it on a slow (sanitized, loaded) machine.
  o.transfer_timeout = std::chrono::milliseconds(1500);
  o.testing.link_faults.seed = seed;
  o.testing.link_faults.fail_percent = 8;
  o.testing.link_faults.drop_percent = 4;
  o.testing.link_faults.delay_percent = 15;
  o.testing.link_faults.reorder_percent = 15;
  o.testing.link_faults.corrupt_percent = 8;
  return o;
}

class FaultsTest : public ::testing::TestWithParam<std::string> {
 protected:
  // One batch of writes under faults; returns each request's final state.
  // (Reads: the target's bytes into the initiator's memory.)
  std::vector<TransferState> RunOnce(uint32_t seed, Opcode op = Opcode::kWrite) {
    if (!TransportRefusal(GetParam()).empty()) return {};
    EnginePair pair;
    pair.Start(GetParam(), Faulty(GetParam(), seed), ConformanceOptions(GetParam()));
    if (::testing::Test::HasFatalFailure()) return {};
    unsigned char* src = pair.Alloc(kRequests * kBlock, &pair.initiator());
    unsigned char* dst = pair.Alloc(kRequests * kBlock, &pair.target());
    if (src == nullptr || dst == nullptr) return {};
    // `from` holds the bytes, `to` receives them.
    unsigned char* from = op == Opcode::kWrite ? src : dst;
    unsigned char* to = op == Opcode::kWrite ? dst : src;
    for (size_t i = 0; i < kRequests * kBlock; ++i)
      from[i] = static_cast<unsigned char>(i * 31 + 7);
    std::vector<TransferRequest> reqs;
    for (size_t i = 0; i < kRequests; ++i) {
      reqs.push_back({op, src + i * kBlock, pair.segment(), pair.Addr(dst) + i * kBlock, kBlock});
    }
    auto batch = pair.initiator().AllocateBatch(kRequests);
    EXPECT_THAT(GetStatus(batch), IsOk());
    EXPECT_THAT(pair.initiator().Submit(*batch, reqs), IsOk());
    (void)pair.initiator().WaitBatch(*batch, kWaitTimeout);
    std::vector<TransferState> states;
    size_t failed = 0;
    for (size_t i = 0; i < kRequests; ++i) {
      auto ts = pair.initiator().GetTransferStatus(*batch, i);
      EXPECT_THAT(GetStatus(ts), IsOk());
      EXPECT_NE(ts->state, TransferState::kPending) << "request " << i << " never ended";
      states.push_back(ts->state);
      if (ts->state == TransferState::kCompleted) {
        // A success means the bytes are there (a corrupted status never
        // reports success for bytes that did not land).
        EXPECT_EQ(std::memcmp(to + i * kBlock, from + i * kBlock, kBlock), 0) << "request " << i;
      } else if (ts->state == TransferState::kFailed) {
        ++failed;
        EXPECT_NE(ts->status.message().find("fault injected"), std::string::npos) << ts->status;
        const StatusCode c = ts->status.code();
        EXPECT_TRUE(c == StatusCode::kUnavailable || c == StatusCode::kDeadlineExceeded ||
                    c == StatusCode::kDataLoss)
            << ts->status;
      }
    }
    EXPECT_GT(failed, 0u);
    EXPECT_LT(failed, kRequests);
    EXPECT_THAT(pair.initiator().FreeBatch(*batch), IsOk());
    return states;
  }
};

INSTANTIATE_TEST_SUITE_P(AllTransports, FaultsTest, ::testing::ValuesIn(kTransports),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(FileTargets, FaultsTest, ::testing::ValuesIn(kFileTargets),
                         [](const auto& info) { return info.param; });

TEST_P(FaultsTest, EveryRequestEndsWithItsBytesOrAClearFault) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  RunOnce(11);
}

TEST_P(FaultsTest, EveryReadEndsWithItsBytesOrAClearFault) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  RunOnce(13, Opcode::kRead);
}

TEST_P(FaultsTest, TheSameSeedGivesTheSameOutcomes) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
  const auto first = RunOnce(23);
  const auto second = RunOnce(23);
  EXPECT_EQ(first, second);
  const auto other = RunOnce(24);
  EXPECT_NE(first, other);
}

}  // namespace
}  // namespace ferry::test
