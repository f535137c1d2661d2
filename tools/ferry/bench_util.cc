#include "bench_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cli.h"

namespace ferry::bench {

std::string Fixed(double v, int digits) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

std::string Pad(const std::string& s, size_t width, bool left) {
  if (s.size() >= width) return s;
  return left ? s + std::string(width - s.size(), ' ') : std::string(width - s.size(), ' ') + s;
}

double Ratio(double a, double b) {
  return (b > 0 && std::isfinite(a) && std::isfinite(b)) ? a / b : kNaN;
}

double Sum(double a, double b) {
  if (std::isnan(b)) return a;
  return a + b;
}

double Median(std::vector<double> v) {
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Fail(const std::string& what, const Status& s) {
  throw cli::RunError(what + ": " + s.ToString());
}

Buffer::Buffer(uint64_t length, bool populate, bool huge, bool shared) : length_(length) {
  if (shared) {
    fd_ = memfd_create("ferry-bench", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(length)) != 0 ||
        fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      throw cli::RunError("cannot make a " + cli::FormatSize(length) +
                          " shared-memory buffer: " + std::strerror(errno));
    }
  }
  const int populate_flag = populate && !huge ? MAP_POPULATE : 0;
  void* p = shared
                ? mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flag, fd_, 0)
                : mmap(nullptr, length, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | populate_flag, -1, 0);
  if (p == MAP_FAILED) {
    throw cli::RunError("cannot allocate a " + cli::FormatSize(length) +
                        " buffer: " + std::strerror(errno));
  }
  data_ = static_cast<uint8_t*>(p);
  if (huge) {
    if (madvise(p, length, MADV_HUGEPAGE) != 0) {
      std::fprintf(stderr, "ferry bench: madvise(MADV_HUGEPAGE): %s (continuing)\n",
                   std::strerror(errno));
    }
    if (populate) std::memset(p, 0, length);
  }
}

Buffer::~Buffer() {
  munmap(data_, length_);
  if (fd_ >= 0) close(fd_);
}

}  // namespace ferry::bench
