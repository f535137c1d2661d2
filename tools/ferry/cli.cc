#include "cli.h"

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

void FlagParser::Value(std::string name, std::function<void(std::string_view)> on_value) {
  flags_.push_back({std::move(name), true, std::move(on_value), nullptr});
}

void FlagParser::Switch(std::string name, std::function<void()> on_set) {
  flags_.push_back({std::move(name), false, nullptr, std::move(on_set)});
}

bool FlagParser::Parse(const std::vector<std::string>& args) {
  bool help = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help = true;
      continue;
    }
    if (!arg.starts_with("--")) {
      throw UsageError("unexpected argument '" + std::string(arg) + "' (flags start with --)");
    }
    std::string_view name = arg;
    std::string_view inline_value;
    bool has_inline = false;
    if (auto eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
      has_inline = true;
    }
    const Flag* flag = nullptr;
    for (const Flag& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) {
      throw UsageError("unknown flag " + std::string(name));
    }
    if (!flag->takes_value) {
      if (has_inline) throw UsageError(std::string(name) + " takes no value");
      flag->on_set();
      continue;
    }
    if (has_inline) {
      flag->on_value(inline_value);
    } else {
      if (i + 1 >= args.size()) throw UsageError(std::string(name) + " needs a value");
      flag->on_value(args[++i]);
    }
  }
  return help;
}

}  // namespace ferry::cli
