// ferry_test_peer: a Ferry engine in its own process, driven by the
// multi-process tests over stdin/stdout.
//
//   ferry_test_peer [--host H] [--port N] [--size BYTES] [--seed S]
//                   [--wire-min V] [--wire-max V] [--handshake-timeout-ms MS]
//                   [--transfer-timeout-ms MS] [--refuse-same-host-copy 1]
//                   [--fabric-provider NAME] [--buffer-file PATH]
//                   [--gpu DRIVER] [--gpu-device N] [--shared 1]
//                   [--pageable-gpu-staging 1]
//
// With --gpu the buffer is GPU memory of device --gpu-device (default 0),
// allocated through the CUDA driver DRIVER ("libcuda.so.1", or the path of
// the tests' fake driver) and registered as cuda:N; CHECK, FILL and the
// notification checks copy through the driver, never touching it with the
// CPU.
// Registers one buffer of --size bytes (default 16 MiB) filled with the
// pattern stream --seed at position = offset in the buffer, then prints
//
//   READY <peer_id> <buffer_addr (0x hex)> <size>
//
// and serves until SIGTERM/SIGINT, stdin EOF or QUIT. Commands, one a line,
// each answered with one line:
//   PING                          -> PONG
//   CHECK <seed> [<off> <len>]    -> OK | BAD <offset>   (buffer vs stream <seed>,
//                                    position = offset; default: whole buffer)
//   FILL <seed>                   -> OK                  (refill the whole buffer)
//   NOTE <name>                   -> NOTE OK | NOTE BAD <offset> | NOTE NONE | NOTE MALFORMED
//       Waits (at most 20 s) for the notification <name>. A notification
//       whose message is "CHECK <seed> <off> <len>" is checked the moment the
//       peer first sees it, so NOTE tells whether the data was in place then.
//   SHARED <size>                 -> SHARED <0x addr>    (Engine::AllocateShared, registered)
//   SUM <0x addr> <len>           -> SUM <FNV-1a 64>     (of bytes of this process)
//   QUIT                          -> BYE, then exits 0
// Errors at start-up print "ERROR <text>" and exit 2.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_driver.h"
#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"

namespace {

volatile sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

[[noreturn]] void Fail(const std::string& what) {
  std::printf("ERROR %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(2);
}

uint64_t ParseNumber(const char* flag, const char* value) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(value, &end, 0);
  if (errno != 0 || end == value || *end != '\0') Fail(std::string("bad value for ") + flag);
  return v;
}

void Reply(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  uint64_t size = 16u << 20;
  uint64_t seed = 1;
  uint16_t wire_min = 0;
  uint16_t wire_max = 0;
  int64_t handshake_timeout_ms = -1;
  int64_t transfer_timeout_ms = -1;
  bool refuse_same_host_copy = false;
  bool shared = false;          // --shared 1: the buffer is a sealed memfd, registered with it
  std::string fabric_provider;  // EngineOptions::fabric_provider
  std::string fabric_nics;      // EngineOptions::fabric_nics
  // The buffer is this file, mapped shared (the test reads it after killing
  // the peer: what a completed write put there must be in it).
  std::string buffer_file;
  std::string gpu_driver;  // --gpu: the buffer is GPU memory
  int gpu_device = 0;
  bool pageable_gpu_staging = false;
};

using ferry::internal::CudaContextScope;
using ferry::internal::CudaDriver;

// GPU memory of the peer's buffer, reached only through the driver.
class GpuBuffer {
 public:
  GpuBuffer(const CudaDriver& d, int device, uint64_t size) : d_(d), device_(device) {
    if (!d.data_path())
      Fail("--gpu: the CUDA driver " + d.library() + " cannot be used: " + d.why_no_data_path());
    CudaContextScope scope(d, device);
    if (!scope.status().ok()) Fail("--gpu: " + scope.status().ToString());
    auto p = d.AllocateDevice(size);
    if (!p.ok()) Fail("--gpu: " + p.status().ToString());
    data_ = static_cast<unsigned char*>(*p);
    auto s = d.CreateStream();
    if (!s.ok()) Fail("--gpu: " + s.status().ToString());
    stream_ = *s;
  }
  unsigned char* data() { return data_; }
  // Copies [off, off + len) of the device buffer into `host`, or back.
  ferry::Status ToHost(uint64_t off, uint64_t len, unsigned char* host) const {
    return Copy(host, data_ + off, len);
  }
  ferry::Status FromHost(const unsigned char* host, uint64_t len) const {
    return Copy(data_, host, len);
  }

