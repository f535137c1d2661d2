// StagingQueue (staging_queue.h) on its own: a stager whose room is a
// count of slots and whose "inner link" is a list the test answers.
#include "base/staging_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry::internal {
namespace {

using namespace std::chrono_literals;

struct TestWork : StagedWork {};

// Room: `slots` slices at once. Start makes every slice ready at once;
// PostReady keeps them for the test to finish (as an inner link would).
class SlotStager : public StagingQueue<TestWork> {
 public:
  explicit SlotStager(size_t slots) : StagingQueue("a test slice"), slots_(slots) {}
  ~SlotStager() override { StopWorker(); }

  // The slices posted so far (moved out).
  std::vector<TestWork> TakePosted() {
    std::lock_guard<std::mutex> lock(posted_mu_);
    std::vector<TestWork> out = std::move(posted_);
    posted_.clear();
    return out;
  }
  void Done(TestWork w, const Status& st) { Finish(std::move(w), st); }
  size_t most_held() const {
    std::lock_guard<std::mutex> lock(posted_mu_);
    return most_held_;
  }

 private:
  bool CanStartLocked(const TestWork&) const override { return held_ < slots_; }
  Status TakeLocked(TestWork&) override {
    ++held_;
    std::lock_guard<std::mutex> lock(posted_mu_);
    most_held_ = std::max(most_held_, held_);
    return OkStatus();
  }
  void ReleaseLocked(TestWork&) override { --held_; }
  void Start(std::vector<TestWork> started) override {
    for (TestWork& w : started) Ready(std::move(w));
  }
  void PostReady(std::vector<TestWork> ready) override {
    std::lock_guard<std::mutex> lock(posted_mu_);
    for (TestWork& w : ready) posted_.push_back(std::move(w));
  }

  const size_t slots_;
  size_t held_ = 0;  // guarded by mu()
  mutable std::mutex posted_mu_;
  std::vector<TestWork> posted_;
  size_t most_held_ = 0;
};

struct Fixture {
  std::shared_ptr<BatchState> batch;
  std::shared_ptr<WriteFence> writes = std::make_shared<WriteFence>();
  explicit Fixture(size_t n) : batch(std::make_shared<BatchState>(n)) {
    EXPECT_TRUE(batch->Reserve(n).ok());
    batch->BeginRange(0, n, [](size_t) { return 1u; });
  }
  std::vector<TestWork> Work(size_t first, size_t n, Clock::time_point deadline) {
    std::vector<TestWork> out;
    for (size_t i = first; i < first + n; ++i) {
      TestWork w;
      w.ctx = PostContext{batch, deadline, nullptr};
      w.slice.opcode = i % 2 == 0 ? Opcode::kWrite : Opcode::kRead;
      w.slice.length = 1;
      w.slice.request = static_cast<uint32_t>(i);
      w.writes = writes;
      out.push_back(std::move(w));
    }
    return out;
  }
};

// Slices start as room frees up, never more at once than the room, and all
// finish; the staged writes hold the link's fence until then.
TEST(StagingQueue, StartsSlicesAsRoomFreesAndFinishesThemAll) {
  constexpr size_t kN = 20;
  Fixture f(kN);
  SlotStager q(3);
  q.Add(f.Work(0, kN, Clock::now() + 60s));
  size_t done = 0;
  const auto until = Clock::now() + 60s;
  while (done < kN && Clock::now() < until) {
    std::vector<TestWork> posted = q.TakePosted();
    if (posted.empty()) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    const bool write_posted = std::any_of(posted.begin(), posted.end(), [](const TestWork& w) {
      return w.slice.opcode == Opcode::kWrite;
    });
    if (write_posted) {
      EXPECT_FALSE(f.writes->Wait(Clock::now())) << "a staged write in flight: the fence is closed";
    }
    for (TestWork& w : posted) q.Done(std::move(w), OkStatus());
    done += posted.size();
  }
  ASSERT_EQ(done, kN);
  EXPECT_LE(q.most_held(), 3u);
  EXPECT_EQ(f.batch->Summary().completed, kN);
  EXPECT_TRUE(f.writes->Wait(Clock::now()));
  q.StopWorker();
}

// A slice still waiting for room at its deadline fails kDeadlineExceeded,
// naming what it is.
TEST(StagingQueue, ASliceWaitingPastItsDeadlineFails) {
  Fixture f(2);
  SlotStager q(1);
  q.Add(f.Work(0, 1, Clock::now() + 60s));  // holds the only slot
  q.Add(f.Work(1, 1, Clock::now() + 20ms));
  std::vector<TestWork> posted;
  while (posted.empty()) {
    posted = q.TakePosted();
    std::this_thread::sleep_for(1ms);
  }
  std::this_thread::sleep_for(50ms);  // past the second slice's deadline
  q.Done(std::move(posted[0]), OkStatus());
  ASSERT_TRUE(f.batch->WaitIdle(Clock::now() + 60s, std::chrono::microseconds(0)));
  EXPECT_EQ(f.batch->Get(0).state, TransferState::kCompleted);
  EXPECT_EQ(f.batch->Get(1).status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(f.batch->Get(1).status.message().find("a test slice"), std::string::npos);
}

// Once stopped, the queue fails what it is handed at once (the transport
// shut down), instead of keeping it forever with no worker.
TEST(StagingQueue, SlicesAddedAfterStopFailAtOnce) {
  Fixture f(2);
  SlotStager q(2);
  q.StopWorker();
  q.Add(f.Work(0, 2, Clock::now() + 60s));
  EXPECT_EQ(f.batch->Summary().failed, 2u);
  EXPECT_EQ(f.batch->Get(0).status.code(), StatusCode::kCancelled);
  EXPECT_TRUE(f.writes->Wait(Clock::now())) << "a failed write left the fence closed";
}

// Stop waits for the slices holding room: it returns once the last one
// finished (on another thread).
TEST(StagingQueue, StopWaitsForTheSlicesHoldingRoom) {
  Fixture f(1);
  SlotStager q(1);
  q.Add(f.Work(0, 1, Clock::now() + 60s));
  std::vector<TestWork> posted;
  while (posted.empty()) {
    posted = q.TakePosted();
    std::this_thread::sleep_for(1ms);
  }
  std::thread finisher([&] {
    std::this_thread::sleep_for(20ms);
    q.Done(std::move(posted[0]), OkStatus());
  });
  q.StopWorker();
  EXPECT_EQ(f.batch->Summary().completed, 1u) << "Stop returned before the slice finished";
  finisher.join();
}

}  // namespace
}  // namespace ferry::internal
