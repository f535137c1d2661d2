#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>

#include "common/cuda_driver.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "common/net.h"
#include "cuda/copy_queue.h"

namespace ferry::internal {
namespace {

constexpr std::string_view kKeyName = "cuda-ipc";

// The endpoint: "<boot id>/<pid>".
std::string Endpoint() { return BootId() + "/" + std::to_string(::getpid()); }

bool ParseEndpoint(const std::string& ep, std::string* boot_id, int* pid) {
  const size_t slash = ep.rfind('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == ep.size()) return false;
  *boot_id = ep.substr(0, slash);
  try {
    size_t used = 0;
    *pid = std::stoi(ep.substr(slash + 1), &used);
    return used == ep.size() - slash - 1 && *pid > 0;
  } catch (...) {
    return false;
  }
}

// The region's "cuda-ipc" key, or null.
const wire::RegionKey* IpcKey(const wire::RegionEntry& r) {
  for (const auto& k : r.keys) {
    if (k.transport == kKeyName && k.value.size() == CudaDriver::kIpcHandleSize) return &k;
  }
  return nullptr;
}

// A GPU allocation of this process: [base, end) on `device`.
struct GpuRange {
  uint64_t base = 0;
  uint64_t end = 0;
  int device = -1;
};

class CudaIpcLink : public PeerLink {
 public:
  CudaIpcLink(const CudaDriver& driver, std::shared_ptr<const PeerInfo> peer, UniqueFd pidfd)
      : driver_(driver),
        label_(peer->Label()),
        pidfd_(std::move(pidfd)),
        devices_(CountDevices(driver)) {}
  ~CudaIpcLink() override { Retire(); }

  // Opens the handle of the peer's first GPU region, so a peer this process
  // cannot map fails the connection instead of its first transfer.
  Status Probe(const PeerInfo& peer) {
    for (const auto& r : peer.desc().regions) {
      if (IpcKey(r) == nullptr) continue;
      return MappingOf(r).status();
    }
    return OkStatus();
  }

  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    // Against Retire: the queues and mappings stay while a post uses them.
    std::shared_lock<std::shared_mutex> using_link(retire_mu_);
    // One submission per device queue: the copies of a post, in order.
    struct Group {
      cuda::CopyQueue* queue;
      std::vector<cuda::Copy> copies;
      std::vector<Slice> slices;
      bool on_device = true;  // every local range is GPU memory too
    };
    std::vector<Group> groups;
    BatchState::Completer now(*ctx.batch);
    const auto& regions = ctx.peer->desc().regions;
    bool landing = false;
    uint32_t last_region = kNoRegion;
    Mapping last_map;
    bool remote_on_queue_device = false;  // the last region is on its queue's device
    size_t group = 0;
    GpuRange local_gpu;  // the last local GPU allocation the kernel may touch
    groups.reserve(2);
    for (const Slice& s : slices) {
      auto fail = [&](const Status& st) {
        now.Complete(s.request, 1, st.WithPrefix("peer " + label_));
      };
      if (s.remote_region == kNoRegion || s.remote_region >= regions.size()) {
        fail(InvalidArgumentError("remote range " + FormatRange(s.remote, s.length) +
                                  " is in no GPU region the peer published"));
        continue;
      }
      const wire::RegionEntry& r = regions[s.remote_region];
      if (s.remote < r.addr || s.length > r.length || s.remote - r.addr > r.length - s.length) {
        fail(InvalidArgumentError("remote range " + FormatRange(s.remote, s.length) +
                                  " is outside region " + FormatRange(r.addr, r.length)));
        continue;
      }
      // The slices of a post mostly share their remote region and local
      // allocation: the last ones' mapping, queue and group are kept.
      if (s.remote_region != last_region) {
        auto mapped = MappingOf(r);
        if (!mapped.ok()) {
          fail(mapped.status());
          continue;
        }
        auto queue = QueueFor(MemoryKind::FromName(r.kind).device());
        if (!queue.ok()) {
          fail(queue.status());
          continue;
        }
        last_region = s.remote_region;
        last_map = *mapped;
        remote_on_queue_device = MemoryKind::FromName(r.kind).device() == (*queue)->device();
        auto g = std::find_if(groups.begin(), groups.end(),
                              [&](const Group& x) { return x.queue == *queue; });
        if (g == groups.end()) {
          g = groups.insert(groups.end(), Group{*queue, {}, {}, true});
          g->copies.reserve(slices.size());
          g->slices.reserve(slices.size());
        }
        group = static_cast<size_t>(g - groups.begin());
      }
      if (s.opcode == Opcode::kRead && !landing) {
        if (!ctx.batch->BeginLanding()) {
          now.Complete(s.request, 1, CancelledError("the request's batch was cancelled"));
          continue;
        }
        landing = true;
      }
      Group* g = &groups[group];
      char* remote = static_cast<char*>(last_map.base) + (s.remote - r.addr);
      const uint64_t local = reinterpret_cast<uint64_t>(s.local);
      // The copy kernel runs on the queue's device and touches both sides
      // there: only where the peer's memory and this local range are both
      // on that device (no peer access is enabled between devices).
      const int device = g->queue->device();
      if (g->on_device && (!remote_on_queue_device || local < local_gpu.base ||
                           local + s.length > local_gpu.end || local_gpu.device != device)) {
        auto range = remote_on_queue_device ? LocalGpuRange(s.local, s.length) : std::nullopt;
        if (range && range->device == device) {
          local_gpu = *range;
        } else {
          g->on_device = false;
        }
      }
      if (s.opcode == Opcode::kWrite) {
        g->copies.push_back({remote, s.local, s.length});
      } else {
        g->copies.push_back({s.local, remote, s.length});
      }
      g->slices.push_back(s);
    }
    if (groups.empty()) {
      if (landing) ctx.batch->EndLanding();
      return;
    }
    // Landing ends with the last group's completion.
    auto left = std::make_shared<std::atomic<size_t>>(groups.size());
    for (Group& g : groups) {
      auto batch = ctx.batch;
      auto done_slices = std::make_shared<std::vector<Slice>>(std::move(g.slices));
      const std::string label = label_;
      g.queue->Submit(
          g.copies,
          [batch, done_slices, left, landing, label](Status st) {
            {
              BatchState::Completer done(*batch);
              const Status failed = st.ok() ? st : st.WithPrefix("peer " + label);
              for (const Slice& s : *done_slices) done.Complete(s.request, 1, failed);
            }
            if (left->fetch_sub(1) == 1 && landing) batch->EndLanding();
          },
          g.on_device);
    }
  }

  Status Notify(const wire::NotifyBody&, Clock::time_point) override {
    return UnimplementedError(
        "the cuda_ipc transport carries no notifications (they go on the peer's cpu route)");
  }

  Status Flush(Clock::time_point deadline) override {
    std::shared_lock<std::shared_mutex> using_link(retire_mu_);
    std::vector<cuda::CopyQueue*> queues;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [d, q] : queues_) queues.push_back(q.get());
    }
    for (auto* q : queues) FERRY_RETURN_IF_ERROR(q->Drain(deadline).WithPrefix("peer " + label_));
    return OkStatus();
  }

