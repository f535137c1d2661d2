#include "bench_options.h"

#include <CLI/CLI.hpp>
#include <functional>
#include <iostream>
#include <utility>

#include "cli.h"
#include "ferry/metadata.h"
#include "ferry/transports.h"

namespace ferry::bench {
namespace {

constexpr const char* kHelp = R"(Usage: ferry bench [FLAGS]

Measures Ferry against plain sockets and memcpy on the same machine, in one run.
With no flags: starts a target process on 127.0.0.1 (the embedded peer-to-peer
handshake, no server), writes 1 MiB blocks in batches of 32 for 1.5 s, runs
the baselines, and prints a table (about 5 s in all).

Roles:
  --role target|initiator   run one side only (default: both, target as a child)
  --listen HOST             address to listen on and advertise (default 127.0.0.1)
  --target HOST:PORT        initiator: the target's peer id (its 'peer_id' line;
                            with --metadata, its NAME: see --name)
  --control HOST:PORT       initiator: the target's control port (its 'control'
                            line; without --metadata found automatically from
                            the target's segment name)
  --metadata URL            how the engines find each other, for every role
                            (default P2PHANDSHAKE: no server); e.g.
                            http://HOST:PORT/metadata (ferry metadata-server);
                            the kinds this build has: ferry info
  --name NAME               with --metadata: the name the target publishes under
                            (default ferry-bench-target; the target prints it
                            first: 'name NAME'); the initiator takes --target
                            NAME (default the same) and, when started by hand,
                            --control HOST:PORT. Given the target's HOST:PORT
                            instead, it looks for the name the target's control
                            port reports, then for the default name

Workload:
  --operation write|read|mixed   direction (default write; mixed: alternate entries)
  --block-size SIZE         bytes per request, e.g. 4K, 64K, 1M (default 1M)
  --batch-size N            requests per batch (default 32)
  --threads N               initiator threads, each with its own batch (default 1)
  --workload kv:MODEL[:tokens=N][:page=P]
                            KV-cache push: one batch = every (layer buffer, page)
                            entry, pages scattered on both sides. Models:
                            llama3-8b, llama3-70b-tp8, deepseek-v3
                            (default tokens=4096, page=16)
  --sync                    one synchronous request at a time (latency)
  --prepared                each thread's batch through prepared descriptor lists:
                            one local and one remote list (strided rows where
                            the layout allows) and one prepared transfer per
                            opcode, posted and waited each iteration; also runs
                            the plain batches of the same requests (rounds
                            prepared, plain, plain, prepared of half the
                            duration each) and prints prepared / plain, the
                            time to build the rows, to prepare the lists and
                            MakeTransfer, the entries after merging, and the
                            time to prepare 1 M rows of 256 B per side
  --duration SECONDS        length of each measured phase (default 1.5; sweep: 1)
  --total-bytes SIZE        stop after this many bytes instead of a duration
  --buffer-size SIZE        registered buffer per side (default: what the workload
                            needs, at least 64M; --role target: 1G)
  --hugepages               back the buffers (both sides) with transparent huge
                            pages (madvise); default: ordinary 4 KiB pages
  --target-memory shared|private   the target process's buffer: shared (default:
                            a sealed memfd registered with its descriptor, which
                            a same-host initiator maps and copies with plain
                            loads and stores) or private (anonymous memory:
                            same-host copies go through the target, cross-memory
                            attach)
  --local-memory private|shared   the initiator's buffer: private (default:
                            anonymous memory) or shared (a sealed memfd mapped
                            shared, as the Python package's managed buffers)

Engine:
  --transport auto|tcp|local|shm|fabric   (auto: shm for the target this bench
                            starts, tcp for another host; local: both engines in
                            this process; shm: another process on this host;
                            fabric: libfabric RMA, needs a provider)
  --fabric-provider NAME    libfabric provider of both engines' fabric transport
                            (EngineOptions.fabric_provider; default
                            FERRY_FABRIC_PROVIDER): e.g. tcp (= tcp;ofi_rxm),
                            verbs, efa; endpoints bind to --listen. With
                            --transport fabric the baselines include a plain
                            libfabric RMA loop (two endpoints in this process)
  --streams N               connections per peer (EngineOptions.tcp_streams)
  --io-threads N            TCP event-loop threads (0: one per stream)
  --slice-size SIZE         TCP slice size
  --spin-us N               event-loop spin before blocking (EngineOptions.spin)
  --wait-spin-us N          waiting caller's spin before blocking (wait_spin)

Files (issue 30):
  --target-kind memory|file  file: write to / read from a file region of this
                            engine (Engine::RegisterFile, io_uring, --transport
                            local: its own segment) or, with --transport tcp|shm,
                            of a second engine of this process (which does the
                            I/O; also timed: the same transfers to its memory,
                            and Ferry against the slower of fio and that),
                            batches of --batch-size
                            requests (the queue depth) at consecutive offsets,
                            against fio (ioengine=io_uring, the same file, block
                            size and queue depth), rounds Ferry, fio (--rounds);
                            takes --operation write|read, --block-size,
                            --batch-size, --duration, --no-baseline, --json;
                            or --workload kv:...: every page of the preset at
                            scattered offsets in buffer and file, one batch
                            (write-back of an offload; read: the cache hit
                            loading them back), ring depth 64, against fio
                            writing/reading the same file in page-sized random
                            blocks at depth 64 (each page once per pass)
  --file PATH               the file (default ./ferry-bench.file; at least 256 MiB,
                            created or extended, filled once for reads)
  --direct                  O_DIRECT on both sides (default: the page cache)
  --durable                 writes complete once on stable storage (Ferry's durable
                            region, fio --sync=dsync)
  --random                  block-aligned random offsets (fio --rw=randread /
                            randwrite) instead of consecutive ones
  --rounds N                how many times Ferry and fio (and the memory phase)
                            alternate (default 2), each phase --duration / N;
                            more rounds weigh a drifting disk on all alike
  --fio-alongside           run fio at the same time as Ferry's phase (sharing
                            the disk) instead of after it: each gets a share of
                            the same disk at the same moment, so the ratio says
                            how well Ferry drives the disk, free of its drift

