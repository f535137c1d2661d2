// Whether this machine lets one process copy another's memory with
// process_vm_readv (what the shm transport needs): a forked child is asked
// for a value. Containers with a strict seccomp profile, or Yama
// ptrace_scope >= 1 without CAP_SYS_PTRACE, refuse it; tests that need shm
// then skip and say why (tests of the fallback still run).
#pragma once

#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ferry::test {

// "" if a process can read a child's memory, else the reason.
inline std::string SameHostCopyRefusal() {
  static const std::string refusal = [] {
    static volatile unsigned long value = 0x5eed5eed5eed5eedul;
    int gate[2];
    if (pipe(gate) != 0) return std::string("pipe: ") + std::strerror(errno);
    const pid_t child = fork();
    if (child < 0) return std::string("fork: ") + std::strerror(errno);
    if (child == 0) {
      close(gate[1]);
      char c;
      (void)!read(gate[0], &c, 1);  // until the parent closes its end
      _exit(0);
    }
    close(gate[0]);
    unsigned long seen = 0;
    iovec local{&seen, sizeof(seen)};
    iovec remote{const_cast<unsigned long*>(&value), sizeof(value)};
    const ssize_t n = process_vm_readv(child, &local, 1, &remote, 1, 0);
    const int err = errno;
    const long pidfd = syscall(SYS_pidfd_open, child, 0);
    const int pidfd_err = errno;
    if (pidfd >= 0) close(static_cast<int>(pidfd));
    close(gate[1]);
    waitpid(child, nullptr, 0);
    if (n != static_cast<ssize_t>(sizeof(seen))) {
      return std::string("process_vm_readv of a child process: ") + std::strerror(err);
    }
    if (pidfd < 0) return std::string("pidfd_open: ") + std::strerror(pidfd_err);
    return seen == value ? std::string() : std::string("process_vm_readv read the wrong bytes");
  }();
  return refusal;
}

}  // namespace ferry::test

// Skips the current test when shm cannot work on this machine.
#define FERRY_SKIP_WITHOUT_SAME_HOST_COPY()                                               \
  do {                                                                                    \
    const std::string why = ::ferry::test::SameHostCopyRefusal();                         \
    if (!why.empty()) GTEST_SKIP() << "same-host copies refused here (" << why << ")";    \
  } while (0)
