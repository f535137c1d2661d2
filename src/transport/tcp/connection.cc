#include "transport/tcp/connection.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "common/log.h"
#include "wire/descriptor.h"

namespace ferry::internal::tcp {

namespace {
constexpr size_t kScratchSize = 64 * 1024;
constexpr int kMaxIov = IOV_MAX < 1024 ? IOV_MAX : 1024;
// Bytes read per readiness event before yielding to other connections.
constexpr size_t kReadBudget = 8u << 20;
constexpr size_t kSeqOffset = 16;  // of the seq field in the frame header
// Bytes read at once when not reading a long payload straight into place.
constexpr size_t kReadAhead = 8u << 10;
// Largest frame (header + entries + payload) a caller sends on its own thread.
constexpr uint64_t kInlineSendMax = 64u << 10;
}  // namespace

// ---- WriteTracker / NotifyWaiter -------------------------------------------

uint64_t WriteTracker::Issue() {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t t = next_++;
  outstanding_.insert(t);
  return t;
}

void WriteTracker::Done(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  outstanding_.erase(ticket);
  cv_.notify_all();
}

uint64_t WriteTracker::Next() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_;
}

bool WriteTracker::WaitBelow(uint64_t bound, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, deadline,
                        [&] { return outstanding_.empty() || *outstanding_.begin() >= bound; });
}

void NotifyWaiter::Set(Status s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(s);
  cv_.notify_all();
}

Status NotifyWaiter::Wait(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline, [&] { return done_; })) {
    return DeadlineExceededError("notification not acknowledged before the deadline");
  }
  return status_;
}

// ---- Connection --------------------------------------------------------------

Connection::Connection(EventLoop* loop, UniqueFd fd, Role role, std::string peer_name,
                       std::shared_ptr<const ServerContext> server, uint16_t wire_version)
    : loop_(loop),
      fd_(std::move(fd)),
      role_(role),
      peer_name_(std::move(peer_name)),
      server_(std::move(server)),
      wire_version_(wire_version) {
  if (server_) hello_deadline_ = Clock::now() + server_->hello_timeout;
}

Connection::~Connection() {
  // Anything still here was never completed (the loop stopped): cancel it.
  Status why = CancelledError("engine shut down; connection to " + peer_name_ + " closed");
  for (auto& f : inflight_) FailRequest(f.req, why);
  for (auto& r : submitted_) FailRequest(r, why);
}

Status Connection::Attach() {
  return loop_->Add(fd_.get(), EPOLLIN | EPOLLRDHUP, shared_from_this());
}

void AppendRange(std::vector<iovec>* iov, void* addr, size_t length) {
  if (!iov->empty()) {
    iovec& last = iov->back();
    if (static_cast<char*>(last.iov_base) + last.iov_len == addr) {
      last.iov_len += length;
      return;
    }
  }
  iov->push_back({addr, length});
}

void FailRequest(Request& r, const Status& why) {
  if (r.batch) {
    BatchState::Completer done(*r.batch);
    for (const Slice& s : r.slices) done.Complete(s.request, 1, why);
  }
  r.batch.reset();
  if (r.notify) r.notify->Set(why);
  if (r.tracker && r.ticket) r.tracker->Done(r.ticket);
  r.tracker.reset();
}