Checks and output:
  --verify                  check every byte of every block against a pattern
                            (writes: the target checks its own buffer; reads: the
                            initiator checks what arrived). Slows the run.
  --inject-mismatch         (testing --verify) damage the first entry of the first
                            measured batch after it arrived; expect mismatches
  --no-baseline             skip the plain-socket and memcpy baselines
  --json                    print one JSON object instead of the table
  --sweep                   sweep block sizes (and threads): table, CSV and PNG chart
  --sweep-blocks LIST       default 4K,16K,64K,256K,1M,4M
  --sweep-threads LIST      default 1,4 (or --threads)
  --output PREFIX           sweep files: PREFIX.csv, PREFIX.png (default ferry-sweep)
  --plot-script PATH        the chart script (default: plot_sweep.py next to ferry)

Sizes take K, M, G (binary). Exit status: 0 ok, 1 the run failed, 2 bad usage.
)";

// The upper bound of an engine option, from the engine's option table (so
// the bench's flags and the engine agree on one range).
int OptionMax(std::string_view name) {
  for (const OptionSpec& spec : OptionTable()) {
    if (spec.name == name) return static_cast<int>(spec.max);
  }
  return 0;
}

int PositiveInt(std::string_view flag, std::string_view text, int max) {
  uint64_t v = cli::ParseUint(flag, text);
  if (v == 0 || v > static_cast<uint64_t>(max)) {
    throw cli::UsageError("bad value '" + std::string(text) + "' for " + std::string(flag) +
                          ": must be 1.." + std::to_string(max));
  }
  return static_cast<int>(v);
}

}  // namespace

std::optional<BenchOptions> BenchOptions::FromCommandLine(const std::vector<std::string>& args) {
  BenchOptions o;
  CLI::App app("ferry bench");
  cli::PrepareApp(app);
  o.AddFlags(app);
  if (cli::ParseFlags(app, args)) {
    std::cout << kHelp;
    return std::nullopt;
  }
  o.Finish();
  return o;
}

bool BenchOptions::ByName() const { return MetadataBackendOf(metadata) != "p2p"; }

