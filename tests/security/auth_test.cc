// Peer authentication (EngineOptions::secret_file, FERRY_SECRET_FILE), over
// every socket transport: engines that share the cluster secret move bytes;
// a wrong secret, or a secret on one side only, is refused on both sides with
// kUnauthenticated saying which side lacks it; connections that skip,
// forge or replay the challenge-response are closed before any memory is
// touched; bad secret files fail Engine::Create naming the path.
// Every wait is bounded; nothing here measures time.
#include "common/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/net.h"
#include "ferry/ferry.h"
#include "tests/conformance/conformance_fixture.h"
#include "tests/testing/buffer.h"
#include "tests/testing/same_host.h"
#include "tests/testing/status_matchers.h"
#include "transport/shm/copy_frames.h"
#include "transport/stream/auth.h"
#include "wire/descriptor.h"
#include "wire/frame.h"

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;
using internal::UniqueFd;

constexpr size_t kSize = 64 * 1024;
constexpr auto kBound = std::chrono::seconds(20);  // every raw-socket wait

// Secret files in a fresh temporary folder, removed at the end.
class SecretFiles {
 public:
  SecretFiles() {
    char tmpl[] = "/tmp/ferry-auth-test-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    dir_ = d ? d : "/tmp";
  }
  ~SecretFiles() {
    for (const auto& p : files_) std::remove(p.c_str());
    ::rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    files_.push_back(path);
    return path;
  }
  std::string Missing() const { return dir_ + "/no-such-secret"; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
};

constexpr char kSecretA[] = "correct horse battery staple, cluster A";
constexpr char kSecretB[] = "a different secret of cluster B, 42";

EngineOptions Opts(const std::string& transport, const std::string& secret_file,
                   const std::string& cluster = "", const std::string& name = "") {
  EngineOptions o = ConformanceOptions(transport);
  o.secret_file = secret_file;
  o.connect_timeout = std::chrono::milliseconds(10000);
  if (!cluster.empty()) {
    o.metadata = "memory://" + cluster;
    o.local_name = name;
  }
  return o;
}

std::unique_ptr<Engine> Make(const EngineOptions& o) {
  auto e = Engine::Create(o);
  EXPECT_THAT(GetStatus(e), IsOk()) << "creating an engine, transport " << o.transport;
  return e.ok() ? std::move(e).value() : nullptr;
}

bool AllBytes(const unsigned char* p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != v) return false;
  }
  return true;
}

// ---- engines against engines, per transport ---------------------------------

class Auth : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "shm") FERRY_SKIP_WITHOUT_SAME_HOST_COPY();
  }
  // A memory:// cluster per test: the descriptors travel in the process and
  // the transport's own streams are the first contact (no handshake on the
  // rpc port), so the streams' authentication is tested by itself.
  std::string Cluster() const {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string("auth-") + info->name();
  }
  SecretFiles files_;
};

TEST_P(Auth, EnginesSharingTheSecretMoveBytes) {
  // The trailing newline is not part of the secret.
  const std::string a = files_.Write("a", std::string(kSecretA) + "\n");
  const std::string a2 = files_.Write("a2", kSecretA);
  EnginePair pair;
  pair.Start(Opts(GetParam(), a), Opts(GetParam(), a2));
  if (HasFatalFailure()) return;
  auto info = pair.initiator().QuerySegment(pair.segment());
  ASSERT_THAT(GetStatus(info), IsOk());
  EXPECT_EQ(info->transport, GetParam());
  unsigned char* local = pair.Alloc(kSize, &pair.initiator());
  unsigned char* remote = pair.Alloc(kSize, &pair.target());
  ASSERT_TRUE(local && remote);
  const std::vector<Piece> pieces = {{0, 4096, 4096}, {8192, 0, 1000}, {16384, 32768, 32768}};
  pair.RunScatter(Opcode::kWrite, local, kSize, remote, kSize, pieces, 11, 2);
  pair.RunScatter(Opcode::kRead, local, kSize, remote, kSize, pieces, 12, 3);
}

