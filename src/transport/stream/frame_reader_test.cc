// The socket-free FrameReader, fed bytes directly: what it reports to its
// sink, where a frame's payload lands, and what it refuses.
#include "transport/stream/frame_reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "wire/frame.h"

namespace ferry::internal::stream {
namespace {

using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using wire::FrameHeader;
using wire::FrameType;

// Where the sink puts the payload of one frame: each step is a destination
// (dest != nullptr) or a discard of `length` bytes.
struct Place {
  char* dest = nullptr;
  size_t length = 0;
};
struct Plan {
  bool expect = false;  // calls ExpectPayload()
  std::vector<Place> places;
};

// Records every event as text ("header 10 seq=1", "frame 10 seq=1 body=..",
// "payload 10 seq=1") and places payloads as `plan` says.
class RecordingSink : public FrameReader::Sink {
 public:
  void set_reader(FrameReader* r) { reader_ = r; }

  // Frame -> where its payload goes. Unset: the sink expects no payload.
  std::function<Plan(const FrameHeader&, std::string_view body)> plan;
  // What OnHeader answers.
  Status header_answer;

  std::vector<std::string> events;

  Status OnHeader(const FrameHeader& h) override {
    events.push_back("header " + Describe(h));
    return header_answer;
  }
  Status OnFrame(const FrameHeader& h, std::string_view body) override {
    events.push_back("frame " + Describe(h) + " body=" + std::string(body));
    if (!plan) return OkStatus();
    Plan p = plan(h, body);
    if (!p.expect) return OkStatus();
    reader_->ExpectPayload();
    for (const Place& pl : p.places) {
      if (pl.dest != nullptr) {
        reader_->AddDestination(pl.dest, pl.length);
      } else {
        reader_->AddDiscard(pl.length);
      }
    }
    return OkStatus();
  }
  Status OnPayload(const FrameHeader& h) override {
    events.push_back("payload " + Describe(h));
    return OkStatus();
  }
  // What Hold answers; each time it is asked is an event too.
  bool hold = false;
  bool Hold() const override {
    asked_hold = true;
    return hold;
  }
  mutable bool asked_hold = false;

