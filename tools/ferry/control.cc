#include "control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <latch>
#include <utility>

#include "cli.h"
#include "pattern.h"

// Commands (initiator -> target), arguments are u64:
//   'R'                      -> u64 user_us, u64 sys_us
//   'N'                      -> u64 n, n bytes: the name the target published ("" for none)
//   'F' seed                 -> u64 0           fill the whole buffer with the pattern
//   'Z' seed n {off len}*n   -> u64 0           poison the ranges (pattern complement)
//   'C' seed n {off len}*n   -> u64 bad, u64 first_bad_offset (~0 if none)
//   'W' off len              then raw bytes until the initiator shuts down its
//                            side -> u64 bytes received (read into buffer[off, off+len) cyclically)
//   'D' off len              then 1 go byte; the target sends buffer[off, off+len)
//                            cyclically until the initiator closes its side
//   'S' n {off len}*n        then raw bytes until the initiator shuts down its side,
//                            scattered into the ranges in order, cyclically -> u64 bytes
//   'G' n {off len}*n        then 1 go byte; the target gathers the ranges in order,
//                            cyclically, until the initiator closes its side
//   'P'                      8-byte ping-pong, spinning, until EOF
// A range outside the buffer closes the connection.

namespace ferry::bench {

using Clock = std::chrono::steady_clock;

double ProcessCpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec * 1e-6;
}

namespace {
constexpr uint64_t kChunk = 1u << 20;  // plain streams send/recv at most this much per call
constexpr int kMaxIov = 1024;          // IOV_MAX on Linux

// Walks scattered ranges of a buffer cyclically, handing out iovecs.
class ScatterCursor {
 public:
  ScatterCursor(uint8_t* base, const std::vector<Range>& ranges) : base_(base), ranges_(ranges) {}
  // Up to kMaxIov iovecs from the cursor on (at most one full cycle), at most
  // kChunk bytes... unless one range alone is longer.
  int Fill(iovec* iov) {
    int n = 0;
    size_t i = idx_, off = off_;
    uint64_t bytes = 0;
    while (n < kMaxIov && bytes < kChunk) {
      const Range& r = ranges_[i];
      iov[n].iov_base = base_ + r.first + off;
      iov[n].iov_len = r.second - off;
      bytes += iov[n].iov_len;
      ++n;
      off = 0;
      i = (i + 1) % ranges_.size();
      if (i == idx_) break;
    }
    return n;
  }
  void Advance(uint64_t bytes) {
    while (bytes > 0) {
      uint64_t rem = ranges_[idx_].second - off_;
      if (bytes >= rem) {
        bytes -= rem;
        idx_ = (idx_ + 1) % ranges_.size();
        off_ = 0;
      } else {
        off_ += bytes;
        bytes = 0;
      }
    }
  }

 private:
  uint8_t* base_;
  const std::vector<Range>& ranges_;
  size_t idx_ = 0;
  uint64_t off_ = 0;
};

// Gathers from the cursor into fd once. Returns bytes sent, or <= 0 on error.
ssize_t GatherOnce(int fd, ScatterCursor& c) {
  iovec iov[kMaxIov];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = static_cast<size_t>(c.Fill(iov));
  ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  if (n > 0) c.Advance(static_cast<uint64_t>(n));
  return n;
}

ssize_t ScatterOnce(int fd, ScatterCursor& c) {
  iovec iov[kMaxIov];
  int cnt = c.Fill(iov);
  ssize_t n = readv(fd, iov, cnt);
  if (n > 0) c.Advance(static_cast<uint64_t>(n));
  return n;
}

bool NonEmpty(const std::vector<Range>& ranges) {
  for (const Range& r : ranges) {
    if (r.second == 0) return false;
  }
  return !ranges.empty();
}
}  // namespace

ControlServer::ControlServer(const std::string& host, uint8_t* buffer, uint64_t length,
                             std::string name)
    : buffer_(buffer), length_(length), name_(std::move(name)) {
  listen_fd_.reset(ListenOn(host, &port_));
  if (pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    throw cli::RunError(std::string("pipe: ") + std::strerror(errno));
  }
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

ControlServer::~ControlServer() {
  Stop();
  if (wake_pipe_[0] >= 0) close(wake_pipe_[0]);
  if (wake_pipe_[1] >= 0) close(wake_pipe_[1]);
}

void ControlServer::Stop() {
  if (stopping_.exchange(true)) return;
  char b = 1;
  (void)!write(wake_pipe_[1], &b, 1);
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Conn> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Conn& c : conns_) shutdown(c.fd, SHUT_RDWR);
    conns.swap(conns_);
  }
  for (Conn& c : conns) {
    if (c.thread.joinable()) c.thread.join();
    close(c.fd);
  }
}

