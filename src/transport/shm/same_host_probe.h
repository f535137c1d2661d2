// Whether this machine lets one process copy another's memory the way the
// shm transport does: process_vm_readv of a forked child, and pidfd_open of
// it. Containers with a strict seccomp profile, or Yama ptrace_scope >= 1
// without CAP_SYS_PTRACE, refuse it (and shm then falls back to tcp).
// The registry reports it as the shm transport's availability (`ferry info`,
// ferry::ListTransports()), and the tests that need shm skip with it
// (tests/testing/same_host.h).
#pragma once

#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ferry::internal::shm {

// "" if a process can read a child's memory and follow it, else the reason.
inline std::string SameHostCopyRefusal() {
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
  if (n != static_cast<ssize_t>(sizeof(seen)) || seen != value) {
    return std::string("process_vm_readv of a child process: ") + std::strerror(n < 0 ? err : EIO);
  }
  if (pidfd < 0) return std::string("pidfd_open: ") + std::strerror(pidfd_err);
  return "";
}

}  // namespace ferry::internal::shm
