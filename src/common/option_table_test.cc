#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/env.h"
#include "ferry/options.h"
#include "ferry/transports.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

const OptionSpec& Spec(std::string_view name) {
  for (const OptionSpec& s : OptionTable()) {
    if (s.name == name) return s;
  }
  ADD_FAILURE() << "no option " << name;
  static const OptionSpec kNone;
  return kNone;
}

size_t RowOf(std::string_view name) {
  const auto table = OptionTable();
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i].name == name) return i;
  }
  ADD_FAILURE() << "no option " << name;
  return table.size();
}

// `o` with the integer option `name` set to `v`, through the table's setter.
EngineOptions With(EngineOptions o, std::string_view name, int64_t v) {
  internal::OptionOverride ov;
  ov.row = RowOf(name);
  ov.integer = v;
  return internal::ApplyOptionOverrides(std::move(o), {ov});
}

TEST(OptionTable, RowsAreWellFormed) {
  std::set<std::string_view> names;
  const EngineOptions defaults{};
  for (const OptionSpec& s : OptionTable()) {
    SCOPED_TRACE(std::string(s.name));
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate row";
    EXPECT_NE(s.range, "");
    EXPECT_NE(s.meaning, "");
    EXPECT_NE(s.belongs_to, "");
    EXPECT_NE(s.integer_value == nullptr, s.string_value == nullptr) << "exactly one accessor";
    EXPECT_EQ(s.default_value, s.Value(defaults));
    if (!s.variable.empty()) {
      EXPECT_TRUE(s.variable.starts_with("FERRY_"));
    }
    if (s.integer_value != nullptr) {
      EXPECT_LE(s.min, s.max);
    }
  }
  EXPECT_EQ(Spec("tcp_streams").default_value, "2");
  EXPECT_EQ(Spec("slice_size").default_value, "1048576");
  EXPECT_EQ(Spec("transport").default_value, "auto");
  EXPECT_EQ(Spec("transport").range, "auto or a transport name (see ferry info)");
  EXPECT_THAT(std::string(Spec("tcp_streams").meaning), HasSubstr("tcp and shm"));
  EXPECT_EQ(Spec("tcp_send_buffer").range, "0 or [64 KiB, 256 MiB]");
  EXPECT_EQ(Spec("max_frame_bytes").range, "[slice_size, 64 MiB]");
  EXPECT_EQ(Spec("listen_port").range, "0 or [1, 65535]");
  EXPECT_EQ(Spec("listen_host").default_value, "127.0.0.1");
}

// Converts to any type: an aggregate takes as many of these as it has fields.
struct AnyField {
  template <typename T>
  operator T() const;  // never called: only in unevaluated braced initializers
};

