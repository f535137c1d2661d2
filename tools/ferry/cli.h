// Small helpers shared by the `ferry` subcommands: flag parsing, number and
// size parsing, and the two ways a command fails (usage error: exit 2;
// runtime error: exit 1).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::cli {

// A mistake in the command line. main() prints it with a hint to --help and
// exits with status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Something went wrong while running (peer unreachable, transfer failed...).
// main() prints it and exits with status 1.
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "4096", "4K", "4KiB", "4KB", "1M", "2G" (binary multiples; case-insensitive).
// Throws UsageError naming `flag` when the text is not a size.
uint64_t ParseSize(std::string_view flag, std::string_view text);
// A non-negative integer.
uint64_t ParseUint(std::string_view flag, std::string_view text);
// Seconds: "2", "0.5", "500ms", "3s".
double ParseSeconds(std::string_view flag, std::string_view text);
// Comma-separated list of sizes / integers.
std::vector<uint64_t> ParseSizeList(std::string_view flag, std::string_view text);
std::vector<uint64_t> ParseUintList(std::string_view flag, std::string_view text);

// "1 MiB", "32 KiB", "1000 B".
std::string FormatSize(uint64_t bytes);

// Declarative flag table. Each flag is "--name VALUE", "--name=VALUE" or,
// for switches, "--name".
class FlagParser {
 public:
  explicit FlagParser(std::string command) : command_(std::move(command)) {}
  void Value(std::string name, std::function<void(std::string_view)> on_value);
  void Switch(std::string name, std::function<void()> on_set);
  // Parses args (without the command words). Throws UsageError on an unknown
  // flag, a missing value, or a positional argument. Returns true if --help
  // (or -h) was given; the other flags are still parsed.
  bool Parse(const std::vector<std::string>& args);

 private:
  struct Flag {
    std::string name;
    bool takes_value;
    std::function<void(std::string_view)> on_value;
    std::function<void()> on_set;
  };
  std::string command_;
  std::vector<Flag> flags_;
};

}  // namespace ferry::cli
