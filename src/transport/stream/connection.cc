#include "transport/stream/connection.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "common/log.h"
#include "common/tsan_sync.h"

namespace ferry::internal::stream {

namespace {
constexpr int kMaxIov = IOV_MAX < 1024 ? IOV_MAX : 1024;
// Bytes read per readiness event before yielding to other connections.
constexpr size_t kReadBudget = 8u << 20;
constexpr size_t kSeqOffset = 16;  // of the seq field in the frame header
// Bytes read at once when not reading a long payload straight into place.
constexpr size_t kReadAhead = 8u << 10;
// Largest frame (header + entries + payload) a caller sends on its own thread.
constexpr uint64_t kInlineSendMax = 64u << 10;
// A served stream stops reading requests while its unsent replies hold more
// than this many bytes or frames, and reads again below half of it: a peer
// that sends requests but does not read the answers (full socket buffers)
// is held back by TCP's flow control instead of growing this engine's
// memory. Far above what a reader keeps in flight (its window and the
// target's small send buffer keep queues at a few MiB).
constexpr uint64_t kReplyQueueHighBytes = 256u << 20;
constexpr size_t kReplyQueueHighFrames = 16384;
// The connection whose replies this thread reads (Connection::Progress):
// its lock is held, so a request it sends meanwhile is queued, not sent
// inline, and a close it finds is left to the loop (Close).
thread_local const Connection* t_reading = nullptr;

// Hands a channel's wake-ups to its connection.
class ChannelWake : public EventLoop::Handler {
 public:
  explicit ChannelWake(std::weak_ptr<Connection> c) : c_(std::move(c)) {}
  void OnEvents(uint32_t) override {
    if (auto c = c_.lock()) c->OnChannelWake();
  }
  void OnTick(Clock::time_point) override {}
  bool WantsTick() const override { return false; }

