// BatchState: the requests of one batch and their completion, counted once
// here for every transport. src/base/ is the layer below both the core and
// the transports: what the core hands a transport (batches, the target, its
// memory registry, the Transport seam) and nothing that knows either side.
//
// Thread contract: Reserve/Begin are called by the submitting thread;
// CompleteSlice by any transport thread; readers (Get, Summary, Wait) by
// anyone. Request slots are allocated up front (capacity), so completions
// never race with a reallocation.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::internal {

class Metrics;
struct RouteCounters;

// How a caller waiting for its batch (BatchState::WaitIdle's spin) moves the
// batch on itself instead of waiting for a transport's thread to: a
// same-host stream over request rings lets the caller read its replies
// (stream/connection.h), so a synchronous request needs no third thread.
class BatchProgress {
 public:
  virtual ~BatchProgress() = default;
  // A caller starts polling; EndProgress follows once it stops.
  virtual void BeginProgress() = 0;
  // Moves work on if there is some now; whether there was. Never blocks.
  virtual bool Progress() = 0;
  virtual void EndProgress() = 0;
};

class BatchState {
 public:
  // `metrics` (may be null) counts this batch's requests by route and
  // outcome, and its busy periods in the latency histogram.
  explicit BatchState(size_t capacity, std::shared_ptr<Metrics> metrics = nullptr);

  size_t capacity() const { return capacity_; }
  // Number of requests reserved so far (submitted or being submitted).
  size_t reserved() const { return reserved_.load(std::memory_order_acquire); }

  // Reserves `n` request slots; returns the index of the first.
  // kResourceExhausted if they do not fit.
  StatusOr<size_t> Reserve(size_t n);
  // Marks request `index` pending with `slices` slices outstanding.
  // REQUIRES: index was reserved; slices > 0.
  void Begin(size_t index, uint32_t slices) {
    BeginRange(index, 1, [slices](size_t) { return slices; });
  }
  // Marks requests [first, first + n) pending, request i with
  // slices_of(i) > 0 slices outstanding; one update of the shared counter.
  // slices_of may call Describe(i, ...) for the metrics. False (and the
  // requests fail at once) if the batch was cancelled: post nothing then.
  template <class SlicesOf>
  bool BeginRange(size_t first, size_t n, SlicesOf slices_of) {
    std::lock_guard<std::mutex> lock(mu_);  // against Cancel
    if (cancelled_.load(std::memory_order_relaxed)) {
      FailRangeLocked(first, n);
      return false;
    }
    for (size_t i = first; i < first + n; ++i) {
      Slot& r = slots_[i];
      r.remaining.store(slices_of(i), std::memory_order_relaxed);
      r.state.store(static_cast<uint8_t>(TransferState::kPending), std::memory_order_relaxed);
    }
    // Pairs with the acq_rel decrement in Completer::Publish.
    if (pending_.fetch_add(n, std::memory_order_acq_rel) == 0) MarkBusy();
    return true;
  }
  // The metrics' route of a request (RouteTag) and its length.
  void Describe(size_t index, uint64_t length, uint8_t tag) { info_[index] = length << 8 | tag; }
  // A tag (1..255) for counting requests of this batch on `route`; 0 (not
  // counted) once a batch used 255 routes or without metrics.
  uint8_t RouteTag(RouteCounters* route);

  // Called, on the completing thread, each time the last pending request
  // finished (must not block). Set before the requests begin.
  void SetOnIdle(std::function<void()> on_idle) { on_idle_ = std::move(on_idle); }

