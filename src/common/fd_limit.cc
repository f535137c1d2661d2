#include "common/fd_limit.h"

#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/log.h"

namespace ferry::internal {

namespace {
std::string Count(uint64_t v) { return v == RLIM_INFINITY ? "unlimited" : std::to_string(v); }
}  // namespace

FdLimits GetFdLimits() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return {};
  return {static_cast<uint64_t>(r.rlim_cur), static_cast<uint64_t>(r.rlim_max)};
}

FdLimits RaiseFdLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return {};
  if (r.rlim_cur < r.rlim_max) {
    const rlim_t before = r.rlim_cur;
    r.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &r) != 0) {
      const int err = errno;
      FERRY_LOG(kDebug, "cannot raise the soft RLIMIT_NOFILE from "
                            << before << " to " << Count(r.rlim_max) << ": " << std::strerror(err));
    } else {
      FERRY_LOG(kDebug,
                "raised the soft RLIMIT_NOFILE from " << before << " to " << Count(r.rlim_max));
    }
  }
  return GetFdLimits();
}

bool OutOfDescriptors() {
  const FdLimits l = GetFdLimits();
  const int64_t open = OpenFdCount();
  return l.soft > 0 && open >= 0 && static_cast<uint64_t>(open) >= l.soft;
}

int64_t OpenFdCount() {
  const FdLimits l = GetFdLimits();
  if (l.soft == 0) return -1;
  // poll() reports POLLNVAL for a number that is not open, and needs no
  // descriptor of its own (an opendir of /proc/self/fd would, and fails
  // exactly when this count matters).
  const uint64_t n = std::min<uint64_t>(l.soft, uint64_t{1} << 20);
  std::vector<pollfd> fds(n);
  for (uint64_t i = 0; i < n; ++i) fds[i] = {static_cast<int>(i), 0, 0};
  if (::poll(fds.data(), fds.size(), 0) < 0) return -1;
  int64_t open = 0;
  for (const pollfd& p : fds) open += (p.revents & POLLNVAL) == 0;
  return open;
}

Status DescriptorError(StatusCode otherwise, std::string_view what, int err) {
  std::string m(what);
  if (err == ENFILE) {
    m.append(
        ": the system's open-file table is full (ENFILE); raise fs.file-max (sysctl) or "
        "close descriptors of other processes");
    return ResourceExhaustedError(std::move(m));
  }
  if (err != EMFILE) {
    m.append(": ").append(std::strerror(err));
    return Status(otherwise, std::move(m));
  }
  const FdLimits l = GetFdLimits();
  const int64_t open = OpenFdCount();
  m.append(": out of file descriptors (EMFILE): ")
      .append(open < 0 ? std::string("all") : std::to_string(open))
      .append(" in use, soft limit RLIMIT_NOFILE = ")
      .append(Count(l.soft))
      .append(" (hard limit ")
      .append(Count(l.hard))
      .append(
          "); raise the soft limit (ulimit -n, or leave the engine option raise_fd_limit on "
          "to raise it to the hard limit), raise the hard limit, or hold fewer links "
          "(max_peer_links, idle_link_timeout, tcp_streams)");
  return ResourceExhaustedError(std::move(m));
}

}  // namespace ferry::internal
