// One suite for every metadata service Ferry talks to (http: `ferry
// metadata-server`; etcd; Redis), each a real server started by the test on
// free loopback ports (tests/testing/services.h). For each: engines in
// separate processes find each other by name and move verified bytes; a
// duplicate name is refused naming the holder; a clean shutdown removes the
// entry; a peer killed without cleanup disappears after its lease/TTL and,
// restarted under the same name, is reached at its new instance; the service
// stopped mid-run: connected peers keep moving bytes, new lookups fail
// `unavailable`, and everything recovers when it returns; a hostile value is
// kDataLoss naming the key. Every wait is bounded; no test asserts how long
// anything took.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/child_process.h"
#include "tests/testing/fd_limit.h"
#include "tests/testing/pattern.h"
#include "tests/testing/services.h"
#include "tests/testing/status_matchers.h"

#ifndef FERRY_CLI_PATH
#error "FERRY_CLI_PATH must name the ferry executable"
#endif

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

constexpr size_t kBufferSize = 1 << 20;
constexpr char kChildFlag[] = "--ferry-metadata-child-engine";

// ---- raw access to each service ------------------------------------------------

std::string Base64(const std::string& in) {
  static constexpr char k[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], k[v & 63]};
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += {k[v >> 18], k[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += {k[v >> 18], k[(v >> 12) & 63], k[(v >> 6) & 63], '='};
  }
  return out;
}

std::string Unbase64(const std::string& in) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : in) {
    const char* p =
        std::strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", c);
    if (c == '=' || p == nullptr) break;
    v = (v << 6) | static_cast<uint32_t>(
                       p - "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/");
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((v >> bits) & 255);
    }
  }
  return out;
}

// The body of an HTTP/1.0 answer ("" without one).
std::string HttpBody(const std::string& reply) {
  const size_t at = reply.find("\r\n\r\n");
  return at == std::string::npos ? "" : reply.substr(at + 4);
}

int HttpStatus(const std::string& reply) {
  return reply.rfind("HTTP/", 0) == 0 && reply.size() > 12 ? std::atoi(reply.c_str() + 9) : -1;
}

