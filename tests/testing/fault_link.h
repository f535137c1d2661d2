// FaultLink: a frame-aware relay between the two ends of one stream, which
// injects faults into the replies (target → initiator) and passes requests
// through untouched. Usable under any stream transport: it only needs the
// two connected sockets (socketpairs in the stream layer's unit tests; a TCP
// or unix socket in front of a real engine likewise).
//
// Faults per reply frame, chosen by an explicit plan (action for the k-th
// reply) or at random from a seed (deterministic: the same seed gives the
// same sequence of actions):
//   kPass     forward unchanged
//   kDrop     swallow it (the initiator's deadline must fail the request)
//   kDelay    forward after `delay`
//   kFail     close both directions (the peer "dies")
//   kReorder  hold it and forward it after the next reply
//   kCorrupt  rewrite the reply's failure list so that it is out of entry
//             order (a forged reply), or, if it lists none, set a bogus status
// Thread-safe; one relay thread per direction, stopped by the destructor.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "wire/frame.h"

namespace ferry::test {

class FaultLink {
 public:
  enum class Action { kPass, kDrop, kDelay, kFail, kReorder, kCorrupt };

  struct Plan {
    std::vector<Action> replies;  // the k-th reply's action; past the end: kPass (or random)
    // With a seed: actions past `replies` are drawn with these weights (percent).
    std::optional<uint32_t> seed;
    int drop_pct = 0, delay_pct = 0, fail_pct = 0, reorder_pct = 0, corrupt_pct = 0;
    std::chrono::milliseconds delay{20};
  };

  // Relays between `initiator_side` (the socket the initiator's stream talks
  // to) and `target_side` (connected to the target's stream). Takes both fds.
  FaultLink(int initiator_side, int target_side, Plan plan)
      : a_(initiator_side), b_(target_side), plan_(std::move(plan)), rng_(plan_.seed.value_or(0)) {
    up_ = std::thread([this] { Pump(a_, b_, /*replies=*/false); });
    down_ = std::thread([this] { Pump(b_, a_, /*replies=*/true); });
  }
  ~FaultLink() {
    stop_ = true;
    up_.join();
    down_.join();
    ::close(a_);
    ::close(b_);
  }

  // The actions taken so far, in reply order.
  std::vector<Action> taken() const {
    std::lock_guard<std::mutex> lock(mu_);
    return taken_;
  }

 private:
  // Reads exactly n bytes; false on EOF, error or stop.
  bool ReadAll(int fd, char* p, size_t n) {
    while (n > 0) {
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, 20) <= 0) {
        if (stop_) return false;
        continue;
      }
      ssize_t r = ::recv(fd, p, n, 0);
      if (r <= 0) return false;
      p += r, n -= static_cast<size_t>(r);
    }
    return true;
  }
  static void WriteAll(int fd, const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      ssize_t w = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (w <= 0) return;
      off += static_cast<size_t>(w);
    }
  }

  Action Next() {
    std::lock_guard<std::mutex> lock(mu_);
    Action a = Action::kPass;
    const size_t k = taken_.size();
    if (k < plan_.replies.size()) {
      a = plan_.replies[k];
    } else if (plan_.seed) {
      int x = static_cast<int>(rng_() % 100);
      const int cuts[] = {plan_.drop_pct, plan_.delay_pct, plan_.fail_pct, plan_.reorder_pct,
                          plan_.corrupt_pct};
      const Action as[] = {Action::kDrop, Action::kDelay, Action::kFail, Action::kReorder,
                           Action::kCorrupt};
      for (int i = 0; i < 5; ++i) {
        if (x < cuts[i]) {
          a = as[i];
          break;
        }
        x -= cuts[i];
      }
    }
    taken_.push_back(a);
    return a;
  }

  // A reply body with its failure list reversed (out of order), or with a
  // bogus whole-frame status if it lists fewer than two failures.
  static std::string Corrupt(const std::string& frame) {
    wire::FrameHeader h;
    auto decoded = wire::DecodeHeader(reinterpret_cast<const uint8_t*>(frame.data()));
    if (!decoded.ok()) return frame;
    h = *decoded;
    const std::string body = frame.substr(wire::kFrameHeaderSize, h.body_len);
    const std::string payload = frame.substr(wire::kFrameHeaderSize + h.body_len);
    auto rep = wire::DecodeReply(body);
    if (!rep.ok()) return frame;
    wire::Reply forged = *rep;
    if (forged.failures.size() >= 2) {
      std::reverse(forged.failures.begin(), forged.failures.end());
    } else {
      forged.status = DataLossError("forged by the fault link");
      if (h.type == wire::FrameType::kReadData) {
        // A failed read reply carries no payload.
        h.payload_len = 0;
        std::string out;
        wire::EncodeReply(forged, &out);
        return wire::BuildFrame(h, out);
      }
    }
    std::string out;
    wire::EncodeReply(forged, &out);
    return wire::BuildFrame(h, out) + payload;
  }

  void Pump(int from, int to, bool replies) {
    std::optional<std::string> held;  // a reordered reply
    while (!stop_) {
      std::string frame(wire::kFrameHeaderSize, '\0');
      if (!ReadAll(from, frame.data(), frame.size())) break;
      auto h = wire::DecodeHeader(reinterpret_cast<const uint8_t*>(frame.data()));
      if (!h.ok()) break;
      const size_t rest = size_t{h->body_len} + h->payload_len;
      frame.resize(wire::kFrameHeaderSize + rest);
      if (!ReadAll(from, frame.data() + wire::kFrameHeaderSize, rest)) break;
      const bool data_reply =
          replies && (h->type == wire::FrameType::kAck || h->type == wire::FrameType::kReadData);
      if (!data_reply) {
        WriteAll(to, frame);
        continue;
      }
      switch (Next()) {
        case Action::kPass:
          break;
        case Action::kDrop:
          continue;
        case Action::kDelay:
          std::this_thread::sleep_for(plan_.delay);
          break;
        case Action::kFail:
          ::shutdown(a_, SHUT_RDWR);
          ::shutdown(b_, SHUT_RDWR);
          return;
        case Action::kReorder:
          if (!held) {
            held = std::move(frame);
            continue;
          }
          break;
        case Action::kCorrupt:
          frame = Corrupt(frame);
          break;
      }
      WriteAll(to, frame);
      if (held) {
        WriteAll(to, *held);
        held.reset();
      }
    }
    ::shutdown(to, SHUT_WR);
  }

  const int a_, b_;
  const Plan plan_;
  mutable std::mutex mu_;
  std::mt19937 rng_;           // guarded by mu_
  std::vector<Action> taken_;  // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread up_, down_;
};

}  // namespace ferry::test