namespace {

// A value flag: its text goes to `parse`, which checks it and throws
// cli::UsageError naming the flag.
void Value(CLI::App& app, const char* flag, std::function<void(const std::string&)> parse) {
  app.add_option_function<std::string>(flag, std::move(parse));
}

// "a, b, c": the forms of --metadata this build takes.
std::string MetadataForms() {
  std::string forms;
  for (const MetadataBackendInfo& b : ListMetadataBackends()) {
    forms += (forms.empty() ? "" : ", ") + b.form;
  }
  return forms;
}

}  // namespace

void BenchOptions::AddFlags(CLI::App& app) {
  AddRoleFlags(app);
  AddWorkloadFlags(app);
  AddEngineFlags(app);
  AddRunFlags(app);
  AddFileFlags(app);
  AddOutputFlags(app);
}

void BenchOptions::AddRoleFlags(CLI::App& app) {
  Value(app, "--role", [this](const std::string& v) {
    if (v == "target") {
      role = Role::kTarget;
    } else if (v == "initiator") {
      role = Role::kInitiator;
    } else {
      throw cli::UsageError("bad value '" + v + "' for --role: expected target or initiator");
    }
  });
  Value(app, "--target", [this](const std::string& v) { target = v; });
  Value(app, "--control", [this](const std::string& v) { control = v; });
  Value(app, "--listen", [this](const std::string& v) {
    if (v.empty()) throw cli::UsageError("bad value '' for --listen: expected an address");
    listen = v;
  });
  Value(app, "--metadata", [this](const std::string& v) {
    if (v.empty() || MetadataBackendOf(v).empty()) {
      throw cli::UsageError("bad value '" + v + "' for --metadata: expected one of " +
                            MetadataForms() + " (see ferry info)");
    }
    metadata = v;
  });
  Value(app, "--name", [this](const std::string& v) {
    if (v.empty()) throw cli::UsageError("bad value '' for --name: expected a name");
    name = v;
  });
}

void BenchOptions::AddWorkloadFlags(CLI::App& app) {
  Value(app, "--operation", [this](const std::string& v) {
    if (v == "write") {
      op = Operation::kWrite;
    } else if (v == "read") {
      op = Operation::kRead;
    } else if (v == "mixed") {
      op = Operation::kMixed;
    } else {
      throw cli::UsageError("bad value '" + v + "' for --operation: expected write, read or mixed");
    }
  });
  Value(app, "--block-size", [this](const std::string& v) {
    block = cli::ParseSize("--block-size", v);
    if (block == 0) throw cli::UsageError("bad value '0' for --block-size: must be at least 1");
    block_set = true;
  });
  Value(app, "--batch-size", [this](const std::string& v) {
    batch = static_cast<uint64_t>(PositiveInt("--batch-size", v, 1 << 24));
    batch_set = true;
  });
  Value(app, "--threads", [this](const std::string& v) {
    threads = PositiveInt("--threads", v, 256);
    threads_set = true;
  });
  Value(app, "--workload", [this](const std::string& v) { kv = ParseKvPreset(v); });
  app.add_flag("--sync", sync);
  app.add_flag("--prepared", prepared);
}

void BenchOptions::AddEngineFlags(CLI::App& app) {
  Value(app, "--transport", [this](const std::string& v) {
    std::string names = "auto";
    bool known = v == "auto";
    for (const TransportInfo& t : ListTransports()) {  // the registry's names
      known = known || v == t.name;
      names += ", " + t.name;
    }
    if (!known) {
      throw cli::UsageError("bad value '" + v + "' for --transport: expected " + names);
    }
    transport = v;
  });
  Value(app, "--fabric-provider", [this](const std::string& v) {
    if (v.empty()) {
      throw cli::UsageError("bad value '' for --fabric-provider: expected a libfabric provider");
    }
    fabric_provider = v;
  });
  Value(app, "--streams", [this](const std::string& v) {
    streams = PositiveInt("--streams", v, OptionMax("tcp_streams"));
  });
  Value(app, "--io-threads", [this](const std::string& v) {
    uint64_t n = cli::ParseUint("--io-threads", v);
    const uint64_t max = static_cast<uint64_t>(OptionMax("io_threads"));
    if (n > max) {
      throw cli::UsageError("bad value '" + v + "' for --io-threads: at most " +
                            std::to_string(max));
    }
    io_threads = static_cast<int>(n);
  });
  Value(app, "--slice-size", [this](const std::string& v) {
    slice_size = cli::ParseSize("--slice-size", v);
    if (slice_size == 0 || slice_size > 0xffffffffu) {
      throw cli::UsageError("bad value '" + v + "' for --slice-size: 1..4G-1");
    }
  });
  Value(app, "--spin-us", [this](const std::string& v) {
    spin_us = static_cast<int64_t>(cli::ParseUint("--spin-us", v));
  });
  Value(app, "--wait-spin-us", [this](const std::string& v) {
    wait_spin_us = static_cast<int64_t>(cli::ParseUint("--wait-spin-us", v));
  });
}

