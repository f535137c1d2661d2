#include "transport/stream/stream_link.h"

#include <algorithm>

namespace ferry::internal::stream {

StreamLink::StreamLink(const StreamLinkConfig& cfg, std::string peer_id, uint16_t version,
                       std::vector<std::shared_ptr<Connection>> streams)
    : max_frame_bytes_(cfg.max_frame_bytes),
      max_frame_entries_(cfg.max_frame_entries),
      stream_window_(cfg.stream_window),
      file_read_window_(cfg.file_read_window),
      encoder_(cfg.encoder),
      peer_id_(std::move(peer_id)),
      version_(version),
      streams_(std::move(streams)),
      tracker_(std::make_shared<WriteTracker>()),
      budget_(std::make_shared<PeerBudget>(cfg.max_outstanding_slices, cfg.max_outstanding_bytes)) {
}

std::shared_ptr<PeerLink> StreamLink::Open(const StreamLinkConfig& cfg, std::string peer_id,
                                           uint16_t version,
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

void StreamLink::Post(const PostContext& ctx, std::vector<Slice> slices) {
  std::vector<RequestFrame> frames;
  size_t i = 0;
  bool exhausted = false;
  auto queue = [&] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (RequestFrame& r : frames) backlog_.push_back(std::move(r));
    }
    frames.clear();
    Feed();
  };
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
    RequestFrame r;
    r.batch = ctx.batch;
    r.deadline = ctx.deadline;
    r.bytes = bytes;
    r.write = op == Opcode::kWrite;
    r.slices.assign(slices.begin() + i, slices.begin() + j);
    r.to_files = std::any_of(r.slices.begin(), r.slices.end(), [&](const Slice& s) {
      return ctx.peer && ctx.peer->KindOf(s.remote_region).type() == MemoryKind::Type::kFile;
    });
    i = j;
    if (!exhausted && !budget_->TryAcquire(r.slices.size(), bytes)) {
      // No room now: what is built goes out first, then wait for answers.
      queue();
      exhausted = !budget_->Acquire(r.slices.size(), bytes, ctx.deadline);
    }
    if (exhausted) {
      FailFrame(r, ResourceExhaustedError(
                       "peer " + peer_id_ +
                       " had no room for more requests before the transfer deadline (" +
                       budget_->Describe() + ")"));
      continue;
    }
    r.budget = budget_;
    encoder_->Encode(op, r.slices.data(), r.slices.size(), bytes, version_, &r);
    if (r.write) {
      r.tracker = tracker_;
      r.ticket = tracker_->Issue();
    }
    frames.push_back(std::move(r));
  }
  queue();
}

Status StreamLink::Notify(const wire::NotifyBody& body, Clock::time_point deadline) {
  uint64_t bound = tracker_->Next();
  if (!tracker_->WaitBelow(bound, deadline)) {
    return DeadlineExceededError("earlier writes to " + peer_id_ +
                                 " did not complete before the notification deadline");
  }
  RequestFrame r;
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

bool StreamLink::Idle() const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!backlog_.empty()) return false;
  }
  if (!budget_->Idle()) return false;
  for (const auto& s : streams_) {
    if (!s->Quiet()) return false;
  }
  return true;
}

bool StreamLink::Closing() const {
  for (const auto& s : streams_) {
    if (s->GoneAway()) return true;
  }
  return false;
}

void StreamLink::Retire() {
  // Nothing waits here once the link is retired: hand every frame over
  // (the streams close when they have answered all of them).
  Feed(/*ignore_window=*/true);
  for (const auto& s : streams_) s->RetireWhenIdle();
}

void StreamLink::Feed(bool ignore_window) {
  while (true) {
    RequestFrame r;
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
        const RequestFrame& next = backlog_.front();
        const uint64_t window = ignore_window ? 0 : Window(next);
        if (window != 0 && !to->Broken() && q != 0 && q + next.bytes > window) return;
      }
      r = std::move(backlog_.front());
      backlog_.pop_front();
    }
    if (late) {
      FailFrame(r, DeadlineExceededError("no stream to peer " + peer_id_ +
                                         " had room for the request before the transfer deadline"));
    } else {
      to->Send(std::move(r));
    }
  }
}

uint64_t StreamLink::Window(const RequestFrame& r) const {
  constexpr uint64_t kMinWindowedEntry = 16u << 10;
  if (r.to_files) return r.write ? 0 : file_read_window_;
  // Writes to the peer's file regions are not held back by the stream
  // window: its disk needs a queue of them, and their bytes land in a
  // staging buffer, not in memory a later read finds in cache (the peer
  // bounds that staging by pausing the stream).
  return r.write && r.bytes >= kMinWindowedEntry * r.slices.size() ? stream_window_ : 0;
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

}  // namespace ferry::internal::stream
