// Hostile input on every port of an engine: its rpc port (handshakes and tcp
// streams) and its same-host socket (abstract unix socket
// "ferry-shm-<pid>-<instance>", shm streams). Raw connections from this
// process send
//   (1) random garbage, before and after a valid hello;
//   (2) valid frames cut at every length of their header and body (and, for
//       a Write, inside its payload), then end the connection;
//   (3) a recorded conversation (hello + Write) replayed on a new
//       connection, with and without a cluster secret, and to a restarted
//       target;
//   (4) entries naming ranges outside registered memory, across two
//       regions, of length 0 and wrapping around the address space;
// and after every attempt the target's registered memory must be byte for
// byte what it was (or hold exactly the bytes a valid entry wrote). All the
// while a real engine moves verified bytes to and from the same target
// (5): it must keep working during and after all of it.
// Frames are built with the encoders of src/wire/ and src/transport/shm/.
// Every wait is bounded; nothing here measures time.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/net.h"
#include "ferry/ferry.h"
#include "tests/conformance/conformance_fixture.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/same_host.h"
#include "tests/testing/status_matchers.h"
#include "transport/shm/copy_frames.h"
#include "transport/shm/request_ring.h"
#include "wire/descriptor.h"
#include "wire/frame.h"

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using internal::UniqueFd;

constexpr size_t kGuard = 256 * 1024;  // the target region hostile frames aim at (two regions)
constexpr size_t kBusy = 1 << 20;      // the target region the valid peer uses
constexpr uint64_t kGuardSeed = 0x6a7d;
constexpr auto kBound = std::chrono::seconds(20);  // every raw-socket wait
constexpr char kSecret[] = "hostile-input test secret, 32+ bytes";

// ---- raw frames -------------------------------------------------------------

std::string Frame(wire::FrameType type, std::string_view body, uint8_t version = 0,
                  std::string_view payload = {}, uint64_t seq = 1) {
  wire::FrameHeader h;
  h.version = version;
  h.type = type;
  h.seq = seq;
  h.payload_len = static_cast<uint32_t>(payload.size());
  std::string f = wire::BuildFrame(h, body);
  f.append(payload);
  return f;
}

// tcp: a Write of `entries`, payload = `payload` (the entries' bytes in order).
std::string WriteFrame(const std::vector<wire::Entry>& entries, std::string_view payload,
                       uint64_t seq = 1) {
  std::string body;
  wire::EncodeEntries(entries.data(), entries.size(), &body);
  return Frame(wire::FrameType::kWrite, body, kWireVersionMax, payload, seq);
}

std::string ReadFrame(const std::vector<wire::Entry>& entries, uint64_t seq = 1) {
  std::string body;
  wire::EncodeEntries(entries.data(), entries.size(), &body);
  return Frame(wire::FrameType::kRead, body, kWireVersionMax, {}, seq);
}

// shm: CopyWrite / CopyRead of `entries` (peer_addr in this process).
std::string CopyFrame(wire::FrameType type, const std::vector<internal::shm::CopyEntry>& entries,
                      uint64_t seq = 1) {
  std::string body;
  internal::shm::EncodeCopyEntries(entries.data(), entries.size(), &body);
  return Frame(type, body, kWireVersionMax, {}, seq);
}

bool Send(int fd, const std::string& bytes) {
  return internal::SendAll(fd, bytes.data(), bytes.size(), Clock::now() + kBound).ok();
}

// Ends our side (EOF for the target), then waits for the target to close,
// discarding what it sends. True if it closed within kBound.
bool EndAndWaitForClose(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto deadline = Clock::now() + kBound;
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, 100);
    if (n < 0 && errno != EINTR) return false;
    if (n <= 0) continue;
    const ssize_t got = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (got == 0) return true;
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

// One frame from the target: header and body (payload, if any, in *payload).
struct Incoming {
  wire::FrameHeader header;
  std::string body;
  std::string payload;
};
::testing::AssertionResult Receive(int fd, Incoming* in) {
  uint8_t hdr[wire::kFrameHeaderSize];
  Status s = internal::RecvAll(fd, hdr, sizeof(hdr), Clock::now() + kBound);
  if (!s.ok()) return ::testing::AssertionFailure() << "no frame from the target: " << s;
  auto h = wire::DecodeHeader(hdr);
  if (!h.ok()) return ::testing::AssertionFailure() << "bad header from the target: " << h.status();
  in->header = *h;
  in->body.assign(h->body_len, '\0');
  in->payload.assign(h->payload_len, '\0');
  s = internal::RecvAll(fd, in->body.data(), in->body.size(), Clock::now() + kBound);
  if (s.ok())
    s = internal::RecvAll(fd, in->payload.data(), in->payload.size(), Clock::now() + kBound);
  if (!s.ok()) return ::testing::AssertionFailure() << "truncated frame from the target: " << s;
  return ::testing::AssertionSuccess();
}

// What a StreamHelloAck said.
struct Ack {
  Status status;  // the target's answer
};
// The next frame must be a StreamHelloAck; what it said.
StatusOr<Ack> HelloAck(int fd) {
  Incoming in;
  ::testing::AssertionResult got = Receive(fd, &in);
  if (!got) return UnavailableError(got.message());
  if (in.header.type != wire::FrameType::kStreamHelloAck) {
    return DataLossError("expected a StreamHelloAck, got type " +
                         std::to_string(static_cast<int>(in.header.type)));
  }
  Ack a;
  FERRY_RETURN_IF_ERROR(wire::DecodeStatus(in.body, &a.status));
  return a;
}

// The next frame must be a reply (Ack or ReadData) to `seq`.
StatusOr<std::pair<wire::Reply, std::string>> ReplyTo(int fd, uint64_t seq) {
  Incoming in;
  ::testing::AssertionResult got = Receive(fd, &in);
  if (!got) return UnavailableError(got.message());
  if (in.header.type != wire::FrameType::kAck && in.header.type != wire::FrameType::kReadData) {
    return DataLossError("expected a reply, got type " +
                         std::to_string(static_cast<int>(in.header.type)));
  }
  if (in.header.seq != seq) return DataLossError("reply to seq " + std::to_string(in.header.seq));
  FERRY_ASSIGN_OR_RETURN(wire::Reply r, wire::DecodeReply(in.body));
  return std::make_pair(std::move(r), std::move(in.payload));
}

