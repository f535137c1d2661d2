// NetnsLab: hosts of our own for a test — network namespaces joined by veth
// pairs, with addresses that exist only inside them — and the faults the
// tests put on them (nftables packet loss, tc tbf rate limits, links set
// down and up). Everything it creates is removed when it is destroyed, and
// by a signal handler if the test dies of a signal (SIGINT, SIGTERM, abort,
// a crash); namespaces left behind by an earlier run that was SIGKILLed are
// removed by RemoveStale().
//
// Names: "ferrynetns-<pid>-<tag>", so runs never collide and a stale
// namespace says which process made it. Every command runs with a bounded
// wait (Run); none reads the environment.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ferry::test::netns {

using Clock = std::chrono::steady_clock;

inline constexpr const char* kPrefix = "ferrynetns-";
inline constexpr const char* kNetnsDir = "/run/netns";

// The full path of a system tool (ip, nft, tc, iperf3), or "" if absent.
inline std::string Tool(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    const std::string path = std::string(dir) + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

struct CommandResult {
  int rc = -1;         // exit status; 128 + signal; -1: could not start or timed out
  std::string output;  // stdout and stderr together
  std::string command;
  bool ok() const { return rc == 0; }
  std::string Describe() const {
    return "`" + command + "` exited " + std::to_string(rc) + (output.empty() ? "" : ": " + output);
  }
};

// Runs argv[0] (a full path) with stdin on /dev/null, collects its output and
// waits at most `timeout` (then SIGKILLs it).
inline CommandResult Run(const std::vector<std::string>& argv,
                         std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  CommandResult r;
  for (const std::string& a : argv) r.command += (r.command.empty() ? "" : " ") + a;
  if (argv.empty() || argv[0].empty()) {
    r.output = "no such tool";
    return r;
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    r.output = std::string("pipe2: ") + std::strerror(errno);
    return r;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigfillset(&defaults);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0].c_str(), &actions, &attr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    r.output = std::string("posix_spawn: ") + std::strerror(rc);
    return r;
  }
  const auto deadline = Clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{out[0], POLLIN, 0};
    const int n = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 500)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    char buf[4096];
    const ssize_t got = read(out[0], buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // EOF: the command (and whatever it started) is done
    r.output.append(buf, static_cast<size_t>(got));
  }
  close(out[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!r.output.empty() && (r.output.back() == '\n' || r.output.back() == ' '))
    r.output.pop_back();
  if (timed_out) {
    r.rc = -1;
    r.output += " (killed after " + std::to_string(timeout.count()) + " ms)";
  } else if (WIFEXITED(status)) {
    r.rc = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    r.rc = 128 + WTERMSIG(status);
  }
  return r;
}

// What a signal handler removes if the test dies: the processes it started
// in the namespaces (SIGKILL: a peer serving a link that vanished mid-frame
// would not exit by itself) and the namespaces' bind mounts under
// /run/netns (what `ip netns del` removes: umount2 + unlink). All three
// calls are async-signal-safe. This fixed table is the one piece of state a
// signal handler can reach; it holds only what this process created.
namespace detail {
inline constexpr int kMaxNamespaces = 8;
inline constexpr int kMaxPids = 16;
struct EmergencyTable {
  char paths[kMaxNamespaces][96] = {};
  volatile sig_atomic_t used[kMaxNamespaces] = {};
  volatile sig_atomic_t pids[kMaxPids] = {};
};
inline EmergencyTable& Emergency() {
  static EmergencyTable table;
  return table;
}

inline void OnFatalSignal(int sig) {
  EmergencyTable& t = Emergency();
  for (int i = 0; i < kMaxPids; ++i) {
    if (t.pids[i] > 0) kill(static_cast<pid_t>(t.pids[i]), SIGKILL);
  }
  for (int i = 0; i < kMaxNamespaces; ++i) {
    if (t.used[i]) {
      umount2(t.paths[i], MNT_DETACH);
      unlink(t.paths[i]);
      t.used[i] = 0;
    }
  }
  // SA_RESETHAND restored the default action: die of the same signal.
  raise(sig);
}

inline void InstallHandlersOnce() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_handler = OnFatalSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
      sigaction(sig, &sa, nullptr);
    }
    return true;
  }();
  (void)installed;
}

inline int Remember(const std::string& name) {
  EmergencyTable& t = Emergency();
  const std::string path = std::string(kNetnsDir) + "/" + name;
  for (int i = 0; i < kMaxNamespaces; ++i) {
    if (!t.used[i] && path.size() < sizeof(t.paths[i])) {
      std::memcpy(t.paths[i], path.c_str(), path.size() + 1);
      t.used[i] = 1;
      return i;
    }
  }
  return -1;
}