void ControlServer::AcceptLoop() {
  while (!stopping_.load(std::memory_order_relaxed)) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    int rc = poll(fds, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_.load()) {
      close(fd);
      return;
    }
    conns_.push_back({fd, std::thread()});
    conns_.back().thread = std::thread([this, fd] { Serve(fd); });
  }
}

bool ControlServer::ValidRanges(const std::vector<Range>& ranges) const {
  for (const Range& r : ranges) {
    if (r.first > length_ || r.second > length_ - r.first) return false;
  }
  return true;
}

void ControlServer::Serve(int fd) {
  while (!stopping_.load(std::memory_order_relaxed)) {
    char cmd = 0;
    if (!RecvAll(fd, &cmd, 1)) return;
    switch (cmd) {
      case 'R':
        if (!ServeCpu(fd)) return;
        break;
      case 'N':
        if (!ServeName(fd)) return;
        break;
      case 'F':
        if (!ServeFill(fd)) return;
        break;
      case 'Z':
        if (!ServePoison(fd)) return;
        break;
      case 'C':
        if (!ServeCheck(fd)) return;
        break;
      case 'W':
        return ServeReceive(fd);
      case 'D':
        return ServeSend(fd);
      case 'S':
        return ServeScatter(fd);
      case 'G':
        return ServeGather(fd);
      case 'P':
        return ServePingPong(fd);
      default:
        return;
    }
  }
}

bool ControlServer::RecvSeedRanges(int fd, uint64_t* seed, std::vector<Range>* ranges) {
  uint64_t n = 0;
  if (!RecvU64(fd, seed) || !RecvU64(fd, &n) || n > (1ull << 26)) return false;
  ranges->resize(n);
  if (!RecvAll(fd, ranges->data(), n * sizeof(Range))) return false;
  return ValidRanges(*ranges);
}

bool ControlServer::RecvLayout(int fd, std::vector<Range>* ranges) {
  uint64_t n = 0;
  if (!RecvU64(fd, &n) || n == 0 || n > (1ull << 26)) return false;
  ranges->resize(n);
  return RecvAll(fd, ranges->data(), n * sizeof(Range)) && ValidRanges(*ranges) &&
         NonEmpty(*ranges);
}

bool ControlServer::ServeCpu(int fd) {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  uint64_t reply[2] = {static_cast<uint64_t>(ru.ru_utime.tv_sec) * 1000000 + ru.ru_utime.tv_usec,
                       static_cast<uint64_t>(ru.ru_stime.tv_sec) * 1000000 + ru.ru_stime.tv_usec};
  return SendAll(fd, reply, sizeof(reply));
}

bool ControlServer::ServeName(int fd) {
  return SendU64(fd, name_.size()) && SendAll(fd, name_.data(), name_.size());
}

bool ControlServer::ServeFill(int fd) {
  uint64_t seed = 0;
  if (!RecvU64(fd, &seed)) return false;
  FillPattern(buffer_, 0, length_, seed);
  return SendU64(fd, 0);
}

bool ControlServer::ServePoison(int fd) {
  uint64_t seed = 0;
  std::vector<Range> ranges;
  if (!RecvSeedRanges(fd, &seed, &ranges)) return false;
  for (const Range& r : ranges) FillPattern(buffer_ + r.first, r.first, r.second, seed, true);
  return SendU64(fd, 0);
}

bool ControlServer::ServeCheck(int fd) {
  uint64_t seed = 0;
  std::vector<Range> ranges;
  if (!RecvSeedRanges(fd, &seed, &ranges)) return false;
  uint64_t bad = 0, first = ~0ull;
  for (const Range& r : ranges) {
    uint64_t f = ~0ull;
    uint64_t b = CheckPattern(buffer_ + r.first, r.first, r.second, seed, &f);
    if (b != 0 && bad == 0) first = f;
    bad += b;
  }
  uint64_t reply[2] = {bad, first};
  return SendAll(fd, reply, sizeof(reply));
}

