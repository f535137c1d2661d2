// The Redis metadata store against real redis-server children
// (tests/testing/services.h): engines find each other by name, malformed
// connection strings, an unreachable server, passwords and ACL users,
// databases, the entry's TTL and its refresh, expiry of an entry nobody
// refreshes, a restarted (empty) server, duplicate names, hostile values and
// the watch noticing a peer re-created under the same name. All in this
// process (the shared suite covers the cross-process cases). Every wait is
// bounded; no test asserts how long anything took.
#ifdef FERRY_HAVE_REDIS_METADATA

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/services.h"
#include "tests/testing/status_matchers.h"

namespace ferry::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

constexpr size_t kBufferSize = 1 << 20;
constexpr auto kTtl = 1500ms;

// A reply of redis-server to a command sent by the test itself.
struct Raw {
  int type = -1;  // REDIS_REPLY_*, -1: no reply (with the reason in str)
  std::string str;
  long long integer = 0;
};

// One command on a connection of its own to 127.0.0.1:port, after AUTH
// (`auth`: {} or {password} or {user, password}) and SELECT db.
Raw Redis(uint16_t port, const std::vector<std::string>& args,
          const std::vector<std::string>& auth = {}, int db = 0) {
  Raw out;
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeval{5, 0});
  if (c == nullptr || c->err != 0) {
    out.str = c != nullptr ? c->errstr : "no memory";
    if (c != nullptr) redisFree(c);
    return out;
  }
  redisSetTimeout(c, timeval{5, 0});
  const auto run = [&](const std::vector<std::string>& a) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const auto& s : a) {
      argv.push_back(s.data());
      lens.push_back(s.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(a.size()), argv.data(), lens.data()));
    Raw got;
    if (r == nullptr) {
      got.str = c->errstr;
      return got;
    }
    got.type = r->type;
    if (r->str != nullptr) got.str.assign(r->str, r->len);
    got.integer = r->integer;
    freeReplyObject(r);
    return got;
  };
  std::vector<std::string> login{"AUTH"};
  login.insert(login.end(), auth.begin(), auth.end());
  if (!auth.empty() && run(login).type != REDIS_REPLY_STATUS) {
    out.str = "AUTH failed";
  } else if (db != 0 && run({"SELECT", std::to_string(db)}).type != REDIS_REPLY_STATUS) {
    out.str = "SELECT failed";
  } else {
    out = run(args);
  }
  redisFree(c);
  return out;
}

// A port nobody listens on (bound, then closed).
uint16_t ClosedPort() {
  const auto ports = FreeLoopbackPorts(1);
  return ports.empty() ? 1 : ports[0];
}

// Polls `done` every 50 ms for at most `timeout`.
template <typename F>
bool WaitFor(F done, std::chrono::milliseconds timeout = 15s) {
  const auto deadline = SteadyClock::now() + timeout;
  while (SteadyClock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

class RedisMetadataTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(server_.Start()); }

  EngineOptions Options(const std::string& name, const std::string& url = "") const {
    EngineOptions o;
    o.transport = "tcp";
    o.listen_host = "127.0.0.1";
    o.metadata = url.empty() ? server_.url() : url;
    o.local_name = name;
    o.metadata_ttl = kTtl;
    o.connect_timeout = 2s;
    o.transfer_timeout = 5s;
    return o;
  }

  std::unique_ptr<Engine> MakeEngine(const std::string& name, const std::string& url = "") {
    auto e = Engine::Create(Options(name, url));
    EXPECT_OK(e.status());
    return e.ok() ? std::move(e).value() : nullptr;
  }

  Raw Cmd(const std::vector<std::string>& args) { return Redis(server_.port(), args); }

  // Reads 4 KiB of the peer's buffer at `addr` through `seg` until it shows
  // pattern `seed` (bounded). Registers a buffer of its own with `e`.
  static ::testing::AssertionResult ReadsPattern(Engine& e, SegmentHandle seg, uint64_t addr,
                                                 uint64_t seed,
                                                 std::chrono::milliseconds timeout = 15s) {
    AlignedBuffer local(4096);
    Status last = e.RegisterMemory(local.data(), 4096);
    if (!last.ok()) return ::testing::AssertionFailure() << last.ToString();
    struct Unregister {
      Engine& e;
      void* p;
      ~Unregister() { (void)e.UnregisterMemory(p); }
    } unregister{e, local.data()};
    const bool ok = WaitFor(
        [&] {
          std::memset(local.data(), 0, 4096);
          last = e.TransferSync({Opcode::kRead, local.data(), seg, addr, 4096});
          return last.ok() && DescribePatternMismatch(local.data(), 4096, seed, 0).empty();
        },
        timeout);
    if (ok) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "pattern " << seed << " never read; last: " << last.ToString();
  }

  RedisServer server_;
};