std::string HttpRequest(const std::string& method, const std::string& target,
                        const std::string& body) {
  return method + " " + target +
         " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

std::string Resp(const std::vector<std::string>& words) {
  std::string out = "*" + std::to_string(words.size()) + "\r\n";
  for (const auto& w : words) out += "$" + std::to_string(w.size()) + "\r\n" + w + "\r\n";
  return out;
}

// A metadata service under test: starts, stops, comes back on the same
// address, and lets the test read and write its keys directly.
class Service {
 public:
  virtual ~Service() = default;
  virtual ::testing::AssertionResult Start() = 0;
  virtual std::string url() const = 0;
  // The engines' metadata_ttl (the HTTP server decides its own TTL).
  virtual std::chrono::milliseconds ttl() const = 0;
  virtual void Stop() = 0;
  virtual ::testing::AssertionResult Restart() = 0;
  // 1: found (*value set), 0: no such key, -1: could not ask.
  virtual int Get(const std::string& key, std::string* value) = 0;
  virtual bool Put(const std::string& key, const std::string& value) = 0;
};

class HttpService : public Service {
 public:
  ::testing::AssertionResult Start() override { return Launch("0"); }
  std::string url() const override {
    return "http://127.0.0.1:" + std::to_string(port_) + "/metadata";
  }
  std::chrono::milliseconds ttl() const override { return 1000ms; }
  void Stop() override { server_.Terminate(); }
  ::testing::AssertionResult Restart() override { return Launch(std::to_string(port_)); }
  int Get(const std::string& key, std::string* value) override {
    const std::string reply =
        RawExchange(port_, HttpRequest("GET", "/metadata?key=" + key, ""), 5s);
    const int status = HttpStatus(reply);
    if (status == 200) *value = HttpBody(reply);
    return status == 200 ? 1 : status == 404 ? 0 : -1;
  }
  bool Put(const std::string& key, const std::string& value) override {
    return HttpStatus(RawExchange(port_, HttpRequest("PUT", "/metadata?key=" + key, value), 5s)) ==
           200;
  }

 private:
  ::testing::AssertionResult Launch(const std::string& port) {
    ::testing::AssertionResult started =
        server_.Start(FERRY_CLI_PATH, {"metadata-server", "--port", port, "--ttl-ms", "1000"});
    if (!started) return started;
    std::string line;
    ::testing::AssertionResult got = server_.ReadLine(&line, 30s);
    if (!got) return got;
    const std::string prefix = "metadata-server listening on 127.0.0.1:";
    if (line.rfind(prefix, 0) != 0)
      return ::testing::AssertionFailure() << "the server said: " << line;
    port_ = std::atoi(line.c_str() + prefix.size());
    return ::testing::AssertionSuccess();
  }

  ChildProcess server_;
  int port_ = 0;
};

class EtcdService : public Service {
 public:
  ::testing::AssertionResult Start() override { return cluster_.Start(1); }
  std::string url() const override { return cluster_.url(); }
  std::chrono::milliseconds ttl() const override {
    return 2000ms;
  }  // etcd's shortest lease is about 2 s
  void Stop() override { cluster_.StopAll(); }
  ::testing::AssertionResult Restart() override { return cluster_.StartAll(); }
  int Get(const std::string& key, std::string* value) override {
    const std::string body = nlohmann::json{{"key", Base64(key)}}.dump();
    const std::string reply =
        RawExchange(cluster_.client_port(0), HttpRequest("POST", "/v3/kv/range", body), 5s);
    if (HttpStatus(reply) != 200) return -1;
    auto j = nlohmann::json::parse(HttpBody(reply), nullptr, false);
    if (j.is_discarded()) return -1;
    if (!j.contains("kvs") || j["kvs"].empty()) return 0;
    *value = Unbase64(j["kvs"][0].value("value", ""));
    return 1;
  }
  bool Put(const std::string& key, const std::string& value) override {
    const std::string body = nlohmann::json{{"key", Base64(key)}, {"value", Base64(value)}}.dump();
    return HttpStatus(RawExchange(cluster_.client_port(0), HttpRequest("POST", "/v3/kv/put", body),
                                  5s)) == 200;
  }

 private:
  EtcdCluster cluster_;
};

class RedisService : public Service {
 public:
  ::testing::AssertionResult Start() override { return server_.Start(); }
  std::string url() const override { return server_.url(); }
  std::chrono::milliseconds ttl() const override { return 1000ms; }
  void Stop() override { server_.Stop(); }
  ::testing::AssertionResult Restart() override { return server_.Restart(); }
  int Get(const std::string& key, std::string* value) override {
    const std::string reply = RawExchange(server_.port(), Resp({"GET", key}), 5s, 5);
    if (reply.rfind("$-1", 0) == 0) return 0;
    if (reply.empty() || reply[0] != '$') return -1;
    const size_t eol = reply.find("\r\n");
    const size_t n = std::strtoul(reply.c_str() + 1, nullptr, 10);
    std::string all = reply;
    // Read the rest of a long value.
    if (eol == std::string::npos) return -1;
    if (all.size() < eol + 2 + n)
      all = RawExchange(server_.port(), Resp({"GET", key}), 5s, eol + 2 + n + 2);
    if (all.size() < eol + 2 + n) return -1;
    *value = all.substr(eol + 2, n);
    return 1;
  }
  bool Put(const std::string& key, const std::string& value) override {
    return RawExchange(server_.port(), Resp({"SET", key, value}), 5s, 5).rfind("+OK", 0) == 0;
  }

 private:
  RedisServer server_;
};

std::unique_ptr<Service> MakeService(const std::string& backend) {
  if (backend == "http") return std::make_unique<HttpService>();
  if (backend == "etcd") return std::make_unique<EtcdService>();
  return std::make_unique<RedisService>();
}

// ---- the child engine -------------------------------------------------------------
// This binary run with `--ferry-metadata-child-engine URL NAME SEED TTL_MS` is an
// engine named NAME (tcp) with one buffer of kBufferSize bytes of pattern
// SEED. It prints "READY <peer_id> <addr>" and serves until its stdin closes.

std::vector<std::string> OwnArgs() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string cur;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return args;
}