template <typename T, typename... Fields>
constexpr size_t FieldCount() {
  if constexpr (requires { T{Fields{}..., AnyField{}}; }) {
    return FieldCount<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}

TEST(OptionTable, HasARowForEveryFieldButTesting) {
  // A field added to EngineOptions without a row (and so unreachable from
  // SetOption, Python and `ferry info`) fails here.
  EXPECT_EQ(OptionTable().size() + 1, FieldCount<EngineOptions>());
  for (std::string_view name : {"local_name", "listen_host", "listen_port", "fabric_provider",
                                "fabric_nics", "peer_max_requests", "notify_inbox_bytes"}) {
    EXPECT_NE(FindOption(name), nullptr) << name;
  }
  EXPECT_EQ(FindOption("testing"), nullptr);
  EXPECT_EQ(FindOption("no_such_option"), nullptr);
  EXPECT_EQ(FindOption("tcp_streams"), &Spec("tcp_streams"));
}

// The transports' names, in the order of ListTransports().
std::vector<std::string> TransportNames() {
  std::vector<std::string> names;
  for (const TransportInfo& t : ListTransports()) names.push_back(t.name);
  return names;
}

TEST(OptionTable, BelongsToTheEngineTheMetadataStoreOrTransports) {
  const std::vector<std::string> transports = TransportNames();
  for (const OptionSpec& s : OptionTable()) {
    SCOPED_TRACE(std::string(s.name));
    if (s.belongs_to == "engine" || s.belongs_to == "metadata") continue;
    // Transports by name, each once, in the registry's order.
    size_t next = 0;
    std::istringstream names{std::string(s.belongs_to)};
    for (std::string name; std::getline(names >> std::ws, name, ',');) {
      const auto it =
          std::find(transports.begin() + static_cast<std::ptrdiff_t>(next), transports.end(), name);
      ASSERT_NE(it, transports.end()) << "\"" << name << "\" is not a transport (or out of order)";
      next = static_cast<size_t>(it - transports.begin()) + 1;
    }
  }
  EXPECT_EQ(Spec("fabric_provider").belongs_to, "fabric");
  EXPECT_EQ(Spec("tcp_streams").belongs_to, "shm, tcp");
  EXPECT_EQ(Spec("metadata_ttl").belongs_to, "metadata");
  EXPECT_EQ(Spec("transfer_timeout").belongs_to, "engine");
}

TEST(SetOption, SetsEveryRowWithinItsRange) {
  for (const OptionSpec& s : OptionTable()) {
    SCOPED_TRACE(std::string(s.name));
    EngineOptions o{};
    if (s.string_value != nullptr) {
      ASSERT_TRUE(SetOption(o, s.name, "a-value").ok());
      EXPECT_EQ(s.string_value(o), "a-value");
      ASSERT_TRUE(SetOption(o, s.name, "").ok());
      EXPECT_EQ(s.string_value(o), "");
      continue;
    }
    for (int64_t v : {s.min, s.max}) {
      ASSERT_TRUE(SetOption(o, s.name, std::to_string(v)).ok()) << v;
      EXPECT_EQ(s.integer_value(o), v);
    }
    if (s.range.starts_with("0 or ")) {
      ASSERT_TRUE(SetOption(o, s.name, "0").ok());
      EXPECT_EQ(s.integer_value(o), 0);
    }
  }
}

TEST(SetOption, RefusesValuesOutsideTheRowLeavingTheOptionsAsTheyWere) {
  for (const OptionSpec& s : OptionTable()) {
    if (s.integer_value == nullptr) continue;
    SCOPED_TRACE(std::string(s.name));
    for (int64_t bad : {s.min - 1, s.max + 1}) {
      if (bad == 0 && s.range.starts_with("0 or ")) continue;
      EngineOptions o{};
      const Status st = SetOption(o, s.name, std::to_string(bad));
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_THAT(st.message(), HasSubstr(std::string(s.name) + " must be ")) << bad;
      EXPECT_THAT(st.message(), HasSubstr("got " + std::to_string(bad))) << bad;
      EXPECT_EQ(s.integer_value(o), s.integer_value(EngineOptions{}));
    }
  }
  EngineOptions o{};
  auto message = [&o](std::string_view name, std::string_view value) {
    return SetOption(o, name, value).message();
  };
  EXPECT_EQ(message("tcp_streams", "65"), "tcp_streams must be in [1, 64], got 65");
  EXPECT_EQ(message("listen_port", "65536"),
            "listen_port must be 0 (any free port) or in [1, 65535], got 65536");
  EXPECT_EQ(message("transfer_timeout", "1.5"),
            "transfer_timeout must be an integer in [1, 86400000] ms, got \"1.5\"");
  EXPECT_EQ(message("slice_size", "1M"),
            "slice_size must be an integer in [4096, 64 MiB], got \"1M\"");
  EXPECT_EQ(message("tcp_streams", ""), "tcp_streams must be an integer in [1, 64], got \"\"");
  EXPECT_EQ(message("tcp_streams", " 3"), "tcp_streams must be an integer in [1, 64], got \" 3\"");
  EXPECT_EQ(message("peer_max_bytes", "99999999999999999999"),
            "peer_max_bytes must be an integer in [1 MiB, 1048576 MiB], got "
            "\"99999999999999999999\"");
  EXPECT_EQ(o.tcp_streams, EngineOptions{}.tcp_streams);
}

TEST(SetOption, LeavesBoundsSetByOtherOptionsToValidateOptions) {
  // max_frame_bytes >= slice_size holds once every option is set, in any order.
  EngineOptions o{};
  ASSERT_TRUE(SetOption(o, "max_frame_bytes", "4096").ok());
  EXPECT_EQ(ValidateOptions(o).message(),
            "max_frame_bytes must be in [slice_size, 64 MiB], got 4096");
  ASSERT_TRUE(SetOption(o, "slice_size", "4096").ok());
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(SetOption, NamesTheClosestOptionsOfAnUnknownName) {
  EngineOptions o{};
  Status st = SetOption(o, "fabric_provder", "tcp");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "unknown option \"fabric_provder\" (did you mean fabric_provider?)");
  EXPECT_EQ(SetOption(o, "timeout", "1").message(),
            "unknown option \"timeout\" (did you mean connect_timeout, transfer_timeout, "
            "handshake_timeout, idle_link_timeout?)");
  st = SetOption(o, "carrier_pigeons", "1");
  EXPECT_THAT(st.message(), HasSubstr("unknown option \"carrier_pigeons\"; the options are "
                                      "local_name, listen_host, listen_port, metadata"));
  EXPECT_THAT(st.message(), HasSubstr("wait_spin"));
  EXPECT_EQ(SetOption(o, "testing", "1").code(), StatusCode::kInvalidArgument);
}

TEST(SetOption, TakesTheSevenOptionsPythonLacked) {
  EngineOptions o{};
  ASSERT_TRUE(SetOption(o, "fabric_provider", "tcp").ok());
  ASSERT_TRUE(SetOption(o, "fabric_nics", "10.0.1.5,10.0.2.5").ok());
  ASSERT_TRUE(SetOption(o, "peer_max_requests", "100").ok());
  ASSERT_TRUE(SetOption(o, "peer_max_bytes", "1048576").ok());
  ASSERT_TRUE(SetOption(o, "max_handshakes_per_source", "8").ok());
  ASSERT_TRUE(SetOption(o, "max_connections_per_source", "16").ok());
  ASSERT_TRUE(SetOption(o, "notify_inbox_bytes", "65536").ok());
  ASSERT_TRUE(SetOption(o, "listen_port", "4000").ok());
  EXPECT_EQ(o.fabric_provider, "tcp");
  EXPECT_EQ(o.fabric_nics, "10.0.1.5,10.0.2.5");
  EXPECT_EQ(o.peer_max_requests, 100u);
  EXPECT_EQ(o.peer_max_bytes, 1048576u);
  EXPECT_EQ(o.max_handshakes_per_source, 8u);
  EXPECT_EQ(o.max_connections_per_source, 16u);
  EXPECT_EQ(o.notify_inbox_bytes, 65536u);
  EXPECT_EQ(o.listen_port, 4000);
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(OptionTable, CoversEveryVariable) {
  std::set<std::string_view> variables;
  for (const OptionSpec& s : OptionTable()) {
    if (!s.variable.empty()) variables.insert(s.variable);
  }
  EXPECT_EQ(variables, (std::set<std::string_view>{
                           "FERRY_METADATA", "FERRY_METADATA_TTL_MS", "FERRY_METADATA_CLUSTER",
                           "FERRY_TCP_STREAMS", "FERRY_IO_THREADS", "FERRY_SPIN_US",
                           "FERRY_WAIT_SPIN_US", "FERRY_AWAIT_SPIN_US", "FERRY_TCP_SEND_BUFFER",
                           "FERRY_TRANSFER_TIMEOUT_MS", "FERRY_TRANSPORT", "FERRY_SECRET_FILE",
                           "FERRY_PEER_MAX_REQUESTS", "FERRY_PEER_MAX_BYTES",
                           "FERRY_METRICS_ADDRESS", "FERRY_FABRIC_PROVIDER", "FERRY_FABRIC_NICS",
                           // Peer links (issue 33).
                           "FERRY_RAISE_FD_LIMIT", "FERRY_IDLE_LINK_TIMEOUT_MS",
                           "FERRY_MAX_PEER_LINKS", "FERRY_MAP_SHARED_MEMORY", "FERRY_SHM_RINGS"}));
}

// The text of a file of the source tree ("" if it cannot be read).
std::string SourceFile(const std::string& path) {
  std::ifstream in(std::string(FERRY_SOURCE_DIR) + "/" + path);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

// The cells of the table row of `text` whose first cell is `first`, or {}.
std::vector<std::string> TableRow(const std::string& text, const std::string& first) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("| ")) continue;
    std::vector<std::string> cells;
    std::istringstream parts(line.substr(1));
    for (std::string cell; std::getline(parts, cell, '|');) {
      const size_t b = cell.find_first_not_of(' ');
      const size_t e = cell.find_last_not_of(' ');
      cells.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
    }
    if (!cells.empty() && cells[0] == first) return cells;
  }
  return {};
}

