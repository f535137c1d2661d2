// Engine: registers memory, opens peer segments and moves bytes between them
// with batched one-sided reads and writes.
//
// Thread safety: every method may be called from any number of threads at
// once. Blocking calls (OpenSegment, WaitBatch, TransferSync,
// SendNotification) block only the calling thread.
//
// Lifetime: memory passed to RegisterMemory must stay valid until it is
// unregistered. The engine must outlive every batch and segment handle it
// returned; destroying the engine fails whatever is still in flight with
// kCancelled and stops its threads.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/export.h"
#include "ferry/file_region.h"
#include "ferry/options.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry {

class FERRY_API Engine {
 public:
  // Starts an engine: binds the rpc port and starts its event loops.
  static StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // "host:port" (IPv6 hosts in brackets): how peers name this engine.
  const std::string& PeerId() const;
  uint16_t RpcPort() const;
  const std::string& LocalName() const;
  Capabilities GetCapabilities() const;
  // The options in effect (after defaults were resolved).
  const EngineOptions& options() const;

  // ---- Memory --------------------------------------------------------------
  // `location` names the memory kind ("cpu", "cpu:N", "cuda:N", "*"; see
  // MemoryRegion). Every transport that needs a per-region key registers the
  // region too, and peers see it (with its kind and keys) in this engine's
  // published descriptor from the moment this returns. A region registered
  // with MemoryRegion::exported = false is for this engine's own transfers
  // only: peers do not see it and their requests into it are refused.
  // kInvalidArgument: null address, zero length or an unknown location.
  // kAlreadyExists: the range overlaps a registered region (named).
  // GPU memory: "cuda:N" ("cuda" = "cuda:0"), or "*" over memory the CUDA
  // driver reports as one device's, registers it as that device's kind.
  // Peers on this host reach it through cuda_ipc, others over tcp (whose
  // target stages it through host memory); this engine's own transfers of
  // it over shm, fabric and tcp are staged through page-locked host buffers
  // (docs/architecture.md, "Memory kinds: cuda").
  // kInvalidArgument too: "cuda:N" for a device N this machine does not
  // have, or a range whose first or last byte is not GPU memory of device N;
  // a host ("cpu", "cpu:N") registration of memory the driver reports as GPU
  // memory (checked when this process has loaded libcuda.so.1); "*" over GPU
  // memory that is not all of one device.
  // kFailedPrecondition: "cuda:N" without a usable CUDA driver (naming why:
  // libcuda.so.1 not found, cuInit failed, an entry point the GPU data paths
  // need missing).
  Status RegisterMemory(void* addr, size_t length, std::string_view location = "*");
  // All or nothing: on failure no region of the list stays registered.
  Status RegisterMemory(std::span<const MemoryRegion> regions);
  // kNotFound: no region starts at `addr`.
  // Guarantee once it returns: no transfer of this engine or of a peer reads
  // or writes the region any more, and none will. Two-sided transports
  // (local, shm, tcp: the target validates every range) pin a region while
  // bytes move, and this waits for the pins; a request arriving later is
  // refused. A one-sided transport (the peer's NIC writes with a key, no
  // validation here) gets its key revoked (Transport::UnregisterRegion)
  // before this returns, after the pins are gone, so later remote accesses
  // fail at the fabric. What is not guaranteed: a peer's request already
  // accepted completes into the region before this returns, so its bytes may
  // still appear there — unregister only memory no peer is writing.
  // This engine's own fabric operations that failed at their deadline stay
  // with the provider until it completes them (a read's bytes may still
  // land): this first waits for those touching the region, at most
  // transfer_timeout; kFailedPrecondition naming one if it is still there
  // then, and the region stays registered (do not free the memory yet).
  Status UnregisterMemory(void* addr);
  // Unregisters each; returns the first error (the others are still tried).
  Status UnregisterMemory(std::span<void* const> addrs);

  // ---- Shared memory (docs/architecture.md, "Mapped segments") ---------------
  // Allocates `length` bytes of host memory that same-host peers can map (a
  // memfd sealed against shrinking, zero-filled), registers it (`location`,
  // `exported` as in MemoryRegion) and returns its address. A peer on this
  // host copies into and out of it with plain loads and stores through its
  // own mapping (shm transport), without a request to this engine; others
  // reach it like any registered memory. Freed by FreeShared, or unmapped
  // when the engine is destroyed. kInvalidArgument: length 0 or a location
  // that is not host memory; kResourceExhausted: no memory or descriptor.
  StatusOr<void*> AllocateShared(size_t length, std::string_view location = "cpu",
                                 bool exported = true);
  // Unregisters memory from AllocateShared (with UnregisterMemory's
  // guarantee; peers' copies through their mappings have ended too, and
  // later ones are refused) and unmaps it. kNotFound: not such memory.
  Status FreeShared(void* addr);

