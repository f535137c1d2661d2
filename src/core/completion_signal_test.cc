// The engine's completion signal as in-process pollers use it (Engine::PollBatch,
// PollTransfer through Impl::PollStep): a waiter wakes on any finish or wake,
// never misses one that came before it started waiting, and a poll step of a
// batch blocks in the caller's waiter, which such a finish ends.
#include "core/completion_signal.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/batch.h"

namespace ferry::internal {
namespace {

using std::chrono::steady_clock;

TEST(CompletionSignal, AWaiterWakesOnAnyChangeAndNeverMissesAnEarlierOne) {
  auto made = CompletionSignal::Create();
  ASSERT_TRUE(made.ok());
  CompletionSignal& s = **made;
  uint64_t seen = s.changes();
  s.Wake();  // before the wait: it returns at once (the deadline is an hour away)
  s.WaitForChange(seen, steady_clock::now() + std::chrono::hours(1));
  EXPECT_NE(s.changes(), seen);
  seen = s.changes();
  std::thread t([&] { s.Notify(); });  // unarmed: no eventfd write, but waiters wake
  s.WaitForChange(seen, steady_clock::now() + std::chrono::hours(1));
  t.join();
  EXPECT_EQ(s.changes(), seen + 1);
  // Nothing changes: the deadline ends the wait.
  s.WaitForChange(s.changes(), steady_clock::now() + std::chrono::milliseconds(1));
}

TEST(CompletionSignal, APollStepOfOneBatchEndsWhenAnotherFinishes) {
  auto made = CompletionSignal::Create();
  ASSERT_TRUE(made.ok());
  CompletionSignal& s = **made;
  BatchState a(1), b(1);
  for (BatchState* x : {&a, &b}) {
    ASSERT_TRUE(x->Reserve(1).ok());
    x->Begin(0, 1);
  }
  b.SetOnIdle([&] { s.Notify(); });
  // As PollStep: what the signal said is read before the batch is looked at.
  auto step = [&](uint64_t seen) {
    return a.PollIdle(std::chrono::hours(1), {}, std::chrono::hours(1),
                      [&](steady_clock::time_point deadline) { s.WaitForChange(seen, deadline); });
  };
  EXPECT_FALSE(step(s.changes()));  // the first poll reports at once
  const uint64_t seen = s.changes();
  std::thread t([&] { b.CompleteSlice(0, OkStatus()); });
  // A tight poll of `a` blocks (an hour at most) until b's finish wakes it
  // (before or after the poll began); `a` is still pending.
  EXPECT_FALSE(step(seen));
  t.join();
  EXPECT_EQ(b.pending(), 0u);
  a.CompleteSlice(0, OkStatus());
  EXPECT_TRUE(step(s.changes()));
}

// TakeFinished: the ids recorded from Arm on, in the order they finished,
// each record taken once; past kMaxFinishedRecords unread the record stops
// and says it overflowed, until the next take.
TEST(CompletionSignal, RecordsWhatFinishedOnceArmedAndSaysWhenItOverflowed) {
  auto made = CompletionSignal::Create();
  ASSERT_TRUE(made.ok());
  CompletionSignal& s = **made;
  using F = CompletionSignal::Finished;
  s.Notify(F::kBatch, 1);  // not armed: not recorded
  s.Arm();
  s.Notify(F::kBatch, 2);
  s.Notify(F::kTransfer, 3);
  s.Notify(F::kBatch, 4);
  s.Notify();  // no id (the engine going away): no record
  FinishedWork done = s.TakeFinished();
  ASSERT_EQ(done.batches.size(), 2u);
  EXPECT_EQ(done.batches[0].value, 2u);
  EXPECT_EQ(done.batches[1].value, 4u);
  ASSERT_EQ(done.transfers.size(), 1u);
  EXPECT_EQ(done.transfers[0].value, 3u);
  EXPECT_FALSE(done.overflowed);
  done = s.TakeFinished();
  EXPECT_TRUE(done.batches.empty() && done.transfers.empty() && !done.overflowed);

  for (uint64_t i = 0; i <= CompletionSignal::kMaxFinishedRecords; ++i) s.Notify(F::kBatch, i);
  done = s.TakeFinished();
  EXPECT_EQ(done.batches.size(), CompletionSignal::kMaxFinishedRecords);
  EXPECT_TRUE(done.overflowed);
  s.Notify(F::kTransfer, 9);
  done = s.TakeFinished();
  EXPECT_FALSE(done.overflowed) << "the overflow is reported once, by the take after it";
  EXPECT_EQ(done.transfers.size(), 1u);
}

}  // namespace
}  // namespace ferry::internal