void Connection::Send(Request r) {
  // Inline: an idle stream (nothing queued, nothing in flight) sends a small
  // frame at once from the caller's thread, saving the hand-off to the loop
  // (and its wake-up if it sleeps). Streams with work in flight leave sending
  // to the loop, which batches frames into one sendmsg.
  if (r.bytes + r.head.size() <= kInlineSendMax && !loop_->InLoopThread()) {
    std::unique_lock<std::mutex> io(io_mu_, std::try_to_lock);
    if (io.owns_lock() && role_ == Role::kInitiator && fd_.valid() && out_.empty() &&
        inflight_.empty()) {
      bool idle = false;
      {
        std::lock_guard<std::mutex> lock(submit_mu_);
        idle = !closed_ && submitted_.empty() && !drain_scheduled_;
        if (idle) queued_bytes_.fetch_add(r.bytes, std::memory_order_relaxed);
      }
      if (idle) {
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
    FailRequest(r, UnavailableError("connection to " + peer_name_ + " is closed"));
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
  std::vector<Request> batch;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    batch.swap(submitted_);
    drain_scheduled_ = false;
  }
  for (Request& r : batch) Enqueue(std::move(r));
  Flush();
}

void Connection::Enqueue(Request r) {
  uint64_t seq = next_seq_++;
  std::memcpy(r.head.data() + kSeqOffset, &seq, sizeof(seq));
  OutFrame f;
  f.total = r.head.size();
  for (const iovec& v : r.payload) f.total += v.iov_len;
  f.head = std::move(r.head);
  f.payload = std::move(r.payload);
  out_.push_back(std::move(f));
  inflight_.push_back(Inflight{seq, std::move(r)});
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
  std::vector<Request> pending;
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
  out_.clear();
  recv_pins_.clear();
  for (auto& f : inflight_) FailRequest(f.req, why);
  inflight_.clear();
  for (auto& r : pending) FailRequest(r, why);
  queued_bytes_.store(0);
  if (on_progress_) on_progress_();  // the link moves waiting frames to other streams
}

bool Connection::WantsTick() const {
  std::lock_guard<std::mutex> io(io_mu_);
  return role_ == Role::kAccepted || !inflight_.empty() || retire_.load(std::memory_order_relaxed);
}

void Connection::OnTick(Clock::time_point now) {
  std::shared_ptr<Connection> keep = shared_from_this();  // Close drops the loop's reference
  std::lock_guard<std::mutex> io(io_mu_);
  if (role_ == Role::kAccepted && now > hello_deadline_) {
    Close(DeadlineExceededError("peer " + peer_name_ + " sent no valid hello in time"));
    return;
  }
  if (!inflight_.empty() && inflight_.front().req.deadline < now) {
    // The stream is stuck (or the peer is gone without a reset): fail what is
    // late with kDeadlineExceeded, the rest of the stream with kUnavailable.
    Status late = DeadlineExceededError("no reply from peer " + peer_name_ +
                                        " before the transfer deadline");
    while (!inflight_.empty() && inflight_.front().req.deadline < now) {
      FailRequest(inflight_.front().req, late);
      inflight_.pop_front();
    }
    Close(UnavailableError("connection to " + peer_name_ + " closed after a request timed out"));
    return;
  }
  CheckIdleRetire();
}

void Connection::OnEvents(uint32_t events) {
  std::shared_ptr<Connection> keep = shared_from_this();
  std::lock_guard<std::mutex> io(io_mu_);
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) ReadSome();
  if (!fd_.valid()) return;
  if (events & EPOLLOUT) Flush();
}

void Connection::UpdateInterest() {
  bool want = !out_.empty();
  if (want == want_write_ || !fd_.valid()) return;
  want_write_ = want;
  loop_->Modify(fd_.get(), EPOLLIN | EPOLLRDHUP | (want ? static_cast<uint32_t>(EPOLLOUT) : 0u));
}

void Connection::Flush(bool from_caller) {
  iovec iov[kMaxIov];
  while (!out_.empty() && fd_.valid()) {
    int n = 0;
    for (auto it = out_.begin(); it != out_.end() && n < kMaxIov; ++it) {
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
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) break;
      Status failed = UnavailableError("sending to " + peer_name_ + " failed: " + ErrnoString(errno));
      if (from_caller) {
        CloseAsync(failed);  // closing unregisters from the loop: the loop does it
      } else {
        Close(failed);
      }
      return;
    }
    size_t left = static_cast<size_t>(w);
    while (left > 0 && !out_.empty()) {
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
  UpdateInterest();
  if (!from_caller) CheckIdleRetire();  // a caller just added work: not idle
}

void Connection::QueueReply(wire::FrameType type, uint64_t seq, std::string body,
                            std::vector<iovec> payload, std::vector<RegionPin> pins) {
  wire::FrameHeader h;
  h.version = role_ == Role::kTarget ? static_cast<uint8_t>(wire_version_) : 0;
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
  out_.push_back(std::move(f));
}

void Connection::ReadSome() {
  size_t budget = kReadBudget;
  bool drained = false;
  while (fd_.valid() && budget > 0 && !drained) {
    // A long payload is read straight into its destinations; everything else
    // (headers, bodies, short payloads and the next frames behind them) is
    // read in one recv into the read-ahead buffer and taken from there, so a
    // small frame costs one system call instead of three.
    const bool direct = phase_ == Phase::kPayload && payload_left_ >= kReadAhead;
    size_t asked = 0;
    ssize_t r;
    if (direct) {
      int n = static_cast<int>(std::min<size_t>(recv_iov_.size() - recv_index_, kMaxIov));
      for (int i = 0; i < n; ++i) asked += recv_iov_[recv_index_ + i].iov_len;
      r = ::readv(fd_.get(), recv_iov_.data() + recv_index_, n);
    } else {
      if (!read_ahead_) read_ahead_ = std::make_unique<char[]>(kReadAhead);
      asked = kReadAhead;
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
    budget -= std::min(budget, got);
    // The epoll registration is level-triggered: after a short recv into
    // the read-ahead buffer the socket is empty, and the loop hears about
    // the next bytes (saves the EAGAIN probe per small frame). A long readv
    // is different: while it copied, the sender kept sending, and reading
    // on beats a trip through epoll_wait (64 KiB x 32 batches: +15%).
    drained = !direct && got < asked;
    Status s = direct ? AdvancePayload(got) : Consume(read_ahead_.get(), got);
    if (!s.ok()) {
      FERRY_LOG(kWarning, "closing connection with " << peer_name_ << ": " << s);
      Close(s);
      return;
    }
  }
  if (fd_.valid() && !out_.empty()) Flush();
}

Status Connection::Consume(const char* p, size_t n) {
  while (n > 0 && fd_.valid()) {
    Status s;
    if (phase_ == Phase::kHeader) {
      const size_t k = std::min(n, wire::kFrameHeaderSize - got_);
      std::memcpy(header_buf_ + got_, p, k);
      got_ += k, p += k, n -= k;
      if (got_ == wire::kFrameHeaderSize) s = OnHeader();
    } else if (phase_ == Phase::kBody) {
      const size_t k = std::min(n, body_.size() - got_);
      std::memcpy(body_.data() + got_, p, k);
      got_ += k, p += k, n -= k;
      if (got_ == body_.size()) s = OnBody();
    } else {
      size_t taken = 0;
      for (size_t i = recv_index_; i < recv_iov_.size() && taken < n; ++i) {
        const size_t k = std::min(n - taken, recv_iov_[i].iov_len);
        std::memcpy(recv_iov_[i].iov_base, p + taken, k);
        taken += k;
      }
      if (taken == 0) return InternalError("payload phase with no room left");
      p += taken, n -= taken;
      s = AdvancePayload(taken);
    }
    if (!s.ok()) return s;
  }
  return OkStatus();
}

Status Connection::AdvancePayload(size_t n) {
  payload_left_ -= n;
  while (n > 0) {
    iovec& v = recv_iov_[recv_index_];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++recv_index_;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
  return recv_index_ == recv_iov_.size() ? OnPayload() : OkStatus();
}

Status Connection::EnterPayload() {
  recv_index_ = 0;
  payload_left_ = 0;
  for (const iovec& v : recv_iov_) payload_left_ += v.iov_len;
  if (recv_iov_.empty()) return OnPayload();
  phase_ = Phase::kPayload;
  return OkStatus();
}

Status Connection::OnHeader() {
  FERRY_ASSIGN_OR_RETURN(header_, wire::DecodeHeader(header_buf_));
  using wire::FrameType;
  const FrameType t = header_.type;
  bool allowed = false;
  switch (role_) {
    case Role::kAccepted:
      // kCopyHello on a tcp connection, or from a process this one cannot
      // see, is answered with a refusal that says so (ServeCopyHello).
      allowed = t == FrameType::kHandshakeRequest || t == FrameType::kStreamHello ||
                t == FrameType::kCopyHello;
      break;
    case Role::kTarget:
      allowed = t == FrameType::kNotify ||
                (copy_ ? t == FrameType::kCopyWrite || t == FrameType::kCopyRead
                       : t == FrameType::kWrite || t == FrameType::kRead);
      break;
    case Role::kInitiator:
      allowed = t == FrameType::kAck || t == FrameType::kReadData;
      break;
  }
  if (!allowed) {
    return DataLossError("unexpected frame type " + std::to_string(static_cast<int>(t)) + " from " +
                         peer_name_);
  }
  if (role_ != Role::kAccepted && header_.version != wire_version_) {
    return DataLossError("frame of wire version " + std::to_string(header_.version) + " from " +
                         peer_name_ + " on a stream that negotiated version " +
                         std::to_string(wire_version_));
  }
  body_.assign(header_.body_len, '\0');
  got_ = 0;
  phase_ = Phase::kBody;
  if (header_.body_len == 0) return OnBody();
  return OkStatus();
}

Status Connection::OnBody() {
  got_ = 0;
  phase_ = Phase::kHeader;
  switch (header_.type) {
    case wire::FrameType::kHandshakeRequest: return ServeHandshake();
    case wire::FrameType::kStreamHello: return ServeHello();
    case wire::FrameType::kCopyHello: return ServeCopyHello();
    case wire::FrameType::kWrite: return ServeWrite();
    case wire::FrameType::kRead: return ServeRead();
    case wire::FrameType::kCopyWrite: return ServeCopy(/*write=*/true);
    case wire::FrameType::kCopyRead: return ServeCopy(/*write=*/false);
    case wire::FrameType::kNotify: return ServeNotify();
    case wire::FrameType::kAck:
    case wire::FrameType::kReadData: return OnReply();
    default: return DataLossError("unexpected frame from " + peer_name_);
  }
}

Status Connection::OnPayload() {
  phase_ = Phase::kHeader;
  recv_iov_.clear();
  recv_index_ = 0;
  if (role_ == Role::kTarget) {
    // A kWrite payload has landed: release the regions and acknowledge.
    recv_pins_.clear();
    wire::Reply rep;
    rep.failures = std::move(recv_failures_);
    recv_failures_.clear();
    std::string body;
    wire::EncodeReply(rep, &body);
    QueueReply(wire::FrameType::kAck, header_.seq, std::move(body));
    return OkStatus();
  }
  CompleteFront(recv_failures_, OkStatus());
  recv_failures_.clear();
  return OkStatus();
}

// ---- target side ----------------------------------------------------------------

Status Connection::ServeHandshake() {
  std::string body = server_->handshake(body_);
  QueueReply(wire::FrameType::kHandshakeResponse, header_.seq, std::move(body));
  return OkStatus();
}

Status Connection::CheckHello(const wire::StreamHello& hello) const {
  if (hello.target_instance != server_->target->instance_id()) {
    return FailedPreconditionError("engine " + server_->target->peer_id() + " is instance " +
                                   std::to_string(server_->target->instance_id()) + ", not " +
                                   std::to_string(hello.target_instance) +
                                   " (it restarted): handshake again");
  }
  if (hello.wire_version < server_->wire_min || hello.wire_version > server_->wire_max) {
    return FailedPreconditionError("wire version " + std::to_string(hello.wire_version) +
                                   " is not spoken by " + server_->target->peer_id() + " (speaks " +
                                   std::to_string(server_->wire_min) + ".." +
                                   std::to_string(server_->wire_max) + ")");
  }
  return OkStatus();
}

Status Connection::ServeHello() {
  FERRY_ASSIGN_OR_RETURN(wire::StreamHello hello, wire::DecodeStreamHello(body_));
  Status result = CheckHello(hello);
  std::string body;
  wire::EncodeStatus(result, &body);
  QueueReply(wire::FrameType::kStreamHelloAck, header_.seq, std::move(body));
  if (result.ok()) {
    role_ = Role::kTarget;
    wire_version_ = hello.wire_version;
    peer_name_ = hello.initiator_peer_id + " (stream " + std::to_string(hello.stream_index) + ")";
  }
  return OkStatus();
}

Status Connection::ProbePeer(const wire::CopyHello& hello) const {
  const std::string who = "process " + std::to_string(peer_pid_) + " (" + hello.hello.initiator_peer_id + ")";
  if (server_->refuse_copy) {
    return FailedPreconditionError("same-host transport: engine " + server_->target->peer_id() +
                                   " refuses to copy to or from " + who + " (testing option)");
  }
  std::string seen(hello.probe.size(), '\0');
  iovec local{seen.data(), seen.size()};
  iovec remote{reinterpret_cast<void*>(hello.probe_addr), hello.probe.size()};
  ssize_t n = ::process_vm_readv(peer_pid_, &local, 1, &remote, 1, 0);
  if (n < 0) {
    return FailedPreconditionError(
        "same-host transport: engine " + server_->target->peer_id() + " cannot reach the memory of " + who +
        " (process_vm_readv: " + ErrnoString(errno) +
        "); it needs ptrace access to that process: the same user with Yama ptrace_scope 0, or "
        "CAP_SYS_PTRACE");
  }
  if (static_cast<size_t>(n) != seen.size() || seen != hello.probe) {
    return FailedPreconditionError("same-host transport: the memory of " + who +
                                   " does not hold the probe it announced (another process, or "
                                   "another pid namespace?)");
  }
  return OkStatus();
}

Status Connection::ServeCopyHello() {
  FERRY_ASSIGN_OR_RETURN(wire::CopyHello hello, wire::DecodeCopyHello(body_));
  Status result = CheckHello(hello.hello);
  if (result.ok() && peer_pid_ == 0) {
    result = FailedPreconditionError(
        "same-host transport: engine " + server_->target->peer_id() +
        " cannot tell which process this stream comes from (not a unix socket, or a process of "
        "another pid namespace)");
  }
  if (result.ok()) {
    // Taken before the probe, so the probe checks the very process the
    // pidfd follows (the pid cannot be recycled while the pidfd is open and
    // the process alive).
    // (syscall: Debian 12's <sys/pidfd.h> lacks C linkage for C++.)
    peer_pidfd_ = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, peer_pid_, 0)));
    if (!peer_pidfd_.valid()) {
      result = FailedPreconditionError("same-host transport: cannot follow process " +
                                       std::to_string(peer_pid_) + " (pidfd_open: " + ErrnoString(errno) + ")");
    }
  }
  if (result.ok()) result = ProbePeer(hello);
  std::string body;
  wire::EncodeStatus(result, &body);
  QueueReply(wire::FrameType::kStreamHelloAck, header_.seq, std::move(body));
  if (result.ok()) {
    role_ = Role::kTarget;
    copy_ = true;
    wire_version_ = hello.hello.wire_version;
    peer_name_ = hello.hello.initiator_peer_id + " (same-host stream " +
                 std::to_string(hello.hello.stream_index) + ", pid " + std::to_string(peer_pid_) + ")";
  }
  return OkStatus();
}

void Connection::AddDestination(char* addr, size_t length) {
  // Never extends a discard range (scratch_ is reused by each of them).
  if (!recv_iov_.empty() && recv_iov_.back().iov_base == scratch_.get()) {
    recv_iov_.push_back({addr, length});
  } else {
    AppendRange(&recv_iov_, addr, length);
  }
}

void Connection::AddDiscard(size_t length) {
  if (!scratch_) scratch_ = std::make_unique<char[]>(kScratchSize);
  while (length > 0) {
    size_t n = std::min(length, kScratchSize);
    recv_iov_.push_back({scratch_.get(), n});
    length -= n;
  }
}

Status Connection::PinEntry(const wire::Entry& e, uint32_t index, const Region** last,
                            std::vector<RegionPin>* pins, std::vector<wire::EntryFailure>* failures) {
  Status s;
  const Region* r = *last;
  if (e.length == 0) {
    s = InvalidArgumentError("zero-length entry");
  } else if (r != nullptr && e.addr >= r->addr && e.length <= r->length &&
             e.addr - r->addr <= r->length - e.length) {
    return OkStatus();  // inside the region pinned for an earlier entry
  } else {
    auto pin = server_->target->registry().Pin(e.addr, e.length, "remote range");
    if (pin.ok()) {
      *last = pin->region();
      pins->push_back(std::move(*pin));
      return OkStatus();
    }
    s = pin.status().WithPrefix("peer " + server_->target->peer_id() + " refused");
  }
  failures->push_back({index, s.code(), s.message()});
  return s;
}

Status Connection::ServeWrite() {
  FERRY_ASSIGN_OR_RETURN(recv_entries_, wire::DecodeEntries(body_));
  uint64_t total = 0;
  for (const auto& e : recv_entries_) total += e.length;
  if (total != header_.payload_len) {
    return DataLossError("write frame from " + peer_name_ + " announces " +
                         std::to_string(header_.payload_len) + " payload bytes but its entries add up to " +
                         std::to_string(total));
  }
  recv_iov_.clear();
  recv_index_ = 0;
  recv_failures_.clear();
  recv_pins_.clear();
  const Region* last = nullptr;  // entries of a frame mostly share a region
  for (uint32_t i = 0; i < recv_entries_.size(); ++i) {
    const wire::Entry& e = recv_entries_[i];
    Status s = PinEntry(e, i, &last, &recv_pins_, &recv_failures_);
    if (!s.ok()) {
      AddDiscard(e.length);  // drain the bytes; nothing is written
      continue;
    }
    AddDestination(reinterpret_cast<char*>(e.addr), e.length);
  }
  return EnterPayload();
}

Status Connection::ServeRead() {
  FERRY_ASSIGN_OR_RETURN(std::vector<wire::Entry> entries, wire::DecodeEntries(body_));
  wire::Reply rep;
  std::vector<iovec> payload;
  std::vector<RegionPin> pins;
  const Region* last = nullptr;
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (!PinEntry(e, i, &last, &pins, &rep.failures).ok()) continue;
    AppendRange(&payload, reinterpret_cast<void*>(e.addr), e.length);
  }
  std::string body;
  wire::EncodeReply(rep, &body);
  QueueReply(wire::FrameType::kReadData, header_.seq, std::move(body), std::move(payload), std::move(pins));
  return OkStatus();
}

