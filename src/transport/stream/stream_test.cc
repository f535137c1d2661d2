// The stream layer end to end without the engine: an initiator StreamLink
// and a served stream (the tcp transport's service) over socketpairs, with a
// FaultLink (tests/testing/fault_link.h) relaying between them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "base/target.h"
#include "tests/testing/fault_link.h"
#include "tests/testing/status_matchers.h"
#include "transport/stream/connection.h"
#include "transport/stream/frame_reader.h"
#include "transport/stream/hello.h"
#include "transport/stream/listener.h"
#include "transport/stream/stream_link.h"
#include "transport/tcp/tcp_frames.h"

namespace ferry::internal::stream {
namespace {

using test::FaultLink;
using Action = FaultLink::Action;
constexpr uint64_t kInstance = 42;
constexpr size_t kBuf = 1 << 20;

// Collects the sequence numbers of the frames it is fed.
struct FrameReaderSink : FrameReader::Sink {
  Status OnHeader(const wire::FrameHeader&) override { return OkStatus(); }
  Status OnFrame(const wire::FrameHeader& h, std::string_view) override {
    seqs.push_back(h.seq);
    return OkStatus();
  }
  Status OnPayload(const wire::FrameHeader&) override { return OkStatus(); }
  std::vector<uint64_t> seqs;
};

FaultLink::Plan Replies(std::vector<Action> actions,
                        std::chrono::milliseconds delay = std::chrono::milliseconds(20)) {
  FaultLink::Plan p;
  p.replies = std::move(actions);
  p.delay = delay;
  return p;
}

class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = LoopPool::Start(1, std::chrono::microseconds(50));
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *pool;
    target_ = std::make_shared<EngineTarget>(kInstance, "target:1");
    remote_.assign(kBuf, 0);
    local_.assign(kBuf, 0);
    MemoryRegion r{remote_.data(), kBuf, "cpu"};
    ASSERT_TRUE(target_->registry().Register({&r, 1}).ok());
  }
  void TearDown() override {
    link_.reset();
    pool_->Stop();
    fault_.reset();
  }

