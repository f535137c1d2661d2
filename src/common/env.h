// The one place Ferry reads environment variables. Each variable is listed in
// the table in env.cc with what it overrides; docs/architecture.md lists them.
#pragma once

#include <optional>
#include <string>

#include "common/log.h"

namespace ferry::internal {

struct Environment {
  LogLevel log_level = LogLevel::kWarning;  // FERRY_LOG_LEVEL=debug|info|warning|error|off
  std::optional<int> tcp_streams;           // FERRY_TCP_STREAMS
  std::optional<int> io_threads;            // FERRY_IO_THREADS
  std::optional<long> spin_us;              // FERRY_SPIN_US
  std::optional<long> wait_spin_us;         // FERRY_WAIT_SPIN_US
  std::optional<long> tcp_send_buffer;      // FERRY_TCP_SEND_BUFFER
  std::optional<long> transfer_timeout_ms;  // FERRY_TRANSFER_TIMEOUT_MS
  std::optional<std::string> transport;     // FERRY_TRANSPORT=auto|tcp|local
};

// Parsed once, on first use; invalid values are logged and ignored.
const Environment& ProcessEnvironment();

}  // namespace ferry::internal
