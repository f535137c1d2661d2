// Small pieces every part of `ferry bench` uses: the clock, the constants of
// a run, number formatting for the table, and the page-aligned buffers.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry::bench {

using Clock = std::chrono::steady_clock;
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The smallest buffer the launcher registers on each side.
inline constexpr uint64_t kMinBuffer = 64ull << 20;
// The pattern seed of the target's buffer for reads (--verify).
inline constexpr uint64_t kReadSeed = 0x7265616473656564ull;
// Every kSampleEvery-th batch of each thread is waited for by polling, to
// time each request's completion (see docs/benchmarks.md).
inline constexpr uint64_t kSampleEvery = 16;
// --sweep caps one batch at this many bytes (bigger blocks: fewer of them).
inline constexpr uint64_t kSweepBatchBytes = 32ull << 20;

inline double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}
inline double Millis(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}
inline uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// `v` with `digits` decimals; "-" when it is not a number (not measured).
std::string Fixed(double v, int digits);
// `s` padded with spaces to `width`: on the left (right-aligned) unless `left`.
std::string Pad(const std::string& s, size_t width, bool left = false);
// a / b, NaN where either is not a number or b is not positive.
double Ratio(double a, double b);
// a + b, where b may be NaN (not measured): then a.
double Sum(double a, double b);
// The middle element (sorts a copy); NaN for none.
double Median(std::vector<double> v);

// Throws cli::RunError "what: status".
[[noreturn]] void Fail(const std::string& what, const Status& s);

// Anonymous, page-aligned memory. populate: fault every page in now, so the
// first transfer does not pay for it. huge: madvise(MADV_HUGEPAGE).
class Buffer {
 public:
  // Throws cli::RunError when the memory cannot be mapped. `shared`: the
  // pages of a memfd sealed against shrinking (fd()), mapped shared.
  Buffer(uint64_t length, bool populate, bool huge = false, bool shared = false);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() const { return data_; }
  uint64_t length() const { return length_; }
  int fd() const { return fd_; }  // -1 unless shared

 private:
  uint8_t* data_;
  uint64_t length_;
  int fd_ = -1;
};

}  // namespace ferry::bench