inline void Forget(int slot) {
  if (slot >= 0) Emergency().used[slot] = 0;
}
}  // namespace detail

// A process started inside the lab's namespaces, killed by the signal
// handler if the test dies. Returns a slot for ForgetProcess (-1: table full).
inline int RememberProcess(pid_t pid) {
  detail::EmergencyTable& t = detail::Emergency();
  for (int i = 0; i < detail::kMaxPids; ++i) {
    if (t.pids[i] == 0) {
      t.pids[i] = pid;
      return i;
    }
  }
  return -1;
}

inline void ForgetProcess(int slot) {
  if (slot >= 0) detail::Emergency().pids[slot] = 0;
}

// "" if this process can make namespaces of its own, else why not.
inline std::string Unavailable() {
  if (geteuid() != 0) return "needs root (ip netns add, veth, nftables, tc)";
  if (Tool("ip").empty()) return "no `ip` command (iproute2)";
  const std::string probe = std::string(kPrefix) + std::to_string(getpid()) + "-probe";
  CommandResult add = Run({Tool("ip"), "netns", "add", probe});
  if (!add.ok()) return "`ip netns add` does not work here: " + add.Describe();
  CommandResult del = Run({Tool("ip"), "netns", "del", probe});
  if (!del.ok()) return "`ip netns del` does not work here: " + del.Describe();
  return "";
}

// Removes namespaces with our prefix whose creator is gone (an earlier run
// that was SIGKILLed, e.g. by a ctest timeout): their processes are killed
// first. Returns the names removed.
inline std::vector<std::string> RemoveStale() {
  std::vector<std::string> removed;
  DIR* dir = opendir(kNetnsDir);
  if (dir == nullptr) return removed;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(kPrefix, 0) == 0) names.push_back(name);
  }
  closedir(dir);
  for (const std::string& name : names) {
    const std::string rest = name.substr(std::strlen(kPrefix));
    const pid_t owner = static_cast<pid_t>(std::strtol(rest.c_str(), nullptr, 10));
    if (owner == getpid()) continue;
    bool alive = owner > 0 && kill(owner, 0) == 0;
    if (alive) {
      // A live process of that pid counts only if it is one of ours.
      std::ifstream comm("/proc/" + std::to_string(owner) + "/comm");
      std::string c;
      std::getline(comm, c);
      alive = c.rfind("netns_test", 0) == 0;
    }
    if (alive) continue;
    CommandResult pids = Run({Tool("ip"), "netns", "pids", name});
    std::istringstream in(pids.output);
    for (pid_t p; in >> p;) {
      if (p > 1) kill(p, SIGKILL);
    }
    if (Run({Tool("ip"), "netns", "del", name}).ok()) removed.push_back(name);
  }
  return removed;
}

class NetnsLab {
 public:
  NetnsLab() { detail::InstallHandlersOnce(); }
  ~NetnsLab() { RemoveAll(); }
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  // The namespace of `tag` ("a", "b", ...).
  std::string Name(const std::string& tag) const {
    return std::string(kPrefix) + std::to_string(getpid()) + "-" + tag;
  }

  // Creates the namespace of `tag` with its loopback up.
  ::testing::AssertionResult AddNamespace(const std::string& tag) {
    const std::string name = Name(tag);
    CommandResult add = Run({Tool("ip"), "netns", "add", name});
    if (!add.ok()) return ::testing::AssertionFailure() << add.Describe();
    created_.push_back({name, detail::Remember(name)});
    return Ip(tag, {"link", "set", "lo", "up"});
  }

  // Joins two namespaces with a veth pair: device `dev_a` in `a` with
  // address `addr_a`, `dev_b` in `b` with `addr_b` (both "/24").
  ::testing::AssertionResult Connect(const std::string& a, const std::string& dev_a,
                                     const std::string& addr_a, const std::string& b,
                                     const std::string& dev_b, const std::string& addr_b) {
    ::testing::AssertionResult r =
        Ip(a, {"link", "add", dev_a, "type", "veth", "peer", "name", dev_b, "netns", Name(b)});
    if (r) r = Ip(a, {"addr", "add", addr_a + "/24", "dev", dev_a});
    if (r) r = Ip(b, {"addr", "add", addr_b + "/24", "dev", dev_b});
    if (r) r = Ip(a, {"link", "set", dev_a, "up"});
    if (r) r = Ip(b, {"link", "set", dev_b, "up"});
    return r;
  }

