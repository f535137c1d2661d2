// Options of `ferry bench`, parsed from its command line.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/options.h"
#include "workload.h"

namespace ferry::bench {

enum class Role { kLauncher, kTarget, kInitiator };

struct BenchOptions {
  Role role = Role::kLauncher;
  std::string target;   // --target HOST:PORT (initiator)
  std::string control;  // --control HOST:PORT (initiator; optional)
  std::string listen = "127.0.0.1";

  Operation op = Operation::kWrite;
  uint64_t block = 1u << 20;
  bool block_set = false;
  uint64_t batch = 32;
  bool batch_set = false;
  int threads = 1;
  bool threads_set = false;
  std::optional<KvPreset> kv;
  bool sync = false;

  std::string transport = "auto";
  int streams = 0;      // 0: the engine's default (EngineOptions::tcp_streams)
  int io_threads = -1;  // -1: the engine's default
  uint64_t slice_size = 0;
  int64_t spin_us = -1;
  int64_t wait_spin_us = -1;

  double duration = 0;  // seconds; 0: default
  uint64_t total_bytes = 0;
  uint64_t buffer_size = 0;  // 0: what the workload needs (target alone: 1 GiB)
  bool hugepages = false;    // madvise(MADV_HUGEPAGE) on the buffers (both sides)

  bool verify = false;
  // Test-only (--inject-mismatch): damages the first entry of the first measured
  // batch after it arrived, so tests can see --verify catch it.
  bool inject_mismatch = false;
  bool no_baseline = false;
  bool json = false;

  bool sweep = false;
  std::vector<uint64_t> sweep_blocks;
  std::vector<uint64_t> sweep_threads;
  std::string output = "ferry-sweep";
  std::string plot_script;  // default: found next to the binary or in the source tree

  // The arguments to hand to a target started by the launcher.
  std::vector<std::string> TargetArgs(uint64_t buffer_size) const;
  // The engine options these flags ask for, over FERRY_* from the environment.
  EngineOptions MakeEngineOptions() const;
};

// Throws cli::UsageError. Returns nullopt when --help was printed.
std::optional<BenchOptions> ParseBenchOptions(const std::vector<std::string>& args);

}  // namespace ferry::bench
