#include "common/log.h"

#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/env.h"

namespace ferry::internal {

LogLevel CurrentLogLevel() {
  // Read once; the environment is the process's configuration (env.h).
  static const LogLevel level = ProcessEnvironment().log_level;
  return level;
}

void EmitLog(LogLevel level, const char* file, int line, const std::string& message) {
  static constexpr const char* kNames[] = {"D", "I", "W", "E", "-"};
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  auto now = std::chrono::duration_cast<std::chrono::microseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
                 .count();
  std::fprintf(stderr, "ferry %s %lld.%06lld %s:%d] %s\n", kNames[static_cast<int>(level)],
               static_cast<long long>(now / 1000000), static_cast<long long>(now % 1000000), base,
               line, message.c_str());
}

}  // namespace ferry::internal
