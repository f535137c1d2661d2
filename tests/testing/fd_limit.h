// Runs a stretch of a test out of file descriptors (the descriptor-budget
// tests of the metadata clients and the peer links).
#pragma once

#include <sys/resource.h>
#include <unistd.h>

namespace ferry::test {

// Lowers the soft RLIMIT_NOFILE to the lowest free descriptor number, so the
// next descriptor this process makes fails with EMFILE; Restore (or the
// destructor) puts the saved limit back. Check gmock matchers only after
// Restore: UBSan's vptr check needs a descriptor of its own (a pipe) to read
// an object and, without one, reports a bad vptr that is not there.
class OutOfDescriptors {
 public:
  OutOfDescriptors() {
    if (getrlimit(RLIMIT_NOFILE, &saved_) != 0) return;
    const int probe = dup(0);
    if (probe < 0) return;
    close(probe);
    rlimit low = saved_;
    low.rlim_cur = static_cast<rlim_t>(probe);
    if (setrlimit(RLIMIT_NOFILE, &low) != 0) return;
    limit_ = probe;
    lowered_ = true;
  }
  ~OutOfDescriptors() { Restore(); }
  OutOfDescriptors(const OutOfDescriptors&) = delete;
  OutOfDescriptors& operator=(const OutOfDescriptors&) = delete;

  // Whether the limit was lowered (false: nothing changed).
  bool lowered() const { return lowered_; }
  // The soft limit while lowered.
  int limit() const { return limit_; }
  // Puts the saved limit back; whether that worked.
  bool Restore() {
    if (!lowered_) return true;
    lowered_ = false;
    return setrlimit(RLIMIT_NOFILE, &saved_) == 0;
  }

 private:
  rlimit saved_{};
  int limit_ = -1;
  bool lowered_ = false;
};

}  // namespace ferry::test
