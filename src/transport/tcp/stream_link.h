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

// What the socket transports (tcp, shm) are configured with alike.
struct StreamTransportConfig {
  int streams = 2;
  uint32_t slice_size = 1u << 20;
  uint32_t max_frame_bytes = 1u << 20;
  uint32_t max_frame_entries = 512;
  std::string local_peer_id;  // "host:port" of this engine, sent in stream hellos
  uint64_t local_instance = 0;
};

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
             std::vector<std::shared_ptr<Connection>> streams);
  ~StreamLink() override { Retire(); }

  // A link over `streams` (connected, hello answered, not attached yet):
  // wires them to it and attaches each to its loop.
  static std::shared_ptr<PeerLink> Open(const StreamLinkConfig& cfg, std::string peer_id, uint16_t version,
                                        std::vector<std::shared_ptr<Connection>> streams);

  void Post(const std::shared_ptr<BatchState>& batch, std::vector<Slice> slices,
            Clock::time_point deadline) override;
  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override;
  bool Healthy() const override;
  void Retire() override;

 private:
  // Lets the streams feed the link when they have room. Before they attach.
  void WireStreams();
  // Hands waiting frames to streams with room, in order; a frame whose
  // deadline passed while it waited fails with kDeadlineExceeded. Any
  // thread; frames are sent outside the lock.
  void Feed(bool ignore_window = false);
  // Write frames of large entries wait for room. Frames of small scattered
  // entries do not: their cost is the sender's scattered loads, which need a
  // deep queue (a 2 MiB window made 2 KiB KV pages ~12% slower, 8 MiB ~8%).
  static bool Windowed(const Request& r);
  // The stream with the fewest bytes queued; ties go to the lowest index, so
  // light traffic stays on one stream (one loop awake on each side) and heavy
  // traffic spreads over all of them. A broken stream only if all are.
  Connection* PickStream();

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