void BenchOptions::AddRunFlags(CLI::App& app) {
  Value(app, "--duration",
        [this](const std::string& v) { duration = cli::ParseSeconds("--duration", v); });
  Value(app, "--total-bytes", [this](const std::string& v) {
    total_bytes = cli::ParseSize("--total-bytes", v);
    if (total_bytes == 0) throw cli::UsageError("bad value '0' for --total-bytes");
  });
  Value(app, "--buffer-size", [this](const std::string& v) {
    buffer_size = cli::ParseSize("--buffer-size", v);
    if (buffer_size == 0) throw cli::UsageError("bad value '0' for --buffer-size");
  });
  app.add_flag("--hugepages", hugepages);
  Value(app, "--target-memory", [this](const std::string& v) {
    if (v != "shared" && v != "private") {
      throw cli::UsageError("bad value '" + v +
                            "' for --target-memory: expected shared or private");
    }
    target_shared = v == "shared";
  });
  Value(app, "--local-memory", [this](const std::string& v) {
    if (v != "shared" && v != "private") {
      throw cli::UsageError("bad value '" + v + "' for --local-memory: expected shared or private");
    }
    local_shared = v == "shared";
  });
}

void BenchOptions::AddFileFlags(CLI::App& app) {
  Value(app, "--target-kind", [this](const std::string& v) {
    if (v != "memory" && v != "file") {
      throw cli::UsageError("bad value '" + v + "' for --target-kind: expected memory or file");
    }
    target_kind = v;
  });
  Value(app, "--file", [this](const std::string& v) {
    if (v.empty()) throw cli::UsageError("bad value '' for --file: expected a path");
    file = v;
  });
  app.add_flag("--direct", direct);
  app.add_flag("--durable", durable);
  app.add_flag("--random", random);
  app.add_flag("--fio-alongside", fio_alongside);
  Value(app, "--rounds", [this](const std::string& v) {
    rounds = cli::ParseUint("--rounds", v);
    if (rounds < 1 || rounds > 100) {
      throw cli::UsageError("bad value '" + v + "' for --rounds: expected 1 to 100");
    }
  });
}

void BenchOptions::AddOutputFlags(CLI::App& app) {
  app.add_flag("--verify", verify);
  app.add_flag("--inject-mismatch", inject_mismatch);
  app.add_flag("--no-baseline", no_baseline);
  app.add_flag("--json", json);
  app.add_flag("--sweep", sweep);
  Value(app, "--sweep-blocks", [this](const std::string& v) {
    sweep_blocks = cli::ParseSizeList("--sweep-blocks", v);
    for (uint64_t b : sweep_blocks) {
      if (b == 0) throw cli::UsageError("bad value '" + v + "' for --sweep-blocks: 0");
    }
  });
  Value(app, "--sweep-threads", [this](const std::string& v) {
    sweep_threads = cli::ParseUintList("--sweep-threads", v);
    for (uint64_t t : sweep_threads) {
      if (t == 0 || t > 256) {
        throw cli::UsageError("bad value '" + v + "' for --sweep-threads: 1..256");
      }
    }
  });
  Value(app, "--output", [this](const std::string& v) { output = v; });
  Value(app, "--plot-script", [this](const std::string& v) { plot_script = v; });
}

void BenchOptions::Finish() {
  CheckFileTarget();
  CheckNames();
  CheckRoles();
  CheckWorkload();
  CheckTarget();
  FillDefaults();
}