TEST_P(Auth, EnginesSharingTheSecretMoveBytesWithoutAHandshake) {
  const std::string a = files_.Write("a", kSecretA);
  auto target = Make(Opts(GetParam(), a, Cluster(), "target"));
  auto initiator = Make(Opts(GetParam(), a, Cluster(), "initiator"));
  ASSERT_TRUE(target && initiator);
  AlignedBuffer src(kSize), dst(kSize);
  std::memset(src.data(), 0x5a, kSize);
  std::memset(dst.data(), 0, kSize);
  ASSERT_THAT(initiator->RegisterMemory(src.data(), kSize), IsOk());
  ASSERT_THAT(target->RegisterMemory(dst.data(), kSize), IsOk());
  auto seg = initiator->OpenSegment("target");
  ASSERT_THAT(GetStatus(seg), IsOk());
  ASSERT_THAT(initiator->TransferSync({Opcode::kWrite, src.data(), *seg, dst.addr(), kSize}),
              IsOk());
  EXPECT_TRUE(AllBytes(dst.data(), kSize, 0x5a));
}

// The target's region, and what must become of it: nothing.
struct Guarded {
  explicit Guarded(Engine& target) : buf(kSize) {
    std::memset(buf.data(), 0x33, kSize);
    EXPECT_THAT(target.RegisterMemory(buf.data(), kSize), IsOk());
  }
  bool Untouched() const { return AllBytes(buf.data(), kSize, 0x33); }
  AlignedBuffer buf;
};

// One attempt of an engine with `from_secret` to open an engine with
// `to_secret` and write into its region.
struct Attempt {
  Status status;          // what the initiator got
  std::string target;     // the target's peer id
  bool untouched = true;  // the target's region after it
};

// Two attempts: over the P2P handshake (the rpc port first), and through a
// memory:// store (no handshake: the transport's streams are the first
// contact).
std::vector<Attempt> Attempts(const std::string& transport, const std::string& from_secret,
                              const std::string& to_secret, const std::string& cluster) {
  std::vector<Attempt> out;
  for (const bool p2p : {true, false}) {
    auto target = Make(Opts(transport, to_secret, p2p ? "" : cluster, "target"));
    auto initiator = Make(Opts(transport, from_secret, p2p ? "" : cluster, "initiator"));
    if (!target || !initiator) return out;
    Guarded guarded(*target);
    AlignedBuffer src(kSize);
    std::memset(src.data(), 0x77, kSize);
    EXPECT_THAT(initiator->RegisterMemory(src.data(), kSize), IsOk());
    Attempt a;
    a.target = target->PeerId();
    auto seg = initiator->OpenSegment(p2p ? target->PeerId() : "target");
    a.status = GetStatus(seg);
    if (a.status.ok()) {
      a.status =
          initiator->TransferSync({Opcode::kWrite, src.data(), *seg, guarded.buf.addr(), kSize});
    }
    a.untouched = guarded.Untouched();
    out.push_back(a);
  }
  EXPECT_EQ(out.size(), 2u);
  return out;
}

TEST_P(Auth, AWrongSecretIsRefusedOnBothSides) {
  const std::string a = files_.Write("a", kSecretA), b = files_.Write("b", kSecretB);
  for (const auto& [from, to] : {std::make_pair(a, b), std::make_pair(b, a)}) {
    for (const Attempt& at : Attempts(GetParam(), from, to, Cluster())) {
      EXPECT_THAT(at.status, StatusIs(StatusCode::kUnauthenticated,
                                      HasSubstr("peer " + at.target +
                                                " does not share this engine's cluster secret")));
      EXPECT_TRUE(at.untouched);
    }
  }
}

TEST_P(Auth, ASecretOnOneSideOnlyIsRefusedSayingWhichSideLacksIt) {
  const std::string a = files_.Write("a", kSecretA);
  for (const Attempt& at : Attempts(GetParam(), "", a, Cluster() + "-1")) {
    EXPECT_THAT(
        at.status,
        StatusIs(
            StatusCode::kUnauthenticated,
            HasSubstr("peer " + at.target +
                      " requires a cluster secret (FERRY_SECRET_FILE) and this engine has none")));
    EXPECT_TRUE(at.untouched);
  }
  for (const Attempt& at : Attempts(GetParam(), a, "", Cluster() + "-2")) {
    EXPECT_THAT(at.status, StatusIs(StatusCode::kUnauthenticated,
                                    HasSubstr("this engine has a cluster secret but peer " +
                                              at.target + " has none")));
    EXPECT_TRUE(at.untouched);
  }
}

