// What only the etcd store has (the shared behaviour is in
// metadata_stores_test.cc): connection strings (etcd://, bare H:P, lists),
// fail-over between endpoints, a three-member cluster that loses a member,
// and a restarted engine taking over the name its dead predecessor's lease
// still holds. Real etcd servers on free loopback ports; every wait bounded.
#ifdef FERRY_HAVE_ETCD_METADATA

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/services.h"
#include "tests/testing/status_matchers.h"

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

EngineOptions Options(const std::string& url, const std::string& name) {
  EngineOptions o;
  o.transport = "tcp";
  o.listen_host = "127.0.0.1";
  o.metadata = url;
  o.local_name = name;
  o.metadata_ttl = 2s;
  o.connect_timeout = 5s;
  o.transfer_timeout = 10s;
  return o;
}

std::unique_ptr<Engine> MakeEngine(const EngineOptions& o) {
  auto e = Engine::Create(o);
  EXPECT_OK(e.status()) << o.local_name;
  return e.ok() ? std::move(e).value() : nullptr;
}

std::string DeadEndpoint() {
  const std::vector<uint16_t> p = FreeLoopbackPorts(1);
  return "127.0.0.1:" + std::to_string(p.empty() ? 1 : p[0]);
}

TEST(EtcdMetadataTest, MalformedConnectionStringsAreClearErrors) {
  for (const std::string url :
       {"etcd://", "etcd://:2379", "etcd://127.0.0.1:0", "etcd://127.0.0.1:99999",
        "etcd://127.0.0.1:abc", "etcd://127.0.0.1:2379,", "etcd://127.0.0.1:2379/path",
        "etcd://user@127.0.0.1:2379", "etcd://[::1:2379"}) {
    EXPECT_THAT(Engine::Create(Options(url, "x")).status(),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(url)))
        << url;
  }
  // Not a form any backend takes.
  EXPECT_THAT(
      Engine::Create(Options("zookeeper://127.0.0.1:2181", "x")).status(),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown kind of connection string")));
  EXPECT_EQ(MetadataBackendOf("127.0.0.1:2379"), "etcd");
  EXPECT_EQ(MetadataBackendOf("10.0.0.1:2379,10.0.0.2:2379"), "etcd");
  EXPECT_EQ(MetadataBackendOf("etcd://h:1"), "etcd");
  EXPECT_EQ(MetadataBackendOf("P2PHANDSHAKE"), "p2p");
  EXPECT_EQ(MetadataBackendOf("127.0.0.1"), "");
}

TEST(EtcdMetadataTest, UnreachableClusterFailsEngineCreationWithUnavailable) {
  EngineOptions o = Options("etcd://" + DeadEndpoint() + "," + DeadEndpoint(), "prefill-0");
  o.connect_timeout = 1s;
  EXPECT_THAT(Engine::Create(o).status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("cannot reach the etcd cluster")));
}

TEST(EtcdMetadataTest, BareHostPortAndADeadFirstEndpointWork) {
  EtcdCluster etcd;
  ASSERT_TRUE(etcd.Start(1));
  // Registered memory outlives the engines (declared before them).
  AlignedBuffer remote(1 << 16), local(1 << 16);
  // Mooncake's form: a bare HOST:PORT is etcd; a dead endpoint first in the
  // list hands every call on to the live one.
  auto decode = MakeEngine(Options(DeadEndpoint() + "," + etcd.endpoint(0), "decode-0"));
  auto prefill = MakeEngine(Options(etcd.endpoint(0), "prefill-0"));
  ASSERT_TRUE(decode && prefill);
  FillPattern(remote.data(), 1 << 16, 3, 0);
  ASSERT_OK(decode->RegisterMemory(remote.data(), 1 << 16));
  ASSERT_OK(prefill->RegisterMemory(local.data(), 1 << 16));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, remote.addr(), 1 << 16}));
  EXPECT_EQ(DescribePatternMismatch(local.data(), 1 << 16, 3, 0), "");
}

TEST(EtcdMetadataTest, ThreeMemberClusterKeepsWorkingWithOneMemberKilled) {
  EtcdCluster etcd;
  ASSERT_TRUE(etcd.Start(3));
  // Registered memory outlives the engines (declared before them).
  AlignedBuffer remote(4096), local(4096), late_buf(4096), second(4096);
  auto decode = MakeEngine(Options(etcd.url(), "decode-0"));
  auto prefill = MakeEngine(Options(etcd.url(), "prefill-0"));
  ASSERT_TRUE(decode && prefill);
  FillPattern(remote.data(), 4096, 8, 0);
  ASSERT_OK(decode->RegisterMemory(remote.data(), 4096));
  ASSERT_OK(prefill->RegisterMemory(local.data(), 4096));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));

  // The member every engine talked to first goes away.
  etcd.KillMember(0);
  // Leases stay alive (entries outlive several TTLs), new engines register
  // and look up through the other two members.
  std::this_thread::sleep_for(3 * 2s);
  auto late = MakeEngine(Options(etcd.url(), "late-0"));
  ASSERT_TRUE(late);
  ASSERT_OK(late->RegisterMemory(late_buf.data(), 4096));
  ASSERT_OK_AND_ASSIGN(SegmentHandle late_seg, late->OpenSegment("decode-0"));
  ASSERT_OK(late->TransferSync({Opcode::kRead, late_buf.data(), late_seg, remote.addr(), 4096}));
  EXPECT_EQ(DescribePatternMismatch(late_buf.data(), 4096, 8, 0), "");
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, remote.addr(), 4096}));

  // A peer re-created under the same name (another buffer, another
  // pattern) is reached through the old handle: the watch, moved to a live
  // member, says it changed.
  decode.reset();
  decode = MakeEngine(Options(etcd.url(), "decode-0"));
  ASSERT_TRUE(decode);
  FillPattern(second.data(), 4096, 9, 0);
  ASSERT_OK(decode->RegisterMemory(second.data(), 4096));
  Status last = UnavailableError("never tried");
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  bool reached = false;
  while (!reached && std::chrono::steady_clock::now() < deadline) {
    std::memset(local.data(), 0, 4096);
    last = prefill->TransferSync({Opcode::kRead, local.data(), seg, second.addr(), 4096});
    reached = last.ok() && DescribePatternMismatch(local.data(), 4096, 9, 0).empty();
    if (!reached) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(reached) << last.ToString();
  // The killed member comes back and rejoins.
  EXPECT_TRUE(etcd.StartMember(0));
}

TEST(EtcdMetadataTest, DuplicateNameMessageSaysWhenADeadHoldersEntryExpires) {
  EtcdCluster etcd;
  ASSERT_TRUE(etcd.Start(1));
  EngineOptions o = Options(etcd.url(), "decode-0");
  o.metadata_ttl = 30s;
  auto holder = MakeEngine(o);
  ASSERT_TRUE(holder);
  o.connect_timeout = 1s;
  EXPECT_THAT(Engine::Create(o).status(),
              StatusIs(StatusCode::kAlreadyExists,
                       HasSubstr("if that engine is gone, its entry expires within")));
}

}  // namespace
}  // namespace ferry::test

#endif  // FERRY_HAVE_ETCD_METADATA
