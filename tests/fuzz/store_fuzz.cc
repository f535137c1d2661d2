// The etcd and HTTP metadata stores (src/metadata/etcd/, src/metadata/http/)
// as an engine uses them, against a loopback server that answers every
// request with bytes of the fuzz input: the whole reply path — cpp-httplib's
// response parser, the stores' status and header handling, etcd's JSON
// (nlohmann), base64, DecodeEntry, CheckClaim, the watch stream — sees
// hostile bytes, without a real etcd or metadata server.
//
// Input: byte 0 picks the operation (see each target), the rest is a list of
// replies separated by kSeparator; the n-th connection gets the n-th reply
// (the last one again when there are fewer). A reply that starts with
// "HTTP/" is sent as it is; any other is sent as the body of a 200 response
// with its Content-Length. The server closes after each reply.
//
// Only 127.0.0.1 is used; every wait is bounded.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_targets.h"
#include "metadata/entries.h"
#include "metadata/metadata.h"
#include "metadata/registry.h"

namespace ferry::fuzz {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kSeparator = "\n~~\n";

void Check(bool ok) {
  if (!ok) std::abort();
}

std::vector<std::string> Replies(std::string_view in) {
  std::vector<std::string> out;
  while (true) {
    const size_t at = in.find(kSeparator);
    std::string piece(in.substr(0, at));
    if (piece.rfind("HTTP/", 0) != 0) {
      piece = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
              std::to_string(piece.size()) + "\r\n\r\n" + piece;
    }
    out.push_back(std::move(piece));
    if (at == std::string_view::npos) break;
    in.remove_prefix(at + kSeparator.size());
  }
  return out;
}

// Waits up to `ms` for `fd` to be readable; false on timeout or error.
bool WaitReadable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

// One listening socket on 127.0.0.1 and a thread that answers each
// connection, in turn, with the next reply of the current input. Made once
// per process (the fuzzer calls a target millions of times).
class LoopbackServer {
 public:
  static LoopbackServer& Get() {
    static LoopbackServer* server = new LoopbackServer();  // lives as long as the process
    return *server;
  }

  uint16_t port() const { return port_; }

  // Replies for the connections from now on; resets the count.
  void Serve(std::vector<std::string> replies) {
    std::lock_guard<std::mutex> lock(mu_);
    replies_ = std::move(replies);
    ++generation_;
    next_ = 0;
    done_ = 0;
  }

  // Waits (bounded) until `n` connections have been answered and closed by
  // the client.
  void WaitDone(int n, milliseconds bound) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, bound, [&] { return done_ >= n; });
  }

 private:
  LoopbackServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    Check(fd_ >= 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    Check(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    Check(::listen(fd_, 64) == 0);
    socklen_t len = sizeof(a);
    Check(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    std::thread([this] { Loop(); }).detach();
  }

  void Loop() {
    while (true) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      const uint64_t generation = Answer(c);
      ::close(c);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (generation == generation_) ++done_;  // not a late one of the previous input
      }
      cv_.notify_all();
    }
  }

  // Returns the generation of the replies it answered from.
  uint64_t Answer(int c) {
    // The request: headers, then Content-Length bytes of body (bounded).
    std::string req;
    char buf[4096];
    size_t need = std::string::npos;
    while (req.size() < (size_t{1} << 20) && WaitReadable(c, 2000)) {
      const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
      const size_t end = req.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      if (need == std::string::npos) {
        need = end + 4;
        for (const char* name : {"Content-Length: ", "content-length: "}) {
          const size_t at = req.find(name);
          if (at != std::string::npos && at < end)
            need += std::strtoull(req.c_str() + at + 16, nullptr, 10);
        }
      }
      if (req.size() >= need) break;
    }
    std::string reply;
    uint64_t generation;
    {
      std::lock_guard<std::mutex> lock(mu_);
      generation = generation_;
      if (!replies_.empty()) reply = replies_[std::min(next_, replies_.size() - 1)];
      ++next_;
    }
    size_t off = 0;
    while (off < reply.size()) {
      const ssize_t n = ::send(c, reply.data() + off, reply.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::shutdown(c, SHUT_WR);
    // Until the client has read it all and closed (bounded).
    while (WaitReadable(c, 2000) && ::recv(c, buf, sizeof(buf), 0) > 0) {
    }
    return generation;
  }

  int fd_ = -1;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> replies_;  // guarded by mu_
  uint64_t generation_ = 0;           // guarded by mu_: one per Serve
  size_t next_ = 0;                   // guarded by mu_
  int done_ = 0;                      // guarded by mu_
};

wire::PeerDescriptor Self() {
  wire::PeerDescriptor d;
  d.engine_name = "e";
  d.peer_id = "127.0.0.1:5";
  d.instance_id = 3;
  d.wire_min = d.wire_max = 1;
  d.transports = {{"tcp", "127.0.0.1:5"}};
  return d;
}

internal::MetadataContext Context() {
  internal::MetadataContext ctx;
  ctx.ttl = milliseconds(2000);
  ctx.timeout = milliseconds(300);  // bounds Publish and Remove
  return ctx;
}

// An error of a store: never empty, never OK-coded.
void CheckError(const Status& s) { Check(!s.ok() && !s.message().empty()); }

void CheckFetched(const StatusOr<wire::PeerDescriptor>& d) {
  if (d.ok()) {
    Check(d->engine_name == "e");
  } else {
    CheckError(d.status());
    const StatusCode c = d.status().code();
    Check(c == StatusCode::kUnavailable || c == StatusCode::kDataLoss ||
          c == StatusCode::kFailedPrecondition);
  }
}

}  // namespace

