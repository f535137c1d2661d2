// Connection: one stream (a TCP or unix-domain socket), driven by one
// EventLoop.
//
// Roles:
//  - kInitiator: opened by this engine to a peer. Sends request frames and
//    completes them when the replies arrive (replies come back in request
//    order on a stream; a reply that matches no request closes the stream).
//  - kAccepted: accepted on a listening socket, waiting for its first frame,
//    which an Opener of the listener's FirstFrames answers (a handshake, a
//    stream hello). Closed if nothing valid arrives within the hello timeout.
//  - kServed: a peer's stream whose hello was accepted; its frames go to the
//    FrameService the opener installed (Serve).
//
// A caller's request goes out on the caller's own thread when the stream is
// idle (nothing queued or in flight, the loop not at it) and small; otherwise
// it is queued for the loop. Payload bytes are sent with sendmsg straight from
// registered memory; long payloads are read with readv straight into it,
// while headers, bodies and short payloads arrive through a small read-ahead
// buffer (one recv for a whole small frame). Frames are parsed by a
// FrameReader (frame_reader.h). A stream with a Channel (channel.h: the
// same-host request rings) sends and reads the same bytes through it
// instead; the loop polls it while it spins, and its socket only says
// whether the peer is alive.
// Thread contract: Send, Broken, QueuedBytes, RetireWhenIdle and CloseAsync
// may be called from any thread; everything else runs on the loop thread,
// or on a caller's thread inside Send, always under io_mu_.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/memory_registry.h"
#include "common/net.h"
#include "transport/stream/admission.h"
#include "transport/stream/channel.h"
#include "transport/stream/event_loop.h"
#include "transport/stream/frame_reader.h"
#include "transport/stream/request.h"
#include "transport/stream/service.h"
#include "wire/frame.h"