 private:
  std::weak_ptr<Connection> c_;
};
}  // namespace

Connection::Connection(EventLoop* loop, UniqueFd fd, std::string peer_name, uint16_t wire_version)
    : loop_(loop),
      fd_(std::move(fd)),
      role_(Role::kInitiator),
      peer_name_(std::move(peer_name)),
      wire_version_(wire_version),
      tsan_key_(TsanSocketKey(fd_.get())) {}

Connection::Connection(EventLoop* loop, UniqueFd fd, std::string peer_name,
                       std::shared_ptr<const FirstFrames> openers,
                       std::chrono::milliseconds hello_timeout)
    : loop_(loop),
      fd_(std::move(fd)),
      role_(Role::kAccepted),
      peer_name_(std::move(peer_name)),
      wire_version_(0),
      openers_(std::move(openers)),
      hello_deadline_(Clock::now() + hello_timeout),
      tsan_key_(TsanSocketKey(fd_.get())) {}

Connection::~Connection() {
  // Anything still here was never completed (the loop stopped): cancel it.
  Status why = CancelledError("engine shut down; connection to " + peer_name_ + " closed");
  for (auto& f : inflight_) FailFrame(f.req, why);
  for (auto& r : submitted_) FailFrame(r, why);
}

Status Connection::Attach() {
  FERRY_RETURN_IF_ERROR(loop_->Add(fd_.get(), EPOLLIN | EPOLLRDHUP, shared_from_this()));
  if (channel_) return InstallChannel();
  return OkStatus();
}

Status Connection::InstallChannel() {
  FERRY_RETURN_IF_ERROR(
      loop_->Add(channel_->wake_fd(), EPOLLIN, std::make_shared<ChannelWake>(weak_from_this())));
  loop_->AddPolled(shared_from_this());
  return OkStatus();
}

bool Connection::ChannelHasReplies() const {
  return channel_ && !read_paused_ && !close_pending_ && channel_->Readable();
}

bool Connection::Poll() {
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  if (!io.owns_lock() || !ChannelHasReplies()) return false;
  ReadSome();
  return true;
}

bool Connection::ArmPoll() {
  loop_asleep_.store(true, std::memory_order_seq_cst);
  // A caller polls: it reads what arrives, and arms the channel when it
  // stops (EndProgress reads loop_asleep_ after its pollers_ decrement).
  if (pollers_.load(std::memory_order_seq_cst) > 0) return true;
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  const bool sleep = io.owns_lock() && (!channel_ || channel_->ArmRead() || read_paused_);
  if (!sleep) loop_asleep_.store(false, std::memory_order_relaxed);  // no DisarmPoll follows
  return sleep;
}

void Connection::DisarmPoll() {
  loop_asleep_.store(false, std::memory_order_seq_cst);
  // (Loop thread: channel_ changes only there.)
  if (channel_) channel_->DisarmRead();
}

void Connection::BeginProgress() {
  pollers_.fetch_add(1, std::memory_order_seq_cst);
  std::lock_guard<std::mutex> io(io_mu_);
  if (channel_) channel_->DisarmRead();  // the peer need not signal: a caller reads
}

bool Connection::Progress() {
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  if (!io.owns_lock() || !ChannelHasReplies()) return false;
  std::shared_ptr<Connection> keep = shared_from_this();
  t_reading = this;
  ReadSome();
  t_reading = nullptr;
  return true;
}

void Connection::EndProgress() {
  std::lock_guard<std::mutex> io(io_mu_);
  if (pollers_.fetch_sub(1, std::memory_order_seq_cst) == 1 &&
      loop_asleep_.load(std::memory_order_seq_cst) && channel_ && !channel_->ArmRead()) {
    // The loop sleeps with the channel unarmed, and bytes are there: it
    // reads them.
    channel_->WakeSelf();
  }
}

void Connection::OnChannelWake() {
  std::shared_ptr<Connection> keep = shared_from_this();
  std::lock_guard<std::mutex> io(io_mu_);
  if (!channel_) return;
  channel_->ClearWake();
  if (!read_paused_) ReadSome();
  if (channel_ && !out_.empty()) Flush();
}

void Connection::OnSocketBesideChannel(uint32_t events) {
  char byte;
  const ssize_t r = ::recv(fd_.get(), &byte, 1, MSG_DONTWAIT);
  if (r == 0 || (events & (EPOLLHUP | EPOLLERR))) {
    Close(UnavailableError("connection closed by peer " + peer_name_));
  } else if (r > 0) {
    Close(DataLossError("bytes from " + peer_name_ +
                        " on the socket of a stream whose frames go through its request rings"));
  } else if (errno != EAGAIN && errno != EINTR) {
    Close(UnavailableError("connection to " + peer_name_ + " failed: " + ErrnoString(errno)));
  }
}

void Connection::Serve(std::shared_ptr<FrameService> service, uint16_t wire_version,
                       std::string peer_name) {
  role_ = Role::kServed;
  if (admission_) admission_->Opened();
  service_ = std::move(service);
  wire_version_ = wire_version;
  peer_name_ = std::move(peer_name);
}

void Connection::AskToCloseWhenIdle(std::chrono::milliseconds after) {
  idle_timeout_ = after;
  last_frame_ = Clock::now();
}

void Connection::Send(RequestFrame r) {
  // Inline: an idle stream (nothing queued, nothing in flight) sends a small
  // frame at once from the caller's thread, saving the hand-off to the loop
  // (and its wake-up if it sleeps). Streams with work in flight leave sending
  // to the loop, which batches frames into one sendmsg.
  if (r.bytes + r.head.size() <= kInlineSendMax && !loop_->InLoopThread() && t_reading != this) {
    std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
    if (io.owns_lock() && role_ == Role::kInitiator && fd_.valid() && !close_pending_ &&
        out_.empty() && inflight_.empty()) {
      bool idle = false;
      {
        std::lock_guard<std::mutex> lock(submit_mu_);
        idle = !closed_ && submitted_.empty() && !drain_scheduled_;
        if (idle) queued_bytes_.fetch_add(r.bytes, std::memory_order_relaxed);
      }
      if (idle) {
        // Over a channel, the caller may read the reply itself.
        if (channel_ && r.batch) r.batch->OfferProgress(shared_from_this());
        Enqueue(std::move(r));
        Flush(/*from_caller=*/true);
        io.unlock();
        // A sleeping loop must run a round to see the new deadline.
        loop_->WakeIfSleeping();
        return;
      }
    }
  }
  bool accepted = false, schedule = false;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    if (!closed_) {
      accepted = true;
      queued_bytes_.fetch_add(r.bytes, std::memory_order_relaxed);
      submitted_.push_back(std::move(r));
      schedule = !drain_scheduled_;
      drain_scheduled_ = true;
    }
  }
  if (!accepted) {
    FailFrame(r, UnavailableError("connection to " + peer_name_ + " is closed"));
    return;
  }
  if (schedule) {
    std::weak_ptr<Connection> weak = weak_from_this();
    loop_->RunInLoop([weak] {
      if (auto self = weak.lock()) {
        std::lock_guard<std::mutex> io(self->io_mu_);
        self->DrainSubmissions();
      }
    });
  }
}

void Connection::DrainSubmissions() {
  std::vector<RequestFrame> batch;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    batch.swap(submitted_);
    drain_scheduled_ = false;
  }
  for (RequestFrame& r : batch) Enqueue(std::move(r));
  Flush();
}

