#include "transport/fault/fault_transport.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "base/wrapping.h"

namespace ferry::internal {
namespace {

using Faults = EngineOptions::Testing::LinkFaults;
enum class Fault { kPass, kFail, kDrop, kDelay, kReorder, kCorrupt };

// Decides the fault of each slice. Thread-safe.
class Dice {
 public:
  explicit Dice(const Faults& f) : f_(f), rng_(f.seed) {}
  Fault Next() {
    std::lock_guard<std::mutex> lock(mu_);
    int x = static_cast<int>(rng_() % 100);
    const std::pair<int, Fault> cuts[] = {{f_.fail_percent, Fault::kFail},
                                          {f_.drop_percent, Fault::kDrop},
                                          {f_.delay_percent, Fault::kDelay},
                                          {f_.reorder_percent, Fault::kReorder},
                                          {f_.corrupt_percent, Fault::kCorrupt}};
    for (const auto& [pct, fault] : cuts) {
      if (x < pct) return fault;
      x -= pct;
    }
    return Fault::kPass;
  }
  // Whether a read slice fails at once and lands later (rolled only when
  // late_read_percent is set: the other faults' sequence stays the same).
  bool LateRead() {
    if (f_.late_read_percent <= 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(rng_() % 100) < f_.late_read_percent;
  }
  const Faults& faults() const { return f_; }

 private:
  const Faults f_;
  std::mutex mu_;
  std::mt19937 rng_;  // guarded by mu_
};

class FaultyLink : public PeerLink {
 public:
  FaultyLink(std::shared_ptr<PeerLink> inner, std::shared_ptr<Dice> dice, std::string transport)
      : inner_(std::move(inner)), dice_(std::move(dice)), transport_(std::move(transport)) {}
  ~FaultyLink() override {
    std::vector<std::thread> workers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers.swap(workers_);
    }
    for (auto& w : workers) w.join();
  }

  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    MoveLateReads();
    std::vector<Slice> pass, held, dropped, late;
    std::vector<Fault> held_faults;
    {
      BatchState::Completer now(*ctx.batch);
      for (const Slice& s : slices) {
        if (s.opcode == Opcode::kRead && dice_->LateRead()) {
          late.push_back(s);
          now.Complete(s.request, 1,
                       DeadlineExceededError("fault injected on the " + transport_ +
                                             " link: the read failed, its bytes still to land"));
          continue;
        }
        switch (dice_->Next()) {
          case Fault::kPass:
            pass.push_back(s);
            break;
          case Fault::kFail:
            now.Complete(
                s.request, 1,
                UnavailableError("fault injected on the " + transport_ + " link: request failed"));
            break;
          case Fault::kDrop:
            dropped.push_back(s);
            break;
          case Fault::kDelay:
            held.push_back(s), held_faults.push_back(Fault::kDelay);
            break;
          case Fault::kReorder:
            held.push_back(s), held_faults.push_back(Fault::kReorder);
            break;
          case Fault::kCorrupt:
            held.push_back(s), held_faults.push_back(Fault::kCorrupt);
            break;
        }
      }
    }
    if (!late.empty()) {
      // The batch stays referenced (as a provider holds an operation's
      // context) until the bytes moved.
      std::lock_guard<std::mutex> lock(mu_);
      late_.push_back({ctx, std::move(late)});
      held_->fetch_add(1);
    }
    if (!pass.empty()) inner_->Post(ctx, std::move(pass));
    if (!held.empty()) Hold(ctx, std::move(held), std::move(held_faults));
    if (!dropped.empty()) Drop(ctx, std::move(dropped));
  }

  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override {
    return inner_->Notify(body, deadline);
  }
  Status Flush(Clock::time_point deadline) override { return inner_->Flush(deadline); }
  bool Healthy() const override { return inner_->Healthy(); }
  bool Idle() const override { return held_->load() == 0 && inner_->Idle(); }
  bool Closing() const override { return inner_->Closing(); }
  void Retire() override { inner_->Retire(); }

 private:
  // Runs `fn` on a worker thread; the link is not idle until it returns.
  void Spawn(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    held_->fetch_add(1);
    workers_.emplace_back([fn = std::move(fn), held = held_] {
      fn();
      held->fetch_sub(1);
    });
  }