namespace {

// Moves the bytes of `run` (entries that passed validation, in order) between
// this process and `pid` with process_vm_readv (write: the bytes come from
// the initiator) or process_vm_writev (read). Both sides' iovecs describe the
// same bytes in the same order, so each merges its adjacent ranges on its
// own. A short count stops at the first range the kernel could not reach:
// that entry fails, the copy resumes after it.
void CopyRun(int pid, bool write, const std::vector<wire::CopyEntry>& entries,
             const std::vector<uint32_t>& run, const std::string& peer,
             std::vector<wire::EntryFailure>* failures) {
  std::vector<iovec> mine, theirs;
  size_t first = 0;
  while (first < run.size()) {
    mine.clear();
    theirs.clear();
    uint64_t total = 0;
    for (size_t k = first; k < run.size(); ++k) {
      const wire::CopyEntry& e = entries[run[k]];
      AppendRange(&mine, reinterpret_cast<void*>(e.addr), e.length);
      AppendRange(&theirs, reinterpret_cast<void*>(e.peer_addr), e.length);
      total += e.length;
    }
    ssize_t n;
    do {
      n = write ? ::process_vm_readv(pid, mine.data(), mine.size(), theirs.data(), theirs.size(), 0)
                : ::process_vm_writev(pid, mine.data(), mine.size(), theirs.data(), theirs.size(), 0);
    } while (n < 0 && errno == EINTR);
    if (n >= 0 && static_cast<uint64_t>(n) == total) return;
    const int err = n < 0 ? errno : EFAULT;
    if (n < 0 && err != EFAULT) {
      // The process is gone (ESRCH) or no longer ours to reach (EPERM): every
      // entry left fails the same way.
      for (size_t k = first; k < run.size(); ++k) {
        failures->push_back({run[k], StatusCode::kUnavailable,
                             std::string(write ? "copying from " : "copying to ") + peer +
                                 " failed: " + ErrnoString(err)});
      }
      return;
    }
    // The entry holding byte `done` failed; the ones before it are complete.
    uint64_t done = n < 0 ? 0 : static_cast<uint64_t>(n);
    size_t k = first;
    while (done >= entries[run[k]].length) done -= entries[run[k]].length, ++k;
    const wire::CopyEntry& bad = entries[run[k]];
    char where[32];
    std::snprintf(where, sizeof(where), "0x%llx", static_cast<unsigned long long>(bad.peer_addr));
    failures->push_back({run[k], StatusCode::kInvalidArgument,
                         std::string(write ? "source" : "destination") + " range at " + where + " (" +
                             std::to_string(bad.length) + " bytes) of " + peer +
                             " could not be copied: " + ErrnoString(EFAULT)});
    first = k + 1;
  }
}

}  // namespace

