#include "bench_roles.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "cli.h"
#include "control.h"
#include "ferry/ferry.h"

namespace ferry::bench {

// ---------------------------------------------------------------------------
// Target role

namespace {

// The signals that stop the target, blocked in this thread (and so in every
// thread started later) to be taken by sigwait().
sigset_t BlockStopSignals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  return sigs;
}

// The target's first lines (see bench_roles.h), flushed: a parent waits for
// them.
void PrintWhereTargetIs(const BenchOptions& o, const Engine& engine,
                        const std::string& control_addr) {
  if (o.ByName()) std::printf("name %s\n", o.name.c_str());
  std::printf("peer_id %s\ncontrol %s\n", engine.PeerId().c_str(), control_addr.c_str());
  std::fflush(stdout);
}

}  // namespace

int RunTarget(const BenchOptions& o) {
  // Signals are taken by sigwait() below; block them before any thread starts.
  sigset_t sigs = BlockStopSignals();

  const uint64_t size = o.buffer_size > 0 ? o.buffer_size : (1ull << 30);
  Buffer buffer(size, o.buffer_size > 0, o.hugepages, o.target_shared);
  ControlServer control(o.listen, buffer.data(), size, o.ByName() ? o.name : "");
  const std::string control_addr = JoinHostPort(o.listen, control.port());

  EngineOptions eo = o.MakeEngineOptions();
  // With a metadata service the initiator looks the target up by its name;
  // else the name lets an initiator started by hand find the control port
  // (see OpenSession).
  eo.local_name =
      o.ByName() ? o.name : std::string(kDefaultTargetName) + ",control=" + control_addr;
  auto engine = Engine::Create(eo);
  if (!engine.ok()) Fail("cannot start the engine", engine.status());
  MemoryRegion region{buffer.data(), size, "cpu:0"};
  region.fd = buffer.fd();  // -1 unless --target-memory shared
  Status s = (*engine)->RegisterMemory({&region, 1});
  if (!s.ok()) Fail("cannot register the target buffer", s);

  PrintWhereTargetIs(o, **engine, control_addr);

  int sig = 0;
  while (sigwait(&sigs, &sig) != 0) {
  }
  control.Stop();
  (*engine)->UnregisterMemory(buffer.data()).IgnoreError();
  engine->reset();
  return 0;
}

// ---------------------------------------------------------------------------
// Launcher: a target child process

TargetChild::TargetChild(const BenchOptions& o, uint64_t buffer_size) {
  Start(o, buffer_size);
  ReadAddresses();
}

TargetChild::~TargetChild() {
  if (pid_ > 0) Stop().IgnoreError();
}

void TargetChild::Start(const BenchOptions& o, uint64_t buffer_size) {
  std::vector<std::string> args = o.TargetArgs(buffer_size);
  args.insert(args.begin(), "ferry");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) throw cli::RunError(std::string("pipe: ") + std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  // Exec the real path (not /proc/self/exe) so the target is called "ferry" in ps.
  char exe[4096];
  ssize_t exe_len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (exe_len <= 0)
    throw cli::RunError(std::string("readlink /proc/self/exe: ") + std::strerror(errno));
  exe[exe_len] = 0;
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw cli::RunError(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    dup2(p[1], STDOUT_FILENO);
    setpgid(0, 0);  // a terminal's Ctrl-C goes to the launcher only
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    execv(exe, argv.data());
    std::fprintf(stderr, "ferry bench: cannot start the target: %s\n", std::strerror(errno));
    _exit(127);
  }
  close(p[1]);
  out_.reset(p[0]);
}

Status TargetChild::Stop() {
  pid_t pid = pid_;
  pid_ = -1;
  kill(pid, SIGTERM);
  int status = 0;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return InternalError(std::string("waitpid: ") + std::strerror(errno));
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return DeadlineExceededError("the bench target did not exit within 10 s of SIGTERM");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return OkStatus();
  if (WIFSIGNALED(status)) {
    return InternalError("the bench target died of signal " + std::to_string(WTERMSIG(status)) +
                         " (" + strsignal(WTERMSIG(status)) + ") at shutdown");
  }
  return InternalError("the bench target exited with status " +
                       std::to_string(WEXITSTATUS(status)));
}

namespace {

// Whether `text` holds a whole line "control ..." (the target's last line).
bool HasControlLine(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line) && !in.eof()) {
    if (line.starts_with("control ")) return true;
  }
  return false;
}

}  // namespace

void TargetChild::ReadAddresses() {
  std::string text;
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (!HasControlLine(text)) {
    int left = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    pollfd pfd{out_.get(), POLLIN, 0};
    if (left <= 0 || poll(&pfd, 1, left) == 0) {
      throw cli::RunError("the bench target did not report its address within 30 s");
    }
    char buf[512];
    ssize_t n = read(out_.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw cli::RunError("the bench target exited before it was ready (see its message above)");
    }
    text.append(buf, static_cast<size_t>(n));
  }
  std::istringstream lines(text);
  std::string key, value;
  while (lines >> key >> value) {
    if (key == "peer_id") peer_id_ = value;
    if (key == "control") control_ = value;
  }
  if (peer_id_.empty() || control_.empty()) {
    throw cli::RunError("the bench target printed something unexpected: " + text);
  }
}

}  // namespace ferry::bench
