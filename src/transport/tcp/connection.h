// Connection: one TCP stream, driven by one EventLoop.
//
// Roles:
//  - kInitiator: opened by this engine to a peer. Sends kWrite/kRead/kNotify
//    request frames and completes them when the replies arrive (replies come
//    back in request order on a stream).
//  - kAccepted: accepted on the rpc port, waiting for its first frame: a
//    handshake (answered with the engine's descriptor) or a stream hello
//    (then it becomes kTarget). Closed if nothing valid arrives in time.
//  - kTarget: serves a peer's requests against the engine's registered
//    memory; every range is validated (and pinned) before bytes move.
//
// A caller's request goes out on the caller's own thread when the stream is
// idle (nothing queued or in flight, the loop not at it) and small; otherwise
// it is queued for the loop. Payload bytes are sent with sendmsg straight from
// registered memory; long payloads are read with readv straight into it,
// while headers, bodies and short payloads arrive through a small read-ahead
// buffer (one recv for a whole small frame).
// Thread contract: Send, Broken, QueuedBytes, RetireWhenIdle and CloseAsync
// may be called from any thread; everything else runs on the loop thread,
// or on a caller's thread inside Send, always under io_mu_.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/net.h"
#include "core/batch.h"
#include "core/memory_registry.h"
#include "core/target.h"
#include "transport/tcp/event_loop.h"
#include "transport/transport.h"
#include "wire/frame.h"

namespace ferry::internal::tcp {

// Tickets of the writes posted to one peer that have not completed yet, so a
// notification can wait for every earlier write. Thread-safe.
class WriteTracker {
 public:
  uint64_t Issue();
  void Done(uint64_t ticket);
  // Ticket the next write will get.
  uint64_t Next();
  // Waits until every ticket below `bound` is done.
  bool WaitBelow(uint64_t bound, Clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<uint64_t> outstanding_;
  uint64_t next_ = 1;
};

// Completion of a notification frame.
class NotifyWaiter {
 public:
  void Set(Status s);
  Status Wait(Clock::time_point deadline);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

// What accepted connections need from the engine.
struct ServerContext {
  std::shared_ptr<EngineTarget> target;
  // Builds the kHandshakeResponse body for a caller's descriptor body.
  std::function<std::string(std::string_view request_body)> handshake;
  std::chrono::milliseconds hello_timeout{5000};
  uint16_t wire_min = 1;
  uint16_t wire_max = 1;
  // Test-only: answer same-host stream hellos as if the initiator's memory
  // could not be reached (exercises the fallback to tcp).
  bool refuse_copy = false;
};

// A request frame from the initiator side.
struct Request {
  wire::FrameType type = wire::FrameType::kWrite;
  std::string head;             // header + body; the seq is filled in when queued
  std::vector<iovec> payload;   // kWrite: local source ranges
  std::shared_ptr<BatchState> batch;
  std::vector<Slice> slices;    // one per entry, in order
  std::shared_ptr<NotifyWaiter> notify;
  std::shared_ptr<WriteTracker> tracker;
  uint64_t ticket = 0;          // kWrite only
  uint64_t bytes = 0;
  Clock::time_point deadline;
};

// Completes every slice of `r` (and its notification or write ticket) with
// `why`.
void FailRequest(Request& r, const Status& why);

// Appends [addr, addr + length) to `iov`, extending the last iovec when the
// range continues it: entries in address order are often adjacent (whole
// pages of a buffer), and fewer iovecs are less for the kernel to walk.
void AppendRange(std::vector<iovec>* iov, void* addr, size_t length);

class Connection : public EventLoop::Handler, public std::enable_shared_from_this<Connection> {
 public:
  enum class Role { kInitiator, kAccepted, kTarget };

  Connection(EventLoop* loop, UniqueFd fd, Role role, std::string peer_name,
             std::shared_ptr<const ServerContext> server, uint16_t wire_version);
  ~Connection() override;

  // Registers with the loop. Loop thread only.
  Status Attach();
  // Marks an accepted unix-socket connection as coming from process `pid`
  // (SO_PEERCRED): a same-host hello (kCopyHello) on it may then succeed and
  // have its transfers copied straight between the two processes; without
  // it the hello is refused. Before Attach.
  void SetPeerProcess(int pid) { peer_pid_ = pid; }
  // Called on the loop thread, under the connection's lock, whenever this
  // stream has answered or failed requests (room for more, or closed). Set
  // before Attach.
  void SetOnProgress(std::function<void()> f) { on_progress_ = std::move(f); }

  // Queues a request (any thread). If the connection is closed, the request
  // fails at once with kUnavailable.
  void Send(Request r);
  bool Broken() const { return broken_.load(std::memory_order_acquire); }
  EventLoop* loop() const { return loop_; }
  // Bytes of requests sent or queued on this stream and not yet answered.
  uint64_t QueuedBytes() const { return queued_bytes_.load(std::memory_order_relaxed); }
  // Closes once nothing is in flight (any thread).
  void RetireWhenIdle();
  // Closes now, failing everything in flight with `why` (any thread).
  void CloseAsync(Status why);