void BenchOptions::CheckFileTarget() {
  const BenchOptions& o = *this;
  if (o.target_kind != "file") {
    if (o.direct || o.durable || o.random || o.rounds != 0 || o.fio_alongside ||
        o.file != "ferry-bench.file") {
      throw cli::UsageError(
          "--file, --direct, --durable, --random, --rounds and --fio-alongside need "
          "--target-kind file");
    }
    return;
  }
  if (o.role != Role::kLauncher ||
      (o.transport != "auto" && o.transport != "local" && o.transport != "tcp" &&
       o.transport != "shm") ||
      o.op == Operation::kMixed || o.sweep || o.prepared || o.sync || o.verify || o.threads_set ||
      o.total_bytes > 0 || o.ByName()) {
    throw cli::UsageError(
        "--target-kind file measures this engine's own file region (--transport local, the "
        "default) or a second engine's (--transport tcp or shm) and takes only --operation "
        "write|read, --block-size, --batch-size or --workload, --duration, --file, --direct, "
        "--durable, --random, --rounds, --fio-alongside, --hugepages, --no-baseline, --json and "
        "the tcp options");
  }
  if (o.fio_alongside && o.no_baseline) {
    throw cli::UsageError("--fio-alongside runs the fio baseline: not with --no-baseline");
  }
  if (o.kv && o.random) {
    throw cli::UsageError(
        "--random does not apply to --workload (the preset's pages are scattered already)");
  }
}

void BenchOptions::CheckNames() {
  BenchOptions& o = *this;
  if (o.ByName()) {
    if (MetadataBackendOf(o.metadata) == "memory" &&
        (o.role != Role::kLauncher || o.transport != "local")) {
      throw cli::UsageError("--metadata " + o.metadata +
                            " reaches only engines of one process: use it with --transport "
                            "local (no --role), or give an http:// service");
    }
    if (o.role == Role::kInitiator && !o.name.empty()) {
      throw cli::UsageError(
          "--name is the target's; the initiator names the target with --target NAME");
    }
    if (o.name.empty()) o.name = kDefaultTargetName;
    if (o.role == Role::kInitiator && o.target.empty()) o.target = o.name;
  } else if (!o.name.empty()) {
    throw cli::UsageError(
        "--name needs --metadata (with P2PHANDSHAKE the target is found by HOST:PORT)");
  }
}

void BenchOptions::CheckRoles() {
  const BenchOptions& o = *this;
  if (o.role == Role::kInitiator && o.target.empty()) {
    throw cli::UsageError("--role initiator needs --target HOST:PORT (the target's peer id)");
  }
  if (o.role != Role::kInitiator && !o.target.empty()) {
    throw cli::UsageError("--target is only for --role initiator");
  }
  if (o.role != Role::kInitiator && !o.control.empty()) {
    throw cli::UsageError("--control is only for --role initiator");
  }
  if (o.role != Role::kLauncher && o.transport == "local") {
    throw cli::UsageError(
        "--transport local runs both engines in one process; "
        "use it without --role");
  }
}

void BenchOptions::CheckWorkload() {
  const BenchOptions& o = *this;
  if (o.kv && (o.block_set || o.batch_set)) {
    throw cli::UsageError(
        "--block-size and --batch-size do not apply to --workload "
        "(the preset defines the entries of a batch)");
  }
  if (o.kv && o.sweep)
    throw cli::UsageError("--sweep sweeps block sizes; it does not take --workload");
  if (o.sweep && o.block_set) {
    throw cli::UsageError("--sweep takes --sweep-blocks, not --block-size");
  }
  if (!o.sweep && (!o.sweep_blocks.empty() || !o.sweep_threads.empty())) {
    throw cli::UsageError("--sweep-blocks and --sweep-threads need --sweep");
  }
  if (o.sweep && o.threads_set && !o.sweep_threads.empty()) {
    throw cli::UsageError("give either --threads or --sweep-threads with --sweep");
  }
  if (o.inject_mismatch && !o.verify) throw cli::UsageError("--inject-mismatch needs --verify");
  if (o.duration > 0 && o.total_bytes > 0) {
    throw cli::UsageError("give either --duration or --total-bytes, not both");
  }
  if (o.sweep && o.total_bytes > 0)
    throw cli::UsageError("--sweep takes --duration, not --total-bytes");
  if (o.sweep && o.sync) throw cli::UsageError("--sweep measures batches; it does not take --sync");
  if (o.prepared && o.sync) {
    throw cli::UsageError("--prepared posts whole batches; it does not take --sync");
  }
  if (o.prepared && o.sweep) throw cli::UsageError("--prepared does not take --sweep");
  if (o.transport == "fabric" && o.fabric_provider.empty() &&
      EngineOptions{}.WithEnvironment().fabric_provider.empty()) {
    throw cli::UsageError(
        "--transport fabric needs a libfabric provider: --fabric-provider NAME (e.g. tcp) or "
        "FERRY_FABRIC_PROVIDER (what this machine has: ferry info)");
  }
}