  // `ip -n <ns> args...`
  ::testing::AssertionResult Ip(const std::string& tag, std::vector<std::string> args) {
    args.insert(args.begin(), {Tool("ip"), "-n", Name(tag)});
    return Check(Run(args));
  }

  // `ip netns exec <ns> tool args...`
  ::testing::AssertionResult Exec(const std::string& tag, const std::string& tool,
                                  std::vector<std::string> args) {
    args.insert(args.begin(), {Tool("ip"), "netns", "exec", Name(tag), Tool(tool)});
    return Check(Run(args));
  }

  // The argv that runs `program args...` inside the namespace of `tag`.
  std::vector<std::string> InNamespace(const std::string& tag, const std::string& program,
                                       const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {"netns", "exec", Name(tag), program};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // Drops `percent` % of the packets entering and leaving the namespace
  // (nftables, chance per packet). 0 removes the rule.
  ::testing::AssertionResult SetLoss(const std::string& tag, int percent) {
    Exec(tag, "nft", {"delete", "table", "inet", "ferry_loss"});  // absent the first time
    if (percent == 0) return ::testing::AssertionSuccess();
    const std::string n = std::to_string(percent);
    return Exec(
        tag, "nft",
        {"add table inet ferry_loss; "
         "add chain inet ferry_loss in { type filter hook input priority 0; policy accept; }; "
         "add chain inet ferry_loss out { type filter hook output priority 0; policy accept; }; "
         "add rule inet ferry_loss in numgen random mod 100 < " +
         n +
         " drop; "
         "add rule inet ferry_loss out numgen random mod 100 < " +
         n + " drop"});
  }

  // Limits what leaves `dev` to `rate` (tc tbf, e.g. "50mbit"); "" removes it.
  ::testing::AssertionResult SetRate(const std::string& tag, const std::string& dev,
                                     const std::string& rate) {
    if (rate.empty()) return Exec(tag, "tc", {"qdisc", "del", "dev", dev, "root"});
    return Exec(tag, "tc",
                {"qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "64kb",
                 "latency", "200ms"});
  }

  ::testing::AssertionResult SetLink(const std::string& tag, const std::string& dev, bool up) {
    return Ip(tag, {"link", "set", dev, up ? "up" : "down"});
  }

  // Moves the calling thread into the namespace of `tag` (threads it starts
  // later, an engine's included, are there too) until Leave().
  ::testing::AssertionResult Enter(const std::string& tag) {
    if (home_fd_ < 0) home_fd_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home_fd_ < 0)
      return ::testing::AssertionFailure() << "open own netns: " << std::strerror(errno);
    const std::string path = std::string(kNetnsDir) + "/" + Name(tag);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return ::testing::AssertionFailure() << "open " << path << ": " << std::strerror(errno);
    const int rc = setns(fd, CLONE_NEWNET);
    const int err = errno;
    close(fd);
    if (rc != 0)
      return ::testing::AssertionFailure() << "setns " << path << ": " << std::strerror(err);
    return ::testing::AssertionSuccess();
  }

  void Leave() {
    if (home_fd_ >= 0) {
      if (setns(home_fd_, CLONE_NEWNET) != 0) {
        ADD_FAILURE() << "setns back to the original namespace: " << std::strerror(errno);
      }
      close(home_fd_);
      home_fd_ = -1;
    }
  }

  // Leaves, kills whatever still runs in our namespaces and deletes them
  // (their veth pairs go with them). Idempotent.
  void RemoveAll() {
    Leave();
    for (auto it = created_.rbegin(); it != created_.rend(); ++it) {
      CommandResult pids = Run({Tool("ip"), "netns", "pids", it->name});
      std::istringstream in(pids.output);
      for (pid_t p; in >> p;) {
        if (p > 1 && p != getpid()) kill(p, SIGKILL);
      }
      CommandResult del = Run({Tool("ip"), "netns", "del", it->name});
      if (!del.ok()) ADD_FAILURE() << "could not remove namespace: " << del.Describe();
      detail::Forget(it->slot);
    }
    created_.clear();
  }

 private:
  static ::testing::AssertionResult Check(const CommandResult& r) {
    if (r.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << r.Describe();
  }

  struct Created {
    std::string name;
    int slot = -1;
  };
  std::vector<Created> created_;
  int home_fd_ = -1;
};

}  // namespace ferry::test::netns