TEST(OptionTable, DocsListEveryRow) {
  const std::string section = SourceFile("docs/configuration.md");
  ASSERT_NE(section, "") << "no docs/configuration.md";
  for (const OptionSpec& s : OptionTable()) {
    SCOPED_TRACE(std::string(s.name));
    // | option | belongs to | variable | range | default | meaning |, as the code has them (the
    // range and the default may add a unit).
    const auto cells = TableRow(section, "`" + std::string(s.name) + "`");
    ASSERT_GE(cells.size(), 6u) << "docs/configuration.md has no row for this option";
    EXPECT_EQ(cells[1], s.belongs_to);
    EXPECT_EQ(cells[2], s.variable.empty() ? "" : "`" + std::string(s.variable) + "`");
    EXPECT_TRUE(cells[3].starts_with(s.range)) << cells[3] << " is not " << s.range;
    EXPECT_TRUE(cells[4].starts_with(s.default_value)) << cells[4] << " is not " << s.default_value;
    EXPECT_EQ(cells[5], s.meaning);
  }
  // ...and no variable the code does not read.
  std::set<std::string> known = {"FERRY_LOG_LEVEL"};
  for (const OptionSpec& s : OptionTable()) {
    if (!s.variable.empty()) known.insert(std::string(s.variable));
  }
  const std::regex variable("FERRY_[A-Z0-9_]+");
  for (auto it = std::sregex_iterator(section.begin(), section.end(), variable);
       it != std::sregex_iterator(); ++it) {
    EXPECT_EQ(known.count(it->str()), 1u) << it->str() << " is in the docs but not in the code";
  }
  EXPECT_NE(section.find("`FERRY_LOG_LEVEL`"), std::string::npos);
}

