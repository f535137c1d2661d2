// StreamLink: the route to one peer over a few streams (connections) — what
// the socket transports (tcp, shm) share on the initiator side.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/transport.h"
#include "transport/stream/connection.h"
#include "transport/stream/event_loop.h"
#include "transport/stream/request.h"

namespace ferry::internal::stream {

// How a transport turns a run of slices (one opcode, consecutive, within the
// frame limits) into one request frame: tcp sends entries and the written
// bytes; shm sends entries with the initiator's addresses and no payload.
// Thread-safe (stateless).
class FrameEncoder {
 public:
  virtual ~FrameEncoder() = default;
  // Fills r->type, r->head (header + body; its seq is set when the frame is
  // queued) and, for frames that carry payload, r->payload.
  virtual void Encode(Opcode op, const Slice* slices, size_t n, uint64_t bytes,
                      uint16_t wire_version, RequestFrame* r) const = 0;
};

struct StreamLinkConfig {
  uint32_t max_frame_bytes = 1u << 20;
  uint32_t max_frame_entries = 512;
  // Bytes a stream may have unanswered before write frames of large entries
  // wait for whichever stream has room first; 0: no window.
  uint64_t stream_window = 2u << 20;
  // The same for frames reading a peer's file regions (whatever the
  // transport): the peer stages them in host buffers until they are answered
  // (and, for lent reads, returned), and bounds what one stream may hold
  // (Connection::kHeldHighBytes); sent beyond that, they would only wait in
  // its stream, with the news of returned lends behind them.
  uint64_t file_read_window = uint64_t{64} << 20;
  // Slices and bytes posted and not answered yet (EngineOptions::
  // peer_max_requests / peer_max_bytes); Post waits for room.
  uint64_t max_outstanding_slices = 1u << 20;
  uint64_t max_outstanding_bytes = uint64_t{16} << 30;
  std::shared_ptr<const FrameEncoder> encoder;
};

// The route to one peer: its streams, and the frames not yet handed to one.
// A write frame of large entries goes to a stream only while that stream has
// fewer than `stream_window` bytes unanswered; each answer (or a closed
// stream) feeds the next frames. So a faster stream takes more of a batch,
// the streams finish it together, and the socket buffers stay shallow (the
// receiver copies bytes still in cache). Assigning every frame at Post time
// left one stream idle at the end of each batch (the measurements:
// docs/benchmarks-history.md, stream windows). Read frames of memory are not
// held back (the peer needs its queue of requests to keep sending; its send
// buffer is kept small instead, see EngineOptions::tcp_send_buffer), nor are
// frames of small entries (see Window); reads of the peer's files wait for
// the wider `file_read_window`.
class StreamLink : public PeerLink, public std::enable_shared_from_this<StreamLink> {
 public:
  StreamLink(const StreamLinkConfig& cfg, std::string peer_id, uint16_t version,
             std::vector<std::shared_ptr<Connection>> streams);
  ~StreamLink() override { Retire(); }

  // A link over `streams` (connected, hello answered, not attached yet):
  // wires them to it and attaches each to its loop.
  static std::shared_ptr<PeerLink> Open(const StreamLinkConfig& cfg, std::string peer_id,
                                        uint16_t version,
                                        std::vector<std::shared_ptr<Connection>> streams);

  // Waits (back-pressure) while the peer has peer_max_requests slices or
  // peer_max_bytes bytes outstanding; frames that find no room before their
  // deadline fail with kResourceExhausted naming the limit.
  void Post(const PostContext& ctx, std::vector<Slice> slices) override;
  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override;
  bool Healthy() const override;
  // No frame waiting, none unanswered on any stream.
  bool Idle() const override;
  // The peer asked to close a stream of this link (kGoAway).
  bool Closing() const override;
  void Retire() override;

 private:
  // Lets the streams feed the link when they have room. Before they attach.
  void WireStreams();
  // Hands waiting frames to streams with room, in order; a frame whose
  // deadline passed while it waited fails with kDeadlineExceeded. Any
  // thread; frames are sent outside the lock.
  void Feed(bool ignore_window = false);
  // The window frame `r` waits for (0: none). Write frames of large entries
  // wait for room (stream_window). Frames of small scattered entries do
  // not: their cost is the sender's scattered loads, which need a deep
  // queue (a window on them made 2 KiB KV pages slower: see
  // docs/benchmarks-history.md). Reads of a peer's files: file_read_window.
  uint64_t Window(const RequestFrame& r) const;
  // The stream with the fewest bytes queued; ties go to the lowest index, so
  // light traffic stays on one stream (one loop awake on each side) and heavy
  // traffic spreads over all of them. A broken stream only if all are.
  Connection* PickStream();

  const uint32_t max_frame_bytes_;
  const uint32_t max_frame_entries_;
  const uint64_t stream_window_;
  const uint64_t file_read_window_;
  const std::shared_ptr<const FrameEncoder> encoder_;
  const std::string peer_id_;
  const uint16_t version_;
  std::vector<std::shared_ptr<Connection>> streams_;
  std::shared_ptr<WriteTracker> tracker_;
  const std::shared_ptr<PeerBudget> budget_;
  mutable std::mutex mu_;
  std::deque<RequestFrame> backlog_;  // guarded by mu_
};

}  // namespace ferry::internal::stream