TEST_P(Auth, EnginesWithoutSecretsSpeakTheOldProtocol) {
  EnginePair pair;
  pair.Start(Opts(GetParam(), ""), Opts(GetParam(), ""));
  if (HasFatalFailure()) return;
  unsigned char* local = pair.Alloc(kSize, &pair.initiator());
  unsigned char* remote = pair.Alloc(kSize, &pair.target());
  ASSERT_TRUE(local && remote);
  pair.RunScatter(Opcode::kWrite, local, kSize, remote, kSize, {{0, 0, kSize}}, 21, 1);
}

INSTANTIATE_TEST_SUITE_P(SocketTransports, Auth, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// A refusal is logged once per peer, not once per connection.
TEST(AuthLog, ARefusalIsLoggedOncePerPeer) {
  const char* level = std::getenv("FERRY_LOG_LEVEL");
  if (level != nullptr && std::string(level) != "warning" && std::string(level) != "info" &&
      std::string(level) != "debug") {
    GTEST_SKIP() << "FERRY_LOG_LEVEL=" << level << " hides warnings";
  }
  SecretFiles files;
  auto target = Make(Opts("tcp", files.Write("a", kSecretA)));
  auto stranger = Make(Opts("tcp", ""));
  ASSERT_TRUE(target && stranger);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(GetStatus(stranger->OpenSegment(target->PeerId())),
                StatusIs(StatusCode::kUnauthenticated));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string line = "refused peer " + stranger->PeerId() + " ";
  size_t count = 0;
  for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++count;
  EXPECT_EQ(count, 1u) << log;
}

// ---- bad secret files --------------------------------------------------------

TEST(AuthSecretFile, BadFilesFailCreateNamingThePath) {
  SecretFiles files;
  const std::string empty = files.Write("empty", "");
  const std::string newline_only = files.Write("newline", "\n");
  const std::string short_one = files.Write("short", "fifteen bytes!!\n");  // 15 + newline
  for (const std::string& path : {files.Missing(), empty, newline_only, short_one}) {
    auto e = Engine::Create(Opts("tcp", path));
    EXPECT_THAT(GetStatus(e), StatusIs(StatusCode::kInvalidArgument, HasSubstr(path))) << path;
  }
  EXPECT_THAT(GetStatus(Engine::Create(Opts("tcp", files.Missing()))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cannot be read")));
  EXPECT_THAT(GetStatus(Engine::Create(Opts("tcp", empty))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(GetStatus(Engine::Create(Opts("tcp", short_one))),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("at least 16")));
  // Sixteen bytes are enough; the secret itself is never in a message.
  const std::string ok = files.Write("ok", "sixteen bytes!!!");
  EXPECT_THAT(GetStatus(Engine::Create(Opts("tcp", ok))), IsOk());
}

// ---- raw connections against an engine with a secret ---------------------

// A connected blocking socket to the rpc port or the same-host socket.
UniqueFd ConnectRpc(uint16_t port) {
  auto fd = internal::ConnectTo({"127.0.0.1", port}, Clock::now() + kBound);
  EXPECT_THAT(GetStatus(fd), IsOk());
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

UniqueFd ConnectShm(const std::string& name) {
  auto fd = internal::ConnectUnix(name, Clock::now() + kBound);
  EXPECT_THAT(GetStatus(fd), IsOk());
  return fd.ok() ? std::move(*fd) : UniqueFd();
}

std::string Frame(wire::FrameType type, std::string_view body, uint8_t version = 0,
                  std::string_view payload = {}) {
  wire::FrameHeader h;
  h.version = version;
  h.type = type;
  h.seq = 1;
  h.payload_len = static_cast<uint32_t>(payload.size());
  std::string f = wire::BuildFrame(h, body);
  f.append(payload);
  return f;
}

// A Write of `n` bytes of 0xee at `addr`, as an attacker would send it after
// its hello (wire version 1).
std::string WriteFrame(uint64_t addr, uint32_t n) {
  wire::Entry e{addr, n};
  std::string body;
  wire::EncodeEntries(&e, 1, &body);
  return Frame(wire::FrameType::kWrite, body, 1, std::string(n, '\xee'));
}

// The frames the peer sends until it closes (at most kBound); `closed` says
// whether it did.
struct Received {
  std::vector<std::pair<wire::FrameHeader, std::string>> frames;
  bool closed = false;
};
Received ReadUntilClose(int fd) {
  Received r;
  std::string bytes;
  const auto deadline = Clock::now() + kBound;
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    const int n = ::poll(&pfd, 1, 100);
    if (n <= 0) continue;
    const ssize_t got = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
      r.closed = true;
      break;
    }
    if (got > 0) bytes.append(buf, static_cast<size_t>(got));
  }
  size_t off = 0;
  while (bytes.size() - off >= wire::kFrameHeaderSize) {
    auto h = wire::DecodeHeader(reinterpret_cast<const uint8_t*>(bytes.data() + off));
    if (!h.ok() || bytes.size() - off - wire::kFrameHeaderSize < h->body_len) break;
    r.frames.emplace_back(*h, bytes.substr(off + wire::kFrameHeaderSize, h->body_len));
    off += wire::kFrameHeaderSize + h->body_len + h->payload_len;
  }
  return r;
}

// One AuthHello → AuthChallenge on `fd`; the challenge (OK status expected).
wire::AuthChallenge Challenge(int fd, const wire::AuthHello& hello) {
  std::string body;
  wire::EncodeAuthHello(hello, &body);
  const std::string f = Frame(wire::FrameType::kAuthHello, body);
  EXPECT_THAT(internal::SendAll(fd, f.data(), f.size(), Clock::now() + kBound), IsOk());
  uint8_t hdr[wire::kFrameHeaderSize];
  wire::AuthChallenge out;
  if (!internal::RecvAll(fd, hdr, sizeof(hdr), Clock::now() + kBound).ok()) {
    ADD_FAILURE() << "no challenge";
    return out;
  }
  auto h = wire::DecodeHeader(hdr);
  EXPECT_TRUE(h.ok() && h->type == wire::FrameType::kAuthChallenge);
  if (!h.ok()) return out;
  std::string reply(h->body_len, '\0');
  EXPECT_THAT(internal::RecvAll(fd, reply.data(), reply.size(), Clock::now() + kBound), IsOk());
  auto c = wire::DecodeAuthChallenge(reply);
  EXPECT_THAT(GetStatus(c), IsOk());
  if (c.ok()) out = *c;
  EXPECT_THAT(out.status, IsOk());
  return out;
}

// Raw connections to an engine with a secret, on its rpc port (tcp) or its
// same-host socket (shm); the test knows the secret, as a peer would.
class RawAuth : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "shm") FERRY_SKIP_WITHOUT_SAME_HOST_COPY();
    path_ = files_.Write("a", kSecretA);
    auto secret = internal::ClusterSecret::Load(path_);
    ASSERT_THAT(GetStatus(secret), IsOk());
    secret_ = *secret;
    // The target; a second engine with the secret learns its instance (the
    // same-host socket's name carries it) through a memory:// store.
    const std::string cluster = std::string("raw-") +
                                ::testing::UnitTest::GetInstance()->current_test_info()->name() +
                                GetParam();
    target_ = Make(Opts(GetParam(), path_, cluster, "target"));
    observer_ = Make(Opts(GetParam(), path_, cluster, "observer"));
    ASSERT_TRUE(target_ && observer_);
    guarded_ = std::make_unique<Guarded>(*target_);
    auto seg = observer_->OpenSegment("target");
    ASSERT_THAT(GetStatus(seg), IsOk());
    auto info = observer_->QuerySegment(*seg);
    ASSERT_THAT(GetStatus(info), IsOk());
    instance_ = info->instance_id;
  }

  UniqueFd Connect() {
    if (GetParam() == "tcp") return ConnectRpc(target_->RpcPort());
    char name[64];
    std::snprintf(name, sizeof(name), "ferry-shm-%d-%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(instance_));
    return ConnectShm(name);
  }

  // The stream's hello, as the transport under test sends it.
  std::string Hello() const {
    wire::StreamHello hello{1, instance_, 1, 0, "127.0.0.1:1"};
    std::string body;
    wire::EncodeStreamHello(hello, &body);
    if (GetParam() == "tcp") return Frame(wire::FrameType::kStreamHello, body);
    // CopyHello: the hello, then a probe of this process's memory.
    static const char probe[16] = "probe-probe-123";
    internal::shm::CopyHello copy;
    copy.hello = hello;
    copy.probe_addr = reinterpret_cast<uint64_t>(probe);
    copy.probe.assign(probe, sizeof(probe));
    body.clear();
    internal::shm::EncodeCopyHello(copy, &body);
    return Frame(wire::FrameType::kCopyHello, body);
  }

  // What a peer with the secret sends after a challenge.
  std::string Proof(const wire::AuthHello& hello, const wire::AuthChallenge& c) const {
    wire::AuthProof p;
    auto mac = secret_->Mac("ferry-auth-v1 client", c.nonce, hello.nonce);
    EXPECT_THAT(GetStatus(mac), IsOk());
    if (mac.ok()) p.mac = *mac;
    std::string body;
    wire::EncodeAuthProof(p, &body);
    return Frame(wire::FrameType::kAuthProof, body);
  }

  // Sends `bytes`, then expects the peer to close without ever accepting the
  // hello, and the region to be untouched.
  void ExpectRefused(int fd, const std::string& bytes, bool expect_refusal_ack) {
    ASSERT_THAT(internal::SendAll(fd, bytes.data(), bytes.size(), Clock::now() + kBound), IsOk());
    Received r = ReadUntilClose(fd);
    EXPECT_TRUE(r.closed) << "the engine did not close the connection";
    bool acked = false;
    for (const auto& [h, body] : r.frames) {
      if (h.type != wire::FrameType::kStreamHelloAck) continue;
      Status st;
      ASSERT_THAT(wire::DecodeStatus(body, &st), IsOk());
      EXPECT_THAT(st,
                  StatusIs(StatusCode::kUnauthenticated, HasSubstr("requires a cluster secret")));
      acked = true;
    }
    EXPECT_EQ(acked, expect_refusal_ack);
    EXPECT_TRUE(guarded_->Untouched()) << "the region was written";
  }

  uint64_t Region() const { return guarded_->buf.addr(); }

  SecretFiles files_;
  std::string path_;
  std::shared_ptr<const internal::ClusterSecret> secret_;
  std::unique_ptr<Engine> target_, observer_;
  std::unique_ptr<Guarded> guarded_;
  uint64_t instance_ = 0;
};

TEST_P(RawAuth, AHelloWithoutAuthenticationIsRefusedAndClosed) {
  UniqueFd fd = Connect();
  ASSERT_TRUE(fd.valid());
  ExpectRefused(fd.get(), Hello() + WriteFrame(Region(), 4096), /*expect_refusal_ack=*/true);
}

TEST_P(RawAuth, AWrongProofIsClosed) {
  UniqueFd fd = Connect();
  ASSERT_TRUE(fd.valid());
  wire::AuthHello hello;
  hello.nonce.fill(7);
  hello.peer_id = "forger";
  Challenge(fd.get(), hello);
  wire::AuthProof wrong;
  wrong.mac.fill(0x42);
  std::string body;
  wire::EncodeAuthProof(wrong, &body);
  ExpectRefused(fd.get(),
                Frame(wire::FrameType::kAuthProof, body) + Hello() + WriteFrame(Region(), 4096),
                false);
}

TEST_P(RawAuth, AReplayedProofIsClosed) {
  wire::AuthHello hello;
  hello.nonce.fill(9);
  hello.peer_id = "replayer";
  std::string recorded;
  {
    // A genuine conversation: its proof opens this connection (the hello is
    // answered, so it passed authentication)...
    UniqueFd fd = Connect();
    ASSERT_TRUE(fd.valid());
    recorded = Proof(hello, Challenge(fd.get(), hello));
    const std::string bytes = recorded + Hello();
    ASSERT_THAT(internal::SendAll(fd.get(), bytes.data(), bytes.size(), Clock::now() + kBound),
                IsOk());
    uint8_t hdr[wire::kFrameHeaderSize];
    ASSERT_THAT(internal::RecvAll(fd.get(), hdr, sizeof(hdr), Clock::now() + kBound), IsOk());
    auto h = wire::DecodeHeader(hdr);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(h->type, wire::FrameType::kStreamHelloAck);
  }
  {
    // ...and opens no other: not sent on its own,
    UniqueFd fd = Connect();
    ASSERT_TRUE(fd.valid());
    ExpectRefused(fd.get(), recorded + Hello() + WriteFrame(Region(), 4096), false);
  }
  {
    // nor after the same hello replayed (a fresh challenge).
    UniqueFd fd = Connect();
    ASSERT_TRUE(fd.valid());
    Challenge(fd.get(), hello);
    ExpectRefused(fd.get(), recorded + Hello() + WriteFrame(Region(), 4096), false);
  }
}

TEST_P(RawAuth, AnAuthenticatedPeerIsServed) {
  // The positive control of the tests above: the same frames after a genuine
  // proof write the region.
  UniqueFd fd = Connect();
  ASSERT_TRUE(fd.valid());
  wire::AuthHello hello;
  hello.nonce.fill(3);
  const std::string proof = Proof(hello, Challenge(fd.get(), hello));
  const std::string bytes = proof + Hello();
  ASSERT_THAT(internal::SendAll(fd.get(), bytes.data(), bytes.size(), Clock::now() + kBound),
              IsOk());
  uint8_t hdr[wire::kFrameHeaderSize];
  ASSERT_THAT(internal::RecvAll(fd.get(), hdr, sizeof(hdr), Clock::now() + kBound), IsOk());
  auto h = wire::DecodeHeader(hdr);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->type, wire::FrameType::kStreamHelloAck);
  std::string body(h->body_len, '\0');
  ASSERT_THAT(internal::RecvAll(fd.get(), body.data(), body.size(), Clock::now() + kBound), IsOk());
  Status st;
  ASSERT_THAT(wire::DecodeStatus(body, &st), IsOk());
  EXPECT_THAT(st, IsOk());
  if (GetParam() != "tcp") return;  // shm streams take copy frames, not writes
  const std::string w = WriteFrame(Region(), 4096);
  ASSERT_THAT(internal::SendAll(fd.get(), w.data(), w.size(), Clock::now() + kBound), IsOk());
  ASSERT_THAT(internal::RecvAll(fd.get(), hdr, sizeof(hdr), Clock::now() + kBound), IsOk());
  EXPECT_TRUE(AllBytes(guarded_->buf.data(), 4096, 0xee));
}

