#include "transport/tcp/stream_link.h"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/log.h"
#include "common/net.h"
#include "wire/exchange.h"

namespace ferry::internal::tcp {

Status SayHello(int fd, wire::FrameType type, const std::string& body, Clock::time_point deadline) {
  FERRY_ASSIGN_OR_RETURN(std::string ack,
                         wire::Exchange(fd, type, body, wire::FrameType::kStreamHelloAck, deadline));
  Status remote;
  FERRY_RETURN_IF_ERROR(wire::DecodeStatus(ack, &remote));
  return remote;
}

StatusOr<std::shared_ptr<LoopPool>> LoopPool::Start(int threads, std::chrono::microseconds spin) {
  auto pool = std::make_shared<LoopPool>();
  for (int i = 0; i < std::max(1, threads); ++i) {
    pool->loops_.push_back(std::make_unique<EventLoop>("io-" + std::to_string(i), spin));
    FERRY_RETURN_IF_ERROR(pool->loops_.back()->Start());
  }
  return pool;
}

std::vector<EventLoop*> LoopPool::loops() const {
  std::vector<EventLoop*> raw;
  for (const auto& l : loops_) raw.push_back(l.get());
  return raw;
}

void LoopPool::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& l : loops_) l->Stop();
}

Listener::Listener(Kind kind, UniqueFd fd, std::vector<EventLoop*> loops,
                   std::shared_ptr<const ServerContext> server, uint32_t send_buffer)
    : kind_(kind),
      fd_(std::move(fd)),
      loops_(std::move(loops)),
      server_(std::move(server)),
      send_buffer_(send_buffer) {}

void Listener::Serve(const std::shared_ptr<Listener>& listener, EventLoop* loop) {
  loop->RunInLoop([loop, listener] {
    Status s = loop->Add(listener->fd(), EPOLLIN, listener);
    if (!s.ok()) FERRY_LOG(kError, "cannot serve a listening socket: " << s);
  });
}

void Listener::OnEvents(uint32_t) {
  while (true) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int c = ::accept4(fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) FERRY_LOG(kWarning, "accept: " << ErrnoString(errno));
      return;
    }
    int pid = 0;
    if (kind_ == Kind::kTcp) {
      SetNoDelay(c);
      if (send_buffer_ != 0) SetSendBuffer(c, static_cast<int>(send_buffer_));
    } else {
      pid = PeerPid(c);
    }
    EventLoop* loop = loops_[next_++ % loops_.size()];
    auto conn = std::make_shared<Connection>(loop, UniqueFd(c), Connection::Role::kAccepted,
                                             "accepted connection " + std::to_string(c), server_, 0);
    if (pid != 0) conn->SetPeerProcess(pid);
    loop->RunInLoop([conn] {
      Status s = conn->Attach();
      if (!s.ok()) FERRY_LOG(kWarning, "cannot serve accepted connection: " << s);
    });
  }
}

StreamLink::StreamLink(const StreamLinkConfig& cfg, std::string peer_id, uint16_t version,
                       std::vector<std::shared_ptr<Connection>> streams)
    : max_frame_bytes_(cfg.max_frame_bytes),
      max_frame_entries_(cfg.max_frame_entries),
      stream_window_(cfg.stream_window),
      copy_(cfg.copy),
      peer_id_(std::move(peer_id)),
      version_(version),
      streams_(std::move(streams)),
      tracker_(std::make_shared<WriteTracker>()) {}

std::shared_ptr<PeerLink> StreamLink::Open(const StreamLinkConfig& cfg, std::string peer_id, uint16_t version,
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

void StreamLink::WireStreams() {
  std::weak_ptr<StreamLink> weak = weak_from_this();
  for (const auto& s : streams_) {
    s->SetOnProgress([weak] {
      if (auto link = weak.lock()) link->Feed();
    });
  }
}

void StreamLink::Post(const std::shared_ptr<BatchState>& batch, std::vector<Slice> slices,
                      Clock::time_point deadline) {
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

Status StreamLink::Notify(const wire::NotifyBody& body, Clock::time_point deadline) {
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

bool StreamLink::Healthy() const {
  for (const auto& s : streams_) {
    if (s->Broken()) return false;
  }
  return true;
}

void StreamLink::Retire() {
  // Nothing waits here once the link is retired: hand every frame over
  // (the streams close when they have answered all of them).
  Feed(/*ignore_window=*/true);
  for (const auto& s : streams_) s->RetireWhenIdle();
}

void StreamLink::Feed(bool ignore_window) {
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

bool StreamLink::Windowed(const Request& r) {
  constexpr uint64_t kMinWindowedEntry = 16u << 10;
  return r.type == wire::FrameType::kWrite && r.bytes >= kMinWindowedEntry * r.slices.size();
}

Connection* StreamLink::PickStream() {
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

}  // namespace ferry::internal::tcp