// A copy of `n` bytes the target's event loop may have written before it
// closed the connection that carried them. The close, seen here as EOF,
// orders those writes before this read, but ThreadSanitizer does not see
// that edge (a socket closed, not written), so this copy is not instrumented
// (and calls no memcpy, which it intercepts), like ferry_test_peer's CHECK.
__attribute__((no_sanitize("thread"), noinline)) std::string CopyAfterClose(const unsigned char* p,
                                                                            size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(p[i]);
  return out;
}

// Refills `n` bytes of such memory with pattern `seed` (position = offset),
// likewise uninstrumented.
__attribute__((no_sanitize("thread"), noinline)) void RefillAfterClose(unsigned char* p, size_t n,
                                                                       uint64_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = PatternByte(seed, i);
}

// ---- the target and the valid peer ------------------------------------------

// What the target registered for hostile frames to aim at: one buffer of
// 2 x kGuard, registered as two adjacent regions, filled with a pattern.
struct GuardedMemory {
  explicit GuardedMemory(Engine& engine) : buf(2 * kGuard) {
    FillPattern(buf.data(), buf.size(), kGuardSeed);
    EXPECT_THAT(engine.RegisterMemory(buf.data(), kGuard), IsOk());
    EXPECT_THAT(engine.RegisterMemory(buf.data() + kGuard, kGuard), IsOk());
  }
  // "" if every byte is as filled, else the first mismatch.
  std::string Changed() const {
    return DescribePatternMismatch(buf.data(), buf.size(), kGuardSeed);
  }
  void Restore() { FillPattern(buf.data(), buf.size(), kGuardSeed); }
  uint64_t addr() const { return buf.addr(); }
  AlignedBuffer buf;
};

