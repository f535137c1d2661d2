#include "common/env.h"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "ferry/options.h"

namespace ferry::internal {
namespace {

std::optional<long> ParseLong(const char* name, long lo, long hi) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi) {
    std::fprintf(stderr, "ferry: ignoring %s=%s (expected an integer in [%ld, %ld])\n", name, v,
                 lo, hi);
    return std::nullopt;
  }
  return x;
}

Environment Parse() {
  Environment env;
  if (const char* v = std::getenv("FERRY_LOG_LEVEL"); v != nullptr && *v != '\0') {
    std::string_view s(v);
    if (s == "debug") env.log_level = LogLevel::kDebug;
    else if (s == "info") env.log_level = LogLevel::kInfo;
    else if (s == "warning" || s == "warn") env.log_level = LogLevel::kWarning;
    else if (s == "error") env.log_level = LogLevel::kError;
    else if (s == "off") env.log_level = LogLevel::kOff;
    else std::fprintf(stderr, "ferry: ignoring FERRY_LOG_LEVEL=%s (expected debug|info|warning|error|off)\n", v);
  }
  if (auto x = ParseLong("FERRY_TCP_STREAMS", 1, 64)) env.tcp_streams = static_cast<int>(*x);
  if (auto x = ParseLong("FERRY_IO_THREADS", 0, 64)) env.io_threads = static_cast<int>(*x);
  if (auto x = ParseLong("FERRY_SPIN_US", 0, 1000000)) env.spin_us = *x;
  if (auto x = ParseLong("FERRY_WAIT_SPIN_US", 0, 1000000)) env.wait_spin_us = *x;
  if (auto x = ParseLong("FERRY_TCP_SEND_BUFFER", 0, 256l << 20)) env.tcp_send_buffer = *x;
  if (auto x = ParseLong("FERRY_TRANSFER_TIMEOUT_MS", 1, 86400000)) env.transfer_timeout_ms = *x;
  if (const char* v = std::getenv("FERRY_TRANSPORT"); v != nullptr && *v != '\0') {
    env.transport = v;
  }
  return env;
}

}  // namespace

const Environment& ProcessEnvironment() {
  static const Environment env = Parse();
  return env;
}

}  // namespace ferry::internal

namespace ferry {

EngineOptions EngineOptions::WithEnvironment() const {
  const auto& env = internal::ProcessEnvironment();
  EngineOptions o = *this;
  if (env.tcp_streams) o.tcp_streams = *env.tcp_streams;
  if (env.io_threads) o.io_threads = *env.io_threads;
  if (env.spin_us) o.spin = std::chrono::microseconds(*env.spin_us);
  if (env.wait_spin_us) o.wait_spin = std::chrono::microseconds(*env.wait_spin_us);
  if (env.tcp_send_buffer) o.tcp_send_buffer = static_cast<uint32_t>(*env.tcp_send_buffer);
  if (env.transfer_timeout_ms) o.transfer_timeout = std::chrono::milliseconds(*env.transfer_timeout_ms);
  if (env.transport) o.transport = *env.transport;
  return o;
}

}  // namespace ferry
