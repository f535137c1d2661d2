// The notification protocol of a fabric endpoint (messages in
// fabric_messages.h): a notification goes out after every earlier write to
// that peer completed, carrying this endpoint's address; the target
// delivers it to its inbox and answers with an acknowledgement carrying the
// inbox's status, which the sender waits for. The receive buffers are
// posted at Open and posted again after each message.
//
// Threads:
// - Notify, WaitForWrites: caller threads (the engine's notifier, a
//   FabricLink's Notify for the other rails), several at once. Both block,
//   until the condition or `deadline`.
// - WakeWriteWaiters: any thread that completed a peer's last pending write
//   (Posting's writes_drained hook).
// - OnRecv, OnRecvError, OnSendDone, PostSends: the progress thread
//   (OnSendDone also Shutdown's, for the messages never completed).
// - PostReceives: Open. CancelAll, CloseReceives: Shutdown.
//
// Lock: mu_ guards the acknowledgements awaited and the next sequence
// number; cv_ signals both an acknowledgement and a peer's writes reaching
// zero (its waiters check atomics: RemotePeer::writes_pending,
// Wakeup::stopping). mu_ is a leaf: nothing else is locked, posted or
// delivered under it. The receive buffers and the reply addresses are the
// progress thread's alone (Open fills one before it starts, Shutdown
// clears it after it stopped).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "base/transport.h"
#include "ferry/status.h"
#include "transport/fabric/fabric_common.h"
#include "transport/fabric/fabric_peer.h"
#include "wire/frame.h"

namespace ferry::internal::fabric {

class MemoryDomain;
class Posting;
class Wakeup;

// Receive buffers posted for notifications and acknowledgements.
inline constexpr int kRecvBuffers = 4;

class Notifications {
 public:
  Notifications(const EndpointConfig& cfg, const Fids& fids, MemoryDomain& md, Posting& posting,
                Wakeup& wakeup)
      : cfg_(cfg), fids_(fids), md_(md), posting_(posting), wakeup_(wakeup) {}
  Notifications(const Notifications&) = delete;
  Notifications& operator=(const Notifications&) = delete;

  // Registers and posts the receive buffers.
  Status PostReceives();

  // Sends after every write posted to `peer` before it has completed, and
  // returns the peer's answer (kDeadlineExceeded at `deadline`).
  Status Notify(const std::shared_ptr<RemotePeer>& peer, const wire::NotifyBody& body,
                Clock::time_point deadline);
  // Returns once every write posted to `peer` before it has completed
  // (kDeadlineExceeded at `deadline`, kCancelled at shutdown).
  Status WaitForWrites(const std::shared_ptr<RemotePeer>& peer, Clock::time_point deadline);
  void WakeWriteWaiters();

  // A message arrived in receive buffer `b` (`len` bytes).
  void OnRecv(MsgBuf& b, size_t len);
  void OnRecvError(MsgBuf& b, int err, const std::string& provider_text);
  // A send completed (err 0) or failed; frees it.
  void OnSendDone(MsgBuf* b, int err, const std::string& text);
  // Posts the queued messages (Posting::PostSends); fails those refused.
  void PostSends();

  // Fails every notification still awaiting its acknowledgement with
  // kCancelled and wakes every waiter.
  void CancelAll();
  // Closes the receive buffers' registrations (the endpoint is closed).
  void CloseReceives();

 private:
  // Queues the notification's message; its sequence number.
  StatusOr<uint64_t> Send(const RemotePeer& peer, const wire::NotifyBody& body);
  // Waits for notification `seq`'s acknowledgement.
  Status AwaitAck(const RemotePeer& peer, uint64_t seq, Clock::time_point deadline);
  void Forget(uint64_t seq);
  void SendAck(const std::string& to, uint64_t seq, const Status& status);
  // The address vector's entry of a notifying peer's address `to`.
  StatusOr<fi_addr_t> ReplyAddress(const std::string& to);
  Status PostRecv(MsgBuf& b);

  const EndpointConfig& cfg_;
  const Fids& fids_;
  MemoryDomain& md_;
  Posting& posting_;
  Wakeup& wakeup_;

  std::mutex mu_;
  std::condition_variable cv_;
  // Acknowledgements awaited, by sequence number (nullopt until answered).
  std::map<uint64_t, std::optional<Status>> acks_;
  uint64_t next_seq_ = 1;

  // The progress thread's.
  std::vector<std::unique_ptr<MsgBuf>> recvs_;
  std::map<std::string, fi_addr_t> reply_addrs_;
};

}  // namespace ferry::internal::fabric