  // A served stream and an initiator link to it through a FaultLink.
  // `tune` adjusts the link's configuration (limits).
  void Open(FaultLink::Plan plan, std::function<void(StreamLinkConfig&)> tune = {}) {
    int to_init[2], to_target[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to_init), 0);
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to_target), 0);
    fault_ = std::make_unique<FaultLink>(to_init[1], to_target[0], std::move(plan));
    // The target side: an accepted connection whose kStreamHello opener
    // installs the tcp service.
    auto openers = std::make_shared<FirstFrames>();
    HelloPolicy policy{target_, 1, 1, idle_timeout_};
    openers->Add(wire::FrameType::kStreamHello, [policy](Connection& c, const wire::FrameHeader& h,
                                                         std::string_view body) {
      FERRY_ASSIGN_OR_RETURN(wire::StreamHello hello, wire::DecodeStreamHello(body));
      Status ok = CheckHello(policy, hello);
      std::string reply;
      wire::EncodeStatus(ok, &reply);
      c.QueueReply(wire::FrameType::kStreamHelloAck, h.seq, std::move(reply));
      if (ok.ok()) {
        c.Serve(std::make_shared<tcp::TcpStreamService>(policy.target, true), 1, "initiator");
        ArrangeIdleClose(policy, h, c);
      }
      return OkStatus();
    });
    UniqueFd served_fd(to_target[1]);
    ASSERT_TRUE(SetNonBlocking(served_fd.get(), true).ok());
    auto served = std::make_shared<Connection>(pool_->loop(0), std::move(served_fd), "served",
                                               openers, std::chrono::milliseconds(5000));
    pool_->loop(0)->RunInLoop([served] { ASSERT_TRUE(served->Attach().ok()); });
    // The initiator: hello (blocking), then a link over the stream.
    UniqueFd fd(to_init[0]);
    wire::StreamHello hello{7, kInstance, 1, 0, "initiator:1"};
    std::string body;
    wire::EncodeStreamHello(hello, &body);
    ASSERT_THAT(SayHello(fd.get(), Credentials{}, "target:1", wire::FrameType::kStreamHello, body,
                         Clock::now() + std::chrono::seconds(10), hello_flags_),
                test::IsOk());
    ASSERT_TRUE(SetNonBlocking(fd.get(), true).ok());
    StreamLinkConfig cfg;
    cfg.encoder = std::make_shared<tcp::TcpFrameEncoder>();
    cfg.max_frame_entries = 4;
    if (tune) tune(cfg);
    link_ = StreamLink::Open(
        cfg, "target:1", 1,
        {std::make_shared<Connection>(pool_->loop(0), std::move(fd), "target:1", 1)});
  }

  // Posts `n` frames of 4 writes each (entry k of frame f: 1 KiB at
  // (4f + k) KiB), plus `bad` entries whose remote range is unregistered,
  // and waits until the batch settles.
  std::shared_ptr<BatchState> Write(size_t frames, std::vector<size_t> bad = {},
                                    std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    auto batch = Post(frames, std::move(bad), deadline);
    EXPECT_TRUE(
        batch->WaitIdle(Clock::now() + std::chrono::seconds(60), std::chrono::microseconds(0)));
    return batch;
  }
  // The same, without waiting.
  std::shared_ptr<BatchState> Post(size_t frames, std::vector<size_t> bad = {},
                                   std::chrono::milliseconds deadline = std::chrono::seconds(30)) {
    const size_t n = frames * 4;
    auto batch = std::make_shared<BatchState>(n);
    EXPECT_TRUE(batch->Reserve(n).ok());
    batch->BeginRange(0, n, [](size_t) { return 1u; });
    std::vector<Slice> slices;
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < 1024; ++j) local_[i * 1024 + j] = static_cast<char>(i * 7 + j);
      uint64_t remote = reinterpret_cast<uint64_t>(remote_.data()) + i * 1024;
      if (std::find(bad.begin(), bad.end(), i) != bad.end())
        remote = 0x1000 + i * 1024;  // unregistered
      slices.push_back({.opcode = Opcode::kWrite,
                        .local = local_.data() + i * 1024,
                        .remote = remote,
                        .length = 1024,
                        .request = static_cast<uint32_t>(i)});
    }
    link_->Post({batch, Clock::now() + deadline, nullptr}, std::move(slices));
    return batch;
  }

  // The stream closes right after it failed its late frames (on the loop
  // thread, just after the completions): wait for it, bounded.
  bool EventuallyBroken() const {
    for (int i = 0; i < 5000 && link_->Healthy(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return !link_->Healthy();
  }

  bool Landed(size_t i) const {
    return std::memcmp(&remote_[i * 1024], &local_[i * 1024], 1024) == 0;
  }

  // The target's idle_link_timeout (HelloPolicy) and the initiator's hello
  // flags, for the next Open.
  std::chrono::milliseconds idle_timeout_{0};
  uint16_t hello_flags_ = wire::kHelloFlagGoAway;
  std::shared_ptr<LoopPool> pool_;
  std::shared_ptr<EngineTarget> target_;
  std::vector<char> remote_, local_;
  std::unique_ptr<FaultLink> fault_;
  std::shared_ptr<PeerLink> link_;
};

TEST_F(StreamTest, WritesThroughAFaultFreeLinkLand) {
  Open({});
  auto batch = Write(3);
  EXPECT_EQ(batch->Summary().completed, 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_TRUE(Landed(i)) << i;
}

// A served stream with no request for the target's idle timeout asks its
// initiator to close it (kGoAway, docs/wire-format.md): the link says
// Closing, and it still works until the core closes it — the target serves
// what the initiator sends meanwhile.
TEST_F(StreamTest, IdleServedStreamAsksItsInitiatorToClose) {
  idle_timeout_ = std::chrono::milliseconds(20);
  Open({});
  EXPECT_EQ(Write(1)->Summary().completed, 4u);
  // Bounded only to end a failing test: the target's loop sleeps until the
  // stream's deadline (20 ms after the last frame), then sends.
  for (int i = 0; i < 20000 && !link_->Closing(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(link_->Closing()) << "no go-away within 20 s";
  EXPECT_TRUE(link_->Healthy());
  EXPECT_TRUE(link_->Idle());
  auto batch = Write(3);
  EXPECT_EQ(batch->Summary().completed, 12u);
  for (size_t i = 0; i < 12; ++i) EXPECT_TRUE(Landed(i)) << i;
  EXPECT_TRUE(link_->Healthy());
}

// An initiator whose hello does not say it handles kGoAway (an older build)
// is never sent one: it would take the frame for a broken stream.
TEST_F(StreamTest, InitiatorThatCannotCloseOnRequestIsNeverAsked) {
  idle_timeout_ = std::chrono::milliseconds(5);
  hello_flags_ = 0;
  Open({});
  EXPECT_EQ(Write(1)->Summary().completed, 4u);
  // 60 timeouts: the frame would have come (see the test above); its
  // absence is what is checked, so a slow machine cannot fail this.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(link_->Closing());
  EXPECT_TRUE(link_->Healthy());
  EXPECT_EQ(Write(2)->Summary().completed, 8u);
}

TEST_F(StreamTest, RefusedEntryFailsAloneInItsFrame) {
  Open({});
  auto batch = Write(1, {2});
  EXPECT_EQ(batch->Summary().completed, 3u);
  EXPECT_THAT(batch->Get(2).status, test::StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(Landed(0) && Landed(1) && Landed(3));
}

TEST_F(StreamTest, DroppedReplyFailsByTheDeadline) {
  Open(Replies({Action::kDrop}));
  auto batch = Write(1, {}, std::chrono::milliseconds(300));
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_THAT(batch->Get(i).status, test::StatusIs(StatusCode::kDeadlineExceeded)) << i;
  }
  EXPECT_TRUE(EventuallyBroken());
}

// Stopping the loops (the engine shuts down) fails the frames in flight
// (their replies were dropped: nothing would ever answer them) with
// kCancelled, and a later post fails at once, though the link is still
// held: nothing waits for a loop that no longer runs.
TEST_F(StreamTest, StoppedLoopsFailWhatTheyHoldAndLaterPostsAtOnce) {
  Open(Replies({Action::kDrop}));
  auto held = Post(2, {}, std::chrono::seconds(600));
  pool_->Stop();
  ASSERT_TRUE(held->WaitIdle(Clock::now() + std::chrono::seconds(60), std::chrono::microseconds(0)))
      << "requests in flight when the loop stopped never finished";
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_THAT(held->Get(i).status, test::StatusIs(StatusCode::kCancelled)) << i;
  }
  auto later = Post(1, {}, std::chrono::seconds(600));
  ASSERT_TRUE(
      later->WaitIdle(Clock::now() + std::chrono::seconds(60), std::chrono::microseconds(0)))
      << "a request posted after the loop stopped never finished";
  EXPECT_EQ(later->Summary().failed, 4u);
  EXPECT_FALSE(link_->Healthy());
}

TEST_F(StreamTest, DelayedRepliesStillComplete) {
  Open(Replies({Action::kDelay, Action::kDelay}, std::chrono::milliseconds(50)));
  auto batch = Write(2);
  EXPECT_EQ(batch->Summary().completed, 8u);
}

TEST_F(StreamTest, ReorderedRepliesCloseTheStreamAndCompleteNothingWrongly) {
  Open(Replies({Action::kReorder, Action::kPass}));
  auto batch = Write(2);
  const BatchStatus s = batch->Summary();
  // The first reply to arrive answers the second frame: it matches no
  // request in order, so the stream closes and both frames fail.
  EXPECT_EQ(s.completed, 0u);
  EXPECT_EQ(s.failed, 8u);
  EXPECT_THAT(s.first_error, test::StatusIs(StatusCode::kDataLoss));
  EXPECT_TRUE(EventuallyBroken());
}

TEST_F(StreamTest, ForgedOutOfOrderFailureListNeverCompletesAFailedEntry) {
  // Entries 1 and 3 are refused by the target; the fault link reverses the
  // reply's failure list ([3, 1]). Read in index order without a check, entry
  // 1 would be marked completed although nothing was written.
  Open(Replies({Action::kCorrupt}));
  auto batch = Write(1, {1, 3});
  EXPECT_NE(batch->Get(1).state, TransferState::kCompleted);
  EXPECT_NE(batch->Get(3).state, TransferState::kCompleted);
  EXPECT_THAT(batch->Get(1).status, test::StatusIs(StatusCode::kDataLoss));
  EXPECT_TRUE(EventuallyBroken());
}

TEST_F(StreamTest, PeerThatDiesFailsEveryRequestUnavailable) {
  Open(Replies({Action::kPass, Action::kFail}));
  auto batch = Write(3);
  const BatchStatus s = batch->Summary();
  EXPECT_EQ(s.completed + s.failed, 12u);
  EXPECT_GE(s.failed, 4u);
  for (size_t i = 0; i < 12; ++i) {
    const TransferStatus t = batch->Get(i);
    if (t.state == TransferState::kCompleted) {
      EXPECT_TRUE(Landed(i)) << i;
    }
    if (t.state == TransferState::kFailed) {
      EXPECT_THAT(t.status, test::StatusIs(StatusCode::kUnavailable)) << i;
    }
  }
}

TEST_F(StreamTest, RandomFaultsBySeedAreRepeatableAndNothingIsLost) {
  std::vector<std::vector<Action>> runs;
  for (int run = 0; run < 2; ++run) {
    FaultLink::Plan plan = Replies({}, std::chrono::milliseconds(5));
    plan.seed = 1234;
    plan.drop_pct = 10;
    plan.delay_pct = 20;
    plan.reorder_pct = 10;
    plan.corrupt_pct = 10;
    Open(std::move(plan));
    auto batch = Write(6, {5}, std::chrono::milliseconds(500));
    const BatchStatus s = batch->Summary();
    EXPECT_EQ(s.completed + s.failed, 24u);  // every request ended
    for (size_t i = 0; i < 24; ++i) {
      if (batch->Get(i).state == TransferState::kCompleted) {
        EXPECT_TRUE(Landed(i)) << i;
      }
    }
    EXPECT_NE(batch->Get(5).state, TransferState::kCompleted);  // refused by the target
    runs.push_back(fault_->taken());
    link_->Retire();
    link_.reset();
    fault_.reset();
    std::fill(remote_.begin(), remote_.end(), 0);
  }
  // The first actions (before a fault closes the stream) repeat exactly.
  ASSERT_FALSE(runs[0].empty());
  EXPECT_EQ(runs[0].front(), runs[1].front());
}

// peer_max_requests: with room for one frame (4 slices) at a time, Post
// waits for each answer before the next frame goes out, and every write
// still lands.
TEST_F(StreamTest, PeerBudgetHoldsFramesBackAndEverythingLands) {
  Open({}, [](StreamLinkConfig& c) { c.max_outstanding_slices = 4; });
  auto batch = Write(40);
  EXPECT_EQ(batch->Summary().completed, 160u);
  for (size_t i = 0; i < 160; ++i) EXPECT_TRUE(Landed(i)) << i;
}

TEST_F(StreamTest, PeerBudgetByBytesHoldsFramesBackAndEverythingLands) {
  Open({}, [](StreamLinkConfig& c) { c.max_outstanding_bytes = 6 * 1024; });  // one frame (4 KiB)
  auto batch = Write(20);
  EXPECT_EQ(batch->Summary().completed, 80u);
  for (size_t i = 0; i < 80; ++i) EXPECT_TRUE(Landed(i)) << i;
}

// A peer that answers nothing: the frames that got room fail at their
// deadline; the ones still waiting for room fail kResourceExhausted naming
// the limit — none is left pending, none reported done.
TEST_F(StreamTest, PeerBudgetExhaustedUntilTheDeadlineFailsTheRestNamingTheLimit) {
  Open(Replies(std::vector<Action>(64, Action::kDrop)),
       [](StreamLinkConfig& c) { c.max_outstanding_slices = 8; });
  auto batch = Write(10, {}, std::chrono::milliseconds(400));
  const BatchStatus s = batch->Summary();
  EXPECT_EQ(s.failed, 40u);
  size_t exhausted = 0;
  for (size_t i = 0; i < 40; ++i) {
    const TransferStatus t = batch->Get(i);
    if (t.status.code() == StatusCode::kResourceExhausted) {
      ++exhausted;
      EXPECT_NE(t.status.message().find("peer_max_requests = 8"), std::string::npos) << t.status;
    } else {
      EXPECT_THAT(t.status, test::StatusIs(StatusCode::kDeadlineExceeded)) << i;
    }
  }
  EXPECT_GE(exhausted, 32u);  // at most two frames (8 slices) had room
}

// A peer that sends read requests and never reads the answers: the served
// stream stops reading its requests once the unsent replies pass the bound
// (so TCP's flow control stops the peer), instead of queueing replies
// without end. Without that rule every request below would be read.
TEST_F(StreamTest, ServedStreamStopsReadingFromAPeerThatReadsNoReplies) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd client(sv[0]);
  auto service = std::make_shared<tcp::TcpStreamService>(target_, true);
  auto served = std::make_shared<Connection>(pool_->loop(0), UniqueFd(sv[1]), "served",
                                             std::make_shared<FirstFrames>(),
                                             std::chrono::milliseconds(60000));
  ASSERT_TRUE(SetNonBlocking(sv[1], true).ok());
  pool_->loop(0)->RunInLoop([served, service] {
    served->Serve(service, 1, "reader");
    ASSERT_TRUE(served->Attach().ok());
  });
  // One read request frame of one 4 KiB entry, sent again and again.
  tcp::TcpFrameEncoder enc;
  Slice one{.opcode = Opcode::kRead,
            .local = local_.data(),
            .remote = reinterpret_cast<uint64_t>(remote_.data()),
            .length = 4096,
            .request = 0};
  RequestFrame r;
  enc.Encode(Opcode::kRead, &one, 1, 4096, 1, &r);
  ASSERT_TRUE(SetNonBlocking(client.get(), true).ok());
  constexpr size_t kCap = 400000;  // far above what the bound lets in
  size_t sent = 0;
  auto stalled_since = Clock::now();
  std::string pending = r.head;
  size_t off = 0;
  while (sent < kCap && Clock::now() - stalled_since < std::chrono::seconds(2)) {
    ssize_t w = ::send(client.get(), pending.data() + off, pending.size() - off,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) {
      off += static_cast<size_t>(w);
      if (off == pending.size()) {
        ++sent;
        off = 0;
      }
      stalled_since = Clock::now();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  EXPECT_LT(sent, kCap) << "the served stream kept reading requests whose replies nobody read";
  pool_->loop(0)->RunInLoop([served] { served->CloseAsync(CancelledError("test over")); });
}

// A service whose replies stay unfinished, each holding `kHolds` bytes (a
// staging buffer of file I/O), until the test finishes them.
class HoldingService : public FrameService {
 public:
  static constexpr uint64_t kHolds = 16u << 20;
  bool Accepts(wire::FrameType t) const override { return t == wire::FrameType::kWrite; }
  Status OnFrame(Connection& c, const wire::FrameHeader& h, std::string_view) override {
    std::lock_guard<std::mutex> lock(mu);
    places.push_back({c.ReserveReply(kHolds), h.seq});
    return OkStatus();
  }
  Status OnPayload(Connection&, const wire::FrameHeader&) override { return OkStatus(); }
  size_t Served() {
    std::lock_guard<std::mutex> lock(mu);
    return places.size();
  }
  // Finishes replies [from, to) (any thread, as the file ring's does).
  void Finish(size_t from, size_t to) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t k = from; k < to; ++k) {
      std::string body;
      wire::EncodeReply({}, &body);
      Connection::FinishReply(places[k].first, wire::FrameType::kAck, places[k].second,
                              std::move(body));
    }
  }
  std::mutex mu;
  std::vector<std::pair<Connection::ReplyPlace, uint64_t>> places;
};

TEST_F(StreamTest, ServedStreamStopsReadingWhileUnfinishedRepliesHoldTooMuch) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd client(sv[0]);
  auto service = std::make_shared<HoldingService>();
  auto served = std::make_shared<Connection>(pool_->loop(0), UniqueFd(sv[1]), "served",
                                             std::make_shared<FirstFrames>(),
                                             std::chrono::milliseconds(60000));
  ASSERT_TRUE(SetNonBlocking(sv[1], true).ok());
  pool_->loop(0)->RunInLoop([served, service] {
    served->Serve(service, 1, "writer");
    ASSERT_TRUE(served->Attach().ok());
  });
  // Small frames: one read of the stream takes them all; the stream serves
  // them only up to the bound (the rest wait in its reader, Sink::Hold).
  constexpr size_t kFrames = 12;
  std::string all;
  for (uint64_t k = 1; k <= kFrames; ++k) {
    wire::FrameHeader h;
    h.version = 1;
    h.type = wire::FrameType::kWrite;
    h.seq = k;
    all += wire::BuildFrame(h, std::string(100, 'x'));
  }
  ASSERT_EQ(::send(client.get(), all.data(), all.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(all.size()));
  // Served (the loop thread's work up to now done: a task queued behind it ran).
  auto served_now = [&](size_t expect) {
    for (int i = 0; i < 10000 && service->Served() < expect; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int round = 0; round < 2; ++round) {  // two: a loop round with its events in between
      std::promise<void> ran;
      pool_->loop(0)->RunInLoop([&ran] { ran.set_value(); });
      ran.get_future().wait();
    }
    return service->Served();
  };
  const size_t first =
      Connection::kHeldHighBytes / HoldingService::kHolds + 1;  // 5: past the bound
  EXPECT_EQ(served_now(first), first)
      << "read on past " << Connection::kHeldHighBytes << " bytes held by unfinished replies";
  // Finishing two leaves 48 MiB held: above half the bound, still paused.
  service->Finish(0, 2);
  EXPECT_EQ(served_now(first), first);
  // One more: 32 MiB, half the bound: it reads until the bound is passed again.
  service->Finish(2, 3);
  EXPECT_EQ(served_now(first + 3), first + 3);
  // All finished: it reads the rest, and every reply arrives, in order.
  service->Finish(3, first + 3);
  EXPECT_EQ(served_now(kFrames), kFrames);
  service->Finish(first + 3, kFrames);
  FrameReaderSink replies;
  FrameReader reader(&replies);
  char buf[4096];
  for (int i = 0; i < 10000 && replies.seqs.size() < kFrames; ++i) {
    const ssize_t r = ::recv(client.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (r > 0) {
      ASSERT_OK(reader.Consume(buf, static_cast<size_t>(r)));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::vector<uint64_t> want(kFrames);
  std::iota(want.begin(), want.end(), 1);
  EXPECT_EQ(replies.seqs, want);
  pool_->loop(0)->RunInLoop([served] { served->CloseAsync(CancelledError("test over")); });
}

TEST(Listener, ServeFailsWhenTheLoopCannotWatchTheSocket) {
  auto pool = LoopPool::Start(1, std::chrono::microseconds(0));
  ASSERT_TRUE(pool.ok());
  // A regular file cannot be watched by epoll (EPERM): the listener must say
  // so instead of leaving a dead port behind.
  UniqueFd file(::open("/proc/self/stat", O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(file.valid());
  ListenerConfig cfg;
  cfg.name = "test port";
  cfg.openers = std::make_shared<FirstFrames>();
  auto l = Listener::Serve(std::move(file), std::move(cfg), **pool);
  EXPECT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("test port"), std::string::npos) << l.status();
  (*pool)->Stop();
}

}  // namespace
}  // namespace ferry::internal::stream
