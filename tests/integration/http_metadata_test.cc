// The HTTP metadata store against a real `ferry metadata-server` child:
// engines find each other by name, claims, clean removal, expiry of an engine
// that died (a child process of this test binary, SIGKILLed), a restarted
// peer reached through the watch, a stopped server, malformed URLs and a
// hostile value. Every wait is bounded; no test asserts how long anything
// took.
#ifdef FERRY_HAVE_HTTP_METADATA

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/status_matchers.h"

#ifndef FERRY_CLI_PATH
#error "FERRY_CLI_PATH must name the ferry executable"
#endif

extern char** environ;

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

constexpr size_t kBufferSize = 1 << 20;
constexpr char kChildFlag[] = "--ferry-http-child-engine";

// A child process with its stdout on a pipe; SIGKILLed and reaped at the
// latest in the destructor.
class Child {
 public:
  ~Child() { Kill(); }

  ::testing::AssertionResult Start(const std::string& path, const std::vector<std::string>& args) {
    Kill();
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
      return ::testing::AssertionFailure() << "pipe2: " << std::strerror(errno);
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    sigaddset(&defaults, SIGTERM);
    sigaddset(&defaults, SIGINT);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<std::string> all{path};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, path.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(in[0]);
    close(out[1]);
    stdin_fd_ = in[1];
    stdout_fd_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      return ::testing::AssertionFailure() << "posix_spawn " << path << ": " << std::strerror(rc);
    }
    return ::testing::AssertionSuccess();
  }

  // The child's next stdout line, waiting at most `timeout`.
  ::testing::AssertionResult ReadLine(std::string* line, std::chrono::milliseconds timeout = 30s) {
    const auto deadline = SteadyClock::now() + timeout;
    for (;;) {
      const size_t nl = buffered_.find('\n');
      if (nl != std::string::npos) {
        *line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return ::testing::AssertionSuccess();
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
      if (left.count() <= 0) return ::testing::AssertionFailure() << "no line from the child in time";
      pollfd pfd{stdout_fd_, POLLIN, 0};
      const int n = poll(&pfd, 1, static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) continue;
      char chunk[4096];
      const ssize_t got = read(stdout_fd_, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return ::testing::AssertionFailure() << "the child closed its stdout (said: " << buffered_ << ")";
      buffered_.append(chunk, static_cast<size_t>(got));
    }
  }

  // SIGTERM, then waits at most `timeout`: the exit code, 128 + signal, or
  // -1 when it had to be SIGKILLed.
  int Terminate(std::chrono::milliseconds timeout = 15s) {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    const auto deadline = SteadyClock::now() + timeout;
    while (SteadyClock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        CloseFds();
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    Kill();
    return -1;
  }

  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      pid_ = -1;
    }
    CloseFds();
  }

 private:
  void CloseFds() {
    if (stdin_fd_ >= 0) close(stdin_fd_);
    if (stdout_fd_ >= 0) close(stdout_fd_);
    stdin_fd_ = stdout_fd_ = -1;
    buffered_.clear();
  }

  pid_t pid_ = -1;
  int stdin_fd_ = -1, stdout_fd_ = -1;
  std::string buffered_;
};

// ---- the child engine --------------------------------------------------------
// This binary run with `--ferry-http-child-engine URL NAME SEED` is an engine
// named NAME (tcp) with one buffer of kBufferSize bytes of pattern SEED. It
// prints "READY <peer_id> <addr>" and serves until its stdin closes.

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

[[noreturn]] void RunChildEngine(const std::string& url, const std::string& name, uint64_t seed) {
  signal(SIGPIPE, SIG_IGN);
  AlignedBuffer buffer(kBufferSize);
  FillPattern(buffer.data(), kBufferSize, seed, 0);
  EngineOptions o;
  o.transport = "tcp";
  o.listen_host = "127.0.0.1";
  o.metadata = url;
  o.local_name = name;
  auto e = Engine::Create(o);
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
  std::printf("READY %s 0x%llx\n", engine->PeerId().c_str(), static_cast<unsigned long long>(buffer.addr()));
  std::fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) != 0) {
  }
  engine.reset();
  std::_Exit(0);
}

// Runs before any test (after every static initializer) in the child mode.
class ChildEngineEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const auto args = OwnArgs();
    for (size_t i = 0; i + 3 < args.size(); ++i) {
      if (args[i] == kChildFlag) RunChildEngine(args[i + 1], args[i + 2], std::strtoull(args[i + 3].c_str(), nullptr, 10));
    }
  }
};
[[maybe_unused]] ::testing::Environment* const kChildEnv =
    ::testing::AddGlobalTestEnvironment(new ChildEngineEnvironment);

// ---- the tests ---------------------------------------------------------------

struct ChildEngine {
  Child process;
  std::string peer_id;
  uint64_t addr = 0;
};

class HttpMetadataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }

  void SetUp() override {
    ASSERT_TRUE(server_.Start(FERRY_CLI_PATH, {"metadata-server", "--port", "0", "--ttl-ms", "600"}));
    std::string line;
    ASSERT_TRUE(server_.ReadLine(&line));
    const std::string prefix = "metadata-server listening on 127.0.0.1:";
    ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
    port_ = std::atoi(line.c_str() + prefix.size());
    ASSERT_GT(port_, 0) << line;
    url_ = "http://127.0.0.1:" + std::to_string(port_) + "/metadata";
  }

  void TearDown() override {
    for (auto& c : children_) c->process.Kill();
    server_.Kill();
  }

  EngineOptions Options(const std::string& name) const {
    EngineOptions o;
    o.transport = "tcp";
    o.listen_host = "127.0.0.1";
    o.metadata = url_;
    o.local_name = name;
    o.connect_timeout = 5s;
    o.transfer_timeout = 10s;
    return o;
  }

  std::unique_ptr<Engine> MakeEngine(const std::string& name) {
    auto e = Engine::Create(Options(name));
    EXPECT_OK(e.status());
    return e.ok() ? std::move(e).value() : nullptr;
  }

  // A raw request to the server: the status (-1: no answer) and the body.
  std::pair<int, std::string> Raw(const std::string& method, const std::string& key, const std::string& body = "") {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(5);
    c.set_read_timeout(5);
    const std::string target = "/metadata?key=" + key;
    httplib::Result r = method == "GET"   ? c.Get(target)
                        : method == "PUT" ? c.Put(target, body, "application/octet-stream")
                                          : c.Delete(target);
    if (!r) return {-1, httplib::to_string(r.error())};
    return {r->status, r->body};
  }

  ChildEngine* StartChildEngine(const std::string& name, uint64_t seed) {
    children_.push_back(std::make_unique<ChildEngine>());
    ChildEngine* c = children_.back().get();
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    EXPECT_GT(n, 0);
    if (n <= 0) return nullptr;
    self[n] = '\0';
    EXPECT_TRUE(c->process.Start(self, {"--gtest_filter=HttpMetadataTest.*", kChildFlag, url_, name,
                                        std::to_string(seed)}));
    std::string line;
    do {  // gtest_main prints a line of its own first
      if (!c->process.ReadLine(&line)) {
        ADD_FAILURE() << "no READY from the child engine " << name;
        return nullptr;
      }
    } while (line.rfind("READY", 0) != 0 && line.rfind("ERROR", 0) != 0);
    std::istringstream in(line);
    std::string word, addr;
    in >> word >> c->peer_id >> addr;
    EXPECT_EQ(word, "READY") << line;
    if (word != "READY") return nullptr;
    c->addr = std::strtoull(addr.c_str(), nullptr, 0);
    return c;
  }

  // Polls (bounded) until GET of `key` answers `status`.
  bool WaitForStatus(const std::string& key, int status, std::chrono::milliseconds timeout = 15s) {
    const auto deadline = SteadyClock::now() + timeout;
    while (SteadyClock::now() < deadline) {
      if (Raw("GET", key).first == status) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  Child server_;
  int port_ = 0;
  std::string url_;
  std::vector<std::unique_ptr<ChildEngine>> children_;
};

TEST_F(HttpMetadataTest, EnginesFindEachOtherByNameAndMoveVerifiedBytes) {
  auto decode = MakeEngine("decode-0");
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(decode && prefill);
  AlignedBuffer remote(kBufferSize), local(kBufferSize);
  FillPattern(remote.data(), kBufferSize, 11, 0);
  FillPattern(local.data(), kBufferSize, 22, 0);
  ASSERT_OK(decode->RegisterMemory(remote.data(), kBufferSize));
  ASSERT_OK(prefill->RegisterMemory(local.data(), kBufferSize));
  EXPECT_EQ(Raw("GET", "ferry/segments/decode-0").first, 200);
  EXPECT_EQ(Raw("GET", "ferry/segments/prefill-0").first, 200);

  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  // Read the first half, write the second half.
  const size_t half = kBufferSize / 2;
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, remote.addr(), half}));
  EXPECT_EQ(DescribePatternMismatch(local.data(), half, 11, 0), "");
  ASSERT_OK(prefill->TransferSync({Opcode::kWrite, local.data() + half, seg, remote.addr() + half, half}));
  EXPECT_EQ(DescribePatternMismatch(remote.data() + half, half, 22, half), "");
}

TEST_F(HttpMetadataTest, SecondLiveEngineClaimingANameFailsNamingTheHolder) {
  auto holder = MakeEngine("decode-0");
  ASSERT_TRUE(holder);
  auto second = Engine::Create(Options("decode-0"));
  EXPECT_THAT(second.status(), StatusIs(StatusCode::kAlreadyExists, HasSubstr(holder->PeerId())));
  // The failed claim left the holder's entry alone: it is still found.
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  EXPECT_OK(prefill->OpenSegment("decode-0").status());
}

