#include "base/batch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "base/metrics.h"

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

TEST(Batch, PollIdleReportsPendingThenWakesOnCompletion) {
  BatchState b(1);
  EXPECT_TRUE(b.PollIdle(std::chrono::seconds(60), {}));  // nothing pending: at once
  ASSERT_TRUE(b.Reserve(1).ok());
  b.Begin(0, 1);
  // The first poll reports at once; the next ones (a tight loop), within the
  // spin (an hour), yield once and report pending.
  EXPECT_FALSE(b.PollIdle(std::chrono::seconds(60), std::chrono::hours(1)));
  EXPECT_FALSE(b.PollIdle(std::chrono::seconds(60), std::chrono::hours(1)));
  // Past the spin it waits (here 1 ms) and still reports pending.
  EXPECT_FALSE(b.PollIdle(std::chrono::milliseconds(1), {}));
  std::thread t([&] { b.CompleteSlice(0, OkStatus()); });
  EXPECT_TRUE(b.PollIdle(std::chrono::seconds(60), {}));  // woken by the completion
  t.join();
  EXPECT_TRUE(b.PollIdle(std::chrono::seconds(60), {}));
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

TEST(Batch, CancelFailsWhatIsPendingAndLaterCompletionsChangeNothing) {
  BatchState b(3);
  ASSERT_TRUE(b.Reserve(3).ok());
  b.BeginRange(0, 3, [](size_t) { return 2u; });
  b.CompleteSlices(0, 2, OkStatus());  // request 0 done before the cancel
  b.CompleteSlice(1, OkStatus());      // request 1 half done
  EXPECT_EQ(b.Cancel(CancelledError("stop")), 2u);
  EXPECT_TRUE(b.cancelled());
  EXPECT_EQ(b.pending(), 0u);
  EXPECT_TRUE(b.WaitIdle(steady_clock::now(), std::chrono::microseconds(0)));
  EXPECT_EQ(b.Get(0).state, TransferState::kCompleted);
  EXPECT_EQ(b.Get(1).state, TransferState::kFailed);
  EXPECT_EQ(b.Get(1).status.code(), StatusCode::kCancelled);
  // The transport finishes the requests later: nothing flips, nothing is
  // counted twice.
  b.CompleteSlice(1, OkStatus());
  b.CompleteSlices(2, 2, OkStatus());
  BatchStatus s = b.Summary();
  EXPECT_EQ(s.state, TransferState::kFailed);
  EXPECT_EQ(s.completed, 1u);
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(b.Get(2).state, TransferState::kFailed);
  EXPECT_EQ(b.pending(), 0u);
  EXPECT_EQ(b.Cancel(CancelledError("again")), 0u);  // idempotent
  EXPECT_TRUE(b.SettleIfFinal());
}

TEST(Batch, RequestsBegunAfterACancelFailAtOnce) {
  BatchState b(4);
  ASSERT_TRUE(b.Reserve(2).ok());
  b.BeginRange(0, 2, [](size_t) { return 1u; });
  b.Cancel(CancelledError("stop"));
  ASSERT_TRUE(b.Reserve(2).ok());
  EXPECT_FALSE(b.BeginRange(2, 2, [](size_t) { return 1u; }));
  EXPECT_EQ(b.Get(3).state, TransferState::kFailed);
  EXPECT_EQ(b.Summary().failed, 4u);
  EXPECT_EQ(b.pending(), 0u);
}

// Cancel returns only after a store of read data in progress ended, and
// later stores are refused. (An ordering, not a timing: the store's thread
// marks its end before EndLanding; Cancel's caller checks the mark.)
TEST(Batch, CancelWaitsForALandingInProgress) {
  BatchState b(1);
  ASSERT_TRUE(b.Reserve(1).ok());
  b.Begin(0, 1);
  ASSERT_TRUE(b.BeginLanding());
  std::atomic<bool> store_done{false}, cancel_returned{false};
  std::thread canceller([&] {
    b.Cancel(CancelledError("stop"));
    EXPECT_TRUE(store_done.load()) << "Cancel returned while a store was in progress";
    cancel_returned.store(true);
  });
  // Hold the landing until Cancel has flagged the batch (it then waits).
  while (!b.cancelled()) std::this_thread::yield();
  EXPECT_FALSE(cancel_returned.load());
  store_done.store(true);
  b.EndLanding();
  canceller.join();
  EXPECT_TRUE(cancel_returned.load());
  EXPECT_FALSE(b.BeginLanding());
}

TEST(Batch, AShadowBatchLandsOnlyWhileItsParentMay) {
  auto parent = std::make_shared<BatchState>(1);
  BatchState shadow(1);
  shadow.SetLandingParent(parent);
  ASSERT_TRUE(shadow.BeginLanding());
  shadow.EndLanding();
  parent->Cancel(CancelledError("stop"));
  EXPECT_FALSE(shadow.BeginLanding());
}

// A batch over more routes than it keeps inline (eight) and up to the
// 255 tags: every request is counted on its own route, completed or
// cancelled; past 255 routes a request is simply not counted.
TEST(Batch, MetricsCountEveryRouteOfABatchWithManyRoutes) {
  constexpr size_t kRoutes = 260;
  auto metrics = std::make_shared<Metrics>();
  BatchState b(kRoutes, metrics);
  std::vector<uint8_t> tags;
  for (size_t i = 0; i < kRoutes; ++i) {
    RouteCounters* r = metrics->Route("127.0.0.1:" + std::to_string(i + 1), "tcp", Opcode::kWrite);
    tags.push_back(b.RouteTag(r));
    EXPECT_EQ(b.RouteTag(r), tags.back()) << i;  // the same route, the same tag
  }
  for (size_t i = 0; i < kRoutes; ++i) EXPECT_EQ(tags[i], i < 255 ? i + 1 : 0) << i;
  ASSERT_TRUE(b.Reserve(kRoutes).ok());
  b.BeginRange(0, kRoutes, [&](size_t i) {
    b.Describe(i, 10 + i, tags[i]);
    return 1u;
  });
  {
    BatchState::Completer c(b);
    for (size_t i = 0; i < kRoutes; i += 2) c.Complete(i, 1, OkStatus());
  }
  b.Cancel(CancelledError("stop"));  // the odd ones: failed by the cancel
  const EngineMetrics m = metrics->Snapshot(0);
  ASSERT_EQ(m.routes.size(), kRoutes);
  size_t counted = 0;
  for (const RouteMetrics& x : m.routes) {
    const size_t i = std::stoul(x.peer.substr(x.peer.find(':') + 1)) - 1;
    if (i >= 255) {
      EXPECT_EQ(x.requests_completed + x.requests_failed, 0u) << x.peer;
      continue;
    }
    ++counted;
    EXPECT_EQ(x.requests_completed, i % 2 == 0 ? 1u : 0u) << x.peer;
    EXPECT_EQ(x.requests_failed, i % 2 == 0 ? 0u : 1u) << x.peer;
    EXPECT_EQ(i % 2 == 0 ? x.bytes_completed : x.bytes_failed, 10 + i) << x.peer;
  }
  EXPECT_EQ(counted, 255u);
}

TEST(Batch, MetricsCountRequestsAndBytesByRouteAndOutcome) {
  auto metrics = std::make_shared<Metrics>();
  BatchState b(4, metrics);
  RouteCounters* w = metrics->Route("127.0.0.1:1", "tcp", Opcode::kWrite);
  RouteCounters* r = metrics->Route("127.0.0.1:1", "tcp", Opcode::kRead);
  EXPECT_EQ(metrics->Route("127.0.0.1:1", "tcp", Opcode::kWrite), w);
  const uint8_t tw = b.RouteTag(w), tr = b.RouteTag(r);
  EXPECT_NE(tw, tr);
  EXPECT_EQ(b.RouteTag(w), tw);
  ASSERT_TRUE(b.Reserve(4).ok());
  const uint64_t lengths[4] = {100, 200, 300, 400};
  b.BeginRange(0, 4, [&](size_t i) {
    b.Describe(i, lengths[i], i < 3 ? tw : tr);
    return 1u;
  });
  {
    BatchState::Completer c(b);
    c.Complete(0, 1, OkStatus());
    c.Complete(1, 1, UnavailableError("x"));
    c.Complete(3, 1, OkStatus());
  }
  b.Cancel(CancelledError("stop"));  // request 2: failed by the cancel
  EngineMetrics m = metrics->Snapshot(0);
  ASSERT_EQ(m.routes.size(), 2u);
  for (const RouteMetrics& x : m.routes) {
    if (x.opcode == Opcode::kWrite) {
      EXPECT_EQ(x.requests_completed, 1u);
      EXPECT_EQ(x.bytes_completed, 100u);
      EXPECT_EQ(x.requests_failed, 2u);
      EXPECT_EQ(x.bytes_failed, 500u);
    } else {
      EXPECT_EQ(x.requests_completed, 1u);
      EXPECT_EQ(x.bytes_completed, 400u);
    }
  }
  EXPECT_EQ(m.cancelled_requests, 1u);
  EXPECT_EQ(m.transfer_latency.count, 1u);  // one busy period
  const std::string text = Metrics::PrometheusText(m);
  EXPECT_NE(text.find("ferry_bytes_total{peer=\"127.0.0.1:1\",transport=\"tcp\",op=\"write\","
                      "outcome=\"failed\"} 500"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("ferry_transfer_latency_seconds_bucket{le=\"+Inf\"} 1"), std::string::npos)
      << text;
}

}  // namespace
}  // namespace ferry::internal