  // ---- Cancellation ----------------------------------------------------
  // Transports bracket every store of read data into this engine's memory
  // (a recv, a copy) with these. BeginLanding false: the batch was
  // cancelled; drop the bytes instead (the slices may still be completed;
  // nobody looks at them any more).
  bool BeginLanding() {
    landing_.fetch_add(1, std::memory_order_seq_cst);
    if (cancelled_.load(std::memory_order_seq_cst)) {
      landing_.fetch_sub(1, std::memory_order_release);
      return false;
    }
    if (landing_parent_ && !landing_parent_->BeginLanding()) {
      landing_.fetch_sub(1, std::memory_order_release);
      return false;
    }
    return true;
  }
  void EndLanding() {
    if (landing_parent_) landing_parent_->EndLanding();
    landing_.fetch_sub(1, std::memory_order_release);
  }
  // A batch standing in for `parent`'s requests (the fault-injecting link's
  // shadow): its data lands only while the parent's may. Set before use.
  void SetLandingParent(std::shared_ptr<BatchState> parent) { landing_parent_ = std::move(parent); }
  // Fails every request still pending with `why` (as observers see them)
  // and returns once no transport thread stores read data of this batch
  // any more, nor will. Idempotent. Returns how many requests it failed.
  size_t Cancel(const Status& why);
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  // Completes one slice of request `index` (transports call this).
  void CompleteSlice(size_t index, const Status& status);
  // Completes `slices` slices of request `index` at once with one status.
  void CompleteSlices(size_t index, uint32_t slices, const Status& status);

  // Completes the slices of many requests (a transport frame's) and
  // publishes the batch's counters once, when it goes out of scope: per
  // request one atomic on its own slot instead of four, two of them on
  // counters that every stream's thread shares. Each request's own state is
  // final as soon as Complete returns; Summary and WaitIdle see the requests
  // when the Completer publishes. One thread, short-lived (one frame).
  class Completer {
   public:
    // While a Completer lives, Cancel waits for it (completing_), so it
    // claims its requests' final states with plain stores; one made after a
    // cancel began claims them by compare-and-swap against the cancel's
    // (a locked instruction per request is measurable on small-entry batches).
    explicit Completer(BatchState& batch) : batch_(batch) {
      batch_.completing_.fetch_add(1, std::memory_order_seq_cst);
      careful_ = batch_.cancelled_.load(std::memory_order_seq_cst);
    }
    ~Completer() {
      Publish();
      batch_.completing_.fetch_sub(1, std::memory_order_release);
    }
    Completer(const Completer&) = delete;
    Completer& operator=(const Completer&) = delete;

    void Complete(size_t index, uint32_t slices, const Status& status);
    void Publish();
    // Starts loading request `index`'s slot. A frame's slices are ordered
    // by address, so their requests are scattered over the batch: without
    // it, each Complete waits for a cache miss.
    void Prefetch(size_t index) const {
      __builtin_prefetch(&batch_.slots_[index], 1);
      if (batch_.info_) __builtin_prefetch(&batch_.info_[index], 0);
    }

   private:
    // Outcomes by route tag, added to the metrics once in Publish.
    struct Tally {
      uint8_t tag = 0;
      uint64_t ok = 0, failed = 0, ok_bytes = 0, failed_bytes = 0;
    };
    void Count(uint64_t info, bool failed);

    BatchState& batch_;
    bool careful_ = false;  // the batch was being cancelled when this began
    size_t completed_ = 0;
    size_t failed_ = 0;
    Tally tally_[2];
  };

  TransferStatus Get(size_t index) const;
  BatchStatus Summary() const;
  size_t pending() const { return pending_.load(std::memory_order_acquire); }
  // True when no request is pending any more (waiting out completions that
  // already published their final state but have not finished their
  // bookkeeping): then the batch may be freed.
  bool SettleIfFinal() const;

