// Real metadata services for tests: etcd (one member or a cluster) and Redis,
// each started as a child process on free loopback ports with its data in a
// temporary folder that is removed afterwards, and stopped (SIGKILL at the
// latest) when the fixture object goes away. Debian's etcd-server and
// redis-server provide the binaries (scripts/install-deps.sh installs them);
// a missing binary is a test failure naming the package, not a skip.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/testing/child_process.h"

namespace ferry::test {

// `n` distinct ports that were free on 127.0.0.1 a moment ago (all bound at
// once, then released). Empty on failure.
inline std::vector<uint16_t> FreeLoopbackPorts(size_t n) {
  std::vector<int> fds;
  std::vector<uint16_t> ports;
  for (size_t i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    fds.push_back(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      break;
    }
    ports.push_back(ntohs(a.sin_port));
  }
  for (int fd : fds) close(fd);
  if (ports.size() != n) ports.clear();
  return ports;
}

// Sends `request` to 127.0.0.1:port and returns what comes back until the
// other side closes or `timeout` passes ("" if it could not connect).
inline std::string RawExchange(uint16_t port, const std::string& request,
                               std::chrono::milliseconds timeout, size_t enough_bytes = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline &&
         (enough_bytes == 0 || got.size() < enough_bytes)) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return got;
}

// The full path of `program` on PATH (or in /usr/sbin, /usr/bin), or "".
inline std::string FindProgram(const std::string& program) {
  std::string path = getenv("PATH") != nullptr ? getenv("PATH") : "";
  path += ":/usr/sbin:/usr/bin:/sbin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t colon = path.find(':', start);
    if (colon == std::string::npos) colon = path.size();
    const std::string candidate = path.substr(start, colon - start) + "/" + program;
    if (colon > start && access(candidate.c_str(), X_OK) == 0) return candidate;
    start = colon + 1;
  }
  return "";
}

// A folder under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* base = getenv("TMPDIR");
    std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/ferry-test-XXXXXX";
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string FileTail(const std::string& file, size_t bytes = 2000) {
  std::ifstream in(file, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

// An etcd cluster of one or more members on 127.0.0.1. Members keep their
// ports and data across KillMember/StartMember, so a restarted member
// rejoins.
class EtcdCluster {
 public:
  ~EtcdCluster() { StopAll(); }

  ::testing::AssertionResult Start(int members = 1) {
    binary_ = FindProgram("etcd");
    if (binary_.empty()) {
      return ::testing::AssertionFailure() << "no etcd binary (install Debian's etcd-server)";
    }
    if (dir_.path().empty()) return ::testing::AssertionFailure() << "no temporary folder";
    const std::vector<uint16_t> ports = FreeLoopbackPorts(2 * static_cast<size_t>(members));
    if (ports.empty()) return ::testing::AssertionFailure() << "no free loopback ports";
    members_.clear();
    for (int i = 0; i < members; ++i) {
      auto m = std::make_unique<Member>();
      m->name = "m" + std::to_string(i);
      m->client_port = ports[2 * static_cast<size_t>(i)];
      m->peer_port = ports[2 * static_cast<size_t>(i) + 1];
      members_.push_back(std::move(m));
    }
    for (int i = 0; i < members; ++i) {
      ::testing::AssertionResult r = Spawn(i);
      if (!r) return r;
    }
    for (int i = 0; i < members; ++i) {
      ::testing::AssertionResult r = WaitHealthy(i);
      if (!r) return r;
    }
    return ::testing::AssertionSuccess();
  }

  // "etcd://127.0.0.1:P1,127.0.0.1:P2,..." (every member).
  std::string url() const {
    std::string s = "etcd://";
    for (size_t i = 0; i < members_.size(); ++i)
      s += (i ? "," : "") + endpoint(static_cast<int>(i));
    return s;
  }
  std::string endpoint(int i) const {
    return "127.0.0.1:" + std::to_string(members_[i]->client_port);
  }
  uint16_t client_port(int i) const { return members_[i]->client_port; }
  int size() const { return static_cast<int>(members_.size()); }

  void KillMember(int i) { members_[i]->process.Kill(); }
  // Starts a member that was killed or stopped again (same ports and data).
  ::testing::AssertionResult StartMember(int i) {
    ::testing::AssertionResult r = Spawn(i);
    if (!r) return r;
    return WaitHealthy(i);
  }
  // Every member down (SIGTERM, then SIGKILL); StartMember brings them back.
  void StopAll() {
    for (auto& m : members_) m->process.Terminate(std::chrono::seconds(10));
  }
  ::testing::AssertionResult StartAll() {
    for (int i = 0; i < size(); ++i) {
      ::testing::AssertionResult r = Spawn(i);
      if (!r) return r;
    }
    for (int i = 0; i < size(); ++i) {
      ::testing::AssertionResult r = WaitHealthy(i);
      if (!r) return r;
    }
    return ::testing::AssertionSuccess();
  }

  std::string LogTail(int i) const { return FileTail(Log(i)); }

 private:
  struct Member {
    std::string name;
    uint16_t client_port = 0;
    uint16_t peer_port = 0;
    ChildProcess process;
    bool started_once = false;
  };

  std::string Log(int i) const { return dir_.path() + "/" + members_[i]->name + ".log"; }

  ::testing::AssertionResult Spawn(int i) {
    Member& m = *members_[i];
    std::string initial;
    for (const auto& other : members_) {
      initial += (initial.empty() ? "" : ",") + other->name +
                 "=http://127.0.0.1:" + std::to_string(other->peer_port);
    }
    const std::string client = "http://127.0.0.1:" + std::to_string(m.client_port);
    const std::string peer = "http://127.0.0.1:" + std::to_string(m.peer_port);
    std::vector<std::string> args = {"--name",
                                     m.name,
                                     "--data-dir",
                                     dir_.path() + "/" + m.name,
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     initial,
                                     "--initial-cluster-token",
                                     "ferry-test-" + std::to_string(getpid()),
                                     "--initial-cluster-state",
                                     "new",
                                     "--logger",
                                     "zap",
                                     "--log-outputs",
                                     "stderr",
                                     "--log-level",
                                     "warn"};
    ChildProcess::Options options;
    options.output_file = Log(i);
    m.started_once = true;
    return m.process.Start(binary_, args, options);
  }

  ::testing::AssertionResult WaitHealthy(int i) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!members_[i]->process.running()) break;
      const std::string reply =
          RawExchange(members_[i]->client_port, "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
                      std::chrono::milliseconds(1000));
      if (reply.find("\"health\":\"true\"") != std::string::npos)
        return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return ::testing::AssertionFailure()
           << "etcd member " << members_[i]->name << " did not become healthy; log:\n"
           << LogTail(i);
  }

  std::string binary_;
  TempDir dir_;
  std::vector<std::unique_ptr<Member>> members_;
};