 private:
  static std::string Describe(const FrameHeader& h) {
    return std::to_string(static_cast<int>(h.type)) + " seq=" + std::to_string(h.seq);
  }
  FrameReader* reader_ = nullptr;
};

// Header + body + payload, as a peer sends them.
std::string Frame(FrameType type, uint64_t seq, std::string_view body,
                  std::string_view payload = {}) {
  FrameHeader h;
  h.version = 1;
  h.type = type;
  h.seq = seq;
  h.payload_len = static_cast<uint32_t>(payload.size());
  std::string out = wire::BuildFrame(h, body);
  out.append(payload);
  return out;
}

// Header bytes exactly as given (no BuildFrame fix-ups).
std::string RawHeader(const FrameHeader& h) {
  std::string out(wire::kFrameHeaderSize, '\0');
  wire::EncodeHeader(h, reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

// Copies up to `n` bytes of `src` into the vectors, as readv would.
size_t FillIov(const iovec* iov, size_t count, const char* src, size_t n) {
  size_t done = 0;
  for (size_t i = 0; i < count && done < n; ++i) {
    const size_t k = std::min(n - done, iov[i].iov_len);
    std::memcpy(iov[i].iov_base, src + done, k);
    done += k;
  }
  return done;
}

// One reader with its sink.
struct Harness {
  Harness() { sink.set_reader(&reader); }
  RecordingSink sink;
  FrameReader reader{&sink};
};

// A write frame (seq 1, 10 payload bytes into dest) and a notify (seq 2, no
// payload), then an ack with an empty body (seq 3).
class TwoFrames : public ::testing::Test {
 protected:
  static constexpr std::string_view kPayload = "0123456789";
  std::string Stream() const {
    return Frame(FrameType::kWrite, 1, "write-body", kPayload) +
           Frame(FrameType::kNotify, 2, "notify-body") + Frame(FrameType::kAck, 3, "");
  }
  void Arm(Harness& h, char* dest) {
    h.sink.plan = [dest](const FrameHeader& fh, std::string_view) {
      if (fh.type != FrameType::kWrite) return Plan{};
      return Plan{true, {{dest, kPayload.size()}}};
    };
  }
  const std::vector<std::string> kEvents = {
      "header 10 seq=1",      "frame 10 seq=1 body=write-body",  "payload 10 seq=1",
      "header 12 seq=2",      "frame 12 seq=2 body=notify-body", "header 20 seq=3",
      "frame 20 seq=3 body=",
  };
};

TEST_F(TwoFrames, OneCallGivesEveryEventInOrder) {
  Harness h;
  char dest[10] = {};
  Arm(h, dest);
  const std::string s = Stream();
  ASSERT_THAT(h.reader.Consume(s.data(), s.size()), IsOk());
  EXPECT_EQ(h.sink.events, kEvents);
  EXPECT_EQ(std::string_view(dest, sizeof(dest)), kPayload);
  EXPECT_FALSE(h.reader.InPayload());
}

TEST_F(TwoFrames, ByteByByteGivesTheSameEventsAsOneCall) {
  Harness one, bytes;
  char dest_one[10] = {}, dest_bytes[10] = {};
  Arm(one, dest_one);
  Arm(bytes, dest_bytes);
  const std::string s = Stream();
  ASSERT_THAT(one.reader.Consume(s.data(), s.size()), IsOk());
  for (size_t i = 0; i < s.size(); ++i)
    ASSERT_THAT(bytes.reader.Consume(s.data() + i, 1), IsOk()) << i;
  EXPECT_EQ(bytes.sink.events, one.sink.events);
  EXPECT_EQ(bytes.sink.events, kEvents);
  EXPECT_EQ(std::string_view(dest_bytes, 10), std::string_view(dest_one, 10));
}

TEST_F(TwoFrames, EverySplitPointGivesTheSameEvents) {
  const std::string s = Stream();
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    Harness h;
    char dest[10] = {};
    Arm(h, dest);
    ASSERT_THAT(h.reader.Consume(s.data(), cut), IsOk()) << cut;
    ASSERT_THAT(h.reader.Consume(s.data() + cut, s.size() - cut), IsOk()) << cut;
    EXPECT_EQ(h.sink.events, kEvents) << cut;
    EXPECT_EQ(std::string_view(dest, 10), kPayload) << cut;
  }
}

TEST_F(TwoFrames, AHoldingSinkStopsAfterAWholeFrameAndTheRestWaits) {
  const std::string s = Stream();
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    Harness h;
    char dest[10] = {};
    Arm(h, dest);
    h.sink.hold = true;
    // Fed in two parts, as two reads of a socket: each part stops after the
    // first frame it completes; the rest waits in the reader.
    ASSERT_THAT(h.reader.Consume(s.data(), cut), IsOk()) << cut;
    if (h.reader.HasPending()) {
      EXPECT_EQ(h.sink.events.back(), "payload 10 seq=1") << cut;
    }
    // Resumed while still holding: one more frame at a time.
    for (int k = 0; k < 4 && h.reader.HasPending(); ++k)
      ASSERT_THAT(h.reader.ConsumePending(), IsOk()) << cut;
    ASSERT_FALSE(h.reader.HasPending()) << cut;
    h.sink.hold = false;
    ASSERT_THAT(h.reader.Consume(s.data() + cut, s.size() - cut), IsOk()) << cut;
    while (h.reader.HasPending()) ASSERT_THAT(h.reader.ConsumePending(), IsOk()) << cut;
    EXPECT_EQ(h.sink.events, kEvents) << cut;
    EXPECT_EQ(std::string_view(dest, 10), kPayload) << cut;
  }
}

TEST_F(TwoFrames, HoldStopsAtEachFrameBoundaryAndNowhereElse) {
  Harness h;
  char dest[10] = {};
  Arm(h, dest);
  h.sink.hold = true;
  const std::string s = Stream();
  ASSERT_THAT(h.reader.Consume(s.data(), s.size()), IsOk());
  EXPECT_EQ(h.sink.events, std::vector<std::string>(kEvents.begin(), kEvents.begin() + 3));
  EXPECT_TRUE(h.reader.HasPending());
  ASSERT_THAT(h.reader.ConsumePending(), IsOk());
  EXPECT_EQ(h.sink.events, std::vector<std::string>(kEvents.begin(), kEvents.begin() + 5));
  ASSERT_THAT(h.reader.ConsumePending(), IsOk());
  EXPECT_EQ(h.sink.events, kEvents);
  EXPECT_FALSE(h.reader.HasPending());
  // The last frame ended the bytes: nothing to hold, not asked then.
  h.sink.asked_hold = false;
  const std::string one = Frame(FrameType::kAck, 4, "x");
  ASSERT_THAT(h.reader.Consume(one.data(), one.size()), IsOk());
  EXPECT_FALSE(h.sink.asked_hold);
  EXPECT_FALSE(h.reader.HasPending());
}

TEST(FrameReader, EventsArriveOnlyWhenTheirPartIsComplete) {
  Harness h;
  char dest[4] = {};
  h.sink.plan = [&](const FrameHeader&, std::string_view) { return Plan{true, {{dest, 4}}}; };
  const std::string s = Frame(FrameType::kWrite, 7, "bb", "pppp");
  const size_t header = wire::kFrameHeaderSize;
  ASSERT_THAT(h.reader.Consume(s.data(), header - 1), IsOk());
  EXPECT_TRUE(h.sink.events.empty());
  ASSERT_THAT(h.reader.Consume(s.data() + header - 1, 2), IsOk());  // header + 1 body byte
  EXPECT_THAT(h.sink.events, ElementsAre("header 10 seq=7"));
  ASSERT_THAT(h.reader.Consume(s.data() + header + 1, 1), IsOk());  // body complete
  EXPECT_THAT(h.sink.events, ElementsAre("header 10 seq=7", "frame 10 seq=7 body=bb"));
  EXPECT_TRUE(h.reader.InPayload());
  EXPECT_EQ(h.reader.PayloadLeft(), 4u);
  ASSERT_THAT(h.reader.Consume(s.data() + header + 2, 3), IsOk());
  EXPECT_EQ(h.reader.PayloadLeft(), 1u);
  EXPECT_EQ(h.sink.events.size(), 2u);
  ASSERT_THAT(h.reader.Consume(s.data() + header + 5, 1), IsOk());
  EXPECT_EQ(h.sink.events.back(), "payload 10 seq=7");
  EXPECT_FALSE(h.reader.InPayload());
}

// dest: 64 bytes of '.'; payload "AAAABBBB" + 5 discarded "xxxxx" + "CCC":
// AAAA -> dest[0..4), BBBB -> dest[4..8) (adjacent: one iovec), xxxxx
// dropped, CCC -> dest[20..23).
class Placement : public ::testing::Test {
 protected:
  static constexpr std::string_view kPayload = "AAAABBBBxxxxxCCC";
  void SetUp() override { std::memset(dest_, '.', sizeof(dest_)); }
  Plan MakePlan() {
    return Plan{true, {{dest_, 4}, {dest_ + 4, 4}, {nullptr, 5}, {dest_ + 20, 3}}};
  }
  void ExpectLanded() {
    const std::string got(dest_, sizeof(dest_));
    EXPECT_EQ(got.substr(0, 8), "AAAABBBB");
    EXPECT_EQ(got.substr(8, 12), std::string(12, '.'));  // around the discard: untouched
    EXPECT_EQ(got.substr(20, 3), "CCC");
    EXPECT_EQ(got.substr(23), std::string(sizeof(dest_) - 23, '.'));
    EXPECT_EQ(got.find('x'), std::string::npos) << got;
  }
  char dest_[64];
};

TEST_F(Placement, WritePayloadLandsInTheDestinationsAndDiscardsLandNowhere) {
  Harness h;
  h.sink.plan = [&](const FrameHeader&, std::string_view) { return MakePlan(); };
  const std::string s = Frame(FrameType::kWrite, 1, "entries", kPayload);
  ASSERT_THAT(h.reader.Consume(s.data(), s.size()), IsOk());
  EXPECT_THAT(h.sink.events,
              ElementsAre("header 10 seq=1", "frame 10 seq=1 body=entries", "payload 10 seq=1"));
  ExpectLanded();
}

TEST_F(Placement, AdjacentDestinationsShareOneIovec) {
  Harness h;
  h.sink.plan = [&](const FrameHeader&, std::string_view) { return MakePlan(); };
  const std::string s = Frame(FrameType::kWrite, 1, "entries", kPayload);
  const size_t head = s.size() - kPayload.size();
  ASSERT_THAT(h.reader.Consume(s.data(), head), IsOk());
  ASSERT_TRUE(h.reader.InPayload());
  EXPECT_EQ(h.reader.PayloadLeft(), kPayload.size());
  ASSERT_EQ(h.reader.PayloadIovCount(), 3u);  // [dest, 8), discard 5, [dest + 20, 3)
  const iovec* iov = h.reader.PayloadIov();
  EXPECT_EQ(iov[0].iov_base, dest_);
  EXPECT_EQ(iov[0].iov_len, 8u);
  EXPECT_EQ(iov[1].iov_len, 5u);
  EXPECT_NE(iov[1].iov_base, dest_ + 8);  // the discard does not go into dest
  EXPECT_EQ(iov[2].iov_base, dest_ + 20);
  EXPECT_EQ(iov[2].iov_len, 3u);
}

TEST_F(Placement, PayloadThroughPayloadIovAndAdvanceEqualsConsume) {
  Harness h;
  h.sink.plan = [&](const FrameHeader&, std::string_view) { return MakePlan(); };
  const std::string s = Frame(FrameType::kWrite, 1, "entries", kPayload);
  const size_t head = s.size() - kPayload.size();
  ASSERT_THAT(h.reader.Consume(s.data(), head), IsOk());
  // As a readv that returns at most 3 bytes at a time (cutting iovecs).
  size_t off = head;
  while (h.reader.InPayload()) {
    const size_t want = std::min<size_t>(3, s.size() - off);
    ASSERT_GT(want, 0u);
    const size_t got =
        FillIov(h.reader.PayloadIov(), h.reader.PayloadIovCount(), s.data() + off, want);
    ASSERT_EQ(got, want);
    const size_t left = h.reader.PayloadLeft();
    ASSERT_THAT(h.reader.Advance(got), IsOk());
    if (h.reader.InPayload()) {
      EXPECT_EQ(h.reader.PayloadLeft(), left - got);
    }
    off += got;
  }
  EXPECT_EQ(off, s.size());
  ExpectLanded();

  // The same frame through Consume only.
  Harness c;
  char other[64];
  std::memset(other, '.', sizeof(other));
  c.sink.plan = [&](const FrameHeader&, std::string_view) {
    return Plan{true, {{other, 4}, {other + 4, 4}, {nullptr, 5}, {other + 20, 3}}};
  };
  ASSERT_THAT(c.reader.Consume(s.data(), s.size()), IsOk());
  EXPECT_EQ(h.sink.events, c.sink.events);
  EXPECT_EQ(std::string(dest_, sizeof(dest_)), std::string(other, sizeof(other)));
}

TEST(FrameReader, DiscardLargerThanTheScratchBufferIsDrained) {
  Harness h;
  constexpr size_t kDrop = 150 * 1024;  // more than one scratch buffer's worth
  char before[4], after[4];
  std::memset(before, '.', 4);
  std::memset(after, '.', 4);
  h.sink.plan = [&](const FrameHeader& fh, std::string_view) {
    if (fh.type != FrameType::kWrite) return Plan{};
    return Plan{true, {{before, 4}, {nullptr, kDrop}, {after, 4}}};
  };
  const std::string payload = "head" + std::string(kDrop, 'x') + "tail";
  const std::string s =
      Frame(FrameType::kWrite, 1, "e", payload) + Frame(FrameType::kAck, 2, "next");
  ASSERT_THAT(h.reader.Consume(s.data(), s.size()), IsOk());
  EXPECT_EQ(std::string_view(before, 4), "head");
  EXPECT_EQ(std::string_view(after, 4), "tail");
  EXPECT_THAT(h.sink.events,
              ElementsAre("header 10 seq=1", "frame 10 seq=1 body=e", "payload 10 seq=1",
                          "header 20 seq=2", "frame 20 seq=2 body=next"));
}

TEST(FrameReader, PayloadNobodyExpectsIsDataLossNamingPayload) {
  Harness h;  // no plan: the sink never calls ExpectPayload
  const std::string s = Frame(FrameType::kWrite, 1, "e", "12345");
  EXPECT_THAT(h.reader.Consume(s.data(), s.size()),
              StatusIs(StatusCode::kDataLoss, HasSubstr("payload")));
  EXPECT_THAT(h.sink.events, ElementsAre("header 10 seq=1", "frame 10 seq=1 body=e"));
}

TEST(FrameReader, SinkPlacingFewerBytesThanAnnouncedIsDataLoss) {
  Harness h;
  char dest[16] = {};
  h.sink.plan = [&](const FrameHeader&, std::string_view) { return Plan{true, {{dest, 5}}}; };
  const std::string s = Frame(FrameType::kWrite, 1, "e", "0123456789");
  EXPECT_THAT(h.reader.Consume(s.data(), s.size()),
              StatusIs(StatusCode::kDataLoss, HasSubstr("payload")));
  EXPECT_THAT(h.sink.events, ElementsAre("header 10 seq=1", "frame 10 seq=1 body=e"));
  EXPECT_EQ(std::string(dest, 16), std::string(16, '\0'));  // nothing landed
}

TEST(FrameReader, SinkPlacingMoreBytesThanAnnouncedIsDataLoss) {
  Harness h;
  char dest[16] = {};
  h.sink.plan = [&](const FrameHeader&, std::string_view) {
    return Plan{true, {{dest, 8}, {nullptr, 4}}};
  };
  const std::string s = Frame(FrameType::kWrite, 1, "e", "0123456789");
  EXPECT_THAT(h.reader.Consume(s.data(), s.size()),
              StatusIs(StatusCode::kDataLoss, HasSubstr("payload")));
  EXPECT_EQ(h.sink.events.size(), 2u);
}

TEST(FrameReader, ExpectingPayloadOfAFrameThatHasNoneIsDataLoss) {
  Harness h;
  char dest[4] = {};
  h.sink.plan = [&](const FrameHeader&, std::string_view) { return Plan{true, {{dest, 4}}}; };
  const std::string s = Frame(FrameType::kWrite, 1, "e");  // payload_len 0
  EXPECT_THAT(h.reader.Consume(s.data(), s.size()), StatusIs(StatusCode::kDataLoss));
  EXPECT_EQ(h.sink.events.size(), 2u);
}

TEST(FrameReader, HeaderRefusedBySinkStopsTheReader) {
  Harness h;
  h.sink.header_answer = FailedPreconditionError("no writes on this stream");
  const std::string s = Frame(FrameType::kWrite, 1, "e", "1234") + Frame(FrameType::kAck, 2, "x");
  EXPECT_THAT(h.reader.Consume(s.data(), s.size()),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("no writes")));
  EXPECT_THAT(h.sink.events, ElementsAre("header 10 seq=1"));  // no OnFrame, nothing after it
}

TEST(FrameReader, HeaderRefusedBySinkStopsTheReaderEvenWithAnEmptyBody) {
  Harness h;
  h.sink.header_answer = DataLossError("unexpected ack");
  const std::string s = Frame(FrameType::kAck, 1, "");
  EXPECT_THAT(h.reader.Consume(s.data(), s.size()),
              StatusIs(StatusCode::kDataLoss, HasSubstr("unexpected ack")));
  EXPECT_THAT(h.sink.events, ElementsAre("header 20 seq=1"));
}

TEST(FrameReader, HeadersDecodeHeaderRefusesAreDataLossAndReachNoSink) {
  FrameHeader ok;
  ok.version = 1;
  ok.type = FrameType::kWrite;
  ok.body_len = 4;

  std::string bad_magic = RawHeader(ok);
  bad_magic[0] = 'G';

  std::string unknown_type = RawHeader(ok);
  unknown_type[5] = 99;

  FrameHeader big = ok;
  big.body_len = wire::kMaxDataBody + 1;
  FrameHeader big_handshake = ok;
  big_handshake.type = FrameType::kHandshakeRequest;
  big_handshake.body_len = wire::kMaxHandshakeBody + 1;
  FrameHeader big_payload = ok;
  big_payload.payload_len = wire::kMaxPayload + 1;
  FrameHeader read_with_payload = ok;
  read_with_payload.type = FrameType::kRead;
  read_with_payload.payload_len = 4;

  const struct {
    const char* name;
    std::string bytes;
    const char* says;
  } cases[] = {
      {"bad magic", bad_magic, "magic"},
      {"unknown type", unknown_type, "type 99"},
      {"oversized body", RawHeader(big), "exceeds"},
      {"oversized handshake body", RawHeader(big_handshake), "exceeds"},
      {"oversized payload", RawHeader(big_payload), "exceeds"},
      {"payload on a read", RawHeader(read_with_payload), "payload"},
  };
  for (const auto& c : cases) {
    Harness h;
    EXPECT_THAT(h.reader.Consume(c.bytes.data(), c.bytes.size()),
                StatusIs(StatusCode::kDataLoss, HasSubstr(c.says)))
        << c.name;
    EXPECT_TRUE(h.sink.events.empty()) << c.name;
  }
  // The same header unharmed is accepted.
  Harness h;
  const std::string good = RawHeader(ok);
  EXPECT_THAT(h.reader.Consume(good.data(), good.size()), IsOk());
  EXPECT_THAT(h.sink.events, ElementsAre("header 10 seq=0"));
}

TEST(FrameReader, ZeroLengthPayloadExpectedCallsOnPayloadAtOnce) {
  Harness h;
  h.sink.plan = [](const FrameHeader& fh, std::string_view) {
    return fh.type == FrameType::kReadData ? Plan{true, {}} : Plan{};
  };
  const std::string s = Frame(FrameType::kReadData, 4, "reply");
  ASSERT_THAT(h.reader.Consume(s.data(), s.size()), IsOk());
  EXPECT_THAT(h.sink.events,
              ElementsAre("header 21 seq=4", "frame 21 seq=4 body=reply", "payload 21 seq=4"));
  EXPECT_FALSE(h.reader.InPayload());
  // And the reader goes on with the next frame.
  const std::string next = Frame(FrameType::kAck, 5, "n");
  ASSERT_THAT(h.reader.Consume(next.data(), next.size()), IsOk());
  EXPECT_EQ(h.sink.events.back(), "frame 20 seq=5 body=n");
}

TEST(FrameReader, AdvancePastThePayloadsEndIsAnError) {
  Harness h;
  char dest[8] = {};
  h.sink.plan = [&](const FrameHeader&, std::string_view) { return Plan{true, {{dest, 8}}}; };
  const std::string s = Frame(FrameType::kWrite, 1, "e", "abcdefgh");
  const size_t head = s.size() - 8;
  ASSERT_THAT(h.reader.Consume(s.data(), head), IsOk());
  ASSERT_TRUE(h.reader.InPayload());
  ASSERT_THAT(h.reader.Advance(3), IsOk());
  EXPECT_EQ(h.reader.PayloadLeft(), 5u);
  EXPECT_THAT(h.reader.Advance(6), StatusIs(StatusCode::kInternal, HasSubstr("past")));
  EXPECT_EQ(h.sink.events.size(), 2u);  // no OnPayload
}

TEST(FrameReader, AdvanceWithNoPayloadInProgressIsAnError) {
  Harness h;
  EXPECT_FALSE(h.reader.InPayload());
  EXPECT_THAT(h.reader.Advance(1), StatusIs(StatusCode::kInternal));
  EXPECT_TRUE(h.sink.events.empty());
}

}  // namespace
}  // namespace ferry::internal::stream
