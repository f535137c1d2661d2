#include "core/batch.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace ferry::internal {
namespace {

using std::chrono::steady_clock;

TEST(Batch, ReserveRespectsCapacity) {
  BatchState b(10);
  auto a = b.Reserve(6);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, 0u);
  auto c = b.Reserve(5);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  auto d = b.Reserve(4);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, 6u);
  EXPECT_EQ(b.reserved(), 10u);
}

TEST(Batch, CompletesAfterAllSlices) {
  BatchState b(2);
  ASSERT_TRUE(b.Reserve(2).ok());
  b.Begin(0, 3);
  b.Begin(1, 1);
  EXPECT_EQ(b.pending(), 2u);
  b.CompleteSlice(0, OkStatus());
  b.CompleteSlice(0, OkStatus());
  EXPECT_EQ(b.Get(0).state, TransferState::kPending);
  b.CompleteSlice(0, OkStatus());
  EXPECT_EQ(b.Get(0).state, TransferState::kCompleted);
  EXPECT_EQ(b.Summary().state, TransferState::kPending);
  b.CompleteSlice(1, OkStatus());
  auto s = b.Summary();
  EXPECT_EQ(s.state, TransferState::kCompleted);
  EXPECT_EQ(s.completed, 2u);
  EXPECT_TRUE(b.WaitIdle(steady_clock::now(), {}));
}

TEST(Batch, FirstFailureIsKeptAndNamed) {
  BatchState b(3);
  ASSERT_TRUE(b.Reserve(3).ok());
  for (int i = 0; i < 3; ++i) b.Begin(i, 2);
  b.CompleteSlice(1, UnavailableError("peer gone"));
  b.CompleteSlice(1, DeadlineExceededError("late"));
  b.CompleteSlices(0, 2, OkStatus());
  b.CompleteSlices(2, 2, OkStatus());
  auto t = b.Get(1);
  EXPECT_EQ(t.state, TransferState::kFailed);
  EXPECT_EQ(t.status.code(), StatusCode::kUnavailable);
  auto s = b.Summary();
  EXPECT_EQ(s.state, TransferState::kFailed);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(s.completed, 2u);
  EXPECT_EQ(s.first_error.message(), "request 1: peer gone");
}

TEST(Batch, WaitIdleTimesOutThenWakesOnCompletion) {
  BatchState b(1);
  ASSERT_TRUE(b.Reserve(1).ok());
  b.Begin(0, 1);
  EXPECT_FALSE(b.WaitIdle(steady_clock::now() + std::chrono::milliseconds(1), {}));
  std::thread t([&] { b.CompleteSlice(0, OkStatus()); });
  EXPECT_TRUE(b.WaitIdle(steady_clock::now() + std::chrono::seconds(60), {}));
  t.join();
}

TEST(Batch, SettlesOnlyWhenEveryRequestIsFinal) {
  BatchState b(2);
  ASSERT_TRUE(b.Reserve(2).ok());
  b.Begin(0, 1);
  b.Begin(1, 2);
  EXPECT_FALSE(b.SettleIfFinal());
  b.CompleteSlice(0, OkStatus());
  b.CompleteSlice(1, OkStatus());
  EXPECT_FALSE(b.SettleIfFinal());  // request 1 still has a slice out
  b.CompleteSlice(1, OkStatus());
  EXPECT_TRUE(b.SettleIfFinal());
}

// Regression: a caller that saw every request counted done (GetBatchStatus)
// got "still in flight" from FreeBatch, because counters were bumped before
// the final state was stored.
TEST(Batch, CountedDoneImpliesFreeable) {
  for (int round = 0; round < 2000; ++round) {
    BatchState b(4);
    ASSERT_TRUE(b.Reserve(4).ok());
    for (int i = 0; i < 4; ++i) b.Begin(i, 1);
    std::thread t([&] {
      for (int i = 0; i < 4; ++i) b.CompleteSlice(i, OkStatus());
    });
    while (true) {
      auto s = b.Summary();
      if (s.completed + s.failed == 4) break;
    }
    EXPECT_TRUE(b.SettleIfFinal()) << "round " << round;
    t.join();
  }
}