  // ---- Files (docs/architecture.md, "Memory kinds: file") ---------------------
  // Registers a range of a file as a region of the memory kind `file` and
  // returns its base address: a reserved address range (nothing is mapped
  // there; never dereference it) where address base + k stands for file
  // offset file.offset + k. Transfers name it like memory (TransferRequest
  // local or remote_addr); this engine's own transfers between it and cpu
  // or GPU memory go through the `local` transport (open this engine's own
  // segment), a peer's through tcp or shm (this engine does the I/O); as the
  // local side of a request to a peer's memory over tcp or shm, each slice is
  // staged through a host buffer of this engine. The bytes
  // move through io_uring (EngineOptions::file_queue_depth), with O_DIRECT
  // when buffer, offset and length are aligned for it. A write completes
  // once the kernel completed it (durable: once on stable storage). The
  // engine opens the file itself: the caller may close its descriptor.
  // UnregisterMemory(base) unregisters it (and releases the file).
  // kInvalidArgument: neither or both of path and fd, not a regular file, a
  // range past the end of the file (naming it); kNotFound: no such file;
  // kFailedPrecondition: the kernel refuses io_uring.
  StatusOr<void*> RegisterFile(const FileRegion& file);

  // ---- Segments ------------------------------------------------------------
  // Opens the segment of the peer "host:port": exchanges descriptors
  // (handshake) and agrees on a wire version. Cached: opening the same peer
  // again returns the same handle. Data connections are made lazily.
  // kFailedPrecondition: no common wire version or a missing capability (the
  // message names both sides' versions); kUnavailable: peer unreachable.
  StatusOr<SegmentHandle> OpenSegment(std::string_view peer_id);
  // Forgets the segment; later use of the handle is kInvalidArgument.
  // Transfers already submitted through it still complete (or fail) as
  // usual; the connections close once they have.
  Status CloseSegment(SegmentHandle segment);
  // Re-handshakes with the peer and returns what it advertises now.
  StatusOr<SegmentInfo> QuerySegment(SegmentHandle segment);
  // What this engine knows of the peer from its last handshake or imported
  // metadata; no round trip.
  StatusOr<SegmentInfo> DescribeSegment(SegmentHandle segment) const;

  // ---- Batches -------------------------------------------------------------
  // kInvalidArgument: capacity 0 or above kMaxBatchCapacity (ferry/limits.h).
  StatusOr<BatchId> AllocateBatch(size_t capacity);
  // Submits requests; may be called several times per batch. Validates every
  // request first; if one is bad, none is submitted and the error names it.
  // The requests of a batch run in no particular order and possibly in
  // parallel (the engine groups them by peer, opcode and destination address):
  // requests whose ranges overlap, or a read of what another request of the
  // same batch writes, give undefined bytes. Order them across batches.
  // kResourceExhausted: more requests than the batch's remaining capacity.
  Status Submit(BatchId batch, std::span<const TransferRequest> requests);
  // State of the index-th request submitted to the batch.
  StatusOr<TransferStatus> GetTransferStatus(BatchId batch, size_t index) const;
  StatusOr<BatchStatus> GetBatchStatus(BatchId batch) const;
  // GetBatchStatus for callers that poll in a loop. When it is called again
  // within 200 us (or 4 x `wait`, if less) of its previous return while
  // requests are pending (a caller spinning on it), it first waits one step:
  // within wait_spin of the batch becoming busy it yields the core once (as
  // WaitBatch spins then); later it blocks, without spinning, until any
  // batch or transfer of this engine finished (this one or another: a caller
  // polling several in turn looks at the others at once) or `wait` passed,
  // so the spinning caller leaves the core to the engine's threads that move
  // the data. Otherwise (nothing pending, a caller that checks now and then)
  // it reports at once. `wait` 0: GetBatchStatus.
  StatusOr<BatchStatus> PollBatch(BatchId batch, std::chrono::microseconds wait) const;
  // For event loops, before they wait on CompletionFd: polls the batch for
  // at most `spin` and never blocks -- moving same-host replies on itself, as
  // WaitBatch does while it spins -- then reports its status, pending or
  // not. A small transfer ends within it and needs no wake-up (the options'
  // await_spin is what ferry.aio passes). `spin` 0: GetBatchStatus.
  StatusOr<BatchStatus> SpinBatch(BatchId batch, std::chrono::microseconds spin) const;
  // Waits until every submitted request finished or the timeout passed.
  // OK: all completed; the first failure's status if any failed;
  // kDeadlineExceeded if requests are still pending at the timeout.
  Status WaitBatch(BatchId batch, std::chrono::milliseconds timeout);
  // kFailedPrecondition while requests are still pending (each request ends,
  // at the latest, at its transfer_timeout).
  Status FreeBatch(BatchId batch);

