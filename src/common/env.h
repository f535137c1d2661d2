// The one place Ferry reads environment variables (env.cc; nothing else calls
// getenv). FERRY_LOG_LEVEL is read here; the variables of engine options are
// the rows of OptionTable() (ferry/options.h, option_table.cc).
// docs/configuration.md lists them all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/log.h"
#include "ferry/options.h"

namespace ferry::internal {

// A FERRY_* variable of the option table that was set to a valid value.
struct OptionOverride {
  size_t row = 0;       // index into OptionTable()
  int64_t integer = 0;  // integer options
  std::string text;     // string options
};

// getenv's contract: the variable's value, or nullptr when it is not set.
using EnvLookup = std::function<const char*(const char* name)>;
// Receives the message ("ferry: ignoring NAME=VALUE (expected ...)") of each
// value that is ignored.
using EnvWarning = std::function<void(const std::string& message)>;

// Reads every variable of OptionTable() through `lookup`. An empty value
// counts as unset; an invalid one (not an integer, or outside the option's
// range) is reported to `warn` and skipped.
std::vector<OptionOverride> ParseOptionVariables(const EnvLookup& lookup, const EnvWarning& warn);

// `o` with `overrides` applied.
EngineOptions ApplyOptionOverrides(EngineOptions o, const std::vector<OptionOverride>& overrides);

struct Environment {
  LogLevel log_level = LogLevel::kWarning;  // FERRY_LOG_LEVEL=debug|info|warning|error|off
  std::vector<OptionOverride> options;      // the option table's FERRY_* variables
};

// Parsed once, on first use; invalid values are reported on stderr and ignored.
const Environment& ProcessEnvironment();

}  // namespace ferry::internal
