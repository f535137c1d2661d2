#include "wire/frame.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/options.h"
#include "tests/testing/status_matchers.h"

namespace ferry::wire {
namespace {

TEST(Frame, HeaderRoundTrip) {
  FrameHeader h;
  h.version = 1;
  h.type = FrameType::kWrite;
  h.flags = 7;
  h.body_len = 100;
  h.payload_len = 1 << 20;
  h.seq = 0x0123456789abcdefull;
  uint8_t buf[kFrameHeaderSize];
  EncodeHeader(h, buf);
  EXPECT_EQ(buf[0], 'F');
  EXPECT_EQ(buf[3], 'Y');
  auto d = DecodeHeader(buf);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->version, 1);
  EXPECT_EQ(d->type, FrameType::kWrite);
  EXPECT_EQ(d->flags, 7);
  EXPECT_EQ(d->body_len, 100u);
  EXPECT_EQ(d->payload_len, 1u << 20);
  EXPECT_EQ(d->seq, h.seq);
}

TEST(Frame, HeaderRejectsGarbage) {
  uint8_t buf[kFrameHeaderSize] = {'G', 'E', 'T', ' ', '/'};
  auto d = DecodeHeader(buf);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kDataLoss);

  FrameHeader h;
  h.type = FrameType::kRead;
  h.payload_len = 5;  // reads carry no payload
  EncodeHeader(h, buf);
  EXPECT_FALSE(DecodeHeader(buf).ok());
  h.type = FrameType::kWrite;
  h.payload_len = kMaxPayload + 1;
  EncodeHeader(h, buf);
  EXPECT_FALSE(DecodeHeader(buf).ok());
  h.payload_len = 0;
  h.body_len = kMaxDataBody + 1;
  EncodeHeader(h, buf);
  EXPECT_FALSE(DecodeHeader(buf).ok());
  buf[5] = 99;  // unknown type
  EXPECT_FALSE(DecodeHeader(buf).ok());
}

TEST(Frame, EntriesRoundTripAndLimits) {
  std::vector<Entry> in = {{0x1000, 5}, {0xffffffffffff0000ull, 1u << 20}};
  std::string body;
  EncodeEntries(in.data(), in.size(), &body);
  EXPECT_EQ(body.size(), EntriesSize(2));
  auto out = DecodeEntries(body);
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[1].addr, in[1].addr);
  EXPECT_EQ((*out)[1].length, in[1].length);
  EXPECT_FALSE(DecodeEntries(body.substr(0, body.size() - 1)).ok());
  EXPECT_FALSE(DecodeEntries(body + "x").ok());
  std::string empty;
  EncodeEntries(nullptr, 0, &empty);
  EXPECT_FALSE(DecodeEntries(empty).ok());
}

TEST(Frame, ReplyRoundTrip) {
  Reply r;
  r.status = OkStatus();
  r.failures.push_back({3, StatusCode::kInvalidArgument, "range [0x10, +4) not registered"});
  std::string body;
  EncodeReply(r, &body);
  auto d = DecodeReply(body);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->status.ok());
  ASSERT_EQ(d->failures.size(), 1u);
  EXPECT_EQ(d->failures[0].index, 3u);
  EXPECT_EQ(d->failures[0].code, StatusCode::kInvalidArgument);
  EXPECT_EQ(d->failures[0].message, r.failures[0].message);
  EXPECT_FALSE(DecodeReply(body.substr(0, body.size() - 2)).ok());
}

TEST(Frame, NotifyAndHelloRoundTrip) {
  std::string body;
  EncodeNotify({"127.0.0.1:5", "done", std::string(1000, 'x')}, &body);
  auto n = DecodeNotify(body);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->sender, "127.0.0.1:5");
  EXPECT_EQ(n->message.size(), 1000u);
  body.clear();
  EncodeStreamHello({1, 2, 1, 3, "[::1]:9"}, &body);
  auto h = DecodeStreamHello(body);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->target_instance, 2u);
  EXPECT_EQ(h->stream_index, 3);
  EXPECT_EQ(h->initiator_peer_id, "[::1]:9");
  EXPECT_FALSE(DecodeStreamHello(body.substr(1)).ok());
}

// A reply whose failures name these entries, in this order.
std::string ReplyNaming(std::vector<uint32_t> indexes) {
  Reply r;
  r.status = OkStatus();
  for (uint32_t i : indexes)
    r.failures.push_back({i, StatusCode::kInvalidArgument, "entry " + std::to_string(i)});
  std::string body;
  EncodeReply(r, &body);
  return body;
}

