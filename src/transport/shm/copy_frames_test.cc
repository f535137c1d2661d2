#include "transport/shm/copy_frames.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ferry::internal::shm {
namespace {

TEST(CopyFrames, CopyEntriesRoundTripAndLimits) {
  std::vector<CopyEntry> in = {{0x1000, 4096, 0x7f0000001000}, {0xffffffffffff0000ull, 1, 42}};
  std::string body;
  EncodeCopyEntries(in.data(), in.size(), &body);
  EXPECT_EQ(body.size(), CopyEntriesSize(2));
  auto out = DecodeCopyEntries(body);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[0].peer_addr, 0x7f0000001000u);
  EXPECT_EQ((*out)[1].addr, 0xffffffffffff0000ull);
  EXPECT_EQ((*out)[1].length, 1u);
  EXPECT_FALSE(DecodeCopyEntries(body.substr(0, body.size() - 1)).ok());
  EXPECT_FALSE(DecodeCopyEntries(body + "x").ok());
  // A plain entry list is not a copy entry list (12 vs 20 bytes per entry).
  std::string plain;
  wire::Entry e[5] = {};
  wire::EncodeEntries(e, 5, &plain);
  EXPECT_FALSE(DecodeCopyEntries(plain).ok());
  std::string empty;
  EncodeCopyEntries(nullptr, 0, &empty);
  EXPECT_FALSE(DecodeCopyEntries(empty).ok());
}

TEST(CopyFrames, CopyHelloRoundTripAndProbeLimit) {
  CopyHello h{{1, 2, 1, 3, "127.0.0.1:9"}, 0x7ffd0000, std::string(16, 'p'), std::nullopt};
  std::string body;
  EncodeCopyHello(h, &body);
  auto out = DecodeCopyHello(body);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->hello.stream_index, 3u);
  EXPECT_EQ(out->hello.initiator_peer_id, "127.0.0.1:9");
  EXPECT_EQ(out->probe_addr, 0x7ffd0000u);
  EXPECT_EQ(out->probe, h.probe);
  EXPECT_FALSE(out->ring.has_value());
  EXPECT_FALSE(DecodeCopyHello(body + "x").ok());
  // Request rings offered: four u32 after the probe, all or nothing.
  h.ring = HelloRing{7, 8, 9, 65536};
  std::string with_ring;
  EncodeCopyHello(h, &with_ring);
  auto ringed = DecodeCopyHello(with_ring);
  ASSERT_TRUE(ringed.ok()) << ringed.status();
  ASSERT_TRUE(ringed->ring.has_value());
  EXPECT_EQ(ringed->ring->memfd, 7u);
  EXPECT_EQ(ringed->ring->initiator_wake, 8u);
  EXPECT_EQ(ringed->ring->target_wake, 9u);
  EXPECT_EQ(ringed->ring->capacity, 65536u);
  EXPECT_FALSE(DecodeCopyHello(with_ring.substr(0, with_ring.size() - 1)).ok());
  EXPECT_FALSE(DecodeCopyHello(with_ring + "x").ok());
  h.ring.reset();
  // A plain stream hello lacks the probe.
  std::string plain;
  wire::EncodeStreamHello(h.hello, &plain);
  EXPECT_FALSE(DecodeCopyHello(plain).ok());
  // The encoder cuts an oversized probe; the decoder refuses one.
  h.probe.assign(kMaxProbe + 10, 'q');
  body.clear();
  EncodeCopyHello(h, &body);
  ASSERT_TRUE(DecodeCopyHello(body).ok());
  EXPECT_EQ(DecodeCopyHello(body)->probe.size(), kMaxProbe);
  std::string forged;
  wire::EncodeStreamHello(h.hello, &forged);
  forged.append(8, '\0');
  forged.push_back(static_cast<char>(kMaxProbe + 1));
  forged.push_back('\0');
  forged.append(kMaxProbe + 1, 'q');
  EXPECT_FALSE(DecodeCopyHello(forged).ok());
}

}  // namespace
}  // namespace ferry::internal::shm
