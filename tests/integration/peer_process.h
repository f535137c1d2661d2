// PeerProcess: runs ferry_test_peer as a child process and talks to it over
// pipes, with bounded waits everywhere. The destructor always SIGKILLs and
// reaps the child. The child also exits on its own when our end of its stdin
// closes, so it does not outlive a crashed test.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
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

extern char** environ;

namespace ferry::test {

class PeerProcess {
 public:
  using Clock = std::chrono::steady_clock;

  PeerProcess() = default;
  ~PeerProcess() { Kill(); }
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  // Spawns `path args...` and waits (bounded) for its READY line.
  ::testing::AssertionResult Start(const std::string& path, const std::vector<std::string>& args,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    Kill();
    int in_pipe[2], out_pipe[2];
    if (pipe2(in_pipe, O_CLOEXEC) != 0) return Errno("pipe2");
    if (pipe2(out_pipe, O_CLOEXEC) != 0) {
      close(in_pipe[0]);
      close(in_pipe[1]);
      return Errno("pipe2");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
    // Nothing else of ours (engine sockets included) leaks into the child.
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

    std::vector<std::string> all;
    all.push_back(path);
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, path.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(in_pipe[0]);
    close(out_pipe[1]);
    if (rc != 0) {
      close(in_pipe[1]);
      close(out_pipe[0]);
      return ::testing::AssertionFailure() << "posix_spawn " << path << ": " << std::strerror(rc);
    }
    pid_ = pid;
    stdin_fd_ = in_pipe[1];
    stdout_fd_ = out_pipe[0];
    buffered_.clear();
    command_line_ = all;

    std::string line;
    ::testing::AssertionResult got = ReadLine(&line, Clock::now() + timeout);
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
    if (pid_ <= 0) return "<no reply: not running>";
    std::string out = command + "\n";
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = write(stdin_fd_, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::string("<no reply: write: ") + std::strerror(errno) + ">";
      done += static_cast<size_t>(n);
    }
    std::string line;
    ::testing::AssertionResult got = ReadLine(&line, Clock::now() + timeout);
    if (!got) return std::string("<no reply: ") + got.message() + ">";
    return line;
  }

  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }

  // SIGSTOP, then waits (bounded) until the whole process has stopped: kill()
  // returns before the target's threads actually stop, and a thread still
  // running could answer requests the test expects to stay in flight.
  ::testing::AssertionResult Freeze(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (pid_ <= 0) return ::testing::AssertionFailure() << "peer not running";
    kill(pid_, SIGSTOP);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WUNTRACED | WNOHANG);
      if (r == pid_ && WIFSTOPPED(status)) return ::testing::AssertionSuccess();
      if (r == pid_) return ::testing::AssertionFailure() << "peer exited instead of stopping";
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return ::testing::AssertionFailure() << "peer did not stop within " << timeout.count() << " ms";
  }

  // SIGKILL and reap. Idempotent.
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

  // Closes the child's stdin (it exits by itself) and waits at most
  // `timeout`. Returns the exit code, 128 + signal if killed by a signal, or
  // -1 if it had to be SIGKILLed after the timeout.
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    if (pid_ <= 0) return -1;
    if (stdin_fd_ >= 0) {
      close(stdin_fd_);
      stdin_fd_ = -1;
    }
    return WaitForExit(timeout);
  }

  // Waits at most `timeout` for the child to exit by itself; returns as Stop.
  int WaitForExit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    const auto deadline = Clock::now() + timeout;
    int status = 0;
    while (Clock::now() < deadline) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        CloseFds();
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
    return -1;
  }

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const std::string& peer_id() const { return peer_id_; }
  uint64_t buffer_addr() const { return buffer_addr_; }
  uint64_t size() const { return size_; }
  uint16_t port() const { return port_; }

  std::string Describe() const {
    std::string s = "peer process [";
    for (const std::string& a : command_line_) s += (s.back() == '[' ? "" : " ") + a;
    return s + "]";
  }

 private:
  static ::testing::AssertionResult Errno(const char* what) {
    return ::testing::AssertionFailure() << what << ": " << std::strerror(errno);
  }

  void CloseFds() {
    if (stdin_fd_ >= 0) close(stdin_fd_);
    if (stdout_fd_ >= 0) close(stdout_fd_);
    stdin_fd_ = stdout_fd_ = -1;
  }

  ::testing::AssertionResult ReadLine(std::string* line, Clock::time_point deadline) {
    for (;;) {
      const size_t nl = buffered_.find('\n');
      if (nl != std::string::npos) {
        *line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return ::testing::AssertionSuccess();
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        return ::testing::AssertionFailure() << "timed out; partial output \"" << buffered_ << "\"";
      }
      pollfd pfd{stdout_fd_, POLLIN, 0};
      const int n = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (n < 0 && errno != EINTR) return Errno("poll");
      if (n <= 0) continue;
      char chunk[4096];
      const ssize_t got = read(stdout_fd_, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Errno("read");
      if (got == 0) {
        return ::testing::AssertionFailure()
               << "the peer closed its stdout (exited?); partial \"" << buffered_ << "\"";
      }
      buffered_.append(chunk, static_cast<size_t>(got));
    }
  }

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
  std::vector<std::string> command_line_;
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
