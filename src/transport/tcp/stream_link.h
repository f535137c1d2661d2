// What the socket transports (tcp, shm) share: the pool of event loops, the
// listener that hands accepted connections to them, and StreamLink, the route
// to one peer over a few streams (connections).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/tcp/connection.h"
#include "transport/tcp/event_loop.h"
#include "transport/transport.h"

namespace ferry::internal::tcp {

// The event-loop threads of an engine, shared by its socket transports.
class LoopPool {
 public:
  static StatusOr<std::shared_ptr<LoopPool>> Start(int threads, std::chrono::microseconds spin);
  ~LoopPool() { Stop(); }
  std::vector<EventLoop*> loops() const;
  EventLoop* loop(size_t i) const { return loops_[i % loops_.size()].get(); }
  // Stops every loop (idempotent). Anything in flight fails with kCancelled.
  void Stop();

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<EventLoop>> loops_;
};

// Accepts connections on a listening socket and hands each to a loop.
// kTcp: TCP_NODELAY and the served send buffer. kUnix: the peer's process
// (SO_PEERCRED), so the connection may become a same-host stream.
class Listener : public EventLoop::Handler {
 public:
  enum class Kind { kTcp, kUnix };
  Listener(Kind kind, UniqueFd fd, std::vector<EventLoop*> loops,
           std::shared_ptr<const ServerContext> server, uint32_t send_buffer);
  int fd() const { return fd_.get(); }
  // Serves the socket from the first loop.
  static void Serve(const std::shared_ptr<Listener>& listener, EventLoop* loop);

  void OnEvents(uint32_t) override;
  void OnTick(Clock::time_point) override {}
  bool WantsTick() const override { return false; }

 private:
  const Kind kind_;
  UniqueFd fd_;
  std::vector<EventLoop*> loops_;
  std::shared_ptr<const ServerContext> server_;
  const uint32_t send_buffer_;
  size_t next_ = 0;
};

// Sends a stream's first frame (kStreamHello or kCopyHello) on a blocking
// socket and returns the peer's answer: OK, the refusal it sent, or why no
// answer came.
Status SayHello(int fd, wire::FrameType type, const std::string& body, Clock::time_point deadline);

struct StreamLinkConfig {
  uint32_t max_frame_bytes = 1u << 20;
  uint32_t max_frame_entries = 512;
  // Bytes a stream may have unanswered before write frames of large entries
  // wait for whichever stream has room first.
  uint64_t stream_window = 2u << 20;
  // Same-host streams: frames carry the initiator's addresses instead of
  // payload (kCopyWrite / kCopyRead) and the target copies the bytes.
  bool copy = false;
};

// The route to one peer: its streams, and the frames not yet handed to one.
// A write frame of large entries goes to a stream only while that stream has
// fewer than `stream_window` bytes unanswered; each answer (or a closed
// stream) feeds the next frames. So a faster stream takes more of a batch,
// the streams finish it together, and the socket buffers stay shallow (the
// receiver copies bytes still in cache). Assigning every frame at Post time
// left one stream idle at the end of each batch: 1 MiB x 32 writes 3.3 ->
// 4.1 GB/s, 32 KiB KV pages 3.5 -> 4.5. Read frames are not held back (the
// peer needs its queue of requests to keep sending; its send buffer is kept
// small instead, see EngineOptions::tcp_send_buffer), nor are frames of
// small entries (see Windowed).
class StreamLink : public PeerLink, public std::enable_shared_from_this<StreamLink> {
 public:
  StreamLink(const StreamLinkConfig& cfg, std::string peer_id, uint16_t version,
             std::vector<std::shared_ptr<Connection>> streams)
      : max_frame_bytes_(cfg.max_frame_bytes),
        max_frame_entries_(cfg.max_frame_entries),
        stream_window_(cfg.stream_window),
        copy_(cfg.copy),
        peer_id_(std::move(peer_id)),
        version_(version),
        streams_(std::move(streams)),
        tracker_(std::make_shared<WriteTracker>()) {}

  ~StreamLink() override { Retire(); }

  // A link over `streams` (connected, hello answered, not attached yet):
  // wires them to it and attaches each to its loop.
  static std::shared_ptr<PeerLink> Open(const StreamLinkConfig& cfg, std::string peer_id, uint16_t version,
                                        std::vector<std::shared_ptr<Connection>> streams) {
    auto link = std::make_shared<StreamLink>(cfg, std::move(peer_id), version, streams);
    link->WireStreams();
    for (const auto& conn : streams) {
      conn->loop()->RunInLoop([conn] {
        Status a = conn->Attach();
        if (!a.ok()) conn->CloseAsync(a);
      });
    }
    return link;
  }

  // Lets the streams feed the link when they have room. Before they attach.
  void WireStreams() {
    std::weak_ptr<StreamLink> weak = weak_from_this();
    for (const auto& s : streams_) {
      s->SetOnProgress([weak] {
        if (auto link = weak.lock()) link->Feed();
      });
    }
  }