// 'W': receives into [off, off + len) cyclically until the initiator shuts
// down its side, then says how many bytes arrived.
void ControlServer::ServeReceive(int fd) {
  uint64_t off = 0, len = 0;
  if (!RecvU64(fd, &off) || !RecvU64(fd, &len) || len == 0 || !ValidRanges({{off, len}})) {
    return;
  }
  uint64_t total = 0, pos = 0;
  while (true) {
    ssize_t n = recv(fd, buffer_ + off + pos, std::min(kChunk, len - pos), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    total += static_cast<uint64_t>(n);
    pos += static_cast<uint64_t>(n);
    if (pos == len) pos = 0;
  }
  SendU64(fd, total);
}

// 'D': after the go byte, sends [off, off + len) cyclically until the
// initiator closes its side.
void ControlServer::ServeSend(int fd) {
  uint64_t off = 0, len = 0;
  char go = 0;
  if (!RecvU64(fd, &off) || !RecvU64(fd, &len) || len == 0 || !ValidRanges({{off, len}}) ||
      !RecvAll(fd, &go, 1)) {
    return;
  }
  uint64_t pos = 0;
  while (true) {
    ssize_t n = send(fd, buffer_ + off + pos, std::min(kChunk, len - pos), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the initiator closed its side: done
    pos += static_cast<uint64_t>(n);
    if (pos == len) pos = 0;
  }
}

// 'S': scatters what arrives into the layout until the initiator shuts down
// its side, then says how many bytes arrived.
void ControlServer::ServeScatter(int fd) {
  std::vector<Range> ranges;
  if (!RecvLayout(fd, &ranges)) return;
  ScatterCursor cursor(buffer_, ranges);
  uint64_t total = 0;
  while (true) {
    ssize_t k = ScatterOnce(fd, cursor);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    total += static_cast<uint64_t>(k);
  }
  SendU64(fd, total);
}

// 'G': after the go byte, gathers the layout and sends it until the
// initiator closes its side.
void ControlServer::ServeGather(int fd) {
  std::vector<Range> ranges;
  char go = 0;
  if (!RecvLayout(fd, &ranges) || !RecvAll(fd, &go, 1)) return;
  ScatterCursor cursor(buffer_, ranges);
  while (true) {
    ssize_t k = GatherOnce(fd, cursor);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
  }
}

// 'P': echoes 8-byte messages, spinning on a non-blocking socket, until EOF
// (or Stop()).
void ControlServer::ServePingPong(int fd) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  char msg[8];
  while (true) {
    size_t got = 0;
    uint64_t spins = 0;
    while (got < sizeof(msg)) {
      ssize_t n = recv(fd, msg + got, sizeof(msg) - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        return;
      } else if ((++spins & 0xfffff) == 0 && stopping_.load(std::memory_order_relaxed)) {
        return;
      }
    }
    size_t sent = 0;
    while (sent < sizeof(msg)) {
      ssize_t n = send(fd, msg + sent, sizeof(msg) - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return;
      }
    }
  }
}

ControlClient::ControlClient(const std::string& host, uint16_t port)
    : where_(JoinHostPort(host, port)), fd_(ConnectTo(host, port)) {}

namespace {
[[noreturn]] void Lost(const std::string& where) {
  throw cli::RunError("lost the control connection to the bench target at " + where);
}
}  // namespace

double ControlClient::TargetCpuSeconds() {
  uint64_t reply[2];
  if (!SendAll(fd_.get(), "R", 1) || !RecvAll(fd_.get(), reply, sizeof(reply))) Lost(where_);
  return (reply[0] + reply[1]) * 1e-6;
}

std::string ControlClient::TargetName() {
  uint64_t n = 0;
  if (!SendAll(fd_.get(), "N", 1) || !RecvU64(fd_.get(), &n) || n > 4096) Lost(where_);
  std::string name(n, '\0');
  if (!RecvAll(fd_.get(), name.data(), n)) Lost(where_);
  return name;
}

void ControlClient::Fill(uint64_t seed) {
  uint64_t ack;
  if (!SendAll(fd_.get(), "F", 1) || !SendU64(fd_.get(), seed) || !RecvU64(fd_.get(), &ack)) {
    Lost(where_);
  }
}

void ControlClient::SendRanges(char cmd, uint64_t seed, const std::vector<Range>& ranges) {
  uint64_t n = ranges.size();
  if (!SendAll(fd_.get(), &cmd, 1) || !SendU64(fd_.get(), seed) || !SendU64(fd_.get(), n) ||
      !SendAll(fd_.get(), ranges.data(), n * sizeof(Range))) {
    Lost(where_);
  }
}

void ControlClient::Poison(uint64_t seed, const std::vector<Range>& ranges) {
  SendRanges('Z', seed, ranges);
  uint64_t ack;
  if (!RecvU64(fd_.get(), &ack)) Lost(where_);
}

uint64_t ControlClient::Check(uint64_t seed, const std::vector<Range>& ranges,
                              uint64_t* first_bad) {
  SendRanges('C', seed, ranges);
  uint64_t reply[2];
  if (!RecvAll(fd_.get(), reply, sizeof(reply))) Lost(where_);
  if (first_bad != nullptr) *first_bad = reply[1];
  return reply[0];
}

namespace {

// Totals of a set of baseline streams that started together at `start`.
StreamResult Summarize(const char* what, Clock::time_point start, const std::vector<uint8_t>& ok,
                       const std::vector<uint64_t>& bytes,
                       const std::vector<Clock::time_point>& end) {
  StreamResult r;
  r.streams = static_cast<int>(ok.size());
  Clock::time_point last = start;
  for (size_t i = 0; i < ok.size(); ++i) {
    if (!ok[i]) throw cli::RunError(std::string(what) + " stream " + std::to_string(i) + " failed");
    r.bytes += bytes[i];
    last = std::max(last, end[i]);
  }
  r.seconds = std::chrono::duration<double>(last - start).count();
  return r;
}

// How one baseline stream ended: whether it worked, and the bytes it moved
// (as the receiver counted them).
struct StreamEnd {
  bool ok = true;
  uint64_t bytes = 0;
};

// Runs `stream(i, deadline)` for i = 0..n-1, each on its own thread, all
// started together once every thread is ready; the deadline is `seconds`
// after the start. Throws cli::RunError naming `what` if a stream failed.
template <typename Stream>
StreamResult RunTogether(const char* what, int n, double seconds, Stream stream) {
  std::latch ready(n + 1), go(1);
  std::vector<uint64_t> bytes(n, 0);
  std::vector<Clock::time_point> end(n);
  std::vector<uint8_t> ok(n, 1);  // not vector<bool>: threads write their own element
  Clock::time_point start;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready.count_down();
      go.wait();
      const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(seconds));
      const StreamEnd e = stream(i, deadline);
      ok[i] = e.ok;
      bytes[i] = e.bytes;
      end[i] = Clock::now();
    });
  }
  ready.arrive_and_wait();
  start = Clock::now();
  go.count_down();
  for (auto& t : threads) t.join();
  return Summarize(what, start, ok, bytes, end);
}