Status Connection::ServeCopy(bool write) {
  FERRY_ASSIGN_OR_RETURN(std::vector<wire::CopyEntry> entries, wire::DecodeCopyEntries(body_));
  // The process that said hello must still be the one behind the pid: once
  // it has exited (its socket may live on in a child), nothing is copied.
  pollfd exited{peer_pidfd_.get(), POLLIN, 0};
  if (::poll(&exited, 1, 0) != 0) {
    return UnavailableError("process " + std::to_string(peer_pid_) + " of " + peer_name_ +
                            " has exited; closing its same-host stream");
  }
  wire::Reply rep;
  std::vector<RegionPin> pins;
  std::vector<uint32_t> run;
  run.reserve(entries.size());
  const Region* last = nullptr;
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::CopyEntry& e = entries[i];
    if (!PinEntry({e.addr, e.length}, i, &last, &pins, &rep.failures).ok()) continue;
    if (run.size() == kMaxIov) {  // an entry needs at most one iovec on each side
      CopyRun(peer_pid_, write, entries, run, peer_name_, &rep.failures);
      run.clear();
    }
    run.push_back(i);
  }
  CopyRun(peer_pid_, write, entries, run, peer_name_, &rep.failures);
  pins.clear();  // the bytes have moved: release the regions
  // Validation and copy failures were collected separately: the initiator
  // expects them in entry order.
  std::sort(rep.failures.begin(), rep.failures.end(),
            [](const wire::EntryFailure& a, const wire::EntryFailure& b) { return a.index < b.index; });
  std::string body;
  wire::EncodeReply(rep, &body);
  QueueReply(wire::FrameType::kAck, header_.seq, std::move(body));
  return OkStatus();
}