void Connection::Enqueue(RequestFrame r) {
  OutFrame f;
  // The newest hooked frame handled (what the pending follow-up says) is
  // written when the frame's first byte goes out (Flush), so a request that
  // waited in the queue still carries the latest news.
  f.news = r.hook && r.head.size() >= wire::kFrameHeaderSize + sizeof(uint64_t);
  uint64_t seq = next_seq_++;
  std::memcpy(r.head.data() + kSeqOffset, &seq, sizeof(seq));
  if (channel_) last_request_ = Clock::now();
  f.total = r.head.size();
  for (const iovec& v : r.payload) f.total += v.iov_len;
  f.head = std::move(r.head);
  f.payload = std::move(r.payload);
  out_.push_back(std::move(f));
  inflight_.push_back(Inflight{seq, std::move(r)});
}

bool Connection::Quiet() const {
  if (Broken()) return true;
  std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
  if (!io.owns_lock()) return false;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    if (!submitted_.empty()) return false;
  }
  return inflight_.empty() && out_.empty() && !deferred_.has_value();
}

void Connection::RetireWhenIdle() {
  retire_.store(true);
  std::weak_ptr<Connection> weak = weak_from_this();
  loop_->RunInLoop([weak] {
    if (auto self = weak.lock()) {
      std::lock_guard<std::mutex> io(self->io_mu_);
      self->CheckIdleRetire();
    }
  });
}

void Connection::CloseAsync(Status why) {
  std::weak_ptr<Connection> weak = weak_from_this();
  loop_->RunInLoop([weak, why] {
    if (auto self = weak.lock()) {
      std::lock_guard<std::mutex> io(self->io_mu_);
      self->Close(why);
    }
  });
}

void Connection::OnStop() {
  std::lock_guard<std::mutex> io(io_mu_);
  Close(CancelledError("engine shut down; connection to " + peer_name_ + " closed"));
}

void Connection::CheckIdleRetire() {
  if (retire_.load() && inflight_.empty() && out_.empty()) {
    std::lock_guard<std::mutex> lock(submit_mu_);
    if (!submitted_.empty()) return;
  } else {
    return;
  }
  Close(CancelledError("connection to " + peer_name_ + " retired"));
}

void Connection::Close(const Status& why) {
  if (t_reading == this) {
    // On a caller's thread (Progress): unregistering from the loop is the
    // loop's to do. Until it does, the stream counts as broken (no new
    // request is routed to it) and nothing more is read or sent.
    if (!close_pending_) {
      close_pending_ = true;
      broken_.store(true, std::memory_order_release);
      CloseAsync(why);
    }
    return;
  }
  std::vector<RequestFrame> pending;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    if (closed_) return;
    closed_ = true;
    pending.swap(submitted_);
  }
  broken_.store(true, std::memory_order_release);
  if (!why.ok() && why.code() != StatusCode::kCancelled && role_ == Role::kInitiator) {
    FERRY_LOG(kInfo, "connection to " << peer_name_ << " closed: " << why);
  }
  std::shared_ptr<Connection> keep = shared_from_this();  // Remove drops the loop's reference
  if (fd_.valid()) {
    loop_->Remove(fd_.get());
    fd_.Reset();
  }
  if (channel_) {
    loop_->Remove(channel_->wake_fd());
    loop_->RemovePolled(this);
    channel_.reset();
  }
  pending_channel_.reset();
  out_.clear();
  out_bytes_ = 0;
  held_bytes_ = 0;
  deferred_.reset();
  admission_.reset();
  service_.reset();  // releases the regions a half-received frame had pinned
  for (auto& f : inflight_) FailFrame(f.req, why);
  inflight_.clear();
  for (auto& r : pending) FailFrame(r, why);
  queued_bytes_.store(0);
  if (on_progress_) on_progress_();  // the link moves waiting frames to other streams
}