// A Redis server on 127.0.0.1 with no persistence. `extra` are more
// command-line settings, e.g. {"--requirepass", "pw"}.
class RedisServer {
 public:
  ~RedisServer() { Stop(); }

  ::testing::AssertionResult Start(std::vector<std::string> extra = {}) {
    binary_ = FindProgram("redis-server");
    if (binary_.empty()) {
      return ::testing::AssertionFailure()
             << "no redis-server binary (install Debian's redis-server)";
    }
    if (dir_.path().empty()) return ::testing::AssertionFailure() << "no temporary folder";
    const std::vector<uint16_t> ports = FreeLoopbackPorts(1);
    if (ports.empty()) return ::testing::AssertionFailure() << "no free loopback port";
    port_ = ports[0];
    extra_ = std::move(extra);
    return Restart();
  }

  // Starts it again on the same port (after Stop), empty.
  ::testing::AssertionResult Restart() {
    std::vector<std::string> args = {"--port",
                                     std::to_string(port_),
                                     "--bind",
                                     "127.0.0.1",
                                     "--dir",
                                     dir_.path(),
                                     "--save",
                                     "",
                                     "--appendonly",
                                     "no",
                                     "--daemonize",
                                     "no",
                                     "--protected-mode",
                                     "no"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    ChildProcess::Options options;
    options.output_file = dir_.path() + "/redis.log";
    ::testing::AssertionResult r = process_.Start(binary_, args, options);
    if (!r) return r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline && process_.running()) {
      const std::string reply = RawExchange(port_, "PING\r\n", std::chrono::milliseconds(500), 5);
      // "+PONG", or "-NOAUTH ..." when a password is required: either way it serves.
      if (reply.rfind("+PONG", 0) == 0 || reply.rfind("-NOAUTH", 0) == 0)
        return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return ::testing::AssertionFailure() << "redis-server did not answer PING; log:\n"
                                         << FileTail(dir_.path() + "/redis.log");
  }

  void Stop() { process_.Terminate(std::chrono::seconds(10)); }
  void Kill() { process_.Kill(); }

  uint16_t port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string binary_;
  TempDir dir_;
  uint16_t port_ = 0;
  std::vector<std::string> extra_;
  ChildProcess process_;
};

}  // namespace ferry::test