  // Submits, waits (transfer_timeout) and frees. OK iff every request completed.
  Status TransferSync(const TransferRequest& request);
  Status TransferSync(std::span<const TransferRequest> requests);
  // Cancels every request of the batch still pending: they fail with
  // kCancelled. Guarantee once it returns: no byte of a read of this batch
  // lands in local memory any more, so its buffers may be reused (on every
  // transport; only shm targets of builds before "shm-lend-reads" copy reads
  // themselves, see docs/reliability.md). Bytes of writes already on their
  // way may still land at the target in full or in part. The batch may be
  // freed right away.
  Status CancelBatch(BatchId batch);

  // ---- Prepared transfers --------------------------------------------------
  // A descriptor list is registered once and then named by index: local
  // rows are checked against this engine's registered memory, remote rows
  // against the segment's descriptor as of its last handshake (no round
  // trip). Either way every entry must lie inside one registered region.
  // kInvalidArgument: an empty list, a zero length, count 0, a range that
  // wraps, more than kMaxDescListEntries entries; kNotFound: an entry
  // outside every (exported) region, naming the row, the entry and the peer.
  // A remote list is bound to the peer instance it was checked against:
  // once the peer restarted, transfers using it fail with
  // kFailedPrecondition (prepare it again after the peer's new descriptor
  // was fetched: QuerySegment or ImportMetadata).
  StatusOr<DescListHandle> PrepareLocalList(std::span<const DescRow> rows);
  StatusOr<DescListHandle> PrepareRemoteList(SegmentHandle segment, std::span<const DescRow> rows);
  // Entries of the list (rows with their strides expanded).
  StatusOr<size_t> DescListEntries(DescListHandle list) const;
  // Transfers made from the list keep what they need; releasing it does not
  // affect them.
  Status ReleaseDescList(DescListHandle list);

  // A transfer of pairs of entries: local entry local_indices[k] with
  // remote entry remote_indices[k], which must be equally long. Checked
  // here once (counts, indices in range, lengths pairwise); adjacent pairs
  // (contiguous on both sides) are merged. `notification`, if given, is
  // delivered to the remote engine once the transfer's data is complete
  // there (for a read: once it is in local memory, so the owner knows its
  // memory was read); the transfer completes when the peer acknowledged it.
  // kInvalidArgument names the bad pair; at most kMaxBatchCapacity pairs.
  StatusOr<TransferHandle> MakeTransfer(Opcode opcode, DescListHandle local,
                                        std::span<const uint32_t> local_indices,
                                        DescListHandle remote,
                                        std::span<const uint32_t> remote_indices,
                                        std::optional<Notification> notification = std::nullopt);
  // Posts the transfer (again, once an earlier post finished). `notification`
  // replaces the one given to MakeTransfer for this post.
  // kFailedPrecondition: still in flight, the remote list belongs to a peer
  // instance that restarted (the message says which), or the notification is
  // longer than an older peer takes (kMaxNotificationMessageV1; so are
  // MakeTransfer's and SendNotification's).
  Status PostTransfer(TransferHandle transfer,
                      std::optional<Notification> notification = std::nullopt);
  // kPending, kCompleted or kFailed with the first failure (request index,
  // peer, range, reason). A transfer that failed is cancelled first: once
  // this reports kFailed, none of its bytes land locally any more.
  // kFailedPrecondition: never posted.
  StatusOr<TransferStatus> GetTransferStatus(TransferHandle transfer);
  // GetTransferStatus for callers that poll in a loop; waits like PollBatch
  // for its data (while only its notification is on its way: one yield).
  StatusOr<TransferStatus> PollTransfer(TransferHandle transfer, std::chrono::microseconds wait);
  // SpinBatch for the transfer's current post, its notification included:
  // at most `spin`, never blocking, then GetTransferStatus.
  StatusOr<TransferStatus> SpinTransfer(TransferHandle transfer, std::chrono::microseconds spin);
  // Waits until the transfer finished or the timeout passed; like WaitBatch.
  Status WaitTransfer(TransferHandle transfer, std::chrono::milliseconds timeout);
  // Of the last post; kFailedPrecondition if never posted.
  StatusOr<TransferTelemetry> GetTransferTelemetry(TransferHandle transfer) const;
  // Cancels the current post (if still pending) with CancelBatch's
  // guarantee; the transfer may be posted again right away.
  Status CancelTransfer(TransferHandle transfer);
  // Cancels it if it is in flight and forgets it.
  Status ReleaseTransfer(TransferHandle transfer);