TEST(Batch, ConcurrentCompletionsCountExactly) {
  constexpr int kRequests = 1000, kSlices = 8;
  BatchState b(kRequests);
  ASSERT_TRUE(b.Reserve(kRequests).ok());
  for (int i = 0; i < kRequests; ++i) b.Begin(i, kSlices);
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kRequests; ++i)
        for (int s = t; s < kSlices; s += 4) b.CompleteSlice(i, OkStatus());
    });
  }
  for (auto& t : ts) t.join();
  auto s = b.Summary();
  EXPECT_EQ(s.completed, static_cast<size_t>(kRequests));
  EXPECT_EQ(b.pending(), 0u);
}

TEST(Batch, CompleterPublishesCountersOnce) {
  BatchState b(4);
  ASSERT_TRUE(b.Reserve(4).ok());
  b.Begin(0, 1);
  b.Begin(1, 2);
  b.Begin(2, 1);
  b.Begin(3, 1);
  {
    BatchState::Completer done(b);
    done.Complete(0, 1, OkStatus());
    done.Complete(1, 1, OkStatus());  // one of two slices: stays pending
    done.Complete(2, 1, UnavailableError("peer gone"));
    // Each request's state is final at once; the counters wait for Publish.
    EXPECT_EQ(b.Get(0).state, TransferState::kCompleted);
    EXPECT_EQ(b.Get(1).state, TransferState::kPending);
    EXPECT_EQ(b.Get(2).state, TransferState::kFailed);
    EXPECT_EQ(b.Get(2).status.message(), "peer gone");
    EXPECT_EQ(b.pending(), 4u);
    EXPECT_EQ(b.Summary().completed, 0u);
    done.Publish();
    EXPECT_EQ(b.pending(), 2u);
    auto s = b.Summary();
    EXPECT_EQ(s.completed, 1u);
    EXPECT_EQ(s.failed, 1u);
    EXPECT_EQ(s.first_error.message(), "request 2: peer gone");
    done.Complete(3, 1, OkStatus());
    done.Complete(1, 1, OkStatus());  // the last slice, on the plain-store path
    // Leaving the scope publishes again.
  }
  auto s = b.Summary();
  EXPECT_EQ(s.state, TransferState::kFailed);
  EXPECT_EQ(s.completed, 3u);
  EXPECT_EQ(s.failed, 1u);
  EXPECT_EQ(b.Get(1).state, TransferState::kCompleted);
  EXPECT_TRUE(b.WaitIdle(steady_clock::now(), {}));
  EXPECT_TRUE(b.SettleIfFinal());
}

// Threads completing slices of the same requests through Completers (one per
// "frame" of 50 slices) count every request exactly once and wake a waiter.
TEST(Batch, ConcurrentCompletersCountExactly) {
  constexpr int kRequests = 2000, kSlices = 3, kThreads = 3;
  BatchState b(kRequests);
  ASSERT_TRUE(b.Reserve(kRequests).ok());
  for (int i = 0; i < kRequests; ++i) b.Begin(i, kSlices);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int first = 0; first < kRequests; first += 50) {
        BatchState::Completer done(b);
        for (int i = first; i < first + 50; ++i) {
          done.Complete(i, 1, (i % 97 == 0 && t == 1) ? InternalError("bad") : OkStatus());
        }
      }
    });
  }
  EXPECT_TRUE(b.WaitIdle(steady_clock::now() + std::chrono::seconds(60), {}));
  for (auto& t : ts) t.join();
  auto s = b.Summary();
  const size_t bad = (kRequests + 96) / 97;
  EXPECT_EQ(s.failed, bad);
  EXPECT_EQ(s.completed, kRequests - bad);
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_EQ(b.Get(i).state, i % 97 == 0 ? TransferState::kFailed : TransferState::kCompleted)
        << i;
  }
}

}  // namespace
}  // namespace ferry::internal
