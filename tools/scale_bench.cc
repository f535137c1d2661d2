// scale_bench: one initiator engine and N target engines, spread over
// several child processes (docs/benchmarks.md, "Many peers").
//
//   scale_bench [--peers N] [--procs P] [--size BYTES] [--streams S]
//               [--idle-ms MS] [--transport tcp|shm] [--netns K] [--json]
//
// Each child process runs N/P target engines (one event loop each), each
// with a registered buffer of --size bytes, and prints their peer ids. The
// initiator (this process) then, for every target in turn: opens its
// segment (the handshake), writes the buffer once (a new link: connect,
// hello, first write) and reads it back, and checks the bytes. It reports
// the handshake and the first write per new peer (p50/p99), the file
// descriptors and resident memory the links added, waits for the idle
// timeout to close every link (descriptors after), and runs a second round
// to all N (every link opened again). Everything on 127.0.0.1 — or, with
// --netns K (root, tcp only), the target processes run in K network
// namespaces of their own ("hosts" ferryscale-<pid>-<k>, each joined to
// this one by a veth pair, 10.77.<k>.1 here and 10.77.<k>.2 there, process
// p in namespace p % K), which this process makes before and removes after
// (also when it fails).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using ferry::Engine;
using ferry::EngineOptions;

struct Args {
  int peers = 100;
  int procs = 4;
  size_t size = 4096;
  int streams = 2;
  int idle_ms = 2000;
  std::string transport = "tcp";
  bool json = false;
  int netns = 0;  // 0: every target on 127.0.0.1
  // Child mode: serve this many targets, listening on `listen`.
  int serve = 0;
  std::string listen = "127.0.0.1";
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "scale_bench: %s\n", what.c_str());
  std::exit(1);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + f);
      return argv[++i];
    };
    if (f == "--peers") {
      a.peers = std::stoi(value());
    } else if (f == "--procs") {
      a.procs = std::stoi(value());
    } else if (f == "--size") {
      a.size = std::stoul(value());
    } else if (f == "--streams") {
      a.streams = std::stoi(value());
    } else if (f == "--idle-ms") {
      a.idle_ms = std::stoi(value());
    } else if (f == "--transport") {
      a.transport = value();
    } else if (f == "--json") {
      a.json = true;
    } else if (f == "--netns") {
      a.netns = std::stoi(value());
    } else if (f == "--serve") {
      a.serve = std::stoi(value());
    } else if (f == "--listen") {
      a.listen = value();
    } else {
      Die("unknown flag " + f + " (see the comment at the top of tools/scale_bench.cc)");
    }
  }
  if (a.peers < 1 || a.procs < 1 || a.size < 1 || a.streams < 1) Die("bad arguments");
  if (a.netns < 0 || a.netns > 250) Die("--netns takes 1 to 250 namespaces");
  if (a.netns > 0 && a.transport != "tcp")
    Die("--netns needs --transport tcp (hosts of their own)");
  a.procs = std::min(a.procs, a.peers);
  a.netns = std::min(a.netns, a.procs);
  return a;
}

uint8_t PatternByte(uint64_t seed, size_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  return static_cast<uint8_t>(x * 0x94D049BB133111EBull >> 56);
}

int OpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n - 1;  // the directory's own
}

// Resident memory of this process, KiB.
long RssKiB() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

EngineOptions Options(const Args& a) {
  EngineOptions o = EngineOptions{}.WithEnvironment();
  o.listen_host = a.listen;
  o.transport = a.transport;
  o.tcp_streams = a.streams;
  o.io_threads = 1;
  o.idle_link_timeout = std::chrono::milliseconds(a.idle_ms);
  return o;
}

// ---- child: the targets ----------------------------------------------------

int Serve(const Args& a) {
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<std::unique_ptr<char[]>> buffers;
  EngineOptions o = Options(a);
  for (int k = 0; k < a.serve; ++k) {
    auto e = Engine::Create(o);
    if (!e.ok()) {
      std::printf("ERROR engine %d: %s\n", k, e.status().ToString().c_str());
      return 2;
    }
    buffers.push_back(std::make_unique<char[]>(a.size));
    std::memset(buffers.back().get(), 0, a.size);
    ferry::Status s = (*e)->RegisterMemory(buffers.back().get(), a.size);
    if (!s.ok()) {
      std::printf("ERROR register: %s\n", s.ToString().c_str());
      return 2;
    }
    std::printf("PEER %s %llu\n", (*e)->PeerId().c_str(),
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buffers.back().get())));
    engines.push_back(std::move(*e));
  }
  std::printf("READY\n");
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  return 0;
}