  // ---- Event loops ---------------------------------------------------------
  // A file descriptor that becomes readable when a batch or a prepared
  // transfer of this engine finishes, so an event loop (epoll, libuv,
  // asyncio's add_reader) waits for transfers without a thread per wait and
  // without polling in a loop. "Finishes": a batch's last pending request
  // completed, failed or was cancelled (its GetBatchStatus is no longer
  // kPending); a prepared transfer's post ended, its notification included
  // (GetTransferStatus no longer kPending).
  //
  // What it is: an eventfd (EFD_NONBLOCK | EFD_CLOEXEC) created with the
  // engine. Each finish adds 1 to its counter (one write(2), on the thread
  // that finished it); it is readable while the counter is not 0, so it is
  // level-triggered for poll/select/epoll (with EPOLLET each finish is an
  // edge). A read of 8 bytes returns the count since the last read and
  // resets it to 0; several finishes may so give one wake-up, and a finish
  // of something nobody waits for gives a wake-up too. It says THAT
  // something finished, not what: the waiter checks the statuses.
  //
  // The waiting protocol, which never loses a finish:
  //   fd = CompletionFd();            // once, before submitting or posting
  //   submit / post ...;
  //   for (;;) {
  //     read(fd, &count, 8);          // reset (EAGAIN: it was 0; fine)
  //     check the status of each batch / transfer waited for;
  //     if all finished: break;
  //     wait until fd is readable;    // poll, epoll_wait, add_reader...
  //   }
  // The read comes before the check: a finish after the check writes after
  // the read, so the fd is readable when the wait begins. One reader per fd:
  // a read consumes every waiter's wake-up, so several waiters share one
  // reader that checks all of them (as ferry.aio does: one per event loop).
  //
  // Arming and cost: until the first call the engine writes nothing (a
  // finish costs one memory fence). From the first call on, each batch or
  // post that finishes after the call returned writes once: one write(2)
  // per batch, not per request. Call it before submitting what you will
  // wait for; a batch that finished before the call shows as finished at
  // the first check of the protocol. The write follows the finish's state
  // (so no finish is lost), hence it can land just after a caller already
  // saw that state, e.g. after a synchronous call returned: a wake-up may
  // find nothing new, and the protocol's loop simply checks and waits again.
  // Lifetime: the engine owns the descriptor; callers must not close it.
  // The engine's destructor writes once more (a waiter wakes and learns the
  // engine is gone from its own bookkeeping) and closes it: remove it from
  // the event loop before destroying the engine, or wait on a dup() of it
  // (which the caller then owns and closes; nothing writes to it any more
  // once the engine is gone).
  int CompletionFd();
  // What finished since the previous call (see FinishedWork): the batches
  // and prepared transfers whose finish wrote the completion descriptor,
  // recorded before the write. A waiter of the protocol above may, after
  // its read, take these and check only them instead of everything it
  // waits for (each wake-up then costs what finished, not what waits);
  // with `overflowed`, or for what it began waiting on before its first
  // read, it checks as above. Finishes before CompletionFd's first call are
  // not recorded. One taker per engine, like the read: it hands on what
  // other waiters wait for.
  FinishedWork TakeFinished();

  // ---- Agent metadata --------------------------------------------------------
  // This engine's descriptor (name, how to reach it, every exported region)
  // as bytes, for callers that ship metadata over their own channel. Format
  // in docs/wire-format.md ("Exported metadata").
  std::string ExportMetadata() const;
  // Opens (or updates) the segment of the peer that exported `bytes`,
  // without a round trip; its later registrations become visible by
  // importing again or through QuerySegment. The wire version is negotiated
  // as in a handshake. kInvalidArgument: not metadata (or damaged);
  // kFailedPrecondition: no common wire version or a missing capability.
  StatusOr<SegmentHandle> ImportMetadata(std::string_view bytes);

  // ---- Telemetry -------------------------------------------------------------
  // Counters since the engine started (see EngineMetrics).
  EngineMetrics GetMetrics() const;
  // The same in Prometheus' text exposition format (what the endpoint
  // EngineOptions::metrics_address serves).
  std::string MetricsText() const;
  // "host:port" of the metrics endpoint; empty when it is off.
  std::string MetricsAddress() const;

  // ---- Notifications -------------------------------------------------------
  // Delivers {name, message} to the peer after every write this engine
  // submitted to it before this call has completed. Blocks until the peer
  // acknowledged it. Messages up to kMaxNotificationMessage (1 MiB); a peer
  // of an older build takes kMaxNotificationMessageV1 (kFailedPrecondition
  // names it). Notifications one thread sends to one peer arrive in order.
  Status SendNotification(SegmentHandle segment, std::string_view name, std::string_view message);
  // Drains the notifications received so far, oldest first.
  std::vector<Notification> GetNotifications();

  // Hidden: the engine's insides are not part of libferry.so's interface.
  class FERRY_LOCAL Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