void BenchOptions::CheckTarget() {
  const BenchOptions& o = *this;
  if (o.role != Role::kTarget) return;
  // The target only needs what shapes its engine and buffer.
  if (o.json || o.verify || o.sweep || o.sync || o.prepared || o.kv || o.block_set || o.batch_set ||
      o.threads_set || o.duration > 0 || o.total_bytes > 0 || o.no_baseline || o.local_shared) {
    throw cli::UsageError(
        "--role target takes only --listen, --metadata, --name, --buffer-size, --hugepages, "
        "--target-memory, "
        "--transport, --fabric-provider, --streams, --io-threads, --slice-size, --spin-us and "
        "--wait-spin-us; the initiator chooses the workload");
  }
}

void BenchOptions::FillDefaults() {
  BenchOptions& o = *this;
  if (o.sweep) {
    if (o.sweep_blocks.empty()) {
      o.sweep_blocks = {4u << 10, 16u << 10, 64u << 10, 256u << 10, 1u << 20, 4u << 20};
    }
    if (o.sweep_threads.empty()) {
      o.sweep_threads = o.threads_set ? std::vector<uint64_t>{static_cast<uint64_t>(o.threads)}
                                      : std::vector<uint64_t>{1, 4};
    }
  }
  if (o.duration == 0 && o.total_bytes == 0) o.duration = o.sweep ? 1.0 : 1.5;
}

std::vector<std::string> BenchOptions::TargetArgs(uint64_t buffer_size) const {
  std::vector<std::string> a = {"bench",
                                "--role",
                                "target",
                                "--listen",
                                listen,
                                "--buffer-size",
                                std::to_string(buffer_size)};
  if (ByName()) a.insert(a.end(), {"--metadata", metadata, "--name", name});
  if (hugepages) a.push_back("--hugepages");
  if (!target_shared) a.insert(a.end(), {"--target-memory", "private"});
  if (transport != "auto") a.insert(a.end(), {"--transport", transport});
  if (!fabric_provider.empty()) a.insert(a.end(), {"--fabric-provider", fabric_provider});
  if (streams > 0) a.insert(a.end(), {"--streams", std::to_string(streams)});
  if (io_threads >= 0) a.insert(a.end(), {"--io-threads", std::to_string(io_threads)});
  if (slice_size > 0) a.insert(a.end(), {"--slice-size", std::to_string(slice_size)});
  if (spin_us >= 0) a.insert(a.end(), {"--spin-us", std::to_string(spin_us)});
  if (wait_spin_us >= 0) a.insert(a.end(), {"--wait-spin-us", std::to_string(wait_spin_us)});
  return a;
}

EngineOptions BenchOptions::MakeEngineOptions() const {
  EngineOptions e = EngineOptions{}.WithEnvironment();
  e.listen_host = listen;
  e.metadata = metadata;
  if (transport != "auto") e.transport = transport;
  if (!fabric_provider.empty()) e.fabric_provider = fabric_provider;
  if (streams > 0) e.tcp_streams = streams;
  if (io_threads >= 0) e.io_threads = io_threads;
  if (slice_size > 0) e.slice_size = static_cast<uint32_t>(slice_size);
  if (spin_us >= 0) e.spin = std::chrono::microseconds(spin_us);
  if (wait_spin_us >= 0) e.wait_spin = std::chrono::microseconds(wait_spin_us);
  return e;
}

}  // namespace ferry::bench