EngineOptions BaseOptions(const std::string& url, const std::string& name,
                          std::chrono::milliseconds ttl) {
  EngineOptions o;
  o.transport = "tcp";
  o.listen_host = "127.0.0.1";
  o.metadata = url;
  o.local_name = name;
  o.metadata_ttl = ttl;
  o.connect_timeout = 5s;
  o.transfer_timeout = 10s;
  return o;
}

[[noreturn]] void RunChildEngine(const std::string& url, const std::string& name, uint64_t seed,
                                 int64_t ttl_ms) {
  signal(SIGPIPE, SIG_IGN);
  AlignedBuffer buffer(kBufferSize);
  FillPattern(buffer.data(), kBufferSize, seed, 0);
  auto e = Engine::Create(BaseOptions(url, name, std::chrono::milliseconds(ttl_ms)));
  if (!e.ok()) {
    std::printf("ERROR %s\n", e.status().ToString().c_str());
    std::fflush(stdout);
    std::_Exit(2);
  }
  std::unique_ptr<Engine> engine = std::move(e).value();
  const Status reg = engine->RegisterMemory(buffer.data(), kBufferSize);
  if (!reg.ok()) {
    std::printf("ERROR %s\n", reg.ToString().c_str());
    std::fflush(stdout);
    std::_Exit(2);
  }
  std::printf("READY %s 0x%llx\n", engine->PeerId().c_str(),
              static_cast<unsigned long long>(buffer.addr()));
  std::fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  engine.reset();
  std::_Exit(0);
}