 private:
  ferry::Status Copy(void* dst, const void* src, uint64_t len) const {
    CudaContextScope scope(d_, device_);
    if (!scope.status().ok()) return scope.status();
    ferry::Status s = d_.CopyAsync(dst, src, len, stream_);
    if (!s.ok()) return s;
    return d_.WaitStream(stream_);
  }
  const CudaDriver& d_;
  const int device_;
  unsigned char* data_ = nullptr;
  CudaDriver::Stream stream_ = nullptr;
};

// The peer's buffer: anonymous, or a shared mapping of --buffer-file.
class PeerBuffer {
 public:
  // `shared`: a sealed memfd's pages (fd()), registered with it, which a
  // same-host initiator maps.
  PeerBuffer(uint64_t size, const std::string& file, bool shared) : size_(size) {
    if (file.empty()) {
      anon_ = std::make_unique<ferry::test::AlignedBuffer>(size, shared);
      data_ = anon_->data();
      return;
    }
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0)
      Fail("cannot size --buffer-file " + file);
    void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (m == MAP_FAILED) Fail("cannot map --buffer-file " + file);
    data_ = static_cast<unsigned char*>(m);
    mapped_ = true;
  }
  ~PeerBuffer() {
    if (mapped_) ::munmap(data_, size_);
  }
  unsigned char* data() { return data_; }
  uint64_t addr() const { return reinterpret_cast<uintptr_t>(data_); }
  int fd() const { return anon_ ? anon_->fd() : -1; }

 private:
  uint64_t size_;
  std::unique_ptr<ferry::test::AlignedBuffer> anon_;
  unsigned char* data_ = nullptr;
  bool mapped_ = false;
};

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Fail("missing value for " + flag);
    const char* value = argv[++i];
    if (flag == "--host") {
      o.host = value;
    } else if (flag == "--port") {
      o.port = static_cast<uint16_t>(ParseNumber(argv[i - 1], value));
    } else if (flag == "--size") {
      o.size = ParseNumber(argv[i - 1], value);
    } else if (flag == "--seed") {
      o.seed = ParseNumber(argv[i - 1], value);
    } else if (flag == "--wire-min") {
      o.wire_min = static_cast<uint16_t>(ParseNumber(argv[i - 1], value));
    } else if (flag == "--wire-max") {
      o.wire_max = static_cast<uint16_t>(ParseNumber(argv[i - 1], value));
    } else if (flag == "--handshake-timeout-ms") {
      o.handshake_timeout_ms = static_cast<int64_t>(ParseNumber(argv[i - 1], value));
    } else if (flag == "--transfer-timeout-ms") {
      o.transfer_timeout_ms = static_cast<int64_t>(ParseNumber(argv[i - 1], value));
    } else if (flag == "--buffer-file") {
      o.buffer_file = value;
    } else if (flag == "--fabric-provider") {
      o.fabric_provider = value;
    } else if (flag == "--fabric-nics") {
      o.fabric_nics = value;
    } else if (flag == "--gpu") {
      o.gpu_driver = value;
    } else if (flag == "--gpu-device") {
      o.gpu_device = static_cast<int>(ParseNumber(argv[i - 1], value));
    } else if (flag == "--shared") {
      o.shared = ParseNumber(argv[i - 1], value) != 0;
    } else if (flag == "--pageable-gpu-staging") {  // TestingOptions::pageable_gpu_staging
      o.pageable_gpu_staging = ParseNumber(argv[i - 1], value) != 0;
    } else if (flag == "--refuse-same-host-copy") {
      o.refuse_same_host_copy = ParseNumber(argv[i - 1], value) != 0;
    } else {
      Fail("unknown flag " + flag);
    }
  }
  if (o.size == 0) Fail("--size must be positive");
  return o;
}

// Checks every notification the moment it is first seen.
class NoteWatcher {
 public:
  NoteWatcher(ferry::Engine* engine, const unsigned char* buf, uint64_t size, const GpuBuffer* gpu)
      : engine_(engine), buf_(buf), size_(size), gpu_(gpu), thread_([this] { Run(); }) {}
  ~NoteWatcher() {
    stop_ = true;
    thread_.join();
  }

