// PeerProcess: runs ferry_test_peer as a child process (ChildProcess) and
// talks to it over pipes, with bounded waits everywhere. The destructor always
// SIGKILLs and reaps the child. The child also exits on its own when our end
// of its stdin closes, so it does not outlive a crashed test.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/child_process.h"

namespace ferry::test {

class PeerProcess {
 public:
  using Clock = std::chrono::steady_clock;

  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // Spawns `path args...` and waits (bounded) for its READY line. A test
  // binary carried to another machine (scripts/device-check.sh) no longer
  // finds the peer at the path it was built with: then the peer beside the
  // running binary, with the same file name, is used.
  ::testing::AssertionResult Start(const std::string& path, const std::vector<std::string>& args,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    ::testing::AssertionResult started = child_.Start(Beside(path), args);
    if (!started) return started;
    std::string line;
    ::testing::AssertionResult got = child_.ReadLine(&line, Clock::now() + timeout);
    if (!got) return got << " (waiting for READY from " << Describe() << ")";
    std::istringstream in(line);
    std::string word, addr;
    in >> word >> peer_id_ >> addr >> size_;
    if (word != "READY" || !in) {
      return ::testing::AssertionFailure() << Describe() << " said \"" << line << "\"";
    }
    buffer_addr_ = std::strtoull(addr.c_str(), nullptr, 0);
    const size_t colon = peer_id_.rfind(':');
    port_ = colon == std::string::npos
                ? 0
                : static_cast<uint16_t>(std::strtoul(peer_id_.c_str() + colon + 1, nullptr, 10));
    return ::testing::AssertionSuccess();
  }

  // Sends one command line and returns the reply line, or "<no reply: why>".
  std::string Call(const std::string& command,
                   std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    if (!child_.running()) return "<no reply: not running>";
    if (!child_.Write(command + "\n"))
      return std::string("<no reply: write: ") + std::strerror(errno) + ">";
    std::string line;
    ::testing::AssertionResult got = child_.ReadLine(&line, Clock::now() + timeout);
    if (!got) return std::string("<no reply: ") + got.message() + ">";
    return line;
  }

  void Signal(int sig) { child_.Signal(sig); }
  // SIGSTOP, bounded wait until the whole process has stopped.
  ::testing::AssertionResult Freeze(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    return child_.Freeze(timeout);
  }
  // SIGKILL and reap. Idempotent.
  void Kill() { child_.Kill(); }
  // Closes the child's stdin (it exits by itself) and waits at most
  // `timeout`. Returns the exit code, 128 + signal if killed by a signal, or
  // -1 if it had to be SIGKILLed after the timeout.
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    return child_.Stop(timeout);
  }
  // Waits at most `timeout` for the child to exit by itself; returns as Stop.
  int WaitForExit(std::chrono::milliseconds timeout) { return child_.WaitForExit(timeout); }

  bool running() const { return child_.running(); }
  pid_t pid() const { return child_.pid(); }
  const std::string& peer_id() const { return peer_id_; }
  uint64_t buffer_addr() const { return buffer_addr_; }
  uint64_t size() const { return size_; }
  uint16_t port() const { return port_; }

  std::string Describe() const { return "peer process " + child_.Describe().substr(6); }

 private:
  static std::string Beside(const std::string& path) {
    if (access(path.c_str(), X_OK) == 0) return path;
    char self[4096];
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return path;
    std::string dir(self, static_cast<size_t>(n));
    dir.resize(dir.rfind('/') + 1);
    const size_t slash = path.rfind('/');
    return dir + (slash == std::string::npos ? path : path.substr(slash + 1));
  }

  ChildProcess child_;
  std::string peer_id_;
  uint64_t buffer_addr_ = 0;
  uint64_t size_ = 0;
  uint16_t port_ = 0;
};

// A raw TCP connection to 127.0.0.1:port (blocking connect), or -1.
inline int ConnectRaw(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Waits (at most until `deadline`) for the other side to close `fd`,
// discarding whatever it sends first. True if it closed (EOF or reset).
inline bool WaitForClose(int fd, std::chrono::steady_clock::time_point deadline) {
  char buf[4096];
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    const int n = poll(&pfd, 1, 100);
    if (n < 0 && errno != EINTR) return false;
    if (n <= 0) continue;
    const ssize_t got = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (got == 0) return true;
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
  return false;
}

}  // namespace ferry::test