TEST_F(RedisMetadataTest, EnginesFindEachOtherByNameAndMoveVerifiedBytes) {
  auto decode = MakeEngine("decode-0");
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(decode && prefill);
  AlignedBuffer remote(kBufferSize), local(kBufferSize);
  FillPattern(remote.data(), kBufferSize, 11, 0);
  FillPattern(local.data(), kBufferSize, 22, 0);
  ASSERT_OK(decode->RegisterMemory(remote.data(), kBufferSize));
  ASSERT_OK(prefill->RegisterMemory(local.data(), kBufferSize));
  EXPECT_EQ(Cmd({"EXISTS", "ferry/segments/decode-0"}).integer, 1);
  EXPECT_EQ(Cmd({"EXISTS", "ferry/segments/prefill-0"}).integer, 1);

  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  const size_t half = kBufferSize / 2;
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, remote.addr(), half}));
  EXPECT_EQ(DescribePatternMismatch(local.data(), half, 11, 0), "");
  ASSERT_OK(prefill->TransferSync(
      {Opcode::kWrite, local.data() + half, seg, remote.addr() + half, half}));
  EXPECT_EQ(DescribePatternMismatch(remote.data() + half, half, 22, half), "");

  // A clean shutdown deletes the entry.
  decode.reset();
  EXPECT_EQ(Cmd({"EXISTS", "ferry/segments/decode-0"}).integer, 0);
}

TEST_F(RedisMetadataTest, MetadataClusterPrefixesTheKey) {
  EngineOptions o = Options("decode-0");
  o.metadata_cluster = "team-a";
  auto e = Engine::Create(o);
  ASSERT_OK(e.status());
  EXPECT_EQ(Cmd({"EXISTS", "team-a/segments/decode-0"}).integer, 1);
  EXPECT_EQ(Cmd({"EXISTS", "ferry/segments/decode-0"}).integer, 0);
}

TEST_F(RedisMetadataTest, MalformedConnectionStringsAreInvalidArgumentsNamingThem) {
  const std::string port = std::to_string(server_.port());
  for (const std::string& url : std::vector<std::string>{
           "redis://", "redis://:6379", "redis://127.0.0.1:", "redis://127.0.0.1:99999",
           "redis://127.0.0.1:abc", "redis://127.0.0.1:" + port + "/x",
           "redis://127.0.0.1:" + port + "/-1", "redis://127.0.0.1:" + port + "/0?timeout=1",
           "redis://::1:6379", "redis://[::1:6379", "redis://[::1]x", "redis://127.0.0.1 :1"}) {
    EXPECT_THAT(
        Engine::Create(Options("prefill-0", url)).status(),
        StatusIs(StatusCode::kInvalidArgument, AllOf(HasSubstr(url), HasSubstr("e.g. redis://"))))
        << url;
  }
  // With user information: named with the password masked.
  struct Case {
    std::string url, masked, secret;
  };
  for (const Case& c : std::vector<Case>{
           {"redis://hunter2@127.0.0.1:" + port, "redis://***@127.0.0.1:" + port, "hunter2"},
           {"redis://alice:@127.0.0.1:" + port, "redis://alice:***@127.0.0.1:" + port, "alice:@"},
           {"redis://alice:hun%zzter2@127.0.0.1:" + port, "redis://alice:***@127.0.0.1:" + port,
            "hun%zzter2"},
           {"redis://alice:hunter2@127.0.0.1:" + port + "/db",
            "redis://alice:***@127.0.0.1:" + port + "/db", "hunter2"}}) {
    EXPECT_THAT(Engine::Create(Options("prefill-0", c.url)).status(),
                StatusIs(StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(c.masked), Not(HasSubstr(c.secret)))))
        << c.url;
  }
  EXPECT_THAT(
      Engine::Create(Options("prefill-0", "rediss://:hunter2@127.0.0.1:" + port)).status(),
      StatusIs(StatusCode::kUnimplemented, AllOf(HasSubstr("TLS"), Not(HasSubstr("hunter2")))));
  // A database the server does not have (16 by default).
  EXPECT_THAT(Engine::Create(Options("prefill-0", server_.url() + "/99")).status(),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(server_.url() + "/99"), HasSubstr("99"))));
}