// Operations (byte 0): 0 Fetch, 1 Publish, 2 Publish then Remove, 3 Watch
// (one stream of watch messages).
void FuzzEtcdJson(std::string_view input) {
  if (input.empty()) return;
  LoopbackServer& server = LoopbackServer::Get();
  server.Serve(Replies(input.substr(1)));
  const int op = static_cast<uint8_t>(input[0]) % 4;
  auto store = internal::MakeEtcdStore("127.0.0.1:" + std::to_string(server.port()), Context());
  Check(store.ok());
  switch (op) {
    case 0:
      CheckFetched((*store)->Fetch("e", Self(), Clock::now() + milliseconds(1000)));
      break;
    case 1:
    case 2: {
      Status s = (*store)->Publish(Self());
      if (!s.ok()) CheckError(s);
      if (op == 2) {
        Status r = (*store)->Remove("e");
        if (s.ok()) {
          if (!r.ok()) CheckError(r);
        } else {
          Check(r.code() == StatusCode::kNotFound);  // nothing was published
        }
      }
      break;
    }
    case 3: {
      std::atomic<int> changes{0};
      Check((*store)
                ->Watch([&](const std::string& name) {
                  Check(!name.empty());
                  ++changes;
                })
                .ok());
      server.WaitDone(1, milliseconds(3000));
      break;
    }
  }
  store->reset();  // joins the store's threads (a lease is revoked: one more reply)
}

// Operations (byte 0): 0 Fetch, 1 Publish, 2 Publish then Remove.
void FuzzHttpStore(std::string_view input) {
  if (input.empty()) return;
  LoopbackServer& server = LoopbackServer::Get();
  server.Serve(Replies(input.substr(1)));
  const int op = static_cast<uint8_t>(input[0]) % 3;
  auto store = internal::MakeHttpStore(
      "http://127.0.0.1:" + std::to_string(server.port()) + "/metadata", Context());
  Check(store.ok());
  switch (op) {
    case 0:
      CheckFetched((*store)->Fetch("e", Self(), Clock::now() + milliseconds(1000)));
      break;
    case 1:
    case 2: {
      Status s = (*store)->Publish(Self());
      if (!s.ok()) CheckError(s);
      if (op == 2) {
        Status r = (*store)->Remove("e");
        if (s.ok()) {
          if (!r.ok()) CheckError(r);
        } else {
          Check(r.code() == StatusCode::kNotFound);
        }
      }
      break;
    }
  }
  store->reset();
}

}  // namespace ferry::fuzz
