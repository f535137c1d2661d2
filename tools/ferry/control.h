// The bench's control channel and plain-socket baselines.
//
// The target process runs a ControlServer next to its engine, on its own
// port. Over it the initiator asks for the target's CPU time, has the target
// fill, poison or check its buffer against the verification pattern, and
// runs the baselines: plain TCP streams that read straight into (or send
// straight from) the same registered buffer, and a busy-polling 8-byte
// ping-pong. Protocol: one command byte, then little-endian u64 arguments;
// see control.cc. Both ends are this program, so it is not versioned.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "net.h"

namespace ferry::bench {

using Range = std::pair<uint64_t, uint64_t>;  // (offset in the target buffer, length)

double ProcessCpuSeconds();  // user + system time of this process (getrusage)

// Thread-safe: Stop() may be called from any thread, once.
class ControlServer {
 public:
  // Listens on host (any free port). `buffer` is borrowed until Stop().
  // `name`: the name the target published in a metadata service ("" for
  // none), what an initiator that asks is told.
  ControlServer(const std::string& host, uint8_t* buffer, uint64_t length, std::string name = "");
  ~ControlServer();
  uint16_t port() const { return port_; }
  // Closes the listener and every connection, joins every thread.
  void Stop();

 private:
  void AcceptLoop();
  // One connection's commands, on its own thread, until it closes.
  void Serve(int fd);
  // The commands (control.cc). Those that answer and wait for the next
  // return false when the connection failed; the others end it.
  bool ServeCpu(int fd);
  bool ServeName(int fd);
  bool ServeFill(int fd);
  bool ServePoison(int fd);
  bool ServeCheck(int fd);
  void ServeReceive(int fd);
  void ServeSend(int fd);
  void ServeScatter(int fd);
  void ServeGather(int fd);
  void ServePingPong(int fd);
  // A seed and ranges of the buffer ('Z', 'C'); false if they did not
  // arrive or lie outside the buffer.
  bool RecvSeedRanges(int fd, uint64_t* seed, std::vector<Range>* ranges);
  // A scatter baseline's layout ('S', 'G'): non-empty ranges of the buffer.
  bool RecvLayout(int fd, std::vector<Range>* ranges);
  bool ValidRanges(const std::vector<Range>& ranges) const;

  uint8_t* buffer_;
  uint64_t length_;
  const std::string name_;
  uint16_t port_ = 0;
  Fd listen_fd_;
  int wake_pipe_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  struct Conn {
    int fd;
    std::thread thread;
  };
  std::list<Conn> conns_;  // guarded by mu_
};

// One control connection (not thread-safe; use one per thread).
class ControlClient {
 public:
  ControlClient(const std::string& host, uint16_t port);
  // The target's user + system CPU seconds so far.
  double TargetCpuSeconds();
  // The name the target published in a metadata service ("" for none).
  std::string TargetName();
  // Fills the whole target buffer with the pattern for `seed`.
  void Fill(uint64_t seed);
  // Writes the complement of the pattern for `seed` into the ranges.
  void Poison(uint64_t seed, const std::vector<Range>& ranges);
  // Counts the bytes in the ranges that differ from the pattern for `seed`.
  uint64_t Check(uint64_t seed, const std::vector<Range>& ranges, uint64_t* first_bad);

 private:
  void SendRanges(char cmd, uint64_t seed, const std::vector<Range>& ranges);
  std::string where_;
  Fd fd_;
};

struct StreamResult {
  int streams = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  double gbps() const { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
};

// Plain TCP streams between this process and the target's control server,
// each on its own thread on both sides, for `seconds`. initiator_sends[i]:
// stream i carries data initiator -> target (else target -> initiator).
// Stream i uses the i-th equal slice of `local` here and of the target
// buffer (`remote_length` bytes) there; the receiver reads straight into it.
StreamResult RunPlainStreams(const std::string& host, uint16_t port,
                             const std::vector<bool>& initiator_sends, uint8_t* local,
                             uint64_t local_length, uint64_t remote_length, double seconds);

// Like RunPlainStreams, but each stream moves the same scattered entries as
// the workload: stream i gathers local_ranges[i] (offsets into `local`) with
// sendmsg and the target scatters them into remote_ranges[i] of its buffer
// with readv, in order, cyclically (or the other way round for reads). Both
// sides know the layout in advance: no per-transfer descriptors travel.
StreamResult RunScatterStreams(const std::string& host, uint16_t port,
                               const std::vector<bool>& initiator_sends, uint8_t* local,
                               const std::vector<std::vector<Range>>& local_ranges,
                               const std::vector<std::vector<Range>>& remote_ranges,
                               double seconds);

// 8-byte ping-pong, both ends spinning on non-blocking recv. Round trips in µs.
std::vector<double> RunPingPong(const std::string& host, uint16_t port, double seconds,
                                size_t max_round_trips);

}  // namespace ferry::bench