// `text` with comment markers ("//") dropped and every run of white space
// made one space, so that a sentence reads the same however it is wrapped.
std::string Flatten(const std::string& text) {
  std::string out;
  std::istringstream words(std::regex_replace(text, std::regex("//"), " "));
  for (std::string word; words >> word;) out += (out.empty() ? "" : " ") + word;
  return out;
}

TEST(TransportOrder, DocumentedAsListTransportsHasIt) {
  const std::vector<std::string> names = TransportNames();
  ASSERT_FALSE(names.empty());
  std::string order;
  for (const std::string& name : names) order += (order.empty() ? "" : ", then ") + name;
  // The sentences that present `auto`'s order; each must name every transport, in order.
  EXPECT_THAT(Flatten(SourceFile("README.md")), HasSubstr("(`auto`: " + order + ";"));
  EXPECT_THAT(Flatten(SourceFile("include/ferry/options.h")),
              HasSubstr("the two memory kinds: " + order + "."));
  EXPECT_THAT(Flatten(SourceFile("python/README.md")), HasSubstr("`auto` tries " + order + ","));
}

TEST(ValidateOptions, DefaultsAreValid) { EXPECT_TRUE(ValidateOptions(EngineOptions{}).ok()); }

TEST(ValidateOptions, RejectsEachIntegerOptionOutsideItsRange) {
  // Room for slice_size and max_frame_bytes to take any value of their ranges.
  EngineOptions base{};
  base.slice_size = 4096;
  base.max_frame_bytes = 64u << 20;
  ASSERT_TRUE(ValidateOptions(base).ok());
  for (const OptionSpec& s : OptionTable()) {
    if (s.integer_value == nullptr) continue;
    SCOPED_TRACE(std::string(s.name));
    const std::string interval(s.range.substr(s.range.find('[')));
    for (int64_t bad : {s.min - 1, s.max + 1}) {
      if (bad == 0 && s.range.starts_with("0 or ")) continue;
      // A bound the field's type sets (listen_port's 65535) cannot be passed.
      if (s.integer_value(With(base, s.name, bad)) != bad) continue;
      const Status st = ValidateOptions(With(base, s.name, bad));
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_THAT(st.message(), HasSubstr(std::string(s.name) + " must be ")) << bad;
      EXPECT_THAT(st.message(), HasSubstr(interval)) << bad;
      EXPECT_THAT(st.message(), HasSubstr("got " + std::to_string(bad))) << bad;
    }
    for (int64_t good : {s.min, s.max}) {
      EXPECT_TRUE(ValidateOptions(With(base, s.name, good)).ok()) << good;
    }
  }
}

TEST(ValidateOptions, KeepsTheEngineMessages) {
  auto message = [](std::string_view name, int64_t v) {
    return ValidateOptions(With(EngineOptions{}, name, v)).message();
  };
  EXPECT_EQ(message("tcp_streams", 0), "tcp_streams must be in [1, 64], got 0");
  EXPECT_EQ(message("io_threads", 65), "io_threads must be in [0, 64], got 65");
  EXPECT_EQ(message("slice_size", 100), "slice_size must be in [4096, 64 MiB], got 100");
  EXPECT_EQ(message("max_frame_bytes", 4096),
            "max_frame_bytes must be in [slice_size, 64 MiB], got 4096");
  EXPECT_EQ(message("max_frame_entries", 0), "max_frame_entries must be in [1, 1024], got 0");
  EXPECT_EQ(message("tcp_send_buffer", 1),
            "tcp_send_buffer must be 0 (kernel autotuning) or in [64 KiB, 256 MiB], got 1");
  EXPECT_EQ(message("transfer_timeout", 0), "transfer_timeout must be in [1, 86400000] ms, got 0");
  EXPECT_EQ(message("connect_timeout", -1), "connect_timeout must be in [1, 86400000] ms, got -1");
  EXPECT_EQ(message("spin", 1000001), "spin must be in [0, 1000000] us, got 1000001");
  EXPECT_TRUE(ValidateOptions(With(EngineOptions{}, "tcp_send_buffer", 0)).ok());
}

