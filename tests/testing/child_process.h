// ChildProcess: runs a program as a child of the test, with its stdin on a
// pipe and its stdout on a pipe (or in a file), and bounded waits everywhere.
// The destructor always SIGKILLs and reaps the child. Nothing of the test's
// (engine sockets included) leaks into the child: every fd above 2 closes.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ferry::test {

class ChildProcess {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    // Non-empty: stdout and stderr go to this file (appended) instead of a
    // pipe; ReadLine then has nothing to read.
    std::string output_file;
    // Extra environment entries ("NAME=value") over this process's.
    std::vector<std::string> env;
  };

  ChildProcess() = default;
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  ::testing::AssertionResult Start(const std::string& path, const std::vector<std::string>& args) {
    return Start(path, args, Options{});
  }

  ::testing::AssertionResult Start(const std::string& path, const std::vector<std::string>& args,
                                   const Options& options) {
    Kill();
    int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1};
    if (pipe2(in_pipe, O_CLOEXEC) != 0) return Errno("pipe2");
    int out_fd = -1;
    if (options.output_file.empty()) {
      if (pipe2(out_pipe, O_CLOEXEC) != 0) {
        close(in_pipe[0]);
        close(in_pipe[1]);
        return Errno("pipe2");
      }
      out_fd = out_pipe[1];
    } else {
      out_fd = open(options.output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (out_fd < 0) {
        close(in_pipe[0]);
        close(in_pipe[1]);
        return Errno(("open " + options.output_file).c_str());
      }
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in_pipe[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out_fd, STDOUT_FILENO);
    if (!options.output_file.empty())
      posix_spawn_file_actions_adddup2(&actions, out_fd, STDERR_FILENO);
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
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.insert(env_strings.end(), options.env.begin(), options.env.end());
    std::vector<char*> envp;
    for (std::string& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);

    pid_t pid = -1;
    const int rc = posix_spawn(&pid, path.c_str(), &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(in_pipe[0]);
    close(out_fd);
    if (rc != 0) {
      close(in_pipe[1]);
      if (out_pipe[0] >= 0) close(out_pipe[0]);
      return ::testing::AssertionFailure() << "posix_spawn " << path << ": " << std::strerror(rc);
    }
    pid_ = pid;
    stdin_fd_ = in_pipe[1];
    stdout_fd_ = out_pipe[0];
    buffered_.clear();
    command_line_ = all;
    return ::testing::AssertionSuccess();
  }

  // The child's next stdout line, waiting at most until `deadline`.
  ::testing::AssertionResult ReadLine(std::string* line, Clock::time_point deadline) {
    for (;;) {
      const size_t nl = buffered_.find('\n');
      if (nl != std::string::npos) {
        *line = buffered_.substr(0, nl);
        buffered_.erase(0, nl + 1);
        return ::testing::AssertionSuccess();
      }
      if (stdout_fd_ < 0)
        return ::testing::AssertionFailure() << Describe() << " has no stdout pipe";
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
               << Describe() << " closed its stdout (exited?); partial \"" << buffered_ << "\"";
      }
      buffered_.append(chunk, static_cast<size_t>(got));
    }
  }

  ::testing::AssertionResult ReadLine(std::string* line, std::chrono::milliseconds timeout) {
    return ReadLine(line, Clock::now() + timeout);
  }

  // Writes `text` to the child's stdin; false if it could not.
  bool Write(const std::string& text) {
    size_t done = 0;
    while (done < text.size()) {
      if (stdin_fd_ < 0) return false;
      const ssize_t n = write(stdin_fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<size_t>(n);
    }
    return true;
  }

  void CloseStdin() {
    if (stdin_fd_ >= 0) close(stdin_fd_);
    stdin_fd_ = -1;
  }

  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }

  // SIGSTOP, then waits (bounded) until the whole process has stopped: kill()
  // returns before the target's threads actually stop.
  ::testing::AssertionResult Freeze(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (pid_ <= 0) return ::testing::AssertionFailure() << "child not running";
    kill(pid_, SIGSTOP);
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WUNTRACED | WNOHANG);
      if (r == pid_ && WIFSTOPPED(status)) return ::testing::AssertionSuccess();
      if (r == pid_) {
        pid_ = -1;
        CloseFds();
        return ::testing::AssertionFailure() << "child exited instead of stopping";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return ::testing::AssertionFailure()
           << "child did not stop within " << timeout.count() << " ms";
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

  // Waits at most `timeout` for the child to exit by itself. Returns the exit
  // code, 128 + signal if a signal ended it, or -1 if it had to be SIGKILLed.
  int WaitForExit(std::chrono::milliseconds timeout) {
    if (pid_ <= 0) return -1;
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int status = 0;
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

  // Closes the child's stdin, then waits as WaitForExit.
  int Stop(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    CloseStdin();
    return WaitForExit(timeout);
  }

  // SIGTERM, then waits as WaitForExit.
  int Terminate(std::chrono::milliseconds timeout = std::chrono::seconds(15)) {
    Signal(SIGTERM);
    return WaitForExit(timeout);
  }

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  std::string Describe() const {
    std::string s = "child [";
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

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
  std::vector<std::string> command_line_;
};

}  // namespace ferry::test
