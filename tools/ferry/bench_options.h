// Options of `ferry bench`, parsed from its command line (CLI11).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/options.h"
#include "workload.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ferry::bench {

enum class Role { kLauncher, kTarget, kInitiator };

// The name a bench target publishes under in a metadata service, unless
// --name says otherwise.
inline constexpr const char* kDefaultTargetName = "ferry-bench-target";

struct BenchOptions {
  Role role = Role::kLauncher;
  std::string target;   // --target HOST:PORT, or NAME with a metadata service (initiator)
  std::string control;  // --control HOST:PORT (initiator; optional)
  std::string listen = "127.0.0.1";
  // --metadata URL: how the engines find each other (every role).
  std::string metadata = "P2PHANDSHAKE";
  // --name NAME: with a metadata service, the name the target publishes
  // under (default kDefaultTargetName).
  std::string name;

  Operation op = Operation::kWrite;
  uint64_t block = 1u << 20;
  bool block_set = false;
  uint64_t batch = 32;
  bool batch_set = false;
  int threads = 1;
  bool threads_set = false;
  std::optional<KvPreset> kv;
  bool sync = false;
  // --prepared: each thread's batch as prepared descriptor lists and one
  // prepared transfer (per opcode), posted again every iteration; the plain
  // batches of the same requests run too, for the ratio.
  bool prepared = false;

  std::string transport = "auto";
  // --fabric-provider NAME: EngineOptions::fabric_provider of both engines
  // ("" = FERRY_FABRIC_PROVIDER, if set). --transport fabric needs one.
  std::string fabric_provider;
  int streams = 0;      // 0: the engine's default (EngineOptions::tcp_streams)
  int io_threads = -1;  // -1: the engine's default
  uint64_t slice_size = 0;
  int64_t spin_us = -1;
  int64_t wait_spin_us = -1;

  double duration = 0;  // seconds; 0: default
  uint64_t total_bytes = 0;
  uint64_t buffer_size = 0;  // 0: what the workload needs (target alone: 1 GiB)
  bool hugepages = false;    // madvise(MADV_HUGEPAGE) on the buffers (both sides)
  // The target's buffer: a sealed memfd registered with its descriptor
  // (same-host initiators map it: "Mapped segments"), or private memory
  // (same-host copies go through the target).
  bool target_shared = true;
  // The initiator's buffer: private anonymous memory (default) or a sealed
  // memfd mapped shared, like the managed buffers of the Python package and
  // the Mooncake drop-in (tools/dropin_bench.py compares against it).
  bool local_shared = false;

  bool verify = false;
  // Test-only (--inject-mismatch): damages the first entry of the first measured
  // batch after it arrived, so tests can see --verify catch it.
  bool inject_mismatch = false;
  bool no_baseline = false;
  bool json = false;

  // --target-kind file (with --file PATH, --direct, --durable): this
  // engine's file region through its own segment against fio on the same
  // file (bench_file.h); memory: everything else.
  std::string target_kind = "memory";
  std::string file = "ferry-bench.file";
  bool direct = false;
  bool durable = false;
  bool random = false;         // --random: block-aligned offsets by a fixed-seed PRNG
  uint64_t rounds = 0;         // --rounds: Ferry/fio alternations (0: the default, 2)
  bool fio_alongside = false;  // --fio-alongside: fio runs during Ferry's phase

  bool sweep = false;
  std::vector<uint64_t> sweep_blocks;
  std::vector<uint64_t> sweep_threads;
  std::string output = "ferry-sweep";
  std::string plot_script;  // default: found next to the binary or in the source tree

  // Whether the engines find each other by name through a metadata service
  // (--metadata other than P2PHANDSHAKE) rather than by HOST:PORT.
  bool ByName() const;
  // The arguments to hand to a target started by the launcher.
  std::vector<std::string> TargetArgs(uint64_t buffer_size) const;
  // The engine options these flags ask for, over FERRY_* from the environment.
  EngineOptions MakeEngineOptions() const;

  // Parses `ferry bench`'s command line and checks the combination. Throws
  // cli::UsageError. Returns nullopt when --help was printed.
  static std::optional<BenchOptions> FromCommandLine(const std::vector<std::string>& args);

 private:
  // The flags, in groups (in the order they were always declared).
  void AddFlags(CLI::App& app);
  void AddRoleFlags(CLI::App& app);
  void AddWorkloadFlags(CLI::App& app);  // what one batch is
  void AddEngineFlags(CLI::App& app);
  void AddRunFlags(CLI::App& app);  // how long, how much memory
  void AddFileFlags(CLI::App& app);
  void AddOutputFlags(CLI::App& app);
  // Refuses combinations that make no sense and fills in the defaults.
  void Finish();
  void CheckFileTarget();
  void CheckNames();  // --metadata, --name, --target NAME
  void CheckRoles();
  void CheckWorkload();
  void CheckTarget();  // what --role target takes
  void FillDefaults();
};

}  // namespace ferry::bench
