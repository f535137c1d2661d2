#include "transport/fabric/fabric_notify.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <algorithm>

#include "base/target.h"
#include "common/log.h"
#include "transport/fabric/fabric_domain.h"
#include "transport/fabric/fabric_info.h"
#include "transport/fabric/fabric_messages.h"
#include "transport/fabric/fabric_posting.h"
#include "transport/fabric/fabric_progress.h"

namespace ferry::internal::fabric {
namespace {

// Peers a target answers (their addresses stay in its address vector).
constexpr size_t kMaxReplyAddresses = 4096;

Status ShutDownError() { return CancelledError("the fabric endpoint was shut down"); }

}  // namespace

Status Notifications::PostReceives() {
  for (int i = 0; i < kRecvBuffers; ++i) {
    auto b = std::make_unique<MsgBuf>();
    b->kind = Kind::kRecv;
    b->data.resize(kMaxMessage);
    FERRY_RETURN_IF_ERROR(md_.RegisterBuffer(*b, FI_RECV));
    FERRY_RETURN_IF_ERROR(PostRecv(*b));
    recvs_.push_back(std::move(b));
  }
  return OkStatus();
}

Status Notifications::PostRecv(MsgBuf& b) {
  const ssize_t ret =
      fi_recv(fids_.ep, b.data.data(), b.data.size(), b.desc, FI_ADDR_UNSPEC, &b.fi);
  if (ret != 0) {
    return UnavailableError("posting a receive: " + ErrorText(static_cast<int>(ret)));
  }
  return OkStatus();
}

// ---- the notifying side -------------------------------------------------------

Status Notifications::Notify(const std::shared_ptr<RemotePeer>& peer, const wire::NotifyBody& body,
                             Clock::time_point deadline) {
  if (peer->broken()) return UnavailableError(peer->why_broken());
  // After every earlier write of this engine to the peer.
  FERRY_RETURN_IF_ERROR(WaitForWrites(peer, deadline));
  FERRY_ASSIGN_OR_RETURN(const uint64_t seq, Send(*peer, body));
  return AwaitAck(*peer, seq, deadline);
}

Status Notifications::WaitForWrites(const std::shared_ptr<RemotePeer>& peer,
                                    Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, deadline,
                      [&] { return peer->writes_pending() == 0 || wakeup_.stopping(); })) {
    return DeadlineExceededError(
        "fabric " + cfg_.provider + ": notification to " + peer->label() +
        " not sent before its deadline: " + std::to_string(peer->writes_pending()) +
        " earlier writes still pending");
  }
  if (wakeup_.stopping()) return ShutDownError();
  return OkStatus();
}

void Notifications::WakeWriteWaiters() {
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

StatusOr<uint64_t> Notifications::Send(const RemotePeer& peer, const wire::NotifyBody& body) {
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (wakeup_.stopping()) return ShutDownError();
    seq = next_seq_++;
    acks_[seq] = std::nullopt;
  }
  Message m;
  m.type = MessageType::kNotify;
  m.seq = seq;
  m.reply_to = fids_.address;
  m.notify = body;
  auto b = std::make_unique<MsgBuf>();
  b->kind = Kind::kSend;
  b->notify_seq = seq;
  b->to = peer.addr();
  EncodeMessage(m, &b->data);
  if (Status reg = md_.RegisterBuffer(*b, FI_SEND); !reg.ok()) {
    Forget(seq);
    return reg;
  }
  if (!posting_.QueueSend(b.get())) {
    Forget(seq);
    CloseFid(b->mr);
    return ShutDownError();
  }
  b.release();  // posting's now
  wakeup_.Wake();
  return seq;
}

Status Notifications::AwaitAck(const RemotePeer& peer, uint64_t seq, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool answered = cv_.wait_until(lock, deadline, [&] { return acks_[seq].has_value(); });
  Status result = answered ? *acks_[seq]
                           : DeadlineExceededError("fabric " + cfg_.provider + ": " + peer.label() +
                                                   " did not acknowledge the notification "
                                                   "before its deadline");
  acks_.erase(seq);
  if (answered && !result.ok() && result.code() != StatusCode::kCancelled &&
      result.message().find("fabric ") != 0) {
    return result.WithPrefix("peer " + peer.label() + " refused");
  }
  return result;
}

