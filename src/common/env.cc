#include "common/env.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace ferry::internal {
namespace {

Environment Parse() {
  Environment env;
  if (const char* v = std::getenv("FERRY_LOG_LEVEL"); v != nullptr && *v != '\0') {
    std::string_view s(v);
    if (s == "debug")
      env.log_level = LogLevel::kDebug;
    else if (s == "info")
      env.log_level = LogLevel::kInfo;
    else if (s == "warning" || s == "warn")
      env.log_level = LogLevel::kWarning;
    else if (s == "error")
      env.log_level = LogLevel::kError;
    else if (s == "off")
      env.log_level = LogLevel::kOff;
    else
      std::fprintf(stderr,
                   "ferry: ignoring FERRY_LOG_LEVEL=%s (expected debug|info|warning|error|off)\n",
                   v);
  }
  env.options = ParseOptionVariables(
      [](const char* name) { return std::getenv(name); },
      [](const std::string& message) { std::fprintf(stderr, "%s\n", message.c_str()); });
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
  return internal::ApplyOptionOverrides(*this, internal::ProcessEnvironment().options);
}

}  // namespace ferry
