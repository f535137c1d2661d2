#include "common/net.h"

#include <gtest/gtest.h>

namespace ferry::internal {
namespace {

TEST(ParsePeerId, BracketsInsideAHostAreRefused) {
  for (const char* id : {"[[x]:1", "[a[b]:80", "a]b:80", "[::1]]:80"}) {
    auto hp = ParsePeerId(id);
    EXPECT_FALSE(hp.ok()) << id;
  }
  auto ok = ParsePeerId("[::1]:80");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->host, "::1");
}

TEST(ParsePeerId, Ipv4AndNames) {
  auto hp = ParsePeerId("127.0.0.1:15000");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "127.0.0.1");
  EXPECT_EQ(hp->port, 15000);
  hp = ParsePeerId("node-1.example:80");
  ASSERT_TRUE(hp.ok());
  EXPECT_EQ(hp->host, "node-1.example");
}

TEST(ParsePeerId, Ipv6InBrackets) {
  auto hp = ParsePeerId("[::1]:17000");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->host, "::1");
  EXPECT_EQ(hp->port, 17000);
  EXPECT_EQ(FormatPeerId("::1", 17000), "[::1]:17000");
  EXPECT_EQ(FormatPeerId("10.0.0.1", 5), "10.0.0.1:5");
}

TEST(ParsePeerId, RejectsBadInput) {
  for (const char* bad : {"", "host", ":80", "host:", "host:0", "host:65536", "host:12x", "::1:80",
                          "[::1]80", "[::1]:", "[::1"}) {
    auto hp = ParsePeerId(bad);
    EXPECT_FALSE(hp.ok()) << bad;
    EXPECT_EQ(hp.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(Net, ListenConnectExchange) {
  auto l = Listen("127.0.0.1", 0);
  ASSERT_TRUE(l.ok()) << l.status();
  auto deadline = Clock::now() + std::chrono::seconds(5);
  auto c = ConnectTo({"127.0.0.1", l->second}, deadline);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(SendAll(c->get(), "ping", 4, deadline).ok());
}

TEST(Net, ConnectRefusedIsUnavailable) {
  auto l = Listen("127.0.0.1", 0);
  ASSERT_TRUE(l.ok());
  uint16_t port = l->second;
  l->first.Reset();  // nothing listens there any more
  auto c = ConnectTo({"127.0.0.1", port}, Clock::now() + std::chrono::seconds(5));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find(std::to_string(port)), std::string::npos);
}

}  // namespace
}  // namespace ferry::internal