// Runs before any test (after every static initializer) in the child mode.
class ChildEngineEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const auto args = OwnArgs();
    for (size_t i = 0; i + 4 < args.size(); ++i) {
      if (args[i] == kChildFlag) {
        RunChildEngine(args[i + 1], args[i + 2], std::strtoull(args[i + 3].c_str(), nullptr, 10),
                       std::strtoll(args[i + 4].c_str(), nullptr, 10));
      }
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kChildEnv =
    ::testing::AddGlobalTestEnvironment(new ChildEngineEnvironment);

struct ChildEngine {
  ChildProcess process;
  std::string peer_id;
  uint64_t addr = 0;
};

// ---- the suite ----------------------------------------------------------------------

class MetadataStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }

  void SetUp() override {
    const std::vector<MetadataBackendInfo> backends = ListMetadataBackends();
    for (const auto& b : backends) {
      if (b.name == GetParam() && !b.built)
        GTEST_SKIP() << "this build has no " << b.name << " store: " << b.missing;
    }
    service_ = MakeService(GetParam());
    ASSERT_TRUE(service_->Start());
  }

  void TearDown() override {
    for (auto& c : children_) c->process.Kill();
  }

  EngineOptions Options(const std::string& name) const {
    return BaseOptions(service_->url(), name, service_->ttl());
  }

  std::unique_ptr<Engine> MakeEngine(const std::string& name) {
    auto e = Engine::Create(Options(name));
    EXPECT_OK(e.status());
    return e.ok() ? std::move(e).value() : nullptr;
  }

  static std::string Key(const std::string& name) { return "ferry/segments/" + name; }

  ChildEngine* StartChildEngine(const std::string& name, uint64_t seed) {
    children_.push_back(std::make_unique<ChildEngine>());
    ChildEngine* c = children_.back().get();
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    EXPECT_GT(n, 0);
    if (n <= 0) return nullptr;
    self[n] = '\0';
    EXPECT_TRUE(c->process.Start(
        self, {"--gtest_filter=Backends/MetadataStoreTest.*", kChildFlag, service_->url(), name,
               std::to_string(seed), std::to_string(service_->ttl().count())}));
    std::string line;
    do {  // gtest_main may print a line of its own first
      if (!c->process.ReadLine(&line, 30s)) {
        ADD_FAILURE() << "no READY from the child engine " << name;
        return nullptr;
      }
    } while (line.rfind("READY", 0) != 0 && line.rfind("ERROR", 0) != 0);
    std::istringstream in(line);
    std::string word, addr;
    in >> word >> c->peer_id >> addr;
    EXPECT_EQ(word, "READY") << "the child engine " << name << " said: " << line;
    if (word != "READY") return nullptr;
    c->addr = std::strtoull(addr.c_str(), nullptr, 0);
    return c;
  }

  // Polls (bounded) until the service has (1) or lacks (0) `key`.
  bool WaitForKey(const std::string& key, int want, std::chrono::milliseconds timeout = 20s) {
    const auto deadline = SteadyClock::now() + timeout;
    std::string value;
    while (SteadyClock::now() < deadline) {
      if (service_->Get(key, &value) == want) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  // Retries a 4 KiB read of `seg` at `addr` (bounded) until it returns
  // pattern `seed`; the last status otherwise.
  Status ReadUntilPattern(Engine& engine, SegmentHandle seg, uint64_t addr, uint64_t seed,
                          unsigned char* buf) {
    Status last = UnavailableError("never tried");
    const auto deadline = SteadyClock::now() + 20s;
    while (SteadyClock::now() < deadline) {
      std::memset(buf, 0, 4096);
      last = engine.TransferSync({Opcode::kRead, buf, seg, addr, 4096});
      if (last.ok() && DescribePatternMismatch(buf, 4096, seed, 0).empty()) return OkStatus();
      if (last.ok()) last = DataLossError(DescribePatternMismatch(buf, 4096, seed, 0));
      std::this_thread::sleep_for(100ms);
    }
    return last;
  }

  std::unique_ptr<Service> service_;
  std::vector<std::unique_ptr<ChildEngine>> children_;
};

TEST_P(MetadataStoreTest, EnginesInSeparateProcessesFindEachOtherByNameAndMoveVerifiedBytes) {
  ChildEngine* decode = StartChildEngine("decode-0", 11);
  ASSERT_TRUE(decode);
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  AlignedBuffer local(kBufferSize);
  FillPattern(local.data(), kBufferSize, 22, 0);
  ASSERT_OK(prefill->RegisterMemory(local.data(), kBufferSize));
  std::string value;
  EXPECT_EQ(service_->Get(Key("decode-0"), &value), 1);
  EXPECT_EQ(service_->Get(Key("prefill-0"), &value), 1);

  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  const size_t half = kBufferSize / 2;
  // Write the second half, then read the whole buffer back.
  ASSERT_OK(
      prefill->TransferSync({Opcode::kWrite, local.data() + half, seg, decode->addr + half, half}));
  AlignedBuffer back(kBufferSize);
  ASSERT_OK(prefill->RegisterMemory(back.data(), kBufferSize));
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, back.data(), seg, decode->addr, kBufferSize}));
  EXPECT_EQ(DescribePatternMismatch(back.data(), half, 11, 0), "");
  EXPECT_EQ(DescribePatternMismatch(back.data() + half, half, 22, half), "");
}

// A process out of file descriptors cannot open a connection to the
// metadata service: RESOURCE_EXHAUSTED naming the limit and what to raise
// (as for peer links, docs/architecture.md "Peer links"), not UNAVAILABLE,
// and the same call works once the limit is back.
TEST_P(MetadataStoreTest, OutOfDescriptorsIsResourceExhaustedNamingTheLimit) {
  if (GetParam() == "redis") {
    GTEST_SKIP() << "the Redis client keeps its one connection open: a lookup opens no descriptor";
  }
  auto target = MakeEngine("fd-target");
  auto initiator = MakeEngine("fd-initiator");
  ASSERT_TRUE(target && initiator);
  OutOfDescriptors out;
  ASSERT_TRUE(out.lowered());
  const Status s = initiator->OpenSegment("fd-target").status();
  ASSERT_TRUE(out.Restore());
  // Checked once the limit is back (UBSan's vptr check needs a descriptor).
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted, HasSubstr("RLIMIT_NOFILE")));
  EXPECT_THAT(s, IsError(HasSubstr("cannot reach the")));  // the service, by its URL
  EXPECT_THAT(s, IsError(HasSubstr("raise")));
  EXPECT_OK(initiator->OpenSegment("fd-target").status());
}