TEST_F(RedisMetadataTest, UnreachableServerIsUnavailableAtCreate) {
  const std::string url = "redis://127.0.0.1:" + std::to_string(ClosedPort());
  EngineOptions o = Options("prefill-0", url);
  o.connect_timeout = 1s;
  EXPECT_THAT(
      Engine::Create(o).status(),
      StatusIs(StatusCode::kUnavailable, HasSubstr("cannot reach the Redis server at " + url)));
  // The default port applies when none is given (nothing listens on 6379 here
  // unless a developer runs a server; then the store simply works).
  auto dflt = Engine::Create(Options("prefill-0", "redis://127.0.0.1"));
  if (!dflt.ok()) {
    EXPECT_THAT(dflt.status(), StatusIs(StatusCode::kUnavailable, HasSubstr("redis://127.0.0.1")));
  }
}

TEST_F(RedisMetadataTest, StoppedServerFailsOpenSegmentWithUnavailable) {
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  server_.Kill();
  EXPECT_THAT(
      prefill->OpenSegment("decode-9").status(),
      StatusIs(StatusCode::kUnavailable, AllOf(HasSubstr("decode-9"), HasSubstr(server_.url()))));
  prefill.reset();  // Remove fails quietly; the threads stop
}

TEST_F(RedisMetadataTest, EntryHasATtlAndIsRefreshedPastIt) {
  auto decode = MakeEngine("decode-0");
  ASSERT_TRUE(decode);
  const Raw first = Cmd({"PTTL", "ferry/segments/decode-0"});
  ASSERT_EQ(first.type, REDIS_REPLY_INTEGER) << first.str;
  EXPECT_GT(first.integer, 0);
  EXPECT_LE(first.integer, kTtl.count());
  // Three TTLs later the entry is still there, its TTL still bounded: the
  // refresh thread rewrites it (with PX) while the engine lives.
  const auto until = SteadyClock::now() + 3 * kTtl;
  while (SteadyClock::now() < until) {
    const Raw r = Cmd({"PTTL", "ferry/segments/decode-0"});
    ASSERT_EQ(r.type, REDIS_REPLY_INTEGER) << r.str;
    ASSERT_GT(r.integer, 0) << "the entry expired while its engine lived";
    ASSERT_LE(r.integer, kTtl.count());
    std::this_thread::sleep_for(100ms);
  }
}

TEST_F(RedisMetadataTest, SecondLiveEngineClaimingANameFailsNamingTheHolder) {
  auto holder = MakeEngine("decode-0");
  ASSERT_TRUE(holder);
  EXPECT_THAT(Engine::Create(Options("decode-0")).status(),
              StatusIs(StatusCode::kAlreadyExists,
                       AllOf(HasSubstr(holder->PeerId()), HasSubstr(server_.url()),
                             HasSubstr("expires within"))));
  // The failed claim left the holder's entry alone.
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  EXPECT_OK(prefill->OpenSegment("decode-0").status());
}

