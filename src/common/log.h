// Minimal leveled logging to stderr. The level is set once per process from
// the environment (see env.h); logging never allocates on hot paths unless a
// message is actually printed.
#pragma once

#include <sstream>
#include <string>

namespace ferry::internal {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kOff = 4 };

LogLevel CurrentLogLevel();
void EmitLog(LogLevel level, const char* file, int line, const std::string& message);

}  // namespace ferry::internal

#define FERRY_LOG(level, expr)                                                           \
  do {                                                                                   \
    if (::ferry::internal::LogLevel::level >= ::ferry::internal::CurrentLogLevel()) {    \
      std::ostringstream ferry_log_os_;                                                  \
      ferry_log_os_ << expr;                                                             \
      ::ferry::internal::EmitLog(::ferry::internal::LogLevel::level, __FILE__, __LINE__, \
                                 ferry_log_os_.str());                                   \
    }                                                                                    \
  } while (0)