  // The peer process is alive (its pidfd is not readable yet).
  bool Healthy() const override {
    if (!pidfd_.valid()) return true;
    pollfd p{pidfd_.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) == 0;
  }

  void Retire() override {
    std::unique_lock<std::shared_mutex> no_posts(retire_mu_);
    std::map<int, std::unique_ptr<cuda::CopyQueue>> queues;
    std::map<std::string, Mapping> mappings;
    {
      std::lock_guard<std::mutex> lock(mu_);
      retired_ = true;
      queues.swap(queues_);
      mappings.swap(mappings_);
    }
    queues.clear();  // waits for every copy
    for (auto& [handle, m] : mappings) {
      CudaContextScope scope(driver_, m.device);
      Status s = scope.status().ok() ? driver_.CloseIpcHandle(m.base) : scope.status();
      if (!s.ok()) FERRY_LOG(kWarning, "peer " << label_ << ": closing a CUDA IPC mapping: " << s);
    }
  }

 private:
  struct Mapping {
    void* base = nullptr;  // the region's first byte in this process
    int device = 0;        // the context it was opened in
  };

  // The device whose context opens a handle of the peer's `device` memory
  // and copies to it: the same ordinal if this process sees it, else 0
  // (copies then go peer to peer).
  int LocalDevice(int device) const { return device < devices_ ? device : 0; }
  static int CountDevices(const CudaDriver& d) {
    auto n = d.DeviceCount();
    return n.ok() ? *n : 0;
  }