TEST_F(RedisMetadataTest, EntryOfAnEngineThatStoppedRefreshingExpiresAndFreesTheName) {
  // An engine that died without cleaning up: its last descriptor, written
  // with a TTL and never refreshed.
  std::string value;
  {
    auto gone = MakeEngine("decode-0");
    ASSERT_TRUE(gone);
    value = Cmd({"GET", "ferry/segments/decode-0"}).str;
  }
  ASSERT_FALSE(value.empty());
  // Expiring later than the claimant's connect timeout: refused, saying when
  // the name frees itself.
  ASSERT_EQ(Cmd({"SET", "ferry/segments/decode-0", value, "PX", "60000"}).type, REDIS_REPLY_STATUS);
  EXPECT_THAT(Engine::Create(Options("decode-0")).status(),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("its entry expires within 60 s")));
  // Then it runs out.
  ASSERT_EQ(Cmd({"PEXPIRE", "ferry/segments/decode-0", std::to_string(kTtl.count())}).integer, 1);
  ASSERT_TRUE(WaitFor([&] {
    return Cmd({"EXISTS", "ferry/segments/decode-0"}).integer == 0;
  })) << "the entry never expired";
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  EXPECT_THAT(prefill->OpenSegment("decode-0").status(),
              StatusIs(StatusCode::kUnavailable,
                       HasSubstr("no segment 'decode-0' in the Redis server at")));
  EXPECT_TRUE(MakeEngine("decode-0"));
}

TEST_F(RedisMetadataTest, EngineRestartedRightAfterACrashWaitsForItsPredecessorsEntry) {
  std::string value;
  {
    auto gone = MakeEngine("decode-0");
    ASSERT_TRUE(gone);
    value = Cmd({"GET", "ferry/segments/decode-0"}).str;
  }
  ASSERT_FALSE(value.empty());
  // The predecessor's entry runs out well within the new engine's connect
  // timeout (2 s): the claim waits for it instead of failing.
  ASSERT_EQ(Cmd({"SET", "ferry/segments/decode-0", value, "PX", "700"}).type, REDIS_REPLY_STATUS);
  auto next = MakeEngine("decode-0");
  ASSERT_TRUE(next);
  const Raw now = Cmd({"GET", "ferry/segments/decode-0"});
  EXPECT_NE(now.str, value);
  EXPECT_FALSE(now.str.empty());
}

TEST_F(RedisMetadataTest, RestartedEmptyServerGetsTheEntriesBack) {
  AlignedBuffer remote(kBufferSize);  // registered memory outlives the engines
  auto decode = MakeEngine("decode-0");
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(decode && prefill);
  FillPattern(remote.data(), kBufferSize, 5, 0);
  ASSERT_OK(decode->RegisterMemory(remote.data(), kBufferSize));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  EXPECT_TRUE(ReadsPattern(*prefill, seg, remote.addr(), 5));

  server_.Stop();
  ASSERT_TRUE(server_.Restart());
  EXPECT_EQ(Cmd({"DBSIZE"}).integer, 0) << "the restarted server was not empty";
  // Within a refresh period (a third of the TTL) both entries are back.
  EXPECT_TRUE(WaitFor([&] {
    return Cmd({"EXISTS", "ferry/segments/decode-0"}).integer == 1 &&
           Cmd({"EXISTS", "ferry/segments/prefill-0"}).integer == 1;
  })) << "the entries never came back";
  const Raw ttl = Cmd({"PTTL", "ferry/segments/decode-0"});
  EXPECT_GT(ttl.integer, 0);
  EXPECT_LE(ttl.integer, kTtl.count());

  auto probe = MakeEngine("probe-0");
  ASSERT_TRUE(probe);
  ASSERT_OK_AND_ASSIGN(SegmentHandle fresh, probe->OpenSegment("decode-0"));
  EXPECT_TRUE(ReadsPattern(*probe, fresh, remote.addr(), 5));
  // The handle opened before the restart keeps working.
  EXPECT_TRUE(ReadsPattern(*prefill, seg, remote.addr(), 5));
}