// After sending until the deadline: shuts down this side and reads the
// byte count the target received.
StreamEnd FinishSending(int fd, bool ok) {
  shutdown(fd, SHUT_WR);
  uint64_t received = 0;
  if (!RecvU64(fd, &received)) ok = false;
  return {ok, received};
}

// Sends [base, base + slice) cyclically until the deadline.
StreamEnd SendSlice(int fd, uint8_t* base, uint64_t slice, Clock::time_point deadline) {
  bool ok = true;
  uint64_t pos = 0;
  while (Clock::now() < deadline) {
    ssize_t k = send(fd, base + pos, std::min(kChunk, slice - pos), MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      ok = false;
      break;
    }
    pos += static_cast<uint64_t>(k);
    if (pos == slice) pos = 0;
  }
  return FinishSending(fd, ok);
}

// Sends the go byte, then receives into [base, base + slice) cyclically
// until the deadline.
StreamEnd ReceiveSlice(int fd, uint8_t* base, uint64_t slice, Clock::time_point deadline) {
  bool ok = SendAll(fd, "g", 1);
  uint64_t total = 0, pos = 0;
  while (ok && Clock::now() < deadline) {
    ssize_t k = recv(fd, base + pos, std::min(kChunk, slice - pos), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      ok = false;
      break;
    }
    total += static_cast<uint64_t>(k);
    pos += static_cast<uint64_t>(k);
    if (pos == slice) pos = 0;
  }
  shutdown(fd, SHUT_RDWR);
  return {ok, total};
}

// Gathers the cursor's ranges and sends them until the deadline.
StreamEnd SendGathered(int fd, ScatterCursor& cursor, Clock::time_point deadline) {
  bool ok = true;
  while (Clock::now() < deadline) {
    ssize_t k = GatherOnce(fd, cursor);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      ok = false;
      break;
    }
  }
  return FinishSending(fd, ok);
}