TEST(ValidateOptions, LeavesTransportNamesToTheEngine) {
  EngineOptions o{};
  o.transport = "carrier-pigeon";
  EXPECT_TRUE(ValidateOptions(o).ok());
}

struct FakeEnvironment {
  std::map<std::string, std::string> vars;
  std::vector<std::string> warnings;

  EngineOptions Overlay(const EngineOptions& o) {
    auto overrides = internal::ParseOptionVariables(
        [this](const char* name) -> const char* {
          auto it = vars.find(name);
          return it == vars.end() ? nullptr : it->second.c_str();
        },
        [this](const std::string& m) { warnings.push_back(m); });
    return internal::ApplyOptionOverrides(o, overrides);
  }
};

TEST(EnvironmentOverlay, ParsesValidValues) {
  FakeEnvironment env;
  env.vars = {{"FERRY_TCP_STREAMS", "3"},     {"FERRY_IO_THREADS", "1"},
              {"FERRY_SPIN_US", "77"},        {"FERRY_WAIT_SPIN_US", "123"},
              {"FERRY_TCP_SEND_BUFFER", "0"}, {"FERRY_TRANSFER_TIMEOUT_MS", "4500"},
              {"FERRY_TRANSPORT", "tcp"},     {"FERRY_UNRELATED", "9"},
              {"FERRY_AWAIT_SPIN_US", "0"}};
  const EngineOptions o = env.Overlay(EngineOptions{});
  EXPECT_EQ(env.warnings, std::vector<std::string>{});
  EXPECT_EQ(o.tcp_streams, 3);
  EXPECT_EQ(o.io_threads, 1);
  EXPECT_EQ(o.spin, std::chrono::microseconds(77));
  EXPECT_EQ(o.wait_spin, std::chrono::microseconds(123));
  EXPECT_EQ(o.await_spin, std::chrono::microseconds(0));
  EXPECT_EQ(o.tcp_send_buffer, 0u);
  EXPECT_EQ(o.transfer_timeout, std::chrono::milliseconds(4500));
  EXPECT_EQ(o.transport, "tcp");
  EXPECT_TRUE(ValidateOptions(o).ok());
}

TEST(EnvironmentOverlay, IgnoresBadValues) {
  FakeEnvironment env;
  env.vars = {{"FERRY_TCP_STREAMS", "0"},
              {"FERRY_IO_THREADS", "abc"},
              {"FERRY_SPIN_US", "12x"},
              {"FERRY_WAIT_SPIN_US", "-1"},
              {"FERRY_TCP_SEND_BUFFER", "1000"},
              {"FERRY_TRANSFER_TIMEOUT_MS", "86400001"},
              {"FERRY_TRANSPORT", ""}};
  EngineOptions start{};
  start.tcp_streams = 5;
  const EngineOptions o = env.Overlay(start);
  EXPECT_EQ(o.tcp_streams, 5);
  EXPECT_EQ(o.io_threads, EngineOptions{}.io_threads);
  EXPECT_EQ(o.spin, EngineOptions{}.spin);
  EXPECT_EQ(o.wait_spin, EngineOptions{}.wait_spin);
  EXPECT_EQ(o.tcp_send_buffer, EngineOptions{}.tcp_send_buffer);
  EXPECT_EQ(o.transfer_timeout, EngineOptions{}.transfer_timeout);
  EXPECT_EQ(o.transport, "auto") << "an empty value counts as unset";
  EXPECT_THAT(env.warnings,
              ::testing::UnorderedElementsAre(
                  "ferry: ignoring FERRY_TCP_STREAMS=0 (expected an integer in [1, 64])",
                  "ferry: ignoring FERRY_IO_THREADS=abc (expected an integer in [0, 64])",
                  "ferry: ignoring FERRY_SPIN_US=12x (expected an integer in [0, 1000000])",
                  "ferry: ignoring FERRY_WAIT_SPIN_US=-1 (expected an integer in [0, 1000000])",
                  "ferry: ignoring FERRY_TCP_SEND_BUFFER=1000 (expected 0 or an integer in "
                  "[65536, 268435456])",
                  "ferry: ignoring FERRY_TRANSFER_TIMEOUT_MS=86400001 (expected an integer in [1, "
                  "86400000])"));
}

}  // namespace
}  // namespace ferry