void Connection::Refuse(const Status& why) {
  if (fd_.valid() && !out_.empty()) Flush();
  if (fd_.valid()) {
    // Half-close after the answer, and read what the peer already sent, so
    // closing does not reset the connection before the answer is read.
    ::shutdown(fd_.get(), SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 16 && ::recv(fd_.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
    }
  }
  Close(why);
}

bool Connection::WantsTick() const {
  std::lock_guard<std::mutex> io(io_mu_);
  return role_ == Role::kAccepted || !inflight_.empty() || deferred_.has_value() ||
         retire_.load(std::memory_order_relaxed) ||
         (channel_ && Clock::now() - last_request_ < std::chrono::seconds(1));
}

Clock::time_point Connection::WakeAt() const {
  std::lock_guard<std::mutex> io(io_mu_);
  if (role_ != Role::kServed || idle_timeout_.count() == 0 || goaway_sent_) {
    return Clock::time_point::max();
  }
  return last_frame_ + idle_timeout_;
}

void Connection::OnTick(Clock::time_point now) {
  std::shared_ptr<Connection> keep = shared_from_this();  // Close drops the loop's reference
  std::lock_guard<std::mutex> io(io_mu_);
  if (role_ == Role::kServed && idle_timeout_.count() > 0 && !goaway_sent_ &&
      now - last_frame_ >= idle_timeout_ && fd_.valid()) {
    // Idle here: the initiator closes the stream when its side is idle too
    // (a request it sends meanwhile is served as any other).
    FERRY_LOG(kDebug, "asking " << peer_name_ << " to close its stream: no request for "
                                << idle_timeout_.count() << " ms");
    goaway_sent_ = true;
    QueueReply(wire::FrameType::kGoAway, 0, std::string());
    Flush();
    if (!fd_.valid()) return;
  }
  if (role_ == Role::kAccepted && now > hello_deadline_) {
    Close(DeadlineExceededError("peer " + peer_name_ + " sent no valid hello in time"));
    return;
  }
  if (deferred_ && fd_.valid()) {  // idle since the last hooked reply: send the follow-up
    RequestFrame f = std::move(*deferred_);
    deferred_.reset();
    Enqueue(std::move(f));
    Flush();
    if (!fd_.valid()) return;
  }
  if (!inflight_.empty() && inflight_.front().req.deadline < now) {
    // The stream is stuck (or the peer is gone without a reset): fail what is
    // late with kDeadlineExceeded, the rest of the stream with kUnavailable.
    Status late =
        DeadlineExceededError("no reply from peer " + peer_name_ + " before the transfer deadline");
    while (!inflight_.empty() && inflight_.front().req.deadline < now) {
      FailFrame(inflight_.front().req, late);
      inflight_.pop_front();
    }
    // Reset instead of a graceful close: what the kernel still holds to
    // send (a write just reported failed) is dropped rather than delivered
    // once the path returns, where it could overwrite newer bytes.
    if (fd_.valid()) {
      const linger reset{1, 0};
      (void)::setsockopt(fd_.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    }
    Close(UnavailableError("connection to " + peer_name_ + " closed after a request timed out"));
    return;
  }
  CheckIdleRetire();
}

void Connection::OnEvents(uint32_t events) {
  std::shared_ptr<Connection> keep = shared_from_this();
  std::lock_guard<std::mutex> io(io_mu_);
  if (channel_) {
    OnSocketBesideChannel(events);
    return;
  }
  if (read_paused_ && (events & (EPOLLHUP | EPOLLERR))) {
    Close(UnavailableError("connection closed by peer " + peer_name_));
    return;
  }
  if (!read_paused_ && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) ReadSome();
  if (!fd_.valid()) return;
  if (events & EPOLLOUT) Flush();
}

bool Connection::ReplyQueueFull() const {
  if (role_ != Role::kServed) return false;
  if (read_paused_)
    return out_bytes_ > kReplyQueueHighBytes / 2 || out_.size() > kReplyQueueHighFrames / 2 ||
           held_bytes_ > kHeldHighBytes / 2;
  return out_bytes_ > kReplyQueueHighBytes || out_.size() > kReplyQueueHighFrames ||
         held_bytes_ > kHeldHighBytes;
}

void Connection::UpdateInterest() {
  const bool want = !out_.empty() && out_.front().place == 0 && !channel_;
  const bool pause = ReplyQueueFull();
  if (read_paused_ && !pause && reader_.HasPending()) {
    // Frames read before the pause wait in the reader, and no new byte
    // need come to wake this stream for them.
    loop_->RunInLoop([weak = weak_from_this()] {
      if (auto c = weak.lock()) {
        std::lock_guard<std::mutex> io(c->io_mu_);
        if (!c->read_paused_) c->ReadSome();
      }
    });
  }
  if (pause && !read_paused_) {
    FERRY_LOG(kDebug, "pausing requests from " << peer_name_ << ": " << out_.size() << " replies ("
                                               << out_bytes_ << " bytes) not yet read by the peer, "
                                               << held_bytes_ << " bytes held by unfinished ones");
  }
  if (channel_) {
    // The socket keeps its interest (liveness); the channel wakes this
    // stream when it has room, and the loop polls it for requests.
    read_paused_ = pause;
    return;
  }
  if ((want == want_write_ && pause == read_paused_) || !fd_.valid()) return;
  want_write_ = want;
  read_paused_ = pause;
  // Paused: no EPOLLIN and no EPOLLRDHUP (which would fire on and on while
  // nothing reads); a peer that goes away shows as a failed send or HUP.
  const uint32_t read = pause ? 0u : static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP);
  loop_->Modify(fd_.get(), read | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u));
}