INSTANTIATE_TEST_SUITE_P(SocketTransports, RawAuth, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return info.param; });

// The handshake on the rpc port: refused, answering with no descriptor (no
// region addresses for a stranger).
TEST(RawAuthHandshake, AHandshakeWithoutAuthenticationIsRefusedAndLeaksNothing) {
  SecretFiles files;
  auto target = Make(Opts("tcp", files.Write("a", kSecretA)));
  ASSERT_TRUE(target);
  Guarded guarded(*target);
  UniqueFd fd = ConnectRpc(target->RpcPort());
  ASSERT_TRUE(fd.valid());
  wire::PeerDescriptor self;
  self.peer_id = "127.0.0.1:1";
  self.wire_min = self.wire_max = 1;
  std::string body;
  wire::EncodeDescriptor(self, &body, wire::kDescriptorFormatMin);
  const std::string f = Frame(wire::FrameType::kHandshakeRequest, body);
  ASSERT_THAT(internal::SendAll(fd.get(), f.data(), f.size(), Clock::now() + kBound), IsOk());
  Received r = ReadUntilClose(fd.get());
  EXPECT_TRUE(r.closed);
  ASSERT_EQ(r.frames.size(), 1u);
  ASSERT_EQ(r.frames[0].first.type, wire::FrameType::kHandshakeResponse);
  auto resp = wire::DecodeHandshakeResponse(r.frames[0].second);
  ASSERT_THAT(GetStatus(resp), IsOk());
  EXPECT_THAT(resp->first,
              StatusIs(StatusCode::kUnauthenticated, HasSubstr("requires a cluster secret")));
  EXPECT_TRUE(resp->second.regions.empty());
  EXPECT_EQ(resp->second.instance_id, 0u);
  EXPECT_TRUE(guarded.Untouched());
}

// An engine without a secret answers an AuthHello with a refusal that says so.
TEST(RawAuthHandshake, AnEngineWithoutASecretRefusesAuthentication) {
  auto target = Make(Opts("tcp", ""));
  ASSERT_TRUE(target);
  UniqueFd fd = ConnectRpc(target->RpcPort());
  ASSERT_TRUE(fd.valid());
  wire::AuthHello hello;
  std::string body;
  wire::EncodeAuthHello(hello, &body);
  const std::string f = Frame(wire::FrameType::kAuthHello, body);
  ASSERT_THAT(internal::SendAll(fd.get(), f.data(), f.size(), Clock::now() + kBound), IsOk());
  Received r = ReadUntilClose(fd.get());
  EXPECT_TRUE(r.closed);
  ASSERT_EQ(r.frames.size(), 1u);
  ASSERT_EQ(r.frames[0].first.type, wire::FrameType::kAuthChallenge);
  auto c = wire::DecodeAuthChallenge(r.frames[0].second);
  ASSERT_THAT(GetStatus(c), IsOk());
  EXPECT_THAT(c->status,
              StatusIs(StatusCode::kUnauthenticated, HasSubstr("has no cluster secret")));
}

}  // namespace
}  // namespace ferry::test
