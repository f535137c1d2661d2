// StorePoller (metadata/poller.h) with scripted hooks: what the watcher
// reports and what it does not, the refresher's calls, and Stop waking a
// hook that waits. Intervals are short so rounds come quickly; every test
// waits on rounds counted by its hooks, never on the clock.
#include "metadata/poller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace ferry::internal {
namespace {

using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

constexpr milliseconds kInterval{1};
constexpr auto kBound = std::chrono::seconds(30);  // a hang fails the test, never a slow machine

// What the hooks saw, shared with the test thread.
class Recorder {
 public:
  // Waits (bounded) until `done` holds; false if it never did.
  bool WaitUntil(const std::function<bool()>& done) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kBound, done);
  }
  void Update(const std::function<void()>& change) {
    {
      std::lock_guard<std::mutex> lock(mu);
      change();
    }
    cv.notify_all();
  }

  std::mutex mu;
  std::condition_variable cv;
  int reads = 0;                                                // guarded by mu
  std::vector<std::string> changed;                             // guarded by mu
  std::vector<std::pair<std::string, milliseconds>> refreshed;  // guarded by mu
};

StorePoller::Reading Value(std::string bytes) { return {true, std::move(bytes)}; }
StorePoller::Reading Gone() { return {true, std::nullopt}; }
StorePoller::Reading Unknown() { return {false, std::nullopt}; }

// A poller whose reads answer `answer(round)` for every name.
struct Scripted {
  explicit Scripted(std::function<StorePoller::Reading(int round)> answer)
      : answer(std::move(answer)),
        poller({[] { return std::vector<std::string>{}; }, [](const std::string&, milliseconds) {},
                [this](const std::vector<std::string>& names) { return Read(names); }},
               kInterval) {}

  std::vector<StorePoller::Reading> Read(const std::vector<std::string>& names) {
    int round;
    {
      std::lock_guard<std::mutex> lock(rec.mu);
      round = rec.reads;
    }
    std::vector<StorePoller::Reading> out(names.size(), answer(round));
    rec.Update([&] { ++rec.reads; });
    return out;
  }

  Status Watch() {
    return poller.Watch(
        [this](const std::string& name) { rec.Update([&] { rec.changed.push_back(name); }); });
  }

  // Waits for `n` more completed reads than now.
  bool WaitForReads(int n) {
    int target;
    {
      std::lock_guard<std::mutex> lock(rec.mu);
      target = rec.reads + n;
    }
    return rec.WaitUntil([&] { return rec.reads >= target; });
  }

  std::function<StorePoller::Reading(int)> answer;
  Recorder rec;
  StorePoller poller;
};

TEST(StorePoller, ReportsAChangedValueOnceAndAVanishedOneOnce) {
  // Rounds 0-2: "v2" for both names; from round 3: nothing under either.
  Scripted s([](int round) { return round < 3 ? Value("v2") : Gone(); });
  s.poller.Seen("a", "v1");
  s.poller.Seen("b", "v2");
  ASSERT_THAT(s.Watch(), IsOk());
  ASSERT_TRUE(s.rec.WaitUntil([&] { return s.rec.changed.size() >= 3; }));
  ASSERT_TRUE(s.WaitForReads(3));  // later rounds read the same: no more reports
  std::lock_guard<std::mutex> lock(s.rec.mu);
  // "a": v1 -> v2, then gone; "b" was v2 already, then gone.
  EXPECT_THAT(s.rec.changed, ElementsAre("a", "a", "b"));
}

TEST(StorePoller, ReadingsWithoutAnAnswerAreNoNews) {
  Scripted s([](int) { return Unknown(); });
  s.poller.Seen("a", "v1");
  s.poller.Seen("b", std::nullopt);
  ASSERT_THAT(s.Watch(), IsOk());
  ASSERT_TRUE(s.WaitForReads(5));
  std::lock_guard<std::mutex> lock(s.rec.mu);
  EXPECT_TRUE(s.rec.changed.empty());
}

TEST(StorePoller, NamesFetchedAgainDuringAPollAreNotReported) {
  StorePoller* poller = nullptr;
  // Round 0: the engine fetches "v3" while the poll reads "v2"; then "v3".
  Scripted s([&](int round) {
    if (round > 0) return Value("v3");
    poller->Seen("a", "v3");
    return Value("v2");
  });
  poller = &s.poller;
  s.poller.Seen("a", "v1");
  ASSERT_THAT(s.Watch(), IsOk());
  ASSERT_TRUE(s.WaitForReads(4));
  std::lock_guard<std::mutex> lock(s.rec.mu);
  EXPECT_TRUE(s.rec.changed.empty());
}

TEST(StorePoller, ASecondWatchIsRefused) {
  Scripted s([](int) { return Unknown(); });
  ASSERT_THAT(s.Watch(), IsOk());
  EXPECT_THAT(s.Watch(),
              StatusIs(StatusCode::kFailedPrecondition, ::testing::HasSubstr("already watched")));
}

TEST(StorePoller, RefreshesEveryPublishedNameWithinAThirdOfTheTtlClamped) {
  Recorder rec;
  StorePoller poller(
      {[] {
         return std::vector<std::string>{"x", "y"};
       },
       [&](const std::string& name, milliseconds timeout) {
         rec.Update([&] { rec.refreshed.emplace_back(name, timeout); });
       },
       [](const std::vector<std::string>&) { return std::vector<StorePoller::Reading>{}; }},
      kInterval);
  poller.SetTtl(milliseconds(30));  // a third is 10 ms: the timeout is the least allowed
  ASSERT_TRUE(rec.WaitUntil([&] { return rec.refreshed.size() >= 2; }));
  poller.Stop();
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_THAT(std::vector(rec.refreshed.begin(), rec.refreshed.begin() + 2),
              UnorderedElementsAre(
                  std::pair<std::string, milliseconds>("x", StorePoller::kMinRefreshTimeout),
                  std::pair<std::string, milliseconds>("y", StorePoller::kMinRefreshTimeout)));
}

TEST(StorePoller, StopWakesAHookWaitingOnTheStoreAndEndsTheThreads) {
  Recorder rec;
  StorePoller* self = nullptr;
  std::optional<bool> waited;  // WaitFor's answer inside the refresh
  StorePoller poller(
      {[] { return std::vector<std::string>{"x"}; },
       [&](const std::string&, milliseconds) {
         rec.Update([&] { rec.refreshed.emplace_back("x", milliseconds(0)); });
         const bool more = self->WaitFor(std::chrono::hours(1));
         rec.Update([&] { waited = more; });
       },
       [](const std::vector<std::string>&) { return std::vector<StorePoller::Reading>{}; }},
      kInterval);
  self = &poller;
  poller.SetTtl(milliseconds(30));
  ASSERT_TRUE(rec.WaitUntil([&] { return !rec.refreshed.empty(); }));
  poller.Stop();  // returns only once the refresh has
  EXPECT_TRUE(poller.stopping());
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_TRUE(waited.has_value());
  EXPECT_FALSE(*waited);
  EXPECT_EQ(rec.refreshed.size(), 1u);
}

TEST(StorePoller, NothingStartsAfterStop) {
  Scripted s([](int) { return Value("v"); });
  s.poller.Stop();
  s.poller.Stop();  // idempotent
  EXPECT_THAT(s.Watch(),
              StatusIs(StatusCode::kFailedPrecondition, ::testing::HasSubstr("shutting down")));
  EXPECT_FALSE(s.poller.WaitFor(std::chrono::hours(1)));
}

}  // namespace
}  // namespace ferry::internal