  StatusOr<cuda::CopyQueue*> QueueFor(int device) {
    const int local = LocalDevice(device);
    std::lock_guard<std::mutex> lock(mu_);
    if (retired_) return UnavailableError("the cuda_ipc link to peer " + label_ + " was retired");
    auto& q = queues_[local];
    if (!q) {
      auto made = cuda::CopyQueue::Create(driver_, local);
      if (!made.ok()) {
        queues_.erase(local);
        return made.status().WithPrefix("a copy stream on cuda:" + std::to_string(local));
      }
      q = std::move(*made);
    }
    return q.get();
  }

  // The GPU allocation of this process holding [p, p + n), if it is GPU
  // memory (allocations seen before, else asked of the driver once per
  // allocation).
  std::optional<GpuRange> LocalGpuRange(const char* p, uint64_t n) {
    const uint64_t a = reinterpret_cast<uint64_t>(p);
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const GpuRange& range : device_ranges_) {
        if (a >= range.base && a + n <= range.end) return range;
      }
    }
    auto device = driver_.DeviceOfPointer(p);
    if (!device.ok() || !device->has_value()) return std::nullopt;
    CudaContextScope scope(driver_, **device);
    if (!scope.status().ok()) return std::nullopt;
    auto allocation = driver_.AllocationOf(p);
    if (!allocation.ok() || a + n > allocation->base + allocation->size) return std::nullopt;
    const GpuRange range{allocation->base, allocation->base + allocation->size, **device};
    std::lock_guard<std::mutex> lock(mu_);
    if (device_ranges_.size() >= 64) device_ranges_.erase(device_ranges_.begin());
    device_ranges_.push_back(range);
    return range;
  }

  // The region's first byte mapped into this process (opened once per
  // allocation and link).
  StatusOr<Mapping> MappingOf(const wire::RegionEntry& r) {
    const wire::RegionKey* key = IpcKey(r);
    if (key == nullptr) {
      return InvalidArgumentError(
          "GPU region " + FormatRange(r.addr, r.length) +
          " has no CUDA IPC handle (it spans several allocations, or the peer's "
          "driver could not export it)");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (retired_) return UnavailableError("the cuda_ipc link to peer " + label_ + " was retired");
    auto it = mappings_.find(key->value);
    if (it == mappings_.end()) {
      const int device = LocalDevice(MemoryKind::FromName(r.kind).device());
      CudaDriver::IpcHandle h;
      std::copy(key->value.begin(), key->value.end(), h.begin());
      CudaContextScope scope(driver_, device);
      FERRY_RETURN_IF_ERROR(scope.status());
      auto base = driver_.OpenIpcHandle(h);
      if (!base.ok()) {
        return UnavailableError("cannot map the GPU memory of region " +
                                FormatRange(r.addr, r.length) + " (" + r.kind +
                                ") the peer shared: " + base.status().message() +
                                " (another container, or a GPU this process cannot see?)");
      }
      it = mappings_.emplace(key->value, Mapping{*base, device}).first;
    }
    return Mapping{static_cast<char*>(it->second.base) + key->key, it->second.device};
  }

  const CudaDriver& driver_;
  const std::string label_;
  const UniqueFd pidfd_;
  const int devices_;            // this process's CUDA devices (asked once, not per slice)
  std::shared_mutex retire_mu_;  // shared by posts and flushes, taken whole by Retire
  std::mutex mu_;
  bool retired_ = false;
  std::map<int, std::unique_ptr<cuda::CopyQueue>> queues_;  // by local device
  std::map<std::string, Mapping> mappings_;                 // by IPC handle: the allocation's base
  // This process's GPU allocations that local ranges were found in.
  std::vector<GpuRange> device_ranges_;
};

class CudaIpcTransport : public Transport {
 public:
  CudaIpcTransport(TransportCaps caps, std::string driver_library)
      : Transport(std::move(caps)), driver_library_(std::move(driver_library)) {}

  // The driver, once this process has one (never loaded here for a process
  // that does not use CUDA), else null.
  const CudaDriver* Driver() const {
    const CudaDriver* d = nullptr;
    if (!driver_library_.empty()) {
      d = &CudaDriver::Load(driver_library_);
    } else if (CudaDriver::LoadedInProcess()) {
      d = &CudaDriver::Get();
    }
    return d != nullptr && d->data_path() ? d : nullptr;
  }