TEST_P(MetadataStoreTest, SecondLiveEngineClaimingANameFailsNamingTheHolder) {
  auto holder = MakeEngine("decode-0");
  ASSERT_TRUE(holder);
  EngineOptions o = Options("decode-0");
  o.connect_timeout = 1s;
  auto second = Engine::Create(o);
  EXPECT_THAT(second.status(), StatusIs(StatusCode::kAlreadyExists, HasSubstr(holder->PeerId())));
  // The failed claim left the holder's entry alone: it is still found.
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  EXPECT_OK(prefill->OpenSegment("decode-0").status());
}

TEST_P(MetadataStoreTest, CleanShutdownRemovesTheEntryAndFreesTheName) {
  auto first = MakeEngine("decode-0");
  ASSERT_TRUE(first);
  std::string value;
  EXPECT_EQ(service_->Get(Key("decode-0"), &value), 1);
  first.reset();
  EXPECT_EQ(service_->Get(Key("decode-0"), &value), 0);
  auto again = MakeEngine("decode-0");
  EXPECT_TRUE(again);
}

TEST_P(MetadataStoreTest, KilledPeerExpiresAndTheRestartedPeerIsReachedAtItsNewInstance) {
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  AlignedBuffer local(kBufferSize);
  ASSERT_OK(prefill->RegisterMemory(local.data(), kBufferSize));

  ChildEngine* first = StartChildEngine("decode-0", 1);
  ASSERT_TRUE(first);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, first->addr, 4096}));
  EXPECT_EQ(DescribePatternMismatch(local.data(), 4096, 1, 0), "");

  // A crash: no removal, no more refreshes. The entry expires with its TTL.
  first->process.Kill();
  ASSERT_TRUE(WaitForKey(Key("decode-0"), 0)) << "the dead engine's entry never expired";
  auto probe = MakeEngine("probe-0");
  ASSERT_TRUE(probe);
  EXPECT_THAT(probe->OpenSegment("decode-0").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("decode-0")));

  // Restarted under the same name (a new instance, a buffer of another
  // pattern): transfers on the old handle reach it.
  ChildEngine* second = StartChildEngine("decode-0", 2);
  ASSERT_TRUE(second);
  EXPECT_OK(ReadUntilPattern(*prefill, seg, second->addr, 2, local.data()));
}

TEST_P(MetadataStoreTest, TransfersInFlightToAKilledInstanceFailUnavailableNamingIt) {
  ChildEngine* decode = StartChildEngine("decode-0", 4);
  ASSERT_TRUE(decode);
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  AlignedBuffer local(kBufferSize);
  ASSERT_OK(prefill->RegisterMemory(local.data(), kBufferSize));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, decode->addr, 4096}));
  // The peer stops answering with a read in flight, then dies.
  ASSERT_TRUE(decode->process.Freeze());
  Status in_flight;
  std::thread reader([&] {
    in_flight =
        prefill->TransferSync({Opcode::kRead, local.data(), seg, decode->addr, kBufferSize});
  });
  std::this_thread::sleep_for(200ms);  // let the request leave (the outcome does not depend on it)
  decode->process.Kill();
  reader.join();
  EXPECT_THAT(in_flight,
              StatusIs(StatusCode::kUnavailable, HasSubstr("segment 'decode-0', instance ")));
}

TEST_P(MetadataStoreTest, EngineRestartedRightAfterACrashTakesOverTheNameOfItsPredecessor) {
  if (GetParam() == "http") GTEST_SKIP() << "the HTTP protocol does not say when an entry expires";
  ChildEngine* first = StartChildEngine("decode-0", 1);
  ASSERT_TRUE(first);
  // Killed: its entry stays until its lease/TTL runs out, which is sooner
  // than the new engine's connect timeout, so the new one waits for it.
  first->process.Kill();
  ChildEngine* second = StartChildEngine("decode-0", 2);
  ASSERT_TRUE(second) << "the restarted engine could not take over the name";
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  AlignedBuffer local(4096);
  ASSERT_OK(prefill->RegisterMemory(local.data(), 4096));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  EXPECT_OK(ReadUntilPattern(*prefill, seg, second->addr, 2, local.data()));
}