// Sends the go byte, then scatters what arrives into the cursor's ranges
// until the deadline.
StreamEnd ReceiveScattered(int fd, ScatterCursor& cursor, Clock::time_point deadline) {
  bool ok = SendAll(fd, "g", 1);
  uint64_t total = 0;
  while (ok && Clock::now() < deadline) {
    ssize_t k = ScatterOnce(fd, cursor);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      ok = false;
      break;
    }
    total += static_cast<uint64_t>(k);
  }
  shutdown(fd, SHUT_RDWR);
  return {ok, total};
}

}  // namespace

StreamResult RunPlainStreams(const std::string& host, uint16_t port,
                             const std::vector<bool>& initiator_sends, uint8_t* local,
                             uint64_t local_length, uint64_t remote_length, double seconds) {
  const int n = static_cast<int>(initiator_sends.size());
  const uint64_t local_slice = (local_length / n) & ~uint64_t{4095};
  const uint64_t remote_slice = (remote_length / n) & ~uint64_t{4095};
  if (local_slice == 0 || remote_slice == 0) {
    throw cli::RunError("buffers too small for " + std::to_string(n) + " baseline streams");
  }
  std::vector<Fd> fds;
  for (int i = 0; i < n; ++i) {
    fds.emplace_back(ConnectTo(host, port));
    uint64_t hdr[2] = {remote_slice * i, remote_slice};
    char cmd = initiator_sends[i] ? 'W' : 'D';
    if (!SendAll(fds[i].get(), &cmd, 1) || !SendAll(fds[i].get(), hdr, sizeof(hdr))) {
      throw cli::RunError("baseline stream setup failed");
    }
  }
  return RunTogether("baseline", n, seconds, [&](int i, Clock::time_point deadline) {
    uint8_t* base = local + local_slice * i;
    return initiator_sends[i] ? SendSlice(fds[i].get(), base, local_slice, deadline)
                              : ReceiveSlice(fds[i].get(), base, local_slice, deadline);
  });
}

StreamResult RunScatterStreams(const std::string& host, uint16_t port,
                               const std::vector<bool>& initiator_sends, uint8_t* local,
                               const std::vector<std::vector<Range>>& local_ranges,
                               const std::vector<std::vector<Range>>& remote_ranges,
                               double seconds) {
  const int n = static_cast<int>(initiator_sends.size());
  std::vector<Fd> fds;
  for (int i = 0; i < n; ++i) {
    if (!NonEmpty(local_ranges[i]) || local_ranges[i].size() != remote_ranges[i].size()) {
      throw cli::RunError("scatter baseline: bad layout for stream " + std::to_string(i));
    }
    fds.emplace_back(ConnectTo(host, port));
    char cmd = initiator_sends[i] ? 'S' : 'G';
    uint64_t cnt = remote_ranges[i].size();
    if (!SendAll(fds[i].get(), &cmd, 1) || !SendU64(fds[i].get(), cnt) ||
        !SendAll(fds[i].get(), remote_ranges[i].data(), cnt * sizeof(Range))) {
      throw cli::RunError("scatter baseline stream setup failed");
    }
  }
  return RunTogether("scatter baseline", n, seconds, [&](int i, Clock::time_point deadline) {
    ScatterCursor cursor(local, local_ranges[i]);
    return initiator_sends[i] ? SendGathered(fds[i].get(), cursor, deadline)
                              : ReceiveScattered(fds[i].get(), cursor, deadline);
  });
}

std::vector<double> RunPingPong(const std::string& host, uint16_t port, double seconds,
                                size_t max_round_trips) {
  Fd fd(ConnectTo(host, port));
  if (!SendAll(fd.get(), "P", 1)) throw cli::RunError("ping-pong setup failed");
  int flags = fcntl(fd.get(), F_GETFL);
  fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
  char msg[8] = {};
  auto round_trip = [&]() {
    size_t sent = 0;
    while (sent < sizeof(msg)) {
      ssize_t n = send(fd.get(), msg + sent, sizeof(msg) - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        throw cli::RunError("ping-pong send failed");
      }
    }
    size_t got = 0;
    while (got < sizeof(msg)) {
      ssize_t n = recv(fd.get(), msg + got, sizeof(msg) - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        throw cli::RunError("ping-pong recv failed");
      }
    }
  };
  for (int i = 0; i < 200; ++i) round_trip();  // warm up
  std::vector<double> rtts;
  rtts.reserve(std::min<size_t>(max_round_trips, 1 << 20));
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (rtts.size() < max_round_trips) {
    auto t0 = Clock::now();
    if (t0 >= deadline) break;
    round_trip();
    rtts.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return rtts;
}

}  // namespace ferry::bench