void Notifications::Forget(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  acks_.erase(seq);
}

// ---- the progress thread --------------------------------------------------------

void Notifications::OnRecv(MsgBuf& b, size_t len) {
  auto m = DecodeMessage(std::string_view(b.data.data(), std::min(len, b.data.size())));
  if (!m.ok()) {
    FERRY_LOG(kWarning, "fabric " << cfg_.provider << ": dropped a message: " << m.status());
  } else if (m->type == MessageType::kAck) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = acks_.find(m->seq);
    if (it != acks_.end()) it->second = m->status;
    cv_.notify_all();
  } else {
    Status delivered = cfg_.target->Deliver({m->notify.sender, m->notify.name, m->notify.message});
    SendAck(m->reply_to, m->seq, delivered);
  }
  if (!wakeup_.stopping()) {
    Status s = PostRecv(b);
    if (!s.ok()) FERRY_LOG(kError, "fabric " << cfg_.provider << ": " << s);
  }
}

void Notifications::OnRecvError(MsgBuf& b, int err, const std::string& provider_text) {
  if (wakeup_.stopping()) return;
  FERRY_LOG(kWarning, "fabric " << cfg_.provider << ": a receive failed: " << ErrorText(err) << " "
                                << provider_text);
  (void)PostRecv(b);
}

StatusOr<fi_addr_t> Notifications::ReplyAddress(const std::string& to) {
  auto it = reply_addrs_.find(to);
  if (it != reply_addrs_.end()) return it->second;
  FERRY_RETURN_IF_ERROR(fids_.CheckAddress(to));
  if (reply_addrs_.size() >= kMaxReplyAddresses) {
    return ResourceExhaustedError("answering more than " + std::to_string(kMaxReplyAddresses) +
                                  " peers");
  }
  fi_addr_t a = FI_ADDR_UNSPEC;
  if (fi_av_insert(fids_.av, to.data(), 1, &a, 0, nullptr) != 1) {
    return InvalidArgumentError("the address could not be inserted");
  }
  reply_addrs_.emplace(to, a);
  return a;
}

void Notifications::SendAck(const std::string& to, uint64_t seq, const Status& status) {
  auto addr = ReplyAddress(to);
  if (!addr.ok()) {
    FERRY_LOG(kWarning, "fabric " << cfg_.provider << ": cannot acknowledge notification " << seq
                                  << ": " << addr.status());
    return;
  }
  Message ack;
  ack.type = MessageType::kAck;
  ack.seq = seq;
  ack.status = status;
  auto b = std::make_unique<MsgBuf>();
  b->kind = Kind::kSend;
  EncodeMessage(ack, &b->data);
  b->to = *addr;
  if (Status s = md_.RegisterBuffer(*b, FI_SEND); !s.ok()) {
    FERRY_LOG(kWarning, "fabric " << cfg_.provider << ": " << s);
    return;
  }
  // Posted by this thread's next round (PostSends). Posting stops only once
  // this thread has, so it takes the message.
  if (posting_.QueueSend(b.get())) {
    b.release();
  } else {
    CloseFid(b->mr);
  }
}

void Notifications::PostSends() {
  for (const Posting::RefusedSend& r : posting_.PostSends()) OnSendDone(r.buf, r.err, r.text);
}

void Notifications::OnSendDone(MsgBuf* b, int err, const std::string& text) {
  posting_.Sent(b);
  if (b->notify_seq != 0 && err != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = acks_.find(b->notify_seq);
    if (it != acks_.end()) {
      it->second = UnavailableError("fabric " + cfg_.provider +
                                    ": sending the notification failed: " + ErrorText(err) +
                                    (text.empty() ? "" : " (" + text + ")"));
    }
    cv_.notify_all();
  }
  CloseFid(b->mr);
  delete b;
}

// ---- shutdown -------------------------------------------------------------------

void Notifications::CancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [seq, st] : acks_) {
    if (!st) st = ShutDownError();
  }
  cv_.notify_all();
}

void Notifications::CloseReceives() {
  for (auto& b : recvs_) CloseFid(b->mr);
  recvs_.clear();
}

}  // namespace ferry::internal::fabric
