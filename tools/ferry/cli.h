// Small helpers shared by the `ferry` subcommands: the command line (CLI11,
// set up the same way for every subcommand), number and size parsing, and
// the two ways a command fails (usage error: exit 2; runtime error: exit 1).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

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

// Prepares a CLI11 app for a subcommand's flags: "--name VALUE",
// "--name=VALUE" and, for switches, "--name". CLI11's own help is off (each
// command prints its hand-written text); -h/--help is a switch ParseFlags
// reports; a flag given twice keeps its last value. Declare the flags on the
// app after this (add_option_function<std::string> whose callbacks parse the
// value and throw UsageError naming the flag; add_flag for switches).
void PrepareApp(CLI::App& app);
// Parses `args` (the words after the command). Throws UsageError on an
// unknown flag, a missing value, a value given to a switch or a positional
// argument. Returns true when -h or --help was given (the other flags are
// still parsed and checked).
bool ParseFlags(CLI::App& app, const std::vector<std::string>& args);

}  // namespace ferry::cli