  void Describe(wire::PeerDescriptor* self) const override {
    if (Driver() != nullptr && !BootId().empty())
      self->transports.push_back({"cuda_ipc", Endpoint()});
  }

  bool CanReach(const wire::PeerDescriptor& peer) const override {
    const wire::TransportEndpoint* ep = peer.FindTransport("cuda_ipc");
    std::string boot;
    int pid = 0;
    return ep != nullptr && peer.process_token != ProcessToken() &&
           ParseEndpoint(ep->endpoint, &boot, &pid) && boot == BootId() && Driver() != nullptr;
  }

  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> peer, uint16_t,
                                              Clock::time_point) override {
    const CudaDriver* d = Driver();
    if (d == nullptr)
      return UnavailableError("cuda_ipc: this process has no CUDA driver that can move GPU memory");
    const wire::TransportEndpoint* ep = peer->desc().FindTransport("cuda_ipc");
    std::string boot;
    int pid = 0;
    if (ep == nullptr || !ParseEndpoint(ep->endpoint, &boot, &pid)) {
      return UnavailableError("peer " + peer->Label() + " offers no usable cuda_ipc endpoint");
    }
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.valid()) {
      return DescriptorError(StatusCode::kUnavailable,
                             "peer " + peer->Label() + ": its process " + std::to_string(pid) +
                                 " cannot be followed (pidfd_open)",
                             errno);
    }
    auto link = std::make_shared<CudaIpcLink>(*d, peer, std::move(pidfd));
    Status probe = link->Probe(*peer);
    if (!probe.ok()) return probe.WithPrefix("cuda_ipc to peer " + peer->Label());
    return std::shared_ptr<PeerLink>(std::move(link));
  }

  StatusOr<std::vector<wire::RegionKey>> RegisterRegion(const Region& r) override {
    std::vector<wire::RegionKey> keys;
    if (r.kind.type() != MemoryKind::Type::kCuda) return keys;
    const CudaDriver* d = Driver();
    if (d == nullptr) return keys;  // registration already checked the driver; nothing to share
    CudaContextScope scope(*d, r.kind.device());
    FERRY_RETURN_IF_ERROR(scope.status());
    const void* addr = reinterpret_cast<const void*>(r.addr);
    FERRY_ASSIGN_OR_RETURN(CudaDriver::Allocation a, d->AllocationOf(addr));
    if (r.addr < a.base || r.end() > a.base + a.size) {
      // No one handle maps it all: same-host peers stage it instead.
      FERRY_LOG(kInfo, "GPU region " << FormatRange(r.addr, r.length)
                                     << " spans several CUDA allocations; "
                                     << "same-host peers cannot map it with CUDA IPC");
      return keys;
    }
    FERRY_ASSIGN_OR_RETURN(CudaDriver::IpcHandle h,
                           d->GetIpcHandle(reinterpret_cast<const void*>(a.base)));
    keys.push_back({std::string(kKeyName), r.addr - a.base, std::string(h.begin(), h.end())});
    return keys;
  }

  void Shutdown() override {}

 private:
  const std::string driver_library_;
};

}  // namespace

TransportCaps CudaIpcCaps() {
  TransportCaps c;
  c.name = "cuda_ipc";
  c.reach = Reach::kSameHost;
  c.memory_kinds = {MemoryKind::Type::kCpu, MemoryKind::Type::kCuda};
  c.remote_kinds = {MemoryKind::Type::kCuda};
  c.needs_region_keys = true;
  c.max_slice = 1u << 30;  // one cuMemcpyAsync per request
  return c;
}

std::string CudaIpcAvailability() {
  const CudaDriver& d = CudaDriver::Get();
  if (!d.available()) return d.why_unavailable();
  if (!d.data_path()) return d.why_no_data_path();
  return "";
}

StatusOr<std::unique_ptr<Transport>> MakeCudaIpcTransport(const TransportContext& ctx) {
  return std::unique_ptr<Transport>(
      std::make_unique<CudaIpcTransport>(CudaIpcCaps(), ctx.options->testing.cuda_driver));
}

}  // namespace ferry::internal