// ---- parent: namespaces as hosts (--netns) -----------------------------------

// Runs `ip ARGS...`; false (and a message) if it fails.
bool Ip(const std::vector<std::string>& args, bool quiet = false) {
  std::vector<std::string> all = {"ip"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (quiet) posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  const int rc = posix_spawnp(&pid, "ip", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  if (rc != 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    if (!quiet) {
      std::string line;
      for (const auto& s : all) line += s + " ";
      std::fprintf(stderr, "scale_bench: failed: %s\n", line.c_str());
    }
    return false;
  }
  return true;
}

// The namespaces this run made (removed at exit, normal or Die's; never
// destroyed, so the exit handler finds it intact).
std::vector<std::string>& Namespaces() {
  static auto* names = new std::vector<std::string>();
  return *names;
}

void RemoveNamespaces() {
  for (const std::string& n : Namespaces()) Ip({"netns", "del", n}, /*quiet=*/true);
  Namespaces().clear();
}

std::string NamespaceAddress(int k) { return "10.77." + std::to_string(k) + ".2"; }

// Namespace k: a veth pair, 10.77.<k>.1/24 on this side, .2 inside, links up.
void MakeNamespaces(int count) {
  if (::geteuid() != 0) Die("--netns needs root (it makes network namespaces)");
  std::atexit(RemoveNamespaces);
  const std::string pid = std::to_string(::getpid());
  for (int k = 0; k < count; ++k) {
    const std::string ns = "ferryscale-" + pid + "-" + std::to_string(k);
    // veth names: at most 15 characters.
    const std::string here = "fsc" + std::to_string(::getpid() % 100000) + "n" + std::to_string(k);
    const std::string net = "10.77." + std::to_string(k) + ".";
    if (!Ip({"netns", "add", ns})) Die("cannot make network namespace " + ns);
    Namespaces().push_back(ns);
    if (!Ip({"link", "add", here, "type", "veth", "peer", "name", "eth0", "netns", ns}) ||
        !Ip({"addr", "add", net + "1/24", "dev", here}) || !Ip({"link", "set", here, "up"}) ||
        !Ip({"-n", ns, "addr", "add", net + "2/24", "dev", "eth0"}) ||
        !Ip({"-n", ns, "link", "set", "eth0", "up"}) ||
        !Ip({"-n", ns, "link", "set", "lo", "up"})) {
      Die("cannot set up network namespace " + ns);
    }
  }
}

// ---- parent: the initiator ---------------------------------------------------

struct Child {
  pid_t pid = -1;
  int to = -1;  // its stdin
  FILE* from = nullptr;
};

// A target process serving `count` engines; with `ns`, inside that network
// namespace (ip netns exec), listening on `listen`.
Child Spawn(const Args& a, int count, const std::string& ns, const std::string& listen) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) Die("pipe2");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe");
  std::vector<std::string> args = {exe,
                                   "--serve",
                                   std::to_string(count),
                                   "--size",
                                   std::to_string(a.size),
                                   "--streams",
                                   std::to_string(a.streams),
                                   "--transport",
                                   a.transport,
                                   "--idle-ms",
                                   std::to_string(a.idle_ms),
                                   "--listen",
                                   listen};
  if (!ns.empty()) args.insert(args.begin(), {"ip", "netns", "exec", ns});
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  Child c;
  if (posix_spawnp(&c.pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) Die("spawn");
  posix_spawn_file_actions_destroy(&fa);
  ::close(in[0]);
  ::close(out[1]);
  c.to = in[1];
  c.from = ::fdopen(out[0], "r");
  return c;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Round {
  std::vector<double> handshake_us, first_write_us;
  int failed = 0;
  double seconds = 0;
};

int Run(const Args& a) {
  rlimit start{};
  ::getrlimit(RLIMIT_NOFILE, &start);
  // The targets first (their processes start their engines in parallel).
  if (a.netns > 0) MakeNamespaces(a.netns);
  const Clock::time_point t0 = Clock::now();
  std::vector<Child> children;
  for (int p = 0; p < a.procs; ++p) {
    const int count = a.peers / a.procs + (p < a.peers % a.procs ? 1 : 0);
    if (a.netns > 0) {
      const int k = p % a.netns;
      children.push_back(Spawn(a, count, Namespaces()[k], NamespaceAddress(k)));
    } else {
      children.push_back(Spawn(a, count, "", a.listen));
    }
  }
  std::vector<std::string> ids;
  std::vector<uint64_t> addrs;
  for (Child& c : children) {
    char line[512];
    while (std::fgets(line, sizeof(line), c.from) != nullptr) {
      std::istringstream in(line);
      std::string word, id;
      unsigned long long addr = 0;
      in >> word;
      if (word == "READY") break;
      if (word != "PEER") Die(std::string("a target process said: ") + line);
      in >> id >> addr;
      ids.push_back(id);
      addrs.push_back(addr);
    }
  }
  if (static_cast<int>(ids.size()) != a.peers) Die("not every target started");
  const double start_s = std::chrono::duration<double>(Clock::now() - t0).count();

  EngineOptions o = Options(a);
  o.io_threads = 0;
  const int fds_before_engine = OpenFds();
  auto created = Engine::Create(o);
  if (!created.ok()) Die("initiator: " + created.status().ToString());
  std::unique_ptr<Engine> e = std::move(*created);
  rlimit raised{};
  ::getrlimit(RLIMIT_NOFILE, &raised);
  std::vector<char> src(a.size * static_cast<size_t>(a.peers)), back(src.size());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(PatternByte(7, i));
  if (!e->RegisterMemory(src.data(), src.size()).ok() ||
      !e->RegisterMemory(back.data(), back.size()).ok()) {
    Die("register");
  }
  const int fds_idle = OpenFds();
  const long rss_idle = RssKiB();

  std::vector<ferry::SegmentHandle> segs(a.peers);
  auto round = [&](bool open) {
    Round r;
    const Clock::time_point begin = Clock::now();
    for (int k = 0; k < a.peers; ++k) {
      const size_t off = static_cast<size_t>(k) * a.size;
      if (open) {
        const Clock::time_point h = Clock::now();
        auto seg = e->OpenSegment(ids[k]);
        if (!seg.ok()) {
          if (r.failed++ < 3)
            std::fprintf(stderr, "open %s: %s\n", ids[k].c_str(), seg.status().ToString().c_str());
          continue;
        }
        r.handshake_us.push_back(Us(Clock::now() - h));
        segs[k] = *seg;
      }
      const Clock::time_point w = Clock::now();
      ferry::Status s = e->TransferSync(ferry::TransferRequest{
          ferry::Opcode::kWrite, src.data() + off, segs[k], addrs[k], a.size});
      r.first_write_us.push_back(Us(Clock::now() - w));
      if (s.ok()) {
        s = e->TransferSync(ferry::TransferRequest{ferry::Opcode::kRead, back.data() + off, segs[k],
                                                   addrs[k], a.size});
      }
      if (s.ok() && std::memcmp(src.data() + off, back.data() + off, a.size) != 0) {
        s = ferry::DataLossError("bytes read back differ");
      }
      if (!s.ok() && r.failed++ < 3) {
        std::fprintf(stderr, "peer %s: %s\n", ids[k].c_str(), s.ToString().c_str());
      }
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    return r;
  };

  const Round first = round(true);
  const int fds_linked = OpenFds();
  const long rss_linked = RssKiB();
  const uint64_t open_links = e->GetMetrics().peer_links_open;
  // The idle timeout: every link closes (bounded wait).
  const Clock::time_point idle_begin = Clock::now();
  while (e->GetMetrics().peer_links_open > 0 &&
         Clock::now() - idle_begin <
             std::chrono::milliseconds(a.idle_ms) * 3 + std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double idle_wait_s = std::chrono::duration<double>(Clock::now() - idle_begin).count();
  // The streams of a retired link close on their event loops, just after.
  const int fds_at_zero_links = OpenFds();
  int fds_after_idle = fds_at_zero_links;
  const Clock::time_point settle_begin = Clock::now();
  for (int settle = 0; settle < 500 && fds_after_idle > fds_idle; ++settle) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    fds_after_idle = OpenFds();
  }
  const double settle_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - settle_begin).count();
  const long rss_after_idle = RssKiB();
  const uint64_t open_after_idle = e->GetMetrics().peer_links_open;
  const Round second = round(false);
  const ferry::EngineMetrics m = e->GetMetrics();

  for (Child& c : children) ::close(c.to);
  for (Child& c : children) {
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    std::fclose(c.from);
  }

  const double links = static_cast<double>(std::max<uint64_t>(open_links, 1));
  std::ostringstream out;
  if (a.json) {
    out << "{\"peers\": " << a.peers << ", \"procs\": " << a.procs << ", \"netns\": " << a.netns
        << ", \"streams\": " << a.streams << ", \"size\": " << a.size << ", \"transport\": \""
        << a.transport << "\", \"nofile_soft_at_start\": " << start.rlim_cur
        << ", \"nofile_soft\": " << raised.rlim_cur << ", \"nofile_hard\": " << raised.rlim_max
        << ", \"targets_start_s\": " << start_s << ", \"failed\": " << first.failed + second.failed
        << ", \"handshake_p50_us\": " << Percentile(first.handshake_us, 0.5)
        << ", \"handshake_p99_us\": " << Percentile(first.handshake_us, 0.99)
        << ", \"first_write_p50_us\": " << Percentile(first.first_write_us, 0.5)
        << ", \"first_write_p99_us\": " << Percentile(first.first_write_us, 0.99)
        << ", \"round1_s\": " << first.seconds << ", \"links_open\": " << open_links
        << ", \"fds_engine\": " << fds_idle - fds_before_engine
        << ", \"fds_per_link\": " << (fds_linked - fds_idle) / links
        << ", \"rss_per_link_kib\": " << static_cast<double>(rss_linked - rss_idle) / links
        << ", \"idle_wait_s\": " << idle_wait_s
        << ", \"links_open_after_idle\": " << open_after_idle
        << ", \"fds_after_idle_beyond_engine\": " << fds_after_idle - fds_idle
        << ", \"fds_when_links_reached_zero\": " << fds_at_zero_links - fds_idle
        << ", \"fds_settle_ms\": " << settle_ms
        << ", \"rss_after_idle_kib\": " << rss_after_idle - rss_idle
        << ", \"round2_write_p50_us\": " << Percentile(second.first_write_us, 0.5)
        << ", \"round2_write_p99_us\": " << Percentile(second.first_write_us, 0.99)
        << ", \"round2_s\": " << second.seconds << ", \"links_opened\": " << m.links_opened
        << ", \"links_closed_idle\": " << m.links_closed_idle << "}\n";
  } else {
    out << "scale_bench: " << a.peers << " targets in " << a.procs << " processes"
        << (a.netns > 0 ? " in " + std::to_string(a.netns) + " network namespaces" : "")
        << " (started in " << start_s << " s), " << a.transport << ", " << a.streams << " streams, "
        << a.size << " B each\n"
        << "  RLIMIT_NOFILE soft " << start.rlim_cur << " at start, " << raised.rlim_cur
        << " after Engine::Create (hard " << raised.rlim_max << ")\n"
        << "  round 1 (new peers): " << first.seconds << " s, failed " << first.failed << "\n"
        << "    handshake   p50 " << Percentile(first.handshake_us, 0.5) << " us, p99 "
        << Percentile(first.handshake_us, 0.99) << " us\n"
        << "    first write p50 " << Percentile(first.first_write_us, 0.5) << " us, p99 "
        << Percentile(first.first_write_us, 0.99) << " us (connect + hello + write)\n"
        << "  links open " << open_links << ": " << (fds_linked - fds_idle) / links << " fds and "
        << static_cast<double>(rss_linked - rss_idle) / links
        << " KiB RSS per link (engine alone: " << fds_idle - fds_before_engine << " fds)\n"
        << "  after the idle timeout (" << a.idle_ms << " ms; waited " << idle_wait_s
        << " s): links open " << open_after_idle << ", fds beyond the engine's own "
        << fds_after_idle - fds_idle << " (" << fds_at_zero_links - fds_idle
        << " when the last link was retired; the streams close on their loops, " << settle_ms
        << " ms later), RSS beyond idle " << rss_after_idle - rss_idle << " KiB\n"
        << "  round 2 (links reopened): " << second.seconds << " s, failed " << second.failed
        << ", write p50 " << Percentile(second.first_write_us, 0.5) << " us, p99 "
        << Percentile(second.first_write_us, 0.99) << " us\n"
        << "  links opened " << m.links_opened << ", closed idle " << m.links_closed_idle << "\n";
  }
  std::cout << out.str();
  return first.failed + second.failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ::signal(SIGPIPE, SIG_IGN);
  const Args a = Parse(argc, argv);
  return a.serve > 0 ? Serve(a) : Run(a);
}