  // Waits until no request is pending (or the batch was cancelled) or the
  // deadline passes; spins for up to `spin` first (cheap when completion is
  // imminent). True when nothing is pending any more (whatever the outcome).
  bool WaitIdle(std::chrono::steady_clock::time_point deadline, std::chrono::microseconds spin);
  // A transport's way for a waiting caller to move this batch on (the first
  // offered is kept; any thread). WaitIdle's spin polls it.
  void OfferProgress(const std::shared_ptr<BatchProgress>& p);
  // One step of a caller polling the batch. Nothing pending: true at once.
  // A poll more than `tight` (default 4 x `wait`) after the previous one
  // returned (a caller that checks now and then, or the first poll) reports
  // at once too. A caller polling in a tight loop waits a step instead, so
  // that it leaves the core to the threads that move the data: within `spin`
  // of the batch becoming busy it yields the core once (completion may be
  // imminent, as in WaitIdle's spin); later it blocks, without spinning,
  // until nothing is pending or `wait` passed — or, given `block`, in
  // block(deadline), which returns early when the caller's engine finished
  // any work (so one poller of several transfers is not held by this one).
  // True when nothing is pending any more.
  bool PollIdle(std::chrono::microseconds wait, std::chrono::microseconds spin,
                std::optional<std::chrono::microseconds> tight = std::nullopt,
                const std::function<void(std::chrono::steady_clock::time_point)>& block = {});

 private:
  // One request's state. 8 bytes: batches of 100,000s of requests are
  // allocated per transfer.
  struct Slot {
    std::atomic<uint32_t> remaining{0};
    std::atomic<uint8_t> state{kNotBegun};  // TransferState, or kNotBegun
    std::atomic<bool> failed{false};
  };

  // A slot's state before its request began (reserved by a Submit still
  // in progress): pending to observers, never touched by Cancel.
  static constexpr uint8_t kNotBegun = 0xff;

  void MarkBusy();
  void OnIdle();
  void FailRangeLocked(size_t first, size_t n);
  void CountCancelled(size_t index);

  const size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  // Per request: length << 8 | route tag (0: not counted).
  std::unique_ptr<uint64_t[]> info_;
  const std::shared_ptr<Metrics> metrics_;
  // The route of tag t (1..255) is entry t - 1 of routes_ and then of
  // more_routes_; the first route_count_ are set (each once, under mu_).
  // A batch meets few routes (peer, transport, opcode): eight inline keep
  // the object small enough for malloc's per-thread cache, which matters
  // because a batch is often freed on a loop thread (its last frame's
  // completion) while the caller allocates the next one; the rest of the
  // 255 are allocated at the ninth route.
  static constexpr size_t kInlineRoutes = 8;
  std::atomic<RouteCounters*>& RouteEntry(size_t i) const;
  mutable std::atomic<RouteCounters*> routes_[kInlineRoutes] = {};
  std::unique_ptr<std::atomic<RouteCounters*>[]> more_routes_;  // set once, under mu_
  std::atomic<std::atomic<RouteCounters*>*> more_{nullptr};     // more_routes_, published
  size_t route_count_ = 0;                                      // guarded by mu_
  std::function<void()> on_idle_;
  // OfferProgress: written once under mu_, then has_progress_ (release).
  std::weak_ptr<BatchProgress> progress_;
  std::atomic<bool> has_progress_{false};
  std::atomic<int64_t> busy_since_ns_{0};
  std::atomic<int64_t> last_poll_ns_{0};  // when the last PollIdle returned
  std::atomic<bool> cancelled_{false};
  std::atomic<uint32_t> landing_{0};
  std::atomic<uint32_t> completing_{0};  // Completers alive
  std::shared_ptr<BatchState> landing_parent_;
  std::atomic<size_t> reserved_{0};
  std::atomic<size_t> pending_{0};
  std::atomic<size_t> completed_{0};
  std::atomic<size_t> failed_{0};

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;
  Status first_error_;    // guarded by mu_
  Status cancel_status_;  // guarded by mu_; set once by Cancel
  // The first failure of each failed request, by index (failures are rare,
  // so they live here rather than in every Slot). Guarded by mu_.
  std::unordered_map<size_t, Status> errors_;
};

}  // namespace ferry::internal