void Connection::Flush(bool from_caller) {
  iovec iov[kMaxIov];
  // (Stops at a reserved reply not finished yet: ReserveReply.)
  while (!out_.empty() && out_.front().place == 0 && fd_.valid() && !close_pending_) {
    int n = 0;
    for (auto it = out_.begin(); it != out_.end() && it->place == 0 && n < kMaxIov; ++it) {
      if (it->news && it->sent == 0) {
        std::memcpy(it->head.data() + wire::kFrameHeaderSize, &deferred_seq_,
                    sizeof(deferred_seq_));
        deferred_.reset();  // this frame carries it
      }
      size_t skip = it->sent;
      auto add = [&](const void* base, size_t len) {
        if (n >= kMaxIov) return;
        if (skip >= len) {
          skip -= len;
          return;
        }
        iov[n].iov_base = const_cast<char*>(static_cast<const char*>(base)) + skip;
        iov[n].iov_len = len - skip;
        skip = 0;
        ++n;
      };
      add(it->head.data(), it->head.size());
      for (const auto& p : it->payload) add(p.iov_base, p.iov_len);
    }
    ssize_t w;
    if (channel_) {
      StatusOr<size_t> put = channel_->Write(iov, n);
      if (!put.ok()) {
        Status broken = put.status().WithPrefix("sending to " + peer_name_);
        if (from_caller) {
          CloseAsync(broken);
        } else {
          Close(broken);
        }
        return;
      }
      if (*put == 0) break;  // full: the channel wakes this stream when there is room
      w = static_cast<ssize_t>(*put);
    } else {
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      TsanBeforeSend(tsan_key_, iov, n);  // ThreadSanitizer only (common/tsan_sync.h)
      w = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      TsanAfterSend();
    }
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      Status failed =
          UnavailableError("sending to " + peer_name_ + " failed: " + ErrnoString(errno));
      if (from_caller) {
        CloseAsync(failed);  // closing unregisters from the loop: the loop does it
      } else {
        Close(failed);
      }
      return;
    }
    size_t left = static_cast<size_t>(w);
    out_bytes_ -= std::min<uint64_t>(out_bytes_, left);
    while (left > 0 && !out_.empty()) {  // (every frame sent from is ready)
      OutFrame& f = out_.front();
      size_t rest = f.total - f.sent;
      if (left >= rest) {
        left -= rest;
        out_.pop_front();
      } else {
        f.sent += left;
        left = 0;
      }
    }
  }
  if (pending_channel_ && out_.empty() && fd_.valid()) {
    // The hello's answer went out over the socket: the rings from here on.
    channel_ = std::move(pending_channel_);
    Status s = InstallChannel();
    if (!s.ok()) {
      Close(s);
      return;
    }
  }
  UpdateInterest();
  if (!from_caller) CheckIdleRetire();  // a caller just added work: not idle
}

void Connection::QueueReply(wire::FrameType type, uint64_t seq, std::string body,
                            std::vector<iovec> payload, std::vector<RegionPin> pins,
                            std::shared_ptr<const void> keep) {
  OutFrame f = ReplyFrame(type, seq, body, std::move(payload), std::move(pins), std::move(keep));
  out_bytes_ += f.total;
  out_.push_back(std::move(f));
}

Connection::OutFrame Connection::ReplyFrame(wire::FrameType type, uint64_t seq,
                                            const std::string& body, std::vector<iovec> payload,
                                            std::vector<RegionPin> pins,
                                            std::shared_ptr<const void> keep) const {
  wire::FrameHeader h;
  h.version = role_ == Role::kServed ? static_cast<uint8_t>(wire_version_) : 0;
  h.type = type;
  h.seq = seq;
  uint64_t plen = 0;
  for (const auto& p : payload) plen += p.iov_len;
  h.payload_len = static_cast<uint32_t>(plen);
  OutFrame f;
  f.head = wire::BuildFrame(h, body);
  f.total = f.head.size() + plen;
  f.payload = std::move(payload);
  f.pins = std::move(pins);
  f.keep = std::move(keep);
  return f;
}

Connection::ReplyPlace Connection::ReserveReply(uint64_t holds) {
  OutFrame f;
  f.place = next_place_++;
  f.holds = holds;
  held_bytes_ += holds;
  out_.push_back(std::move(f));
  return ReplyPlace{weak_from_this(), out_.back().place};
}