TEST_P(MetadataStoreTest,
       StoppedServiceLeavesConnectedPeersWorkingAndEverythingRecoversWhenItReturns) {
  ChildEngine* decode = StartChildEngine("decode-0", 5);
  ASSERT_TRUE(decode);
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  AlignedBuffer local(kBufferSize);
  ASSERT_OK(prefill->RegisterMemory(local.data(), kBufferSize));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, decode->addr, 4096}));

  service_->Stop();
  // Connected peers do not need the service.
  std::memset(local.data(), 0, 4096);
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, decode->addr, 4096}));
  EXPECT_EQ(DescribePatternMismatch(local.data(), 4096, 5, 0), "");
  // New lookups cannot be answered.
  EXPECT_THAT(prefill->OpenSegment("decode-1").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("cannot reach")));

  ASSERT_TRUE(service_->Restart());
  // The engines publish themselves again (a restarted service may have
  // lost everything), and an engine that comes later finds them.
  ASSERT_TRUE(WaitForKey(Key("decode-0"), 1)) << "decode-0 never published itself again";
  ASSERT_TRUE(WaitForKey(Key("prefill-0"), 1)) << "prefill-0 never published itself again";
  auto late = MakeEngine("late-0");
  ASSERT_TRUE(late);
  AlignedBuffer late_buf(4096);
  ASSERT_OK(late->RegisterMemory(late_buf.data(), 4096));
  ASSERT_OK_AND_ASSIGN(SegmentHandle late_seg, late->OpenSegment("decode-0"));
  ASSERT_OK(late->TransferSync({Opcode::kRead, late_buf.data(), late_seg, decode->addr, 4096}));
  EXPECT_EQ(DescribePatternMismatch(late_buf.data(), 4096, 5, 0), "");
}

TEST_P(MetadataStoreTest, HostileValuesAreDataLossNamingTheKey) {
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  ASSERT_TRUE(service_->Put(Key("evil"), std::string("\x02\x00garbage\xff\xff\xff\xff", 13)));
  EXPECT_THAT(prefill->OpenSegment("evil").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr(Key("evil"))));
  // A real descriptor cut short, and one of another engine, are refused too.
  std::string real;
  ASSERT_EQ(service_->Get(Key("prefill-0"), &real), 1);
  ASSERT_TRUE(service_->Put(Key("cut"), real.substr(0, real.size() / 2)));
  EXPECT_THAT(prefill->OpenSegment("cut").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr(Key("cut"))));
  ASSERT_TRUE(service_->Put(Key("other"), real));
  EXPECT_THAT(prefill->OpenSegment("other").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr(Key("other"))));
  ASSERT_TRUE(service_->Put(Key("empty"), ""));
  EXPECT_THAT(prefill->OpenSegment("empty").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr(Key("empty"))));
}

TEST_P(MetadataStoreTest, ClustersSharingOneServiceKeepApart) {
  EngineOptions a = Options("decode-0");
  a.metadata_cluster = "blue";
  auto blue = Engine::Create(a);
  ASSERT_OK(blue.status());
  EngineOptions b = Options("decode-0");
  b.metadata_cluster = "green";
  auto green = Engine::Create(b);
  ASSERT_OK(green.status()) << "the same name in another cluster is no conflict";
  std::string value;
  EXPECT_EQ(service_->Get("blue/segments/decode-0", &value), 1);
  EXPECT_EQ(service_->Get("green/segments/decode-0", &value), 1);
  EXPECT_EQ(service_->Get(Key("decode-0"), &value), 0);
  EngineOptions bad = Options("x");
  bad.metadata_cluster = "a/b";
  EXPECT_THAT(Engine::Create(bad).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("metadata_cluster")));
}

INSTANTIATE_TEST_SUITE_P(Backends, MetadataStoreTest, ::testing::Values("http", "etcd", "redis"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ferry::test
