#include "cli.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace ferry::cli {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

[[noreturn]] void Bad(std::string_view flag, std::string_view text, std::string_view what) {
  throw UsageError("bad value '" + std::string(text) + "' for " + std::string(flag) + ": " +
                   std::string(what));
}

std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    parts.push_back(
        text.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

}  // namespace

uint64_t ParseUint(std::string_view flag, std::string_view text) {
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    Bad(flag, text, "expected a non-negative whole number");
  }
  return value;
}

uint64_t ParseSize(std::string_view flag, std::string_view text) {
  uint64_t number = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (text.empty() || ec != std::errc() || ptr == text.data()) {
    Bad(flag, text, "expected a size such as 4096, 4K, 1M or 2G");
  }
  std::string suffix = Lower(std::string_view(ptr, text.data() + text.size() - ptr));
  uint64_t mult = 1;
  if (suffix.empty() || suffix == "b") {
    mult = 1;
  } else if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    mult = 1ull << 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    mult = 1ull << 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    mult = 1ull << 30;
  } else if (suffix == "t" || suffix == "tb" || suffix == "tib") {
    mult = 1ull << 40;
  } else {
    Bad(flag, text, "unknown unit '" + suffix + "' (use K, M, G or T, binary multiples)");
  }
  if (number > std::numeric_limits<uint64_t>::max() / mult) Bad(flag, text, "too large");
  return number * mult;
}

double ParseSeconds(std::string_view flag, std::string_view text) {
  std::string s = Lower(text);
  double scale = 1.0;
  if (s.size() > 2 && s.ends_with("ms")) {
    scale = 1e-3;
    s.resize(s.size() - 2);
  } else if (s.size() > 1 && s.ends_with("s")) {
    s.resize(s.size() - 1);
  }
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0) {
    Bad(flag, text, "expected a positive number of seconds such as 2, 0.5 or 500ms");
  }
  return v * scale;
}

std::vector<uint64_t> ParseSizeList(std::string_view flag, std::string_view text) {
  std::vector<uint64_t> out;
  for (auto part : Split(text, ',')) out.push_back(ParseSize(flag, part));
  return out;
}

std::vector<uint64_t> ParseUintList(std::string_view flag, std::string_view text) {
  std::vector<uint64_t> out;
  for (auto part : Split(text, ',')) out.push_back(ParseUint(flag, part));
  return out;
}

std::string FormatSize(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  uint64_t v = bytes;
  while (unit < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++unit;
  }
  return std::to_string(v) + " " + kUnits[unit];
}

void PrepareApp(CLI::App& app) {
  app.set_help_flag();  // no CLI11 help: the commands print their own text
  app.allow_extras();   // left-overs are reported by ParseFlags, in our words
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("-h,--help");
}

bool ParseFlags(CLI::App& app, const std::vector<std::string>& args) {
  // Before CLI11 sees them: "--switch=..." is refused (CLI11 would take
  // "--switch=true"), "--name=" hands the flag an empty value (CLI11 would
  // take the next word), and short options other than -h are not flags of
  // ours (a negative number stays a value, for the flag to refuse).
  std::vector<std::string> words;
  bool options_ended = false;
  for (const std::string& arg : args) {
    if (!options_ended && arg.size() > 1 && arg[0] == '-' && arg[1] != '-' && arg != "-h" &&
        !std::isdigit(static_cast<unsigned char>(arg[1]))) {
      throw UsageError("unexpected argument '" + arg + "' (flags start with --)");
    }
    const size_t eq = arg.find('=');
    const CLI::Option* flag = options_ended || !arg.starts_with("--") || eq == std::string::npos
                                  ? nullptr
                                  : app.get_option_no_throw(arg.substr(0, eq));
    options_ended = options_ended || arg == "--";
    if (flag != nullptr && flag->get_items_expected_max() == 0) {
      throw UsageError(arg.substr(0, eq) + " takes no value");
    }
    if (flag != nullptr && eq + 1 == arg.size()) {
      words.insert(words.end(), {arg.substr(0, eq), ""});
    } else {
      words.push_back(arg);
    }
  }
  std::vector<std::string> reversed(words.rbegin(), words.rend());  // CLI11 pops from the back
  try {
    app.parse(reversed);
  } catch (const CLI::ArgumentMismatch& e) {
    // "--name: 1 required TEXT missing".
    const std::string what = e.what();
    if (auto colon = what.find(':'); colon != std::string::npos && what.ends_with(" missing")) {
      throw UsageError(what.substr(0, colon) + " needs a value");
    }
    throw UsageError(what);
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  const std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) {
    const std::string& arg = extras.front();
    if (arg.starts_with("--")) throw UsageError("unknown flag " + arg.substr(0, arg.find('=')));
    throw UsageError("unexpected argument '" + arg + "' (flags start with --)");
  }
  return app.get_option("--help")->count() > 0;
}

}  // namespace ferry::cli