TEST_F(HttpMetadataTest, CleanShutdownRemovesTheEntryAndFreesTheName) {
  auto first = MakeEngine("decode-0");
  ASSERT_TRUE(first);
  EXPECT_EQ(Raw("GET", "ferry/segments/decode-0").first, 200);
  first.reset();
  EXPECT_EQ(Raw("GET", "ferry/segments/decode-0").first, 404);
  auto again = MakeEngine("decode-0");
  EXPECT_TRUE(again);
}

TEST_F(HttpMetadataTest, DeadEngineExpiresAndARestartedPeerIsReachedAtItsNewInstance) {
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  AlignedBuffer local(kBufferSize);
  ASSERT_OK(prefill->RegisterMemory(local.data(), kBufferSize));

  ChildEngine* first = StartChildEngine("decode-0", 1);
  ASSERT_TRUE(first);
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, prefill->OpenSegment("decode-0"));
  ASSERT_OK(prefill->TransferSync({Opcode::kRead, local.data(), seg, first->addr, 4096}));
  EXPECT_EQ(DescribePatternMismatch(local.data(), 4096, 1, 0), "");

  // A crash: no DELETE, no more refreshes. The entry expires after the TTL.
  first->process.Kill();
  ASSERT_TRUE(WaitForStatus("ferry/segments/decode-0", 404)) << "the dead engine's entry never expired";
  auto probe = MakeEngine("probe-0");
  ASSERT_TRUE(probe);
  EXPECT_THAT(probe->OpenSegment("decode-0").status(), StatusIs(StatusCode::kUnavailable, HasSubstr("decode-0")));

  // Restarted under the same name (a new instance, a new buffer of another
  // pattern): the prefill engine's transfers on its old handle reach it.
  ChildEngine* second = StartChildEngine("decode-0", 2);
  ASSERT_TRUE(second);
  bool reached = false;
  Status last;
  const auto deadline = SteadyClock::now() + 15s;
  while (!reached && SteadyClock::now() < deadline) {
    std::memset(local.data(), 0, 4096);
    last = prefill->TransferSync({Opcode::kRead, local.data(), seg, second->addr, 4096});
    reached = last.ok() && DescribePatternMismatch(local.data(), 4096, 2, 0).empty();
    if (!reached) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(reached) << "the restarted peer was never reached; last: " << last.ToString();
}

TEST_F(HttpMetadataTest, StoppedServerFailsOpenSegmentWithUnavailable) {
  EngineOptions o = Options("prefill-0");
  o.connect_timeout = 1s;
  auto e = Engine::Create(o);
  ASSERT_OK(e.status());
  std::unique_ptr<Engine> prefill = std::move(e).value();
  ASSERT_EQ(server_.Terminate(), 0) << "the server must exit 0 on SIGTERM";
  EXPECT_THAT(prefill->OpenSegment("decode-9").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("metadata service")));
  prefill.reset();  // Remove fails quietly; the refresh thread stops
}

TEST_F(HttpMetadataTest, MalformedUrlsAndAnUnreachableServerAreClearErrors) {
  for (const std::string url : {"http://", "http://:8080/metadata", "http://127.0.0.1:99999/metadata",
                                "http://127.0.0.1:abc/metadata", "https://127.0.0.1:8080/metadata",
                                "http://127.0.0.1:8080/metadata?key=x"}) {
    EngineOptions o = Options("prefill-0");
    o.metadata = url;
    EXPECT_THAT(Engine::Create(o).status(), StatusIs(StatusCode::kInvalidArgument, HasSubstr(url))) << url;
  }
  // A port nobody listens on (bound, then closed).
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  EngineOptions o = Options("prefill-0");
  o.metadata = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + "/metadata";
  EXPECT_THAT(Engine::Create(o).status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("cannot reach the metadata service at " + o.metadata)));
}

TEST_F(HttpMetadataTest, HostileValueIsDataLossNamingTheKey) {
  auto prefill = MakeEngine("prefill-0");
  ASSERT_TRUE(prefill);
  ASSERT_EQ(Raw("PUT", "ferry/segments/evil", std::string("\x02\x00garbage\xff\xff\xff\xff", 13)).first, 200);
  EXPECT_THAT(prefill->OpenSegment("evil").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ferry/segments/evil")));
  // A real descriptor cut short, and one of another engine, are refused too.
  auto [status, real] = Raw("GET", "ferry/segments/prefill-0");
  ASSERT_EQ(status, 200);
  ASSERT_EQ(Raw("PUT", "ferry/segments/cut", real.substr(0, real.size() / 2)).first, 200);
  EXPECT_THAT(prefill->OpenSegment("cut").status(), StatusIs(StatusCode::kDataLoss, HasSubstr("ferry/segments/cut")));
  ASSERT_EQ(Raw("PUT", "ferry/segments/other", real).first, 200);
  EXPECT_THAT(prefill->OpenSegment("other").status(),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ferry/segments/other")));
}

}  // namespace
}  // namespace ferry::test

#endif  // FERRY_HAVE_HTTP_METADATA
