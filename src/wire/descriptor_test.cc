#include "wire/descriptor.h"

#include <gtest/gtest.h>

namespace ferry::wire {
namespace {

PeerDescriptor Sample() {
  PeerDescriptor d;
  d.engine_name = "prefill-0";
  d.peer_id = "127.0.0.1:15001";
  d.instance_id = 42;
  d.process_token = 7;
  d.hostname = "node1";
  d.pid = 1234;
  d.version = "0.1.0";
  d.wire_min = 1;
  d.wire_max = 1;
  d.transports = {{"tcp", "127.0.0.1:15001"}, {"local", "7"}};
  d.features = {"read", "write", "notify"};
  d.regions = {{0x10000, 4096, "cpu:0", "cpu", {}}, {0x20000, 1 << 20, "*", "cpu", {}}};
  return d;
}

TEST(Descriptor, RoundTrip) {
  std::string bytes;
  EncodeDescriptor(Sample(), &bytes);
  auto d = DecodeDescriptor(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->engine_name, "prefill-0");
  EXPECT_EQ(d->instance_id, 42u);
  EXPECT_EQ(d->transports.size(), 2u);
  EXPECT_TRUE(d->HasFeature("notify"));
  EXPECT_FALSE(d->HasFeature("auth"));
  ASSERT_NE(d->FindTransport("tcp"), nullptr);
  EXPECT_EQ(d->FindTransport("tcp")->endpoint, "127.0.0.1:15001");
  ASSERT_EQ(d->regions.size(), 2u);
  EXPECT_EQ(d->regions[1].length, 1u << 20);
}

TEST(Descriptor, EveryTruncationIsRejected) {
  std::string bytes;
  EncodeDescriptor(Sample(), &bytes);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeDescriptor(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeDescriptor(bytes + "z").ok());
}

TEST(Descriptor, UnknownFormatNamesIt) {
  std::string bytes;
  EncodeDescriptor(Sample(), &bytes);
  bytes[0] = 9;
  auto d = DecodeDescriptor(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("format 9"), std::string::npos);
}

TEST(Descriptor, NegotiationPicksHighestCommonVersion) {
  PeerDescriptor a = Sample(), b = Sample();
  a.wire_min = 1;
  a.wire_max = 3;
  b.wire_min = 2;
  b.wire_max = 5;
  auto v = NegotiateWireVersion(a, b);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
}

TEST(Descriptor, NoCommonVersionNamesBothSides) {
  PeerDescriptor local = Sample(), remote = Sample();
  remote.peer_id = "127.0.0.1:16000";
  remote.wire_min = remote.wire_max = 2;
  auto v = NegotiateWireVersion(local, remote);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = v.status().message();
  EXPECT_NE(m.find("2..2"), std::string::npos) << m;
  EXPECT_NE(m.find("1..1"), std::string::npos) << m;
  EXPECT_NE(m.find("127.0.0.1:16000"), std::string::npos) << m;
  EXPECT_NE(m.find("upgrade this engine"), std::string::npos) << m;
}

}  // namespace
}  // namespace ferry::wire