TEST(Frame, ReplyWithFailuresOutOfOrderIsRefused) {
  using ::ferry::test::StatusIs;
  using ::testing::HasSubstr;
  EXPECT_THAT(DecodeReply(ReplyNaming({5, 2})),
              StatusIs(StatusCode::kDataLoss, HasSubstr("order")));
  EXPECT_THAT(DecodeReply(ReplyNaming({3, 3})),
              StatusIs(StatusCode::kDataLoss, HasSubstr("order")));
  EXPECT_THAT(DecodeReply(ReplyNaming({0, 1, 9, 4})),
              StatusIs(StatusCode::kDataLoss, HasSubstr("order")));
  EXPECT_THAT(DecodeReply(ReplyNaming({1, 2, 2})),
              StatusIs(StatusCode::kDataLoss, HasSubstr("order")));
  // The message names both entries.
  auto d = DecodeReply(ReplyNaming({5, 2}));
  EXPECT_THAT(d, StatusIs(StatusCode::kDataLoss,
                          ::testing::AllOf(HasSubstr("entry 2"), HasSubstr("entry 5"))));
}

TEST(Frame, ReplyWithFailuresInIncreasingOrderIsAccepted) {
  for (const std::vector<uint32_t>& idx :
       {std::vector<uint32_t>{}, {0}, {7}, {2, 5}, {0, 1, 2, 3}, {1, 100, 16383}}) {
    auto d = DecodeReply(ReplyNaming(idx));
    ASSERT_THAT(d, ::ferry::test::IsOk()) << ::testing::PrintToString(idx);
    std::vector<uint32_t> got;
    for (const auto& f : d->failures) {
      got.push_back(f.index);
      EXPECT_EQ(f.code, StatusCode::kInvalidArgument);
      EXPECT_EQ(f.message, "entry " + std::to_string(f.index));
    }
    EXPECT_EQ(got, idx);
  }
}

TEST(Frame, HeaderWithOnlyTheMagicWrongIsRefused) {
  FrameHeader h;
  h.version = 1;
  h.type = FrameType::kAck;
  h.body_len = 8;
  uint8_t buf[kFrameHeaderSize];
  EncodeHeader(h, buf);
  ASSERT_TRUE(DecodeHeader(buf).ok());
  buf[3] = 'X';  // "FRRX"
  EXPECT_THAT(DecodeHeader(buf),
              ::ferry::test::StatusIs(StatusCode::kDataLoss, ::testing::HasSubstr("magic")));
}

TEST(Frame, AuthenticationBodiesRoundTripAndHaveAFixedLayout) {
  AuthHello hello;
  hello.nonce.fill(0xab);
  hello.peer_id = "10.0.0.1:4000";
  std::string body;
  EncodeAuthHello(hello, &body);
  EXPECT_EQ(body.size(), 1u + kAuthBytes + 2 + hello.peer_id.size());
  auto h = DecodeAuthHello(body);
  ASSERT_THAT(h, ::ferry::test::IsOk());
  EXPECT_EQ(h->mode, kAuthModeHmacSha256);
  EXPECT_EQ(h->nonce, hello.nonce);
  EXPECT_EQ(h->peer_id, hello.peer_id);
  EXPECT_THAT(DecodeAuthHello(body + "x"), ::ferry::test::StatusIs(StatusCode::kDataLoss));
  EXPECT_THAT(DecodeAuthHello(body.substr(0, 20)), ::ferry::test::StatusIs(StatusCode::kDataLoss));

  AuthChallenge challenge;
  challenge.status = UnauthenticatedError("engine 10.0.0.2:4000 has no cluster secret");
  challenge.nonce.fill(1);
  challenge.mac.fill(2);
  body.clear();
  EncodeAuthChallenge(challenge, &body);
  auto c = DecodeAuthChallenge(body);
  ASSERT_THAT(c, ::ferry::test::IsOk());
  EXPECT_THAT(c->status, ::ferry::test::StatusIs(StatusCode::kUnauthenticated,
                                                 ::testing::HasSubstr("no cluster secret")));
  EXPECT_EQ(c->nonce, challenge.nonce);
  EXPECT_EQ(c->mac, challenge.mac);
  EXPECT_THAT(DecodeAuthChallenge(body.substr(0, body.size() - 1)),
              ::ferry::test::StatusIs(StatusCode::kDataLoss));

  AuthProof proof;
  proof.mac.fill(3);
  body.clear();
  EncodeAuthProof(proof, &body);
  EXPECT_EQ(body.size(), kAuthBytes);
  auto p = DecodeAuthProof(body);
  ASSERT_THAT(p, ::ferry::test::IsOk());
  EXPECT_EQ(p->mac, proof.mac);
  EXPECT_THAT(DecodeAuthProof(body + "x"), ::ferry::test::StatusIs(StatusCode::kDataLoss));
}

}  // namespace

// The option table's frame limits (src/common/option_table.cc) agree with
// what one frame may carry.
TEST(Frame, OptionLimitsFitTheWire) {
  EngineOptions o{};
  o.slice_size = o.max_frame_bytes = kMaxPayload;
  EXPECT_TRUE(ValidateOptions(o).ok());
  o.max_frame_bytes = kMaxPayload + 1;
  EXPECT_FALSE(ValidateOptions(o).ok());
  o.slice_size = kMaxPayload + 1;
  EXPECT_FALSE(ValidateOptions(o).ok());
}

}  // namespace ferry::wire