Status Connection::ServeNotify() {
  FERRY_ASSIGN_OR_RETURN(wire::NotifyBody n, wire::DecodeNotify(body_));
  server_->target->Deliver({std::move(n.sender), std::move(n.name), std::move(n.message)});
  std::string body;
  wire::EncodeReply({}, &body);
  QueueReply(wire::FrameType::kAck, header_.seq, std::move(body));
  return OkStatus();
}

// ---- initiator side -----------------------------------------------------------

Status Connection::OnReply() {
  if (inflight_.empty() || inflight_.front().seq != header_.seq) {
    return DataLossError("reply with sequence " + std::to_string(header_.seq) + " from " + peer_name_ +
                         " matches no request in flight");
  }
  FERRY_ASSIGN_OR_RETURN(wire::Reply rep, wire::DecodeReply(body_));
  Request& req = inflight_.front().req;
  bool is_read = req.type == wire::FrameType::kRead;
  if ((header_.type == wire::FrameType::kReadData) != is_read) {
    return DataLossError("reply type does not match the request from " + peer_name_);
  }
  for (const auto& f : rep.failures) {
    if (f.index >= req.slices.size()) {
      return DataLossError("reply from " + peer_name_ + " names entry " + std::to_string(f.index) +
                           " of a frame with " + std::to_string(req.slices.size()));
    }
  }
  if (!is_read || !rep.status.ok()) {
    if (header_.payload_len != 0) return DataLossError("unexpected payload from " + peer_name_);
    CompleteFront(rep.failures, rep.status);
    return OkStatus();
  }
  // kReadData: the payload carries the entries that did not fail, in order.
  std::vector<bool> failed(req.slices.size(), false);
  for (const auto& f : rep.failures) failed[f.index] = true;
  recv_iov_.clear();
  recv_index_ = 0;
  uint64_t expect = 0;
  for (size_t i = 0; i < req.slices.size(); ++i) {
    if (failed[i]) continue;
    AddDestination(req.slices[i].local, req.slices[i].length);
    expect += req.slices[i].length;
  }
  if (expect != header_.payload_len) {
    return DataLossError("read reply from " + peer_name_ + " carries " +
                         std::to_string(header_.payload_len) + " bytes, expected " + std::to_string(expect));
  }
  recv_failures_ = std::move(rep.failures);
  return EnterPayload();
}

void Connection::CompleteFront(const std::vector<wire::EntryFailure>& failures, const Status& frame_status) {
  Request req = std::move(inflight_.front().req);
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
  if (req.tracker && req.ticket) req.tracker->Done(req.ticket);
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

}  // namespace ferry::internal::tcp