void Connection::FinishReply(const ReplyPlace& place, wire::FrameType type, uint64_t seq,
                             std::string body, std::vector<iovec> payload,
                             std::vector<RegionPin> pins, std::shared_ptr<const void> keep) {
  std::shared_ptr<Connection> self = place.stream.lock();
  if (!self) return;
  // The frame is built and queued on the loop thread, under the stream's lock.
  struct Reply {
    wire::FrameType type;
    uint64_t seq;
    std::string body;
    std::vector<iovec> payload;
    std::vector<RegionPin> pins;
    std::shared_ptr<const void> keep;
  };
  auto r = std::make_shared<Reply>(
      Reply{type, seq, std::move(body), std::move(payload), std::move(pins), std::move(keep)});
  self->loop_->RunInLoop([weak = place.stream, id = place.id, r] {
    if (auto c = weak.lock()) {
      std::lock_guard<std::mutex> io(c->io_mu_);
      c->FillReply(id, c->ReplyFrame(r->type, r->seq, r->body, std::move(r->payload),
                                     std::move(r->pins), std::move(r->keep)));
    }
  });
}

void Connection::FillReply(uint64_t id, OutFrame f) {
  for (OutFrame& slot : out_) {
    if (slot.place != id) continue;
    out_bytes_ += f.total;
    held_bytes_ -= slot.holds;
    slot = std::move(f);  // place 0: ready
    if (fd_.valid()) Flush();
    return;
  }
  // Not there: the stream closed meanwhile (Close cleared the queue).
}

bool Connection::FramesHandled(const Status& s) {
  if (s.ok()) return true;
  if (!fd_.valid()) return false;  // closed while handling a frame (a send failed)
  FERRY_LOG(kWarning, "closing connection with " << peer_name_ << ": " << s);
  Close(s);
  return false;
}

void Connection::ReadSome() {
  size_t budget = kReadBudget;
  bool drained = false;
  while (fd_.valid() && !close_pending_ && budget > 0 && !drained && !ReplyQueueFull()) {
    // Read data lands in this engine's memory only while its batch is not
    // cancelled (BatchState::BeginLanding): held around this step's recv and
    // the copies out of it, released at the end of the step; a payload
    // whose batch was cancelled is read and dropped.
    struct ReleaseLandings {
      std::vector<std::shared_ptr<BatchState>>& held;
      ~ReleaseLandings() {
        for (auto& b : held) b->EndLanding();
        held.clear();
      }
    } release{landing_};
    if (reader_.HasPending()) {  // frames read before a pause (Hold)
      if (!FramesHandled(reader_.ConsumePending())) return;
      continue;
    }
    if (role_ == Role::kInitiator && reader_.InPayload() && !inflight_.empty() &&
        inflight_.front().req.batch) {
      const std::shared_ptr<BatchState>& b = inflight_.front().req.batch;
      if (b->BeginLanding()) {
        landing_.push_back(b);
      } else {
        reader_.DiscardRest();
      }
    }
    // A long payload is read straight into its destinations; everything else
    // (headers, bodies, short payloads and the next frames behind them) is
    // read in one recv into the read-ahead buffer and taken from there, so a
    // small frame costs one system call instead of three.
    const bool direct = reader_.InPayload() && reader_.PayloadLeft() >= kReadAhead;
    size_t asked = 0;
    ssize_t r;
    iovec ahead{};
    const iovec* iov = &ahead;
    int n = 1;
    if (direct) {
      n = static_cast<int>(std::min<size_t>(reader_.PayloadIovCount(), kMaxIov));
      iov = reader_.PayloadIov();
      for (int i = 0; i < n; ++i) asked += iov[i].iov_len;
    } else {
      if (!read_ahead_) read_ahead_ = std::make_unique<char[]>(kReadAhead);
      asked = kReadAhead;
      ahead = {read_ahead_.get(), kReadAhead};
    }
    if (channel_) {
      StatusOr<size_t> got = channel_->Read(iov, n);
      if (!got.ok()) {
        Status broken = got.status().WithPrefix("receiving from " + peer_name_);
        FERRY_LOG(kWarning, "closing connection with " << peer_name_ << ": " << broken);
        Close(broken);
        return;
      }
      if (*got == 0) break;  // nothing there: the loop polls again
      r = static_cast<ssize_t>(*got);
    } else if (direct) {
      TsanAcquire(tsan_key_);  // the call writes what the peer sent (tsan_sync.h)
      r = ::readv(fd_.get(), iov, n);
    } else {
      TsanAcquire(tsan_key_);
      r = ::recv(fd_.get(), read_ahead_.get(), kReadAhead, MSG_DONTWAIT);
    }
    if (r == 0) {
      Close(UnavailableError("connection closed by peer " + peer_name_));
      return;
    }
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      Close(UnavailableError("receiving from " + peer_name_ + " failed: " + ErrnoString(errno)));
      return;
    }
    const size_t got = static_cast<size_t>(r);
    if (!channel_) TsanAcquire(tsan_key_);  // (a channel orders its own bytes)
    budget -= std::min(budget, got);
    // The epoll registration is level-triggered: after a short recv into
    // the read-ahead buffer the socket is empty, and the loop hears about
    // the next bytes (saves the EAGAIN probe per small frame). A long readv
    // is different: while it copied, the sender kept sending, and reading
    // on beats a trip through epoll_wait (measured on 64 KiB x 32 batches).
    drained = !direct && got < asked;
    if (!FramesHandled(direct ? reader_.Advance(got) : reader_.Consume(read_ahead_.get(), got)))
      return;
  }
  if (fd_.valid() && !out_.empty()) Flush();
}