TEST_F(RedisMetadataTest, PeerRecreatedUnderTheSameNameIsReachedThroughTheWatchAndNotStolenBack) {
  auto prefill = MakeEngine("prefill-0");
  auto first = MakeEngine("decode-0");
  ASSERT_TRUE(prefill && first);
  AlignedBuffer one(kBufferSize), two(kBufferSize);
  FillPattern(one.data(), kBufferSize, 1, 0);
  FillPattern(two.data(), kBufferSize, 2, 0);
  ASSERT_OK(first->RegisterMemory(one.data(), kBufferSize));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  ASSERT_TRUE(ReadsPattern(*prefill, seg, one.addr(), 1));

  // The name changes hands while the first engine still lives (its links
  // stay healthy, so only the watch can tell the prefill engine).
  // (The first engine's refresh may put its entry back between the DEL and
  // the claim: then try again.)
  std::unique_ptr<Engine> second;
  for (int i = 0; i < 20 && !second; ++i) {
    Cmd({"DEL", "ferry/segments/decode-0"});
    auto e = Engine::Create(Options("decode-0"));
    if (e.ok()) {
      second = std::move(e).value();
    } else {
      ASSERT_THAT(e.status(), StatusIs(StatusCode::kAlreadyExists, HasSubstr(first->PeerId())));
    }
  }
  ASSERT_TRUE(second) << "the name never changed hands";
  ASSERT_OK(second->RegisterMemory(two.data(), kBufferSize));
  const std::string taken = Cmd({"GET", "ferry/segments/decode-0"}).str;
  EXPECT_TRUE(ReadsPattern(*prefill, seg, two.addr(), 2))
      << "the watch never noticed the new instance";

  // The first engine's refreshes (every TTL/3) do not steal the name back.
  std::this_thread::sleep_for(2 * kTtl);
  EXPECT_EQ(Cmd({"GET", "ferry/segments/decode-0"}).str, taken);
  // Nor does its clean shutdown delete the other engine's entry.
  first.reset();
  EXPECT_EQ(Cmd({"GET", "ferry/segments/decode-0"}).str, taken);
  EXPECT_TRUE(ReadsPattern(*prefill, seg, two.addr(), 2));
}