  void OnEvents(uint32_t events) override;
  void OnTick(Clock::time_point now) override;
  bool WantsTick() const override;

 private:
  struct OutFrame {
    std::string head;
    std::vector<iovec> payload;
    std::vector<RegionPin> pins;  // kept until the bytes are sent
    size_t sent = 0;
    size_t total = 0;  // head + payload bytes
  };
  struct Inflight {
    uint64_t seq;
    Request req;
  };
  enum class Phase { kHeader, kBody, kPayload };

  void DrainSubmissions();
  // Assigns the sequence number and queues the frame for sending.
  void Enqueue(Request r);
  void Close(const Status& why);
  // Sends what is queued. from_caller: on a caller's thread (inline send),
  // which must not close the connection itself.
  void Flush(bool from_caller = false);
  void UpdateInterest();
  void ReadSome();
  // Feeds bytes read ahead into the frame being received (header, body,
  // payload), dispatching each part as it completes.
  Status Consume(const char* p, size_t n);
  // Counts n payload bytes as landed; dispatches the frame when it is whole.
  Status AdvancePayload(size_t n);
  // Starts receiving a payload into recv_iov_ (dispatches at once if empty).
  Status EnterPayload();
  // Called when a complete header/body/payload has arrived.
  Status OnHeader();
  Status OnBody();
  Status OnPayload();
  // Target side handlers.
  Status ServeHandshake();
  Status ServeHello();
  Status ServeCopyHello();
  // Whether `hello` may open a stream to this engine (instance, version).
  Status CheckHello(const wire::StreamHello& hello) const;
  // Reads the initiator's probe bytes out of its memory.
  Status ProbePeer(const wire::CopyHello& hello) const;
  Status ServeWrite();
  // kCopyWrite / kCopyRead: validates the entries, then moves the bytes with
  // process_vm_readv / process_vm_writev.
  Status ServeCopy(bool write);
  Status ServeRead();
  Status ServeNotify();
  // Initiator side.
  Status OnReply();
  void CompleteFront(const std::vector<wire::EntryFailure>& failures, const Status& frame_status);
  void QueueReply(wire::FrameType type, uint64_t seq, std::string body,
                  std::vector<iovec> payload = {}, std::vector<RegionPin> pins = {});
  void AddDiscard(size_t length);
  // Appends a payload destination to recv_iov_ (AppendRange).
  void AddDestination(char* addr, size_t length);
  // Pins the region holding entry `e` unless *last already covers it; on
  // failure records it in `failures` (naming the range) and returns it.
  Status PinEntry(const wire::Entry& e, uint32_t index, const Region** last,
                  std::vector<RegionPin>* pins, std::vector<wire::EntryFailure>* failures);
  void CheckIdleRetire();

  EventLoop* const loop_;
  UniqueFd fd_;
  Role role_;
  std::string peer_name_;
  const std::shared_ptr<const ServerContext> server_;
  uint16_t wire_version_;
  Clock::time_point hello_deadline_;

  int peer_pid_ = 0;     // accepted unix connections: the peer process
  // A same-host stream: the peer process (pidfd_open), readable once it has
  // exited, so a recycled pid is never copied to or from.
  UniqueFd peer_pidfd_;
  bool copy_ = false;   // a same-host stream: kCopyWrite/kCopyRead, no payloads

  std::atomic<bool> broken_{false};
  std::atomic<uint64_t> queued_bytes_{0};
  std::atomic<bool> retire_{false};
  std::function<void()> on_progress_;  // set before Attach, then read-only

  // Submissions from other threads.
  std::mutex submit_mu_;
  std::vector<Request> submitted_;  // guarded by submit_mu_
  bool drain_scheduled_ = false;    // guarded by submit_mu_
  bool closed_ = false;             // guarded by submit_mu_ (written on the loop thread)

  // Below: the loop's state, guarded by io_mu_. The loop holds it while it
  // handles this connection's events, ticks and tasks; a caller holds it
  // (try_lock) to send inline.
  mutable std::mutex io_mu_;
  uint64_t next_seq_ = 1;
  std::deque<OutFrame> out_;
  bool want_write_ = false;
  std::deque<Inflight> inflight_;

  Phase phase_ = Phase::kHeader;
  uint8_t header_buf_[wire::kFrameHeaderSize];
  size_t got_ = 0;
  wire::FrameHeader header_;
  std::string body_;
  std::vector<iovec> recv_iov_;
  size_t recv_index_ = 0;
  std::vector<RegionPin> recv_pins_;
  std::vector<wire::EntryFailure> recv_failures_;
  std::vector<wire::Entry> recv_entries_;
  size_t payload_left_ = 0;              // bytes of recv_iov_ not yet filled
  std::unique_ptr<char[]> read_ahead_;   // kReadAhead bytes, allocated on first use
  std::unique_ptr<char[]> scratch_;
};

}  // namespace ferry::internal::tcp