namespace ferry::internal::stream {

class Connection : public EventLoop::Handler,
                   public FrameReader::Sink,
                   public BatchProgress,
                   public std::enable_shared_from_this<Connection> {
 public:
  enum class Role { kInitiator, kAccepted, kServed };

  // An initiator stream to `peer_name`, speaking `wire_version`.
  Connection(EventLoop* loop, UniqueFd fd, std::string peer_name, uint16_t wire_version);
  // An accepted connection whose first frame `openers` answer within
  // `hello_timeout`.
  Connection(EventLoop* loop, UniqueFd fd, std::string peer_name,
             std::shared_ptr<const FirstFrames> openers, std::chrono::milliseconds hello_timeout);
  ~Connection() override;

  // Registers with the loop. Loop thread only.
  Status Attach();
  // Initiator: frames go through `channel` instead of the socket. Before
  // Attach.
  void SetChannel(std::unique_ptr<Channel> channel) { channel_ = std::move(channel); }
  // Served streams (an opener, loop thread, under the connection's lock):
  // once the replies queued now (the hello's answer) have gone out over the
  // socket, frames go through `channel`.
  void UseChannelAfterReplies(std::unique_ptr<Channel> channel) {
    pending_channel_ = std::move(channel);
  }
  bool HasChannel() const { return channel_ != nullptr; }
  // Marks an accepted unix-socket connection as coming from process `pid`
  // (SO_PEERCRED), for openers that need to know it. Before Attach.
  void SetPeerProcess(int pid) { peer_pid_ = pid; }
  // Where an accepted connection comes from ("10.0.0.2:53412", "process
  // 812"), for logs. Before Attach.
  void SetRemote(std::string remote) { remote_ = std::move(remote); }
  // The accepted connection's place among its source's connections
  // (given back when it closes; no longer pending once served). Before Attach.
  void SetAdmission(std::unique_ptr<Admission::Ticket> t) { admission_ = std::move(t); }
  const std::string& remote() const { return remote_; }
  // Called on the loop thread, under the connection's lock, whenever this
  // stream has answered or failed requests (room for more, or closed). Set
  // before Attach.
  void SetOnProgress(std::function<void()> f) { on_progress_ = std::move(f); }

  // Queues a request (any thread). If the connection is closed, the request
  // fails at once with kUnavailable.
  void Send(RequestFrame r);
  bool Broken() const { return broken_.load(std::memory_order_acquire); }
  EventLoop* loop() const { return loop_; }
  // Bytes of requests sent or queued on this stream and not yet answered.
  uint64_t QueuedBytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  // Nothing queued, in flight or deferred (any thread); a closed stream is
  // quiet. False while the loop is busy with it.
  bool Quiet() const;
  // Closes once nothing is in flight (any thread).
  void RetireWhenIdle();
  // Closes now, failing everything in flight with `why` (any thread).
  void CloseAsync(Status why);
  // Initiator: the peer asked to close this stream (kGoAway: it had no
  // request there for the peer's idle timeout). The stream still works; the
  // core closes its link once no caller uses it (any thread).
  bool GoneAway() const { return gone_away_.load(std::memory_order_acquire); }

  // ---- For openers and services (loop thread, under the connection's lock) --
  // Makes this accepted connection a served stream whose frames go to
  // `service`.
  void Serve(std::shared_ptr<FrameService> service, uint16_t wire_version, std::string peer_name);
  // Served streams: after `after` with no frame from the initiator, sends it
  // kGoAway (once); the stream stays served until the initiator closes it.
  void AskToCloseWhenIdle(std::chrono::milliseconds after);
  // Queues a reply frame; `pins` are kept until its payload is sent.
  // `keep` too (host copies of GPU memory the payload points into).
  void QueueReply(wire::FrameType type, uint64_t seq, std::string body,
                  std::vector<iovec> payload = {}, std::vector<RegionPin> pins = {},
                  std::shared_ptr<const void> keep = nullptr);
  // Served streams: holds the place of a reply a service finishes later,
  // off the loop thread (file I/O): later replies queue behind it, so the
  // initiator still gets them in frame order, and the queue's bounds count
  // it. FinishReply (any thread) fills it and sends it; once the stream has
  // closed it drops the reply (releasing its pins and `keep`).
  // `holds`: the bytes the frame keeps until then (its staging buffer). The
  // stream stops reading requests while its unfinished replies hold more
  // than kHeldHighBytes, and reads again at half of it: a peer that sends
  // file writes faster than the disk takes them, or asks for a batch of
  // reads of any size, costs this engine a bounded staging, not one as
  // large as the batch (frames already read wait in the stream's reader:
  // FrameReader::Sink::Hold).
  struct ReplyPlace {
    std::weak_ptr<Connection> stream;
    uint64_t id = 0;
  };
  static constexpr uint64_t kHeldHighBytes = uint64_t{64} << 20;
  ReplyPlace ReserveReply(uint64_t holds = 0);
  static void FinishReply(const ReplyPlace& place, wire::FrameType type, uint64_t seq,
                          std::string body, std::vector<iovec> payload = {},
                          std::vector<RegionPin> pins = {},
                          std::shared_ptr<const void> keep = nullptr);
  // Refuses an accepted connection: sends what is queued (the refusal, if
  // the frame has an answer) as far as the socket takes it now, and closes
  // with `why`. The frame handler then returns an error.
  void Refuse(const Status& why);
  // Where the payload of the frame being served goes.
  FrameReader& reader() { return reader_; }
  int peer_pid() const { return peer_pid_; }
  const std::string& peer_name() const { return peer_name_; }
  uint16_t wire_version() const { return wire_version_; }

  // EventLoop::Handler
  void OnEvents(uint32_t events) override;
  void OnTick(Clock::time_point now) override;
  bool WantsTick() const override;
  Clock::time_point WakeAt() const override;
  // The loop stopped (the engine shuts down): requests in flight or queued
  // fail now, and later ones at once, instead of waiting for answers no
  // loop will read.
  void OnStop() override;
  // Streams with a channel: polled on every round of the loop, and armed
  // (the peer signals its wake descriptor) before the loop sleeps.
  bool Poll() override;
  bool ArmPoll() override;
  void DisarmPoll() override;
  // The channel's wake descriptor is readable (its handler calls this).
  void OnChannelWake();

  // BatchProgress (streams with a channel; a caller waiting for a batch
  // whose frame it sent inline): the caller reads replies itself, on its
  // own thread under the connection's lock; while any caller polls, the
  // peer is not asked to signal, and the loop may sleep. A close a reply
  // leads to is left to the loop.
  void BeginProgress() override;
  bool Progress() override;
  void EndProgress() override;

  // FrameReader::Sink
  Status OnHeader(const wire::FrameHeader& h) override;
  Status OnFrame(const wire::FrameHeader& h, std::string_view body) override;
  Status OnPayload(const wire::FrameHeader& h) override;
  // A served stream over its bounds (ReplyQueueFull) serves no further
  // frame of what it has read: they wait in the reader until it reads again.
  bool Hold() const override { return ReplyQueueFull(); }

 private:
  struct OutFrame {
    std::string head;
    std::vector<iovec> payload;
    std::vector<RegionPin> pins;       // kept until the bytes are sent
    std::shared_ptr<const void> keep;  // likewise
    size_t sent = 0;
    size_t total = 0;    // head + payload bytes
    uint64_t place = 0;  // ReserveReply's id while not yet finished; 0: ready to send
    uint64_t holds = 0;  // while not yet finished: what ReserveReply was told it holds
    bool news = false;   // a hooked request: deferred_seq_ goes in when its bytes first go out
  };
  // A reply frame of this stream (QueueReply, FinishReply).
  OutFrame ReplyFrame(wire::FrameType type, uint64_t seq, const std::string& body,
                      std::vector<iovec> payload, std::vector<RegionPin> pins,
                      std::shared_ptr<const void> keep) const;
  // What feeding the reader said: true if OK; else closes the stream with
  // it (unless handling a frame closed it already) and returns false.
  bool FramesHandled(const Status& s);
  // Fills the reserved place `id` (loop thread): see FinishReply.
  void FillReply(uint64_t id, OutFrame f);
  struct Inflight {
    uint64_t seq;
    RequestFrame req;
  };

  void DrainSubmissions();
  // Assigns the sequence number and queues the frame for sending.
  void Enqueue(RequestFrame r);
  void Close(const Status& why);
  // Sends what is queued. from_caller: on a caller's thread (inline send),
  // which must not close the connection itself.
  void Flush(bool from_caller = false);
  void UpdateInterest();
  // Served streams: too many unsent replies to read more requests.
  bool ReplyQueueFull() const;
  void ReadSome();
  // Bytes wait in the channel and this stream may read them now.
  bool ChannelHasReplies() const;
  // Registers the channel's wake descriptor and polling with the loop.
  Status InstallChannel();
  // Streams with a channel: what the socket's readiness means (the peer
  // closed it, or sent bytes where none may come).
  void OnSocketBesideChannel(uint32_t events);
  // Initiator side: a reply (header + body) to the oldest frame in flight.
  Status OnReply(const wire::FrameHeader& h, std::string_view body);
  void CompleteFront(const std::vector<wire::EntryFailure>& failures, const Status& frame_status);
  void CheckIdleRetire();

  EventLoop* const loop_;
  UniqueFd fd_;
  Role role_;
  std::string peer_name_;
  uint16_t wire_version_;
  const std::shared_ptr<const FirstFrames> openers_;  // kAccepted
  std::shared_ptr<FrameService> service_;             // kServed
  Clock::time_point hello_deadline_;
  const uint64_t tsan_key_;  // ThreadSanitizer only (common/tsan_sync.h); else 0
  int peer_pid_ = 0;         // accepted unix connections: the peer process
  std::string remote_;       // accepted connections: where from (logs)
  AuthSession auth_;         // kAccepted: where the authentication stands
  std::unique_ptr<Admission::Ticket> admission_;  // accepted connections; loop thread

  std::atomic<bool> broken_{false};
  std::atomic<uint64_t> queued_bytes_{0};
  std::atomic<bool> retire_{false};
  std::atomic<bool> gone_away_{false};  // kInitiator: kGoAway received
  std::function<void()> on_progress_;   // set before Attach, then read-only

  // Submissions from other threads.
  mutable std::mutex submit_mu_;
  std::vector<RequestFrame> submitted_;  // guarded by submit_mu_
  bool drain_scheduled_ = false;         // guarded by submit_mu_
  bool closed_ = false;                  // guarded by submit_mu_ (written on the loop thread)

  // Below: the loop's state, guarded by io_mu_. The loop holds it while it
  // handles this connection's events, ticks and tasks; a caller holds it
  // (try_lock) to send inline.
  mutable std::mutex io_mu_;
  uint64_t next_seq_ = 1;
  uint64_t next_place_ = 1;  // ReserveReply
  std::deque<OutFrame> out_;
  uint64_t out_bytes_ = 0;   // unsent bytes of out_ (kServed: the pause rule)
  uint64_t held_bytes_ = 0;  // the `holds` of out_'s unfinished replies (the pause rule)
  bool want_write_ = false;
  bool read_paused_ = false;  // EPOLLIN off: see ReplyQueueFull
  std::deque<Inflight> inflight_;
  // The newest follow-up of a ReplyHook not sent yet, and the sequence
  // number of the hooked frame it answers (see ReplyHook).
  std::optional<RequestFrame> deferred_;
  uint64_t deferred_seq_ = 0;
  FrameReader reader_{this};
  std::unique_ptr<Channel> channel_;          // frames go through it, not the socket
  std::unique_ptr<Channel> pending_channel_;  // UseChannelAfterReplies
  // Callers polling (BeginProgress..EndProgress), and whether the loop is
  // asleep (ArmPoll..DisarmPoll): a loop that sleeps while a caller polls
  // leaves arming the channel to the last caller to stop.
  std::atomic<int> pollers_{0};
  std::atomic<bool> loop_asleep_{false};
  // A Close on a caller's thread reading replies (Progress) is left to the
  // loop: until then the stream is broken and reads and sends nothing.
  bool close_pending_ = false;
  // The last request queued: a stream with a channel wants ticks (its
  // deadlines watched without waking the loop per request) for a second
  // after it.
  Clock::time_point last_request_{};
  std::vector<wire::EntryFailure> reply_failures_;  // of a read reply whose payload is arriving
  // Batches whose read data the current ReadSome step may store
  // (BatchState::BeginLanding taken; released at the end of the step).
  std::vector<std::shared_ptr<BatchState>> landing_;
  std::unique_ptr<char[]> read_ahead_;  // kReadAhead bytes, allocated on first use
  // kServed: AskToCloseWhenIdle's timeout (0: never), the last frame's
  // arrival, and whether kGoAway went out.
  std::chrono::milliseconds idle_timeout_{0};
  Clock::time_point last_frame_{};
  bool goaway_sent_ = false;
};

}  // namespace ferry::internal::stream