TEST_F(RedisMetadataTest, HostileValuesAreDataLossNamingTheKey) {
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  ASSERT_EQ(
      Cmd({"SET", "ferry/segments/evil", std::string("\x02\x00garbage\xff\xff\xff\xff", 13)}).type,
      REDIS_REPLY_STATUS);
  EXPECT_THAT(prefill->OpenSegment("evil").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ferry/segments/evil")));
  const std::string real = Cmd({"GET", "ferry/segments/prefill-0"}).str;
  ASSERT_FALSE(real.empty());
  ASSERT_EQ(Cmd({"SET", "ferry/segments/cut", real.substr(0, real.size() / 2)}).type,
            REDIS_REPLY_STATUS);
  EXPECT_THAT(prefill->OpenSegment("cut").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ferry/segments/cut")));
  ASSERT_EQ(Cmd({"SET", "ferry/segments/other", real}).type, REDIS_REPLY_STATUS);
  EXPECT_THAT(prefill->OpenSegment("other").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ferry/segments/other")));
  ASSERT_EQ(Cmd({"RPUSH", "ferry/segments/list", "x"}).type, REDIS_REPLY_INTEGER);
  EXPECT_THAT(prefill->OpenSegment("list").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ferry/segments/list")));
  // A name held by a key that is no descriptor cannot be claimed, and the
  // error says by what.
  EXPECT_THAT(Engine::Create(Options("evil")).status(),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("ferry/segments/evil")));
  EXPECT_THAT(Engine::Create(Options("list")).status(),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("list")));
}

TEST_F(RedisMetadataTest, DatabasesKeepEnginesApart) {
  auto in_one = MakeEngine("decode-0", server_.url() + "/1");
  auto in_two = MakeEngine("prefill-0", server_.url() + "/2");
  ASSERT_TRUE(in_one && in_two);
  EXPECT_EQ(Redis(server_.port(), {"EXISTS", "ferry/segments/decode-0"}, {}, 1).integer, 1);
  EXPECT_EQ(Redis(server_.port(), {"EXISTS", "ferry/segments/decode-0"}, {}, 2).integer, 0);
  EXPECT_EQ(Cmd({"DBSIZE"}).integer, 0);
  EXPECT_THAT(in_two->OpenSegment("decode-0").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("no segment 'decode-0'")));
  // The same name is free in another database.
  auto also = MakeEngine("decode-0", server_.url() + "/2");
  ASSERT_TRUE(also);
  EXPECT_OK(in_two->OpenSegment("decode-0").status());
}

class RedisAuthTest : public ::testing::Test {
 protected:
  EngineOptions Options(const std::string& name, const std::string& url) const {
    EngineOptions o;
    o.transport = "tcp";
    o.listen_host = "127.0.0.1";
    o.metadata = url;
    o.local_name = name;
    o.metadata_ttl = kTtl;
    o.connect_timeout = 2s;
    return o;
  }
  RedisServer server_;
};

TEST_F(RedisAuthTest, PasswordRightWorksWrongIsClearAndNeverShown) {
  const std::string password = "pa:ss@w/rd";  // %-encoded in the URL
  ASSERT_TRUE(server_.Start({"--requirepass", password}));
  const std::string hostport = "127.0.0.1:" + std::to_string(server_.port());
  const std::string url = "redis://:pa%3Ass%40w%2Frd@" + hostport;

  auto decode = Engine::Create(Options("decode-0", url));
  ASSERT_OK(decode.status());
  auto prefill = Engine::Create(Options("prefill-0", url));
  ASSERT_OK(prefill.status());
  EXPECT_OK((*prefill)->OpenSegment("decode-0").status());
  EXPECT_EQ(Redis(server_.port(), {"EXISTS", "ferry/segments/decode-0"}, {password}).integer, 1);

  const Status wrong = Engine::Create(Options("probe-0", "redis://:hunter2@" + hostport)).status();
  EXPECT_THAT(wrong,
              StatusIs(StatusCode::kUnauthenticated,
                       AllOf(HasSubstr("redis://:***@" + hostport),
                             HasSubstr("refused the credentials"), Not(HasSubstr("hunter2")))));
  const Status none = Engine::Create(Options("probe-0", "redis://" + hostport)).status();
  EXPECT_THAT(none, StatusIs(StatusCode::kUnauthenticated, HasSubstr("requires a password")));
}

TEST_F(RedisAuthTest, AclUserRightWorksWrongIsClearAndNeverShown) {
  ASSERT_TRUE(server_.Start({"--user", "alice", "on", ">secret", "~*", "&*",
                             "+@all",  // one argument per word
                             "--user", "bob", "on", ">bobpw", "~*", "+@read", "+ping"}));
  const std::string hostport = "127.0.0.1:" + std::to_string(server_.port());
  auto decode = Engine::Create(Options("decode-0", "redis://alice:secret@" + hostport));
  ASSERT_OK(decode.status());
  auto prefill = Engine::Create(Options("prefill-0", "redis://alice:secret@" + hostport + "/0"));
  ASSERT_OK(prefill.status());
  EXPECT_OK((*prefill)->OpenSegment("decode-0").status());

  EXPECT_THAT(
      Engine::Create(Options("probe-0", "redis://alice:wr0ngpass@" + hostport)).status(),
      StatusIs(StatusCode::kUnauthenticated,
               AllOf(HasSubstr("redis://alice:***@" + hostport), Not(HasSubstr("wr0ngpass")))));
  EXPECT_THAT(Engine::Create(Options("probe-0", "redis://mallory:secret@" + hostport)).status(),
              StatusIs(StatusCode::kUnauthenticated, Not(HasSubstr("secret"))));
  // A user that may read but not write or run scripts: a clear refusal at creation.
  EXPECT_THAT(
      Engine::Create(Options("probe-0", "redis://bob:bobpw@" + hostport)).status(),
      StatusIs(StatusCode::kFailedPrecondition, AllOf(HasSubstr("EVAL"), Not(HasSubstr("bobpw")))));
}

}  // namespace
}  // namespace ferry::test

#endif  // FERRY_HAVE_REDIS_METADATA