  // The late reads of earlier posts: moved now, into their local buffers,
  // through a batch of their own (no fence: their requests already
  // failed), waiting for them; then their posts' batches are let go.
  void MoveLateReads() {
    std::vector<Late> due;
    {
      std::lock_guard<std::mutex> lock(mu_);
      due.swap(late_);
    }
    for (Late& l : due) {
      auto shadow = std::make_shared<BatchState>(l.slices.size());
      (void)shadow->Reserve(l.slices.size());
      shadow->BeginRange(0, l.slices.size(), [](size_t) { return 1u; });
      for (size_t k = 0; k < l.slices.size(); ++k) l.slices[k].request = static_cast<uint32_t>(k);
      const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
      inner_->Post({shadow, deadline, l.ctx.peer}, std::move(l.slices));
      shadow->WaitIdle(deadline + std::chrono::seconds(5), std::chrono::microseconds(0));
      held_->fetch_sub(1);
    }
  }

  // Posts the slices through a shadow batch, then answers the real one:
  // late, out of order, or with a corrupted status.
  void Hold(const PostContext& ctx, std::vector<Slice> held, std::vector<Fault> faults) {
    auto shadow = std::make_shared<BatchState>(held.size());
    shadow->SetLandingParent(
        ctx.batch);  // a cancel of the real batch fences the shadow's reads too
    (void)shadow->Reserve(held.size());
    shadow->BeginRange(0, held.size(), [](size_t) { return 1u; });
    std::vector<Slice> posted = held;
    for (size_t k = 0; k < posted.size(); ++k) posted[k].request = static_cast<uint32_t>(k);
    PostContext sctx{shadow, ctx.deadline, ctx.peer};
    inner_->Post(sctx, std::move(posted));
    const std::chrono::milliseconds delay = dice_->faults().delay;
    std::shared_ptr<BatchState> batch = ctx.batch;
    const Clock::time_point deadline = ctx.deadline;
    std::string transport = transport_;
    Spawn([shadow, batch, held = std::move(held), faults = std::move(faults), delay, deadline,
           transport] {
      shadow->WaitIdle(deadline + std::chrono::seconds(5), std::chrono::microseconds(0));
      if (std::find(faults.begin(), faults.end(), Fault::kDelay) != faults.end()) {
        std::this_thread::sleep_for(delay);
      }
      std::vector<size_t> order(held.size());
      for (size_t k = 0; k < order.size(); ++k) order[k] = k;
      if (std::find(faults.begin(), faults.end(), Fault::kReorder) != faults.end()) {
        std::reverse(order.begin(), order.end());
      }
      for (size_t k : order) {
        TransferStatus got = shadow->Get(k);
        Status s =
            got.state == TransferState::kPending
                ? DeadlineExceededError("fault injected on the " + transport + " link: no answer")
                : got.status;
        if (faults[k] == Fault::kCorrupt && s.ok()) {
          s = DataLossError("fault injected on the " + transport + " link: corrupted status");
        }
        batch->CompleteSlice(held[k].request, s);
      }
    });
  }

  // The replies never come: the slices fail at their deadline.
  void Drop(const PostContext& ctx, std::vector<Slice> dropped) {
    std::shared_ptr<BatchState> batch = ctx.batch;
    const Clock::time_point deadline = ctx.deadline;
    std::string transport = transport_;
    Spawn([batch, dropped = std::move(dropped), deadline, transport] {
      std::this_thread::sleep_until(deadline);
      BatchState::Completer done(*batch);
      for (const Slice& s : dropped) {
        done.Complete(
            s.request, 1,
            DeadlineExceededError("fault injected on the " + transport +
                                  " link: reply dropped, no answer before the transfer deadline"));
      }
    });
  }

  const std::shared_ptr<PeerLink> inner_;
  const std::shared_ptr<Dice> dice_;
  const std::string transport_;
  std::mutex mu_;
  std::vector<std::thread> workers_;  // guarded by mu_; joined by the destructor
  struct Late {
    PostContext ctx;
    std::vector<Slice> slices;
  };
  std::vector<Late> late_;  // guarded by mu_: reads failed, still to move
  // Workers still holding slices.
  const std::shared_ptr<std::atomic<int>> held_ = std::make_shared<std::atomic<int>>(0);
};

class FaultyTransport : public WrappingTransport {
 public:
  FaultyTransport(std::unique_ptr<Transport> inner, std::shared_ptr<Dice> dice)
      : WrappingTransport(std::move(inner)), dice_(std::move(dice)) {}

 protected:
  std::shared_ptr<PeerLink> Wrap(std::shared_ptr<PeerLink> inner) override {
    return std::make_shared<FaultyLink>(std::move(inner), dice_, std::string(Name()));
  }

 private:
  const std::shared_ptr<Dice> dice_;
};

}  // namespace

std::unique_ptr<Transport> WithFaults(std::unique_ptr<Transport> inner, const Faults& f) {
  return std::make_unique<FaultyTransport>(std::move(inner), std::make_shared<Dice>(f));
}

}  // namespace ferry::internal