Status Connection::OnHeader(const wire::FrameHeader& h) {
  if (!fd_.valid()) return CancelledError("connection to " + peer_name_ + " closed");
  using wire::FrameType;
  const FrameType t = h.type;
  bool allowed = false;
  switch (role_) {
    case Role::kAccepted:
      allowed = openers_ != nullptr && (openers_->Find(t) != nullptr ||
                                        t == FrameType::kAuthHello || t == FrameType::kAuthProof);
      break;
    case Role::kServed:
      allowed = service_ != nullptr && service_->Accepts(t);
      break;
    case Role::kInitiator:
      allowed = t == FrameType::kAck || t == FrameType::kReadData || t == FrameType::kGoAway ||
                t == FrameType::kLendAck;
      if (t == FrameType::kGoAway && (h.body_len != 0 || h.payload_len != 0)) {
        return DataLossError("a go-away frame with a body or payload from " + peer_name_);
      }
      break;
  }
  if (!allowed) {
    return DataLossError("unexpected frame type " + std::to_string(static_cast<int>(t)) + " from " +
                         peer_name_);
  }
  if (role_ != Role::kAccepted && h.version != wire_version_) {
    return DataLossError("frame of wire version " + std::to_string(h.version) + " from " +
                         peer_name_ + " on a stream that negotiated version " +
                         std::to_string(wire_version_));
  }
  return OkStatus();
}

Status Connection::OnFrame(const wire::FrameHeader& h, std::string_view body) {
  switch (role_) {
    case Role::kAccepted: {
      // Authentication first: the opener sees only what it lets through.
      FERRY_ASSIGN_OR_RETURN(bool open, openers_->auth().OnFirstFrame(auth_, *this, h, body));
      if (!open) return OkStatus();
      const Opener* opener = openers_->Find(h.type);
      if (opener == nullptr) return DataLossError("unexpected first frame from " + peer_name_);
      return (*opener)(*this, h, body);
    }
    case Role::kServed:
      if (!service_) break;
      if (idle_timeout_.count() > 0) last_frame_ = Clock::now();
      return service_->OnFrame(*this, h, body);
    case Role::kInitiator:
      if (h.type == wire::FrameType::kGoAway) {
        FERRY_LOG(kDebug, "peer " << peer_name_ << " asks to close its idle stream");
        gone_away_.store(true, std::memory_order_release);
        return OkStatus();
      }
      return OnReply(h, body);
  }
  return CancelledError("connection to " + peer_name_ + " closed");
}

Status Connection::OnPayload(const wire::FrameHeader& h) {
  switch (role_) {
    case Role::kServed:
      if (!service_) break;
      return service_->OnPayload(*this, h);
    case Role::kInitiator: {
      std::vector<wire::EntryFailure> failures = std::move(reply_failures_);
      reply_failures_.clear();
      CompleteFront(failures, OkStatus());
      return OkStatus();
    }
    case Role::kAccepted:
      break;
  }
  return InternalError("payload on a connection that expects none");
}

// ---- initiator side -----------------------------------------------------------