// A real engine writing and reading verified bytes to and from the target's
// busy region, in a loop, until stopped.
class ValidPeer {
 public:
  ValidPeer(const std::string& transport, Engine& target, unsigned char* remote)
      : local_(kBusy), remote_(remote) {
    auto e = Engine::Create(ConformanceOptions(transport));
    EXPECT_THAT(GetStatus(e), IsOk());
    if (!e.ok()) return;
    engine_ = std::move(e).value();
    EXPECT_THAT(engine_->RegisterMemory(local_.data(), kBusy), IsOk());
    auto seg = engine_->OpenSegment(target.PeerId());
    EXPECT_THAT(GetStatus(seg), IsOk());
    if (!seg.ok()) return;
    seg_ = *seg;
    auto info = engine_->QuerySegment(seg_);
    EXPECT_THAT(GetStatus(info), IsOk());
    if (info.ok()) {
      EXPECT_EQ(info->transport, transport);
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~ValidPeer() { Stop(); }

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int rounds() const { return rounds_.load(); }
  // The first failure ("" if none).
  std::string error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  // Waits (bounded) until `more` rounds past the current one completed.
  bool WaitRounds(int more) {
    const int want = rounds_.load() + more;
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (rounds_.load() < want && Clock::now() < deadline && error().empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return rounds_.load() >= want;
  }

 private:
  // One round: write a pattern window, read it back, check both ends.
  void Loop() {
    std::mt19937_64 rng(99);
    while (!stop_) {
      const uint64_t len = 1 + rng() % (kBusy / 2);
      const uint64_t off = rng() % (kBusy - len);
      const uint64_t seed = RequestSeed(4242, static_cast<uint64_t>(rounds_.load()));
      FillPattern(local_.data(), len, seed);
      const uint64_t remote = reinterpret_cast<uint64_t>(remote_) + off;
      Status s = engine_->TransferSync({Opcode::kWrite, local_.data(), seg_, remote, len});
      if (s.ok()) {
        std::memset(local_.data(), 0, len);
        s = engine_->TransferSync({Opcode::kRead, local_.data(), seg_, remote, len});
      }
      std::string bad = s.ok() ? DescribePatternMismatch(local_.data(), len, seed) : s.ToString();
      if (bad.empty()) bad = DescribePatternMismatch(remote_ + off, len, seed);
      if (!bad.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = "round " + std::to_string(rounds_.load()) + ": " + bad;
        return;
      }
      ++rounds_;
    }
  }

  AlignedBuffer local_;
  unsigned char* remote_;
  std::unique_ptr<Engine> engine_;
  SegmentHandle seg_;
  std::atomic<bool> stop_{false};
  std::atomic<int> rounds_{0};
  mutable std::mutex mu_;
  std::string error_;
  std::thread thread_;
};

EngineOptions TargetOptions(const std::string& secret_file = "") {
  EngineOptions o = ConformanceOptions("auto");
  // Long enough that every close seen below is the target's answer to what
  // it got, not its hello timer.
  o.handshake_timeout = std::chrono::seconds(60);
  o.secret_file = secret_file;
  return o;
}

// "shm_ring": a same-host stream whose frames go through request rings. The
// test's side stays a plain socket (one end of a socketpair) so every case
// runs unchanged: this relay moves what the test sends into ring 0 and
// ring 1's bytes back, passes the test's end of its writing to the target
// (closing the write side of the stream's socket), and closes the test's
// end once the target closed the stream.
class RingRelay {
 public:
  RingRelay(UniqueFd stream, std::unique_ptr<internal::shm::RequestRing> ring, UniqueFd test_end)
      : stream_(std::move(stream)), ring_(std::move(ring)), test_end_(std::move(test_end)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~RingRelay() {
    stop_.store(true);
    thread_.join();
  }

 private:
  void Run() {
    std::string to_ring, to_test;
    bool test_writing = true;
    char buf[64 * 1024];
    while (!stop_.load()) {
      bool moved = false;
      if (test_writing && to_ring.empty()) {
        const ssize_t n = ::recv(test_end_.get(), buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
          to_ring.assign(buf, static_cast<size_t>(n));
          moved = true;
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          test_writing = false;  // the test ended its side: so does the stream
          ::shutdown(stream_.get(), SHUT_WR);
        }
      }
      if (!to_ring.empty()) {
        iovec v{to_ring.data(), to_ring.size()};
        auto w = ring_->Write(&v, 1);
        if (!w.ok()) break;
        to_ring.erase(0, *w);
        moved |= *w > 0;
      }
      if (to_test.empty()) {
        iovec v{buf, sizeof(buf)};
        auto r = ring_->Read(&v, 1);
        if (!r.ok()) break;
        to_test.assign(buf, *r);
        moved |= *r > 0;
      }
      if (!to_test.empty()) {
        const ssize_t n =
            ::send(test_end_.get(), to_test.data(), to_test.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          to_test.erase(0, static_cast<size_t>(n));
          moved = true;
        } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
          break;
        }
      }
      char b;
      const ssize_t c = ::recv(stream_.get(), &b, 1, MSG_DONTWAIT);
      if (c == 0 || (c < 0 && errno != EAGAIN && errno != EINTR)) break;  // the target closed
      if (moved) continue;
      ring_->ArmRead();
      pollfd p[2] = {{stream_.get(), POLLRDHUP, 0}, {ring_->wake_fd(), POLLIN, 0}};
      ::poll(p, 2, 1);
      ring_->ClearWake();
      ring_->DisarmRead();
    }
    test_end_.Reset();  // the test sees the stream end
    stream_.Reset();
  }

  UniqueFd stream_;
  std::unique_ptr<internal::shm::RequestRing> ring_;
  UniqueFd test_end_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A connection to one port of an engine, and the frames that open a stream
// on it.
class Port {
 public:
  Port(std::string kind, const Engine& target, uint64_t instance)
      : kind_(std::move(kind)), rpc_port_(target.RpcPort()), instance_(instance) {
    char name[64];
    std::snprintf(name, sizeof(name), "ferry-shm-%d-%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(instance));
    shm_name_ = name;
  }

  bool shm() const { return kind_ == "shm" || kind_ == "shm_ring"; }

  UniqueFd Connect() const {
    auto fd = shm() ? internal::ConnectUnix(shm_name_, Clock::now() + kBound)
                    : internal::ConnectTo({"127.0.0.1", rpc_port_}, Clock::now() + kBound);
    EXPECT_THAT(GetStatus(fd), IsOk()) << "connecting to the " << kind_ << " port";
    return fd.ok() ? std::move(*fd) : UniqueFd();
  }

  // StreamHello (rpc) or CopyHello (shm) for `instance`; offering `ring`.
  std::string Hello(uint64_t instance, const internal::shm::RequestRing* ring = nullptr) const {
    wire::StreamHello hello{7, instance, kWireVersionMax, 0, "127.0.0.1:1"};
    std::string body;
    wire::EncodeStreamHello(hello, &body);
    if (!shm()) return Frame(wire::FrameType::kStreamHello, body);
    internal::shm::CopyHello copy;
    copy.hello = hello;
    copy.probe_addr = reinterpret_cast<uint64_t>(kProbe);
    copy.probe.assign(kProbe, sizeof(kProbe));
    if (ring != nullptr) copy.ring = ring->fds();
    body.clear();
    internal::shm::EncodeCopyHello(copy, &body);
    return Frame(wire::FrameType::kCopyHello, body);
  }
  std::string Hello() const { return Hello(instance_); }

  // A Write (rpc: its payload is `src`) or CopyWrite (shm: from `src`) of
  // `len` bytes at `remote`.
  std::string Write(uint64_t remote, const unsigned char* src, uint32_t len,
                    uint64_t seq = 1) const {
    if (shm()) {
      return CopyFrame(wire::FrameType::kCopyWrite,
                       {{remote, len, reinterpret_cast<uint64_t>(src)}}, seq);
    }
    return WriteFrame({{remote, len}}, std::string_view(reinterpret_cast<const char*>(src), len),
                      seq);
  }

  // A connection that said a hello the target accepted ("shm_ring": one
  // whose frames go through the rings it offered, behind a RingRelay).
  UniqueFd Open() const {
    UniqueFd fd = Connect();
    if (!fd.valid()) return fd;
    std::unique_ptr<internal::shm::RequestRing> ring;
    if (kind_ == "shm_ring") {
      auto made = internal::shm::RequestRing::Create();
      EXPECT_THAT(GetStatus(made), IsOk());
      if (!made.ok()) return UniqueFd();
      ring = *std::move(made);
    }
    EXPECT_TRUE(Send(fd.get(), Hello(instance_, ring.get())));
    auto ack = HelloAck(fd.get());
    EXPECT_THAT(GetStatus(ack), IsOk());
    if (ack.ok()) {
      EXPECT_THAT(ack->status, IsOk()) << "the target refused a valid hello";
    }
    if (!ack.ok() || !ack->status.ok()) return UniqueFd();
    if (!ring) return fd;
    EXPECT_TRUE(ring->Attached()) << "the target did not take the rings";
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return UniqueFd();
    relays_.push_back(
        std::make_unique<RingRelay>(std::move(fd), std::move(ring), UniqueFd(pair[1])));
    return UniqueFd(pair[0]);
  }

  const std::string& kind() const { return kind_; }

 private:
  static constexpr char kProbe[16] = "hostile-probe-1";
  std::string kind_;
  uint16_t rpc_port_;
  uint64_t instance_;
  std::string shm_name_;
  mutable std::vector<std::unique_ptr<RingRelay>> relays_;
};

// ---- the fixture: one target engine, one valid peer, per port ---------------

class HostileInput : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "rpc") FERRY_SKIP_WITHOUT_SAME_HOST_COPY();
    auto t = Engine::Create(TargetOptions());
    ASSERT_THAT(GetStatus(t), IsOk());
    target_ = std::move(t).value();
    guarded_ = std::make_unique<GuardedMemory>(*target_);
    busy_ = std::make_unique<AlignedBuffer>(kBusy);
    ASSERT_THAT(target_->RegisterMemory(busy_->data(), kBusy), IsOk());
    // The valid peer speaks the transport of the port under test.
    peer_ =
        std::make_unique<ValidPeer>(GetParam() == "rpc" ? "tcp" : "shm", *target_, busy_->data());
    ASSERT_FALSE(HasFailure());
    ASSERT_TRUE(peer_->WaitRounds(1)) << peer_->error();
    port_ = std::make_unique<Port>(GetParam(), *target_, Instance(*target_));
  }

  void TearDown() override {
    if (!peer_) return;
    // (5): the valid peer kept working through all of it, and still does.
    EXPECT_TRUE(peer_->WaitRounds(3)) << "the valid peer stalled: " << peer_->error();
    peer_->Stop();
    EXPECT_EQ(peer_->error(), "");
    RecordProperty("valid_peer_rounds", peer_->rounds());
  }

  // The target's instance, as a peer sees it.
  static uint64_t Instance(Engine& target) {
    auto probe = Engine::Create(ConformanceOptions("tcp"));
    EXPECT_THAT(GetStatus(probe), IsOk());
    if (!probe.ok()) return 0;
    auto seg = (*probe)->OpenSegment(target.PeerId());
    EXPECT_THAT(GetStatus(seg), IsOk());
    if (!seg.ok()) return 0;
    auto info = (*probe)->QuerySegment(*seg);
    EXPECT_THAT(GetStatus(info), IsOk());
    return info.ok() ? info->instance_id : 0;
  }

  // After a hostile attempt: the target's memory is untouched.
  void ExpectUntouched(const std::string& what) {
    const std::string changed = guarded_->Changed();
    EXPECT_EQ(changed, "") << what;
    if (!changed.empty()) guarded_->Restore();
  }

  std::unique_ptr<Engine> target_;
  std::unique_ptr<GuardedMemory> guarded_;
  std::unique_ptr<AlignedBuffer> busy_;
  std::unique_ptr<ValidPeer> peer_;
  std::unique_ptr<Port> port_;
};

// (1) Random bytes: on a fresh connection, with and without a valid magic,
// and after a valid hello: random bytes, well-formed data frames naming
// random addresses, and valid headers with random lengths and bodies. Each
// connection ends (the target closes it, at the latest at our EOF); nothing
// is written.
TEST_P(HostileInput, RandomGarbageIsClosedAndWritesNothing) {
  std::mt19937_64 rng(20261201);
  auto random_bytes = [&rng](size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  };
  const wire::FrameType data_type =
      port_->shm() ? wire::FrameType::kCopyWrite : wire::FrameType::kWrite;
  int closed = 0;
  constexpr int kAttempts = 60;
  for (int i = 0; i < kAttempts; ++i) {
    const int kind = i % 5;
    std::string bytes;
    bool after_hello = false;
    if (kind == 0) {
      bytes = random_bytes(1 + rng() % 2048);
    } else if (kind == 1) {
      bytes = "FRRY" + random_bytes(rng() % 2048);
    } else if (kind == 2) {
      after_hello = true;
      bytes = random_bytes(1 + rng() % 2048);
    } else if (kind == 3) {
      // A well-formed data frame of 1..8 entries at random addresses with
      // random lengths (each must fail: none lies in registered memory).
      after_hello = true;
      const size_t n = 1 + rng() % 8;
      if (port_->shm()) {
        std::vector<internal::shm::CopyEntry> entries;
        for (size_t k = 0; k < n; ++k) {
          entries.push_back({rng(), static_cast<uint32_t>(rng() % 8192), rng()});
        }
        bytes = CopyFrame(rng() % 2 ? wire::FrameType::kCopyWrite : wire::FrameType::kCopyRead,
                          entries, rng());
      } else {
        std::vector<wire::Entry> entries;
        size_t payload = 0;
        for (size_t k = 0; k < n; ++k) {
          entries.push_back({rng(), static_cast<uint32_t>(rng() % 8192)});
          payload += entries.back().length;
        }
        bytes = rng() % 2 ? WriteFrame(entries, random_bytes(payload), rng())
                          : ReadFrame(entries, rng());
      }
    } else {
      // A plausible data frame: right magic, version and type; random
      // lengths, seq and body.
      after_hello = true;
      wire::FrameHeader h;
      h.version = kWireVersionMax;
      h.type = data_type;
      h.body_len = static_cast<uint32_t>(rng() % 512);
      h.payload_len = port_->shm() ? 0 : static_cast<uint32_t>(rng() % 8192);
      h.seq = rng();
      uint8_t raw[wire::kFrameHeaderSize];
      wire::EncodeHeader(h, raw);
      bytes.assign(reinterpret_cast<char*>(raw), sizeof(raw));
      bytes += random_bytes(h.body_len + h.payload_len);
    }
    UniqueFd fd = after_hello ? port_->Open() : port_->Connect();
    ASSERT_TRUE(fd.valid()) << "attempt " << i;
    (void)Send(fd.get(), bytes);  // the target may hang up part-way
    if (EndAndWaitForClose(fd.get()))
      ++closed;
    else
      ADD_FAILURE() << "attempt " << i << " (kind " << kind << "): the connection stayed open";
    ExpectUntouched("after garbage attempt " + std::to_string(i) + " (kind " +
                    std::to_string(kind) + ")");
  }
  EXPECT_EQ(closed, kAttempts);
  EXPECT_TRUE(peer_->WaitRounds(1)) << peer_->error();
}

// (2) Valid frames cut at every length: the hello (and on the rpc port a
// handshake request) before any stream exists, and a Write/CopyWrite after
// an accepted hello. The connection ends after the cut: the target closes
// it and writes nothing. A Write cut inside its payload may have put the
// bytes that arrived into the named range (payload bytes go straight to
// memory), but nothing else, and it is never acknowledged.
TEST_P(HostileInput, TruncatedFramesCloseAndWriteNothing) {
  AlignedBuffer src(4096);
  FillPattern(src.data(), 4096, 777);
  const uint64_t at = guarded_->addr() + 1000;
  std::vector<std::pair<std::string, std::string>> before_hello = {{"hello", port_->Hello()}};
  if (!port_->shm()) {
    wire::PeerDescriptor self;
    self.peer_id = "127.0.0.1:1";
    self.wire_min = self.wire_max = kWireVersionMax;
    std::string body;
    wire::EncodeDescriptor(self, &body, wire::kDescriptorFormatMin);
    before_hello.push_back({"handshake request", Frame(wire::FrameType::kHandshakeRequest, body)});
  }
  int attempts = 0;
  for (const auto& [name, frame] : before_hello) {
    for (size_t cut = 0; cut < frame.size(); ++cut) {
      UniqueFd fd = port_->Connect();
      ASSERT_TRUE(fd.valid());
      ASSERT_TRUE(cut == 0 || Send(fd.get(), frame.substr(0, cut)));
      EXPECT_TRUE(EndAndWaitForClose(fd.get()))
          << name << " cut at " << cut << " of " << frame.size();
      ExpectUntouched(name + " cut at " + std::to_string(cut));
      ++attempts;
    }
  }
  const std::string write = port_->Write(at, src.data(), 4096);
  const size_t header_and_body = port_->shm() ? write.size() : write.size() - 4096;
  std::vector<size_t> cuts;
  for (size_t cut = 0; cut < header_and_body; ++cut) cuts.push_back(cut);
  if (!port_->shm()) {
    for (size_t in_payload : {size_t{1}, size_t{2048}, size_t{4095}})
      cuts.push_back(header_and_body + in_payload);
  }
  int torn = 0;
  for (size_t cut : cuts) {
    UniqueFd fd = port_->Open();
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(cut == 0 || Send(fd.get(), write.substr(0, cut)));
    ::shutdown(fd.get(), SHUT_WR);
    // No reply may come: the frame never arrived whole.
    Incoming in;
    const bool replied = Receive(fd.get(), &in);
    EXPECT_FALSE(replied) << "the target answered a Write cut at " << cut << " (type "
                          << static_cast<int>(in.header.type) << ")";
    EXPECT_TRUE(EndAndWaitForClose(fd.get())) << "write cut at " << cut;
    ++attempts;
    if (cut <= header_and_body) {
      ExpectUntouched("write cut at " + std::to_string(cut));
      continue;
    }
    // Inside the payload: outside [at, at + arrived) nothing may change;
    // inside, each byte is the old one or the one that arrived.
    const size_t arrived = cut - header_and_body;
    const std::string snapshot = CopyAfterClose(guarded_->buf.data(), guarded_->buf.size());
    const unsigned char* g = reinterpret_cast<const unsigned char*>(snapshot.data());
    const size_t at_off = static_cast<size_t>(at - guarded_->addr());
    EXPECT_EQ(DescribePatternMismatch(g, at_off, kGuardSeed), "")
        << "before the range, cut " << cut;
    EXPECT_EQ(DescribePatternMismatch(g + at_off + arrived, guarded_->buf.size() - at_off - arrived,
                                      kGuardSeed, at_off + arrived),
              "")
        << "past the bytes that arrived, cut " << cut;
    bool changed = false;
    for (size_t i = 0; i < arrived; ++i) {
      const unsigned char now = g[at_off + i];
      changed = changed || now != PatternByte(kGuardSeed, at_off + i);
      EXPECT_TRUE(now == src.data()[i] || now == PatternByte(kGuardSeed, at_off + i))
          << "byte " << i;
    }
    if (changed) ++torn;
    RefillAfterClose(guarded_->buf.data(), guarded_->buf.size(), kGuardSeed);
  }
  RecordProperty("truncated_attempts", attempts);
  RecordProperty("payload_cuts_that_landed_in_part", torn);
  std::printf("[ truncation ] %s port: %d cut frames", port_->kind().c_str(), attempts);
  if (!port_->shm()) {
    std::printf(
        "; %d of 3 Writes cut inside the payload left the bytes that arrived in the named range",
        torn);
  }
  std::printf("\n");
  EXPECT_TRUE(peer_->WaitRounds(1)) << peer_->error();
}

// (4) Ranges outside registered memory: straddling a region's end, across
// two adjacent regions, in memory the target never registered, of length
// 0, and wrapping around the address space. Each fails alone in the reply
// (naming the range); the valid entry of the same frame is written; nothing
// else changes; the stream keeps serving.
TEST_P(HostileInput, RangesOutsideRegisteredMemoryFailAlone) {
  static unsigned char unregistered[8192];  // this process's memory, never registered
  std::memset(unregistered, 0x5c, sizeof(unregistered));
  const uint64_t base = guarded_->addr();
  const uint64_t end = base + 2 * kGuard;
  struct Case {
    std::string name;
    uint64_t addr;
    uint32_t len;
  };
  const std::vector<Case> bad = {
      {"straddling the end of the second region", end - 100, 4096},
      {"across the two adjacent regions", base + kGuard - 2048, 4096},
      {"unregistered memory", reinterpret_cast<uint64_t>(unregistered), 4096},
      {"length 0", base + 8192, 0},
      {"wrapping around the address space", UINT64_MAX - 100, 4096},
      {"starting at the last byte of the space", UINT64_MAX, 4096},
      {"address 0", 0, 4096},
  };
  AlignedBuffer src(4096 * (bad.size() + 1));
  FillPattern(src.data(), src.size(), 31337);
  const uint64_t good_at = base + 4096;
  constexpr uint32_t kGood = 4096;

  // One frame: the valid entry first, then every bad one.
  UniqueFd fd = port_->Open();
  ASSERT_TRUE(fd.valid());
  std::string frame;
  if (port_->shm()) {
    std::vector<internal::shm::CopyEntry> entries = {{good_at, kGood, src.addr()}};
    for (size_t i = 0; i < bad.size(); ++i) {
      entries.push_back({bad[i].addr, bad[i].len, src.addr() + 4096 * (i + 1)});
    }
    frame = CopyFrame(wire::FrameType::kCopyWrite, entries, 1);
  } else {
    std::vector<wire::Entry> entries = {{good_at, kGood}};
    size_t payload = kGood;
    for (const Case& c : bad) {
      entries.push_back({c.addr, c.len});
      payload += c.len;
    }
    frame = WriteFrame(entries,
                       std::string_view(reinterpret_cast<const char*>(src.data()), payload), 1);
  }
  ASSERT_TRUE(Send(fd.get(), frame));
  auto reply = ReplyTo(fd.get(), 1);
  ASSERT_THAT(GetStatus(reply), IsOk());
  EXPECT_THAT(reply->first.status, IsOk());
  ASSERT_EQ(reply->first.failures.size(), bad.size()) << "every bad entry fails, the good one not";
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(reply->first.failures[i].index, i + 1) << bad[i].name;
    EXPECT_NE(reply->first.failures[i].code, StatusCode::kOk) << bad[i].name;
    EXPECT_FALSE(reply->first.failures[i].message.empty()) << bad[i].name;
    std::printf("[ out of range ] %s port, %s: %s: %s\n", port_->kind().c_str(),
                bad[i].name.c_str(),
                std::string(StatusCodeName(reply->first.failures[i].code)).c_str(),
                reply->first.failures[i].message.c_str());
  }
  // The good entry landed; nothing else changed.
  const size_t good_off = static_cast<size_t>(good_at - base);
  EXPECT_EQ(DescribePatternMismatch(guarded_->buf.data() + good_off, kGood, 31337), "");
  FillPattern(guarded_->buf.data() + good_off, kGood, kGuardSeed, good_off);
  ExpectUntouched("after the out-of-range writes");
  for (unsigned char c : unregistered) ASSERT_EQ(c, 0x5c) << "unregistered memory was written";

  // Reads of the same ranges fail too and carry no bytes (rpc), or copy
  // nothing into this process (shm).
  AlignedBuffer dst(4096 * (bad.size() + 1));
  std::memset(dst.data(), 0xa5, dst.size());
  if (port_->shm()) {
    std::vector<internal::shm::CopyEntry> entries = {{good_at, kGood, dst.addr()}};
    for (size_t i = 0; i < bad.size(); ++i) {
      entries.push_back({bad[i].addr, bad[i].len, dst.addr() + 4096 * (i + 1)});
    }
    ASSERT_TRUE(Send(fd.get(), CopyFrame(wire::FrameType::kCopyRead, entries, 2)));
  } else {
    std::vector<wire::Entry> entries = {{good_at, kGood}};
    for (const Case& c : bad) entries.push_back({c.addr, c.len});
    ASSERT_TRUE(Send(fd.get(), ReadFrame(entries, 2)));
  }
  reply = ReplyTo(fd.get(), 2);
  ASSERT_THAT(GetStatus(reply), IsOk());
  EXPECT_EQ(reply->first.failures.size(), bad.size());
  if (port_->shm()) {
    EXPECT_EQ(DescribePatternMismatch(dst.data(), kGood, kGuardSeed, good_off), "");
    for (size_t i = kGood; i < dst.size(); ++i)
      ASSERT_EQ(dst.data()[i], 0xa5) << "byte " << i << " was copied";
  } else {
    ASSERT_EQ(reply->second.size(), kGood)
        << "a ReadData carries only the bytes of entries that did not fail";
    EXPECT_EQ(DescribePatternMismatch(reply->second.data(), kGood, kGuardSeed, good_off), "");
  }

  // shm only: the initiator's side of an entry is outside this process's
  // memory (or wraps): that entry fails, the target's range is not written.
  if (port_->shm()) {
    const std::vector<internal::shm::CopyEntry> entries = {
        {base + 16384, 4096, UINT64_MAX - 10},  // wraps
        {base + 32768, 4096, 0},                // address 0
        {base + 49152, 4096, src.addr()}};      // valid
    ASSERT_TRUE(Send(fd.get(), CopyFrame(wire::FrameType::kCopyWrite, entries, 3)));
    reply = ReplyTo(fd.get(), 3);
    ASSERT_THAT(GetStatus(reply), IsOk());
    ASSERT_EQ(reply->first.failures.size(), 2u);
    EXPECT_EQ(reply->first.failures[0].index, 0u);
    EXPECT_EQ(reply->first.failures[1].index, 1u);
    EXPECT_EQ(DescribePatternMismatch(guarded_->buf.data() + 49152, 4096, 31337), "");
    FillPattern(guarded_->buf.data() + 49152, 4096, kGuardSeed, 49152);
    ExpectUntouched("after copies from outside this process's memory");
  }

  // The stream still serves: one more valid write, acknowledged and in place.
  ASSERT_TRUE(Send(fd.get(), port_->Write(good_at, src.data() + 4096, kGood, 4)));
  reply = ReplyTo(fd.get(), 4);
  ASSERT_THAT(GetStatus(reply), IsOk());
  EXPECT_TRUE(reply->first.failures.empty());
  EXPECT_EQ(DescribePatternMismatch(guarded_->buf.data() + good_off, kGood, 31337, 4096), "");
  guarded_->Restore();
  EXPECT_TRUE(peer_->WaitRounds(1)) << peer_->error();
}

// (3) A recorded conversation (hello, then a Write that landed) replayed on
// a new connection. Without a cluster secret nothing tells a replay from the
// original: while the target instance lives, the replay is served (the
// port's only gate is the instance in the hello), so a process that can
// reach the port can write; once the target restarted (a new instance,
// here at the same addresses), the recorded hello is refused and nothing is
// written. With a secret, the replay is refused before any byte lands.
TEST_P(HostileInput, AReplayWithoutASecretIsServedOnlyByTheSameInstance) {
  // Its own target, so that it can be restarted; the fixture's keeps serving
  // the valid peer.
  AlignedBuffer region(kGuard);
  FillPattern(region.data(), kGuard, kGuardSeed);
  AlignedBuffer src(4096);
  FillPattern(src.data(), 4096, 1234);
  std::string recorded;
  {
    auto t = Engine::Create(TargetOptions());
    ASSERT_THAT(GetStatus(t), IsOk());
    ASSERT_THAT((*t)->RegisterMemory(region.data(), kGuard), IsOk());
    Port port(GetParam(), **t, Instance(**t));
    recorded = port.Hello() + port.Write(region.addr() + 512, src.data(), 4096);
    for (const char* round : {"original", "replay"}) {
      UniqueFd fd = port.Connect();
      ASSERT_TRUE(fd.valid());
      ASSERT_TRUE(Send(fd.get(), recorded));
      auto ack = HelloAck(fd.get());
      ASSERT_THAT(GetStatus(ack), IsOk()) << round;
      EXPECT_THAT(ack->status, IsOk()) << round;
      auto reply = ReplyTo(fd.get(), 1);
      ASSERT_THAT(GetStatus(reply), IsOk()) << round;
      EXPECT_TRUE(reply->first.failures.empty()) << round;
      EXPECT_EQ(DescribePatternMismatch(region.data() + 512, 4096, 1234), "")
          << round << " did not land";
      FillPattern(region.data(), kGuard, kGuardSeed);
    }
    ASSERT_THAT((*t)->UnregisterMemory(region.data()), IsOk());
  }
  // The target restarts: the same memory, a new instance (and port).
  auto t2 = Engine::Create(TargetOptions());
  ASSERT_THAT(GetStatus(t2), IsOk());
  ASSERT_THAT((*t2)->RegisterMemory(region.data(), kGuard), IsOk());
  Port port2(GetParam(), **t2, Instance(**t2));
  const std::string recorded_hello =
      port2.shm()
          ? recorded.substr(
                0, recorded.size() - CopyFrame(wire::FrameType::kCopyWrite, {{0, 0, 0}}).size())
          : recorded.substr(
                0, recorded.size() - WriteFrame({{0, 4096}}, std::string(4096, '\0')).size());
  const std::string recorded_write = recorded.substr(recorded_hello.size());
  // Step by step: the recorded hello is refused with the reason; the Write
  // after it closes the connection.
  {
    UniqueFd fd = port2.Connect();
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(Send(fd.get(), recorded_hello));
    auto ack = HelloAck(fd.get());
    ASSERT_THAT(GetStatus(ack), IsOk());
    EXPECT_THAT(ack->status, StatusIs(StatusCode::kFailedPrecondition, HasSubstr("it restarted")))
        << "a hello naming the old instance";
    (void)Send(fd.get(), recorded_write);
    EXPECT_TRUE(EndAndWaitForClose(fd.get()));
  }
  // All at once, as recorded: closed (the refusal may be lost to the reset
  // of a connection closed with unread bytes).
  {
    UniqueFd fd = port2.Connect();
    ASSERT_TRUE(fd.valid());
    (void)Send(fd.get(), recorded);
    EXPECT_TRUE(EndAndWaitForClose(fd.get()));
  }
  EXPECT_EQ(DescribePatternMismatch(region.data(), kGuard, kGuardSeed), "")
      << "the replay wrote into the restarted target";
  ASSERT_THAT((*t2)->UnregisterMemory(region.data()), IsOk());
  EXPECT_TRUE(peer_->WaitRounds(1)) << peer_->error();
}

TEST_P(HostileInput, AReplayWithASecretIsRefusedBeforeAnyByteLands) {
  char dir_tmpl[] = "/tmp/ferry-hostile-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_tmpl), nullptr);
  const std::string dir = dir_tmpl, path = dir + "/secret";
  std::ofstream(path, std::ios::binary) << kSecret;
  auto secret = internal::ClusterSecret::Load(path);
  ASSERT_THAT(GetStatus(secret), IsOk());
  AlignedBuffer region(kGuard);
  FillPattern(region.data(), kGuard, kGuardSeed);
  AlignedBuffer src(4096);
  FillPattern(src.data(), 4096, 5678);
  auto t = Engine::Create(TargetOptions(path));
  std::remove(path.c_str());
  ::rmdir(dir.c_str());
  ASSERT_THAT(GetStatus(t), IsOk());
  ASSERT_THAT((*t)->RegisterMemory(region.data(), kGuard), IsOk());
  // Its instance, learnt the honest way: by an engine with the secret.
  uint64_t instance = 0;
  {
    char d2[] = "/tmp/ferry-hostile-XXXXXX";
    ASSERT_NE(::mkdtemp(d2), nullptr);
    const std::string p2 = std::string(d2) + "/secret";
    std::ofstream(p2, std::ios::binary) << kSecret;
    EngineOptions o = ConformanceOptions("tcp");
    o.secret_file = p2;
    auto honest = Engine::Create(o);
    std::remove(p2.c_str());
    ::rmdir(d2);
    ASSERT_THAT(GetStatus(honest), IsOk());
    auto seg = (*honest)->OpenSegment((*t)->PeerId());
    ASSERT_THAT(GetStatus(seg), IsOk());
    auto info = (*honest)->QuerySegment(*seg);
    ASSERT_THAT(GetStatus(info), IsOk());
    instance = info->instance_id;
  }
  Port port(GetParam(), **t, instance);

  // The original conversation: AuthHello, the challenge, a genuine proof,
  // the hello and a Write, which lands.
  wire::AuthHello hello;
  hello.nonce.fill(0x17);
  hello.peer_id = "recorded-peer";
  std::string auth_hello_body;
  wire::EncodeAuthHello(hello, &auth_hello_body);
  const std::string auth_hello = Frame(wire::FrameType::kAuthHello, auth_hello_body);
  std::string recorded;
  {
    UniqueFd fd = port.Connect();
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(Send(fd.get(), auth_hello));
    Incoming in;
    ASSERT_TRUE(Receive(fd.get(), &in));
    ASSERT_EQ(in.header.type, wire::FrameType::kAuthChallenge);
    auto challenge = wire::DecodeAuthChallenge(in.body);
    ASSERT_THAT(GetStatus(challenge), IsOk());
    ASSERT_THAT(challenge->status, IsOk());
    auto mac = (*secret)->Mac("ferry-auth-v1 client", challenge->nonce, hello.nonce);
    ASSERT_THAT(GetStatus(mac), IsOk());
    wire::AuthProof proof;
    proof.mac = *mac;
    std::string proof_body;
    wire::EncodeAuthProof(proof, &proof_body);
    const std::string rest = Frame(wire::FrameType::kAuthProof, proof_body) + port.Hello() +
                             port.Write(region.addr() + 512, src.data(), 4096);
    recorded = auth_hello + rest;
    ASSERT_TRUE(Send(fd.get(), rest));
    auto ack = HelloAck(fd.get());
    ASSERT_THAT(GetStatus(ack), IsOk());
    ASSERT_THAT(ack->status, IsOk());
    auto reply = ReplyTo(fd.get(), 1);
    ASSERT_THAT(GetStatus(reply), IsOk());
    EXPECT_TRUE(reply->first.failures.empty());
    EXPECT_EQ(DescribePatternMismatch(region.data() + 512, 4096, 5678), "")
        << "the original did not land";
    FillPattern(region.data(), kGuard, kGuardSeed);
  }
  // The replay, all at once and step by step (waiting for the new challenge
  // first): refused, closed, nothing written, no hello accepted.
  for (const bool stepwise : {false, true}) {
    UniqueFd fd = port.Connect();
    ASSERT_TRUE(fd.valid());
    if (stepwise) {
      ASSERT_TRUE(Send(fd.get(), auth_hello));
      Incoming in;
      ASSERT_TRUE(Receive(fd.get(), &in));
      ASSERT_EQ(in.header.type, wire::FrameType::kAuthChallenge);
      (void)Send(fd.get(), recorded.substr(auth_hello.size()));
    } else {
      (void)Send(fd.get(), recorded);
    }
    // Whatever comes back is at most the challenge; never a hello ack or a reply.
    std::string got;
    const auto deadline = Clock::now() + kBound;
    bool closed = false;
    char buf[4096];
    while (Clock::now() < deadline && !closed) {
      pollfd p{fd.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) closed = true;
      if (n > 0) got.append(buf, static_cast<size_t>(n));
    }
    EXPECT_TRUE(closed) << "the target kept a replayed connection (stepwise " << stepwise << ")";
    for (size_t off = 0; off + wire::kFrameHeaderSize <= got.size();) {
      auto h = wire::DecodeHeader(reinterpret_cast<const uint8_t*>(got.data() + off));
      ASSERT_TRUE(h.ok());
      EXPECT_EQ(h->type, wire::FrameType::kAuthChallenge) << "stepwise " << stepwise;
      off += wire::kFrameHeaderSize + h->body_len + h->payload_len;
    }
    EXPECT_EQ(DescribePatternMismatch(region.data(), kGuard, kGuardSeed), "")
        << "a replayed conversation wrote (stepwise " << stepwise << ")";
  }
  ASSERT_THAT((*t)->UnregisterMemory(region.data()), IsOk());
  EXPECT_TRUE(peer_->WaitRounds(1)) << peer_->error();
}

// A client on the rpc port that asks for much more than the socket buffers
// hold and never reads the replies: the target's stream to it is stuck, and
// the valid peer (other streams, same event loops) keeps moving bytes; once
// the client goes, the target lets go of it.
TEST_P(HostileInput, AClientThatStopsReadingStallsOnlyItself) {
  if (port_->shm()) GTEST_SKIP() << "shm replies carry no data: nothing fills a socket buffer";
  UniqueFd fd = port_->Open();
  ASSERT_TRUE(fd.valid());
  // 64 reads of the whole 256 KiB guarded region each: 16 MiB of replies.
  std::string frames;
  for (uint64_t seq = 1; seq <= 64; ++seq) frames += ReadFrame({{guarded_->addr(), kGuard}}, seq);
  ASSERT_TRUE(Send(fd.get(), frames));
  const int before = peer_->rounds();
  EXPECT_TRUE(peer_->WaitRounds(10))
      << "the valid peer stalled behind a client that does not read: " << peer_->error();
  EXPECT_GE(peer_->rounds(), before + 10);
  fd = UniqueFd();  // the client goes away with its replies unread
  EXPECT_TRUE(peer_->WaitRounds(3)) << peer_->error();
  ExpectUntouched("after the stalled reader");
}

// (7) A frame whose file entries would need more staging than a frame may
// carry (64 MiB, the payload limit): 64 entries of a whole 1 GiB file
// region (a sparse file) ask for 64 GiB of host buffers. The target stages
// none of it: each such entry fails naming the sizes and the limit, and the
// stream serves a valid request to the same region afterwards.
TEST_P(HostileInput, AFrameAskingForMoreStagingThanAFrameCarriesFailsItsEntries) {
  std::string dir = (std::filesystem::temp_directory_path() / "ferry-hostile-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/big.bin";
  constexpr uint64_t kFile = uint64_t{1} << 30;
  {
    std::ofstream(path).close();
    std::filesystem::resize_file(path, kFile);
  }
  auto base = target_->RegisterFile({.path = path});
  ASSERT_THAT(GetStatus(base), IsOk());
  const uint64_t at = reinterpret_cast<uint64_t>(*base);
  constexpr size_t kEntries = 64;
  static unsigned char src[4096];
  std::memset(src, 0x3c, sizeof(src));
  UniqueFd fd = port_->Open();
  ASSERT_TRUE(fd.valid());
  if (port_->shm()) {
    // (A same-host reader of files must take lends; this raw peer does
    // not, so it writes: the target would copy each entry into a buffer.)
    std::vector<internal::shm::CopyEntry> entries(
        kEntries, {at, static_cast<uint32_t>(kFile), reinterpret_cast<uint64_t>(src)});
    ASSERT_TRUE(Send(fd.get(), CopyFrame(wire::FrameType::kCopyWrite, entries, 1)));
  } else {
    std::vector<wire::Entry> entries(kEntries, {at, static_cast<uint32_t>(kFile)});
    ASSERT_TRUE(Send(fd.get(), ReadFrame(entries, 1)));
  }
  auto reply = ReplyTo(fd.get(), 1);
  ASSERT_THAT(GetStatus(reply), IsOk());
  EXPECT_THAT(reply->first.status, IsOk());
  ASSERT_EQ(reply->first.failures.size(), kEntries);
  for (size_t i = 0; i < kEntries; ++i) {
    EXPECT_EQ(reply->first.failures[i].index, i);
    EXPECT_EQ(reply->first.failures[i].code, StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(reply->first.failures[0].message, ::testing::HasSubstr("64 MiB"));
  std::printf("[ staging ] %s port: %s\n", port_->kind().c_str(),
              reply->first.failures[0].message.c_str());
  EXPECT_EQ(reply->second.size(), 0u);
  // A valid request to the region on the same stream is served.
  if (port_->shm()) {
    ASSERT_TRUE(Send(fd.get(), port_->Write(at, src, sizeof(src), 2)));
    reply = ReplyTo(fd.get(), 2);
    ASSERT_THAT(GetStatus(reply), IsOk());
    EXPECT_TRUE(reply->first.failures.empty());
  } else {
    ASSERT_TRUE(Send(fd.get(), ReadFrame({{at, 4096}}, 2)));
    reply = ReplyTo(fd.get(), 2);
    ASSERT_THAT(GetStatus(reply), IsOk());
    EXPECT_TRUE(reply->first.failures.empty());
    EXPECT_EQ(reply->second, std::string(4096, '\0'));
  }
  fd = UniqueFd();
  EXPECT_THAT(target_->UnregisterMemory(*base), IsOk());
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// "shm_ring": the shm port, each opened stream's frames through request
// rings (RingRelay).
INSTANTIATE_TEST_SUITE_P(Ports, HostileInput, ::testing::Values("rpc", "shm", "shm_ring"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ferry::test