  // "OK", "BAD <off>", "MALFORMED" or "NONE" (not seen within the timeout).
  std::string Wait(const std::string& name, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return results_.count(name) != 0; });
    auto it = results_.find(name);
    return it == results_.end() ? "NONE" : it->second;
  }

 private:
  void Run() {
    while (!stop_) {
      std::vector<ferry::Notification> notes = engine_->GetNotifications();
      for (const ferry::Notification& n : notes) {
        std::string result = Check(n.message);
        std::lock_guard<std::mutex> lock(mu_);
        results_[n.name] = result;
        cv_.notify_all();
      }
      if (notes.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::string Check(const std::string& message) const {
    std::istringstream in(message);
    std::string word;
    uint64_t seed = 0, off = 0, len = 0;
    if (!(in >> word >> seed >> off >> len) || word != "CHECK" || off > size_ ||
        len > size_ - off) {
      return "MALFORMED";
    }
    const unsigned char* at = buf_ + off;
    std::vector<unsigned char> host;
    if (gpu_ != nullptr) {  // what the GPU memory holds right now
      host.resize(len);
      const ferry::Status s = gpu_->ToHost(off, len, host.data());
      if (!s.ok()) return "GPU " + s.ToString();
      at = host.data();
    }
    const std::optional<size_t> bad = ferry::test::CheckPattern(at, len, seed, off);
    return bad ? "BAD " + std::to_string(off + *bad) : "OK";
  }

  ferry::Engine* engine_;
  const unsigned char* buf_;
  uint64_t size_;
  const GpuBuffer* gpu_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> results_;
  std::thread thread_;
};

// CHECK and FILL touch the buffer that remote engines write into. The
// happens-before edge from such a write to a CHECK (the writer's engine got
// our engine's acknowledgement, then the driver wrote to our stdin) runs
// through other processes, which ThreadSanitizer cannot see; so these two do
// not go through its instrumentation (and do not call memcmp/memcpy, which
// it intercepts). The notification checks in NoteWatcher stay instrumented:
// there the engine itself must order the data before the notification.
__attribute__((no_sanitize("thread"), noinline)) std::optional<size_t> CheckBufferFromAfar(
    const unsigned char* p, size_t len, uint64_t seed, uint64_t pos) {
  uint64_t word = 0;
  for (size_t i = 0; i < len; ++i) {
    const uint64_t at = pos + i;
    if (i == 0 || (at & 7) == 0) word = ferry::test::PatternWord(seed, at >> 3);
    if (p[i] != static_cast<unsigned char>(word >> ((at & 7) * 8))) return i;
  }
  return std::nullopt;
}

__attribute__((no_sanitize("thread"), noinline)) void FillBufferFromAfar(unsigned char* p,
                                                                         size_t len,
                                                                         uint64_t seed) {
  uint64_t word = 0;
  for (size_t i = 0; i < len; ++i) {
    if ((i & 7) == 0) word = ferry::test::PatternWord(seed, i >> 3);
    p[i] = static_cast<unsigned char>(word >> ((i & 7) * 8));
  }
}

std::string HandleCommand(const std::string& line, unsigned char* buf, uint64_t size,
                          NoteWatcher& notes, const GpuBuffer* gpu, ferry::Engine* engine,
                          bool* quit) {
  std::istringstream in(line);
  std::string cmd;
  in >> cmd;
  if (cmd == "PING") return "PONG";
  if (cmd == "SHARED") {  // a new buffer from Engine::AllocateShared
    uint64_t n = 0;
    if (!(in >> n)) return "ERROR usage: SHARED <size>";
    auto p = engine->AllocateShared(n);
    if (!p.ok()) return "ERROR " + p.status().ToString();
    char out[64];
    std::snprintf(out, sizeof(out), "SHARED 0x%llx",
                  static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(*p)));
    return out;
  }
  if (cmd == "SUM") {  // FNV-1a of bytes of this process (a SHARED buffer)
    uint64_t addr = 0, n = 0;
    if (!(in >> std::hex >> addr >> std::dec >> n)) return "ERROR usage: SUM <hex addr> <len>";
    const auto* p = reinterpret_cast<const unsigned char*>(addr);
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return "SUM " + std::to_string(h);
  }
  if (cmd == "QUIT") {
    *quit = true;
    return "BYE";
  }
  if (cmd == "FILL") {
    uint64_t seed = 0;
    if (!(in >> seed)) return "ERROR usage: FILL <seed>";
    if (gpu != nullptr) {
      std::vector<unsigned char> host(size);
      FillBufferFromAfar(host.data(), size, seed);
      const ferry::Status s = gpu->FromHost(host.data(), size);
      return s.ok() ? "OK" : "ERROR " + s.ToString();
    }
    FillBufferFromAfar(buf, size, seed);
    return "OK";
  }
  if (cmd == "CHECK") {
    uint64_t seed = 0, off = 0, len = size;
    if (!(in >> seed)) return "ERROR usage: CHECK <seed> [<off> <len>]";
    if (in >> off) {
      if (!(in >> len)) return "ERROR usage: CHECK <seed> [<off> <len>]";
    }
    if (off > size || len > size - off) return "ERROR range outside the buffer";
    std::vector<unsigned char> host;
    if (gpu != nullptr) {
      host.resize(len);
      const ferry::Status s = gpu->ToHost(off, len, host.data());
      if (!s.ok()) return "ERROR " + s.ToString();
      const std::optional<size_t> bad = CheckBufferFromAfar(host.data(), len, seed, off);
      return bad ? "BAD " + std::to_string(off + *bad) : "OK";
    }
    const std::optional<size_t> bad = CheckBufferFromAfar(buf + off, len, seed, off);
    return bad ? "BAD " + std::to_string(off + *bad) : "OK";
  }
  if (cmd == "NOTE") {
    std::string name;
    if (!(in >> name)) return "ERROR usage: NOTE <name>";
    return "NOTE " + notes.Wait(name, std::chrono::seconds(20));
  }
  return "ERROR unknown command";
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = ParseArgs(argc, argv);

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: poll() returns EINTR
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  PeerBuffer host_buffer(opt.gpu_driver.empty() ? opt.size : 64, opt.buffer_file,
                         opt.shared && opt.gpu_driver.empty());
  std::unique_ptr<GpuBuffer> gpu;
  if (!opt.gpu_driver.empty())
    gpu = std::make_unique<GpuBuffer>(CudaDriver::Load(opt.gpu_driver), opt.gpu_device, opt.size);
  unsigned char* const buffer = gpu ? gpu->data() : host_buffer.data();
  if (gpu) {
    std::vector<unsigned char> host(opt.size);
    ferry::test::FillPattern(host.data(), opt.size, opt.seed, 0);
    const ferry::Status s = gpu->FromHost(host.data(), opt.size);
    if (!s.ok()) Fail("--gpu: " + s.ToString());
  } else {
    ferry::test::FillPattern(buffer, opt.size, opt.seed, 0);
  }

  ferry::EngineOptions eo;
  eo.listen_host = opt.host;
  eo.listen_port = opt.port;
  eo.testing.wire_version_min = opt.wire_min;
  eo.testing.wire_version_max = opt.wire_max;
  eo.testing.refuse_same_host_copy = opt.refuse_same_host_copy;
  eo.fabric_provider = opt.fabric_provider;
  eo.fabric_nics = opt.fabric_nics;
  if (opt.gpu_driver != CudaDriver::kLibrary) eo.testing.cuda_driver = opt.gpu_driver;
  eo.testing.pageable_gpu_staging = opt.pageable_gpu_staging;
  if (opt.handshake_timeout_ms >= 0) {
    eo.handshake_timeout = std::chrono::milliseconds(opt.handshake_timeout_ms);
  }
  if (opt.transfer_timeout_ms >= 0) {
    eo.transfer_timeout = std::chrono::milliseconds(opt.transfer_timeout_ms);
  }
  auto engine_or = ferry::Engine::Create(eo);
  if (!engine_or.ok()) Fail("Engine::Create: " + engine_or.status().ToString());
  std::unique_ptr<ferry::Engine> engine = std::move(engine_or).value();
  const std::string location = gpu ? "cuda:" + std::to_string(opt.gpu_device) : "*";
  ferry::MemoryRegion region{buffer, opt.size, location};
  if (!gpu) region.fd = host_buffer.fd();
  const ferry::Status reg = engine->RegisterMemory({&region, 1});
  if (!reg.ok()) Fail("RegisterMemory: " + reg.ToString());

  int rc = 0;
  {
    NoteWatcher notes(engine.get(), buffer, opt.size, gpu.get());
    char ready[256];
    std::snprintf(ready, sizeof(ready), "READY %s 0x%llx %llu", engine->PeerId().c_str(),
                  static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(buffer)),
                  static_cast<unsigned long long>(opt.size));
    Reply(ready);

    std::string pending;
    bool quit = false;
    while (!quit && !g_stop) {
      pollfd pfd{STDIN_FILENO, POLLIN, 0};
      const int n = poll(&pfd, 1, 200);
      if (n < 0) {
        if (errno == EINTR) continue;
        rc = 3;
        break;
      }
      if (n == 0) continue;
      char chunk[4096];
      const ssize_t got = read(STDIN_FILENO, chunk, sizeof(chunk));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;  // EOF: the driver is gone
      pending.append(chunk, static_cast<size_t>(got));
      size_t nl;
      while (!quit && (nl = pending.find('\n')) != std::string::npos) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        Reply(HandleCommand(line, buffer, opt.size, notes, gpu.get(), engine.get(), &quit));
      }
    }
  }
  // Shut down in order: engine first (stops transfers into the buffer).
  const ferry::Status unreg = engine->UnregisterMemory(buffer);
  if (!unreg.ok()) {
    std::fprintf(stderr, "ferry_test_peer: UnregisterMemory: %s\n", unreg.ToString().c_str());
    rc = 4;
  }
  engine.reset();
  return rc;
}