Status Connection::OnReply(const wire::FrameHeader& h, std::string_view body) {
  if (inflight_.empty() || inflight_.front().seq != h.seq) {
    return DataLossError("reply with sequence " + std::to_string(h.seq) + " from " + peer_name_ +
                         " matches no request in flight");
  }
  // The decoders refuse failures (and staged entries) out of entry order.
  wire::Reply rep;
  std::vector<wire::StagedLend> staged;
  if (h.type == wire::FrameType::kLendAck) {
    FERRY_ASSIGN_OR_RETURN(wire::LendAck ack, wire::DecodeLendAck(body));
    rep = std::move(ack.reply);
    staged = std::move(ack.staged);
  } else {
    FERRY_ASSIGN_OR_RETURN(rep, wire::DecodeReply(body));
  }
  RequestFrame& req = inflight_.front().req;
  const bool is_read = req.type == wire::FrameType::kRead;
  if ((h.type == wire::FrameType::kReadData) != is_read ||
      (h.type == wire::FrameType::kLendAck && req.hook == nullptr)) {
    return DataLossError("reply type does not match the request from " + peer_name_);
  }
  // (One past the last entry named, in 64 bits: an index may be 2^32 - 1.)
  const uint64_t last_named =
      std::max(rep.failures.empty() ? 0 : uint64_t{rep.failures.back().index} + 1,
               staged.empty() ? 0 : uint64_t{staged.back().index} + 1);
  if (last_named > req.slices.size()) {
    return DataLossError("reply from " + peer_name_ + " names entry " +
                         std::to_string(last_named - 1) + " of a frame with " +
                         std::to_string(req.slices.size()));
  }
  if (!is_read || !rep.status.ok()) {
    if (h.payload_len != 0) return DataLossError("unexpected payload from " + peer_name_);
    std::optional<RequestFrame> next;
    const bool hooked = req.hook != nullptr;
    if (hooked) {
      const size_t target_failures = rep.failures.size();
      next = req.hook->OnReply(req, h.seq, staged, &rep.failures);
      if (rep.failures.size() != target_failures) {
        std::stable_sort(rep.failures.begin(), rep.failures.end(),
                         [](const wire::EntryFailure& a, const wire::EntryFailure& b) {
                           return a.index < b.index;
                         });
      }
    }
    CompleteFront(rep.failures, rep.status);
    if (next) {
      // Sent only if no hooked frame carries the news first (ReplyHook):
      // one return frame per read made same-host 4 KiB reads slower.
      deferred_ = std::move(next);
      deferred_seq_ = h.seq;
    }
    return OkStatus();
  }
  // kReadData: the payload carries the entries that did not fail, in order.
  // (Called within a ReadSome step, which releases the landing taken here.)
  const bool lands = req.batch == nullptr || req.batch->BeginLanding();
  if (lands && req.batch) landing_.push_back(req.batch);
  uint64_t expect = 0;
  reader_.ExpectPayload();
  size_t fi = 0;
  for (size_t i = 0; i < req.slices.size(); ++i) {
    if (fi < rep.failures.size() && rep.failures[fi].index == i) {
      ++fi;
      continue;
    }
    if (lands) {
      reader_.AddDestination(req.slices[i].local, req.slices[i].length);
    } else {
      reader_.AddDiscard(req.slices[i].length);
    }
    expect += req.slices[i].length;
  }
  if (expect != h.payload_len) {
    return DataLossError("read reply from " + peer_name_ + " carries " +
                         std::to_string(h.payload_len) + " bytes, expected " +
                         std::to_string(expect));
  }
  reply_failures_ = std::move(rep.failures);
  return OkStatus();
}

void Connection::CompleteFront(const std::vector<wire::EntryFailure>& failures,
                               const Status& frame_status) {
  RequestFrame req = std::move(inflight_.front().req);
  inflight_.pop_front();
  queued_bytes_.fetch_sub(std::min(req.bytes, queued_bytes_.load(std::memory_order_relaxed)),
                          std::memory_order_relaxed);
  if (req.notify) req.notify->Set(frame_status);
  if (req.batch) {
    BatchState::Completer done(*req.batch);
    constexpr size_t kAhead = 16;
    const size_t n = req.slices.size();
    for (size_t i = 0; i < std::min(n, kAhead); ++i) done.Prefetch(req.slices[i].request);
    size_t fi = 0;
    // Failures arrive sorted by index (the target walks entries in order).
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) done.Prefetch(req.slices[i + kAhead].request);
      Status s = frame_status;
      while (fi < failures.size() && failures[fi].index < i) ++fi;
      if (s.ok() && fi < failures.size() && failures[fi].index == i) {
        s = Status(failures[fi].code, failures[fi].message);
      }
      done.Complete(req.slices[i].request, 1, s);
    }
  }
  SettleFrame(req);
  if (on_progress_) {
    on_progress_();  // room for the link's next frame (before an idle retire)
    // A frame the link just gave this stream goes out now, not after the
    // rest of this read loop (8 MiB): a peer serving reads would idle.
    bool given;
    {
      std::lock_guard<std::mutex> lock(submit_mu_);
      given = !submitted_.empty();
    }
    if (given) DrainSubmissions();
  }
  CheckIdleRetire();
}

}  // namespace ferry::internal::stream