  void Post(const std::shared_ptr<BatchState>& batch, std::vector<Slice> slices,
            Clock::time_point deadline) override {
    std::vector<Request> frames;
    size_t i = 0;
    while (i < slices.size()) {
      // Coalesce consecutive slices of one opcode into a frame.
      const Opcode op = slices[i].opcode;
      size_t j = i;
      uint64_t bytes = 0;
      while (j < slices.size() && slices[j].opcode == op && j - i < max_frame_entries_ &&
             (j == i || bytes + slices[j].length <= max_frame_bytes_)) {
        bytes += slices[j].length;
        ++j;
      }
      Request r;
      r.type = copy_ ? (op == Opcode::kWrite ? wire::FrameType::kCopyWrite : wire::FrameType::kCopyRead)
                     : (op == Opcode::kWrite ? wire::FrameType::kWrite : wire::FrameType::kRead);
      r.batch = batch;
      r.deadline = deadline;
      r.bytes = bytes;
      r.slices.assign(slices.begin() + i, slices.begin() + j);
      std::string body;
      if (copy_) {
        body.reserve(wire::CopyEntriesSize(j - i));
        std::vector<wire::CopyEntry> entries(j - i);
        for (size_t k = i; k < j; ++k) {
          entries[k - i] = {slices[k].remote, slices[k].length, reinterpret_cast<uint64_t>(slices[k].local)};
        }
        wire::EncodeCopyEntries(entries.data(), entries.size(), &body);
      } else {
        body.reserve(wire::EntriesSize(j - i));
        std::vector<wire::Entry> entries(j - i);
        for (size_t k = i; k < j; ++k) entries[k - i] = {slices[k].remote, slices[k].length};
        wire::EncodeEntries(entries.data(), entries.size(), &body);
      }
      wire::FrameHeader h;
      h.version = static_cast<uint8_t>(version_);
      h.type = r.type;
      if (op == Opcode::kWrite) {
        if (!copy_) {
          h.payload_len = static_cast<uint32_t>(bytes);
          r.payload.reserve(j - i);
          for (size_t k = i; k < j; ++k) AppendRange(&r.payload, slices[k].local, slices[k].length);
        }
        r.tracker = tracker_;
        r.ticket = tracker_->Issue();
      }
      r.head = wire::BuildFrame(h, body);
      frames.push_back(std::move(r));
      i = j;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Request& r : frames) backlog_.push_back(std::move(r));
    }
    Feed();
  }

  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override {
    uint64_t bound = tracker_->Next();
    if (!tracker_->WaitBelow(bound, deadline)) {
      return DeadlineExceededError("earlier writes to " + peer_id_ +
                                   " did not complete before the notification deadline");
    }
    Request r;
    r.type = wire::FrameType::kNotify;
    r.notify = std::make_shared<NotifyWaiter>();
    r.deadline = deadline;
    std::string b;
    wire::EncodeNotify(body, &b);
    wire::FrameHeader h;
    h.version = static_cast<uint8_t>(version_);
    h.type = wire::FrameType::kNotify;
    r.head = wire::BuildFrame(h, b);
    auto waiter = r.notify;
    PickStream()->Send(std::move(r));
    return waiter->Wait(deadline + std::chrono::seconds(1));
  }

  bool Healthy() const override {
    for (const auto& s : streams_) {
      if (s->Broken()) return false;
    }
    return true;
  }

  void Retire() override {
    // Nothing waits here once the link is retired: hand every frame over
    // (the streams close when they have answered all of them).
    Feed(/*ignore_window=*/true);
    for (const auto& s : streams_) s->RetireWhenIdle();
  }

 private:
  // Hands waiting frames to streams with room, in order; a frame whose
  // deadline passed while it waited fails with kDeadlineExceeded. Any
  // thread; frames are sent outside the lock.
  void Feed(bool ignore_window = false) {
    while (true) {
      Request r;
      Connection* to = nullptr;
      bool late = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (backlog_.empty()) return;
        late = backlog_.front().deadline < Clock::now();
        if (!late) {
          to = PickStream();
          const uint64_t q = to->QueuedBytes();
          // Every stream is full: the next answer feeds again. A broken
          // stream (all are) takes the frame and fails it at once.
          const Request& next = backlog_.front();
          if (!ignore_window && Windowed(next) && !to->Broken() && q != 0 &&
              q + next.bytes > stream_window_) {
            return;
          }
        }
        r = std::move(backlog_.front());
        backlog_.pop_front();
      }
      if (late) {
        FailRequest(
            r, DeadlineExceededError("no stream to peer " + peer_id_ +
                                     " had room for the request before the transfer deadline"));
      } else {
        to->Send(std::move(r));
      }
    }
  }

  // Write frames of large entries wait for room. Frames of small scattered
  // entries do not: their cost is the sender's scattered loads, which need a
  // deep queue (a 2 MiB window made 2 KiB KV pages ~12% slower, 8 MiB ~8%).
  static bool Windowed(const Request& r) {
    constexpr uint64_t kMinWindowedEntry = 16u << 10;
    return r.type == wire::FrameType::kWrite && r.bytes >= kMinWindowedEntry * r.slices.size();
  }

  // The stream with the fewest bytes queued; ties go to the lowest index, so
  // light traffic stays on one stream (one loop awake on each side) and heavy
  // traffic spreads over all of them. A broken stream only if all are.
  Connection* PickStream() {
    Connection* best = nullptr;
    uint64_t best_q = 0;
    for (const auto& s : streams_) {
      if (s->Broken()) continue;
      uint64_t q = s->QueuedBytes();
      if (best == nullptr || q < best_q) {
        best = s.get();
        best_q = q;
      }
    }
    return best ? best : streams_[0].get();
  }

  const uint32_t max_frame_bytes_;
  const uint32_t max_frame_entries_;
  const uint64_t stream_window_;
  const bool copy_;
  const std::string peer_id_;
  const uint16_t version_;
  std::vector<std::shared_ptr<Connection>> streams_;
  std::shared_ptr<WriteTracker> tracker_;
  std::mutex mu_;
  std::deque<Request> backlog_;  // guarded by mu_
};


}  // namespace ferry::internal::tcp
