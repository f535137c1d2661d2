#include "transport/local/local_transport.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "base/staging_pool.h"
#include "cuda/sync_copies.h"
#include "storage/file_segment.h"

namespace ferry::internal {

struct LocalDirectory::Impl {
  mutable std::mutex mu;
  std::unordered_map<uint64_t, std::weak_ptr<EngineTarget>> targets;
};

LocalDirectory::LocalDirectory() : impl_(std::make_unique<Impl>()) {}

LocalDirectory& LocalDirectory::Get() {
  static LocalDirectory* dir =
      new LocalDirectory();  // never destroyed: engines may outlive statics
  return *dir;
}

void LocalDirectory::Add(const std::shared_ptr<EngineTarget>& target) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->targets[target->instance_id()] = target;
}

void LocalDirectory::Remove(uint64_t instance_id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->targets.erase(instance_id);
}

std::shared_ptr<EngineTarget> LocalDirectory::Find(uint64_t instance_id) const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->targets.find(instance_id);
  return it == impl_->targets.end() ? nullptr : it->second.lock();
}

namespace {

// File ops in flight: a link's writes (its notifications wait for them),
// and all of a transport's ops (its shutdown waits for them: they run on
// the ring of the engine that owns the file, which may be another engine
// of this process, and complete this engine's batches).
class FileOpCount {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mu_);
    ++n_;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--n_ == 0) cv_.notify_all();
  }
  bool None() {
    std::lock_guard<std::mutex> lock(mu_);
    return n_ == 0;
  }
  bool WaitUntil(Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, deadline, [&] { return n_ == 0; });
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return n_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t n_ = 0;  // guarded by mu_
};

// Copies between GPU and host memory for a link's file ops of GPU memory
// (staged through host memory: the file's ring reads and writes only host
// memory). One SyncCopies, made on first use, shared by the posting threads
// and the rings' threads under a lock; the host buffers come from one
// StagingPool of the same driver (page-locked, reused: the copies run on the
// copy engines; base/staging_pool.h).
class GpuCopies {
 public:
  Status Copy(const CudaDriver& driver, int device, void* dst, const void* src, size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!copies_) copies_ = std::make_unique<cuda::SyncCopies>(driver);
    return copies_->Copy(device, dst, src, n);
  }
  // Page-aligned host memory for a slice of n bytes; kResourceExhausted if
  // there is none.
  StatusOr<std::shared_ptr<char>> HostBuffer(const CudaDriver& driver, size_t n) {
    std::shared_ptr<StagingPool> pool;
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      if (!pool_) pool_ = std::make_shared<StagingPool>(nullptr, &driver);
      pool = pool_;
    }
    try {
      return pool->Get(n);
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError("no host memory to stage a GPU slice of " + std::to_string(n) +
                                    " bytes");
    }
  }

 private:
  std::mutex mu_;
  std::unique_ptr<cuda::SyncCopies> copies_;  // guarded by mu_
  std::mutex pool_mu_;
  std::shared_ptr<StagingPool> pool_;  // guarded by pool_mu_
};

// The file ops of one Post, by the ring that runs them (each engine has its
// own; a post mostly reaches one).
using FileOpGroups = std::vector<std::pair<storage::FileIo*, std::vector<storage::FileOp>>>;

class LocalLink : public PeerLink {
 public:
  LocalLink(std::shared_ptr<EngineTarget> self, std::weak_ptr<EngineTarget> target,
            std::string peer_id, std::shared_ptr<FileOpCount> transport_ops)
      : self_(std::move(self)),
        transport_ops_(std::move(transport_ops)),
        target_(std::move(target)),
        peer_id_(std::move(peer_id)) {}

  void Post(const PostContext& ctx, std::vector<Slice> slices) override {
    std::shared_ptr<EngineTarget> target = target_.lock();
    FileOpGroups file_ops;
    {
      BatchState::Completer done(*ctx.batch);
      PostSlices(ctx, target, slices, done, file_ops);
    }
    for (auto& [io, ops] : file_ops) io->Submit(std::move(ops));
  }

  Status Notify(const wire::NotifyBody& body, Clock::time_point deadline) override {
    // Memory copies complete in Post; file writes on their ring: every
    // earlier write is done once those are.
    if (!file_writes_->WaitUntil(deadline)) {
      return DeadlineExceededError("file writes to peer " + peer_id_ +
                                   " still in flight at the notification's deadline");
    }
    std::shared_ptr<EngineTarget> target = target_.lock();
    if (!target) return UnavailableError("peer engine " + peer_id_ + " was shut down");
    return target->Deliver({body.sender, body.name, body.message})
        .WithPrefix("peer " + peer_id_ + " refused");
  }

  bool Healthy() const override { return !target_.expired(); }
  // Memory copies finish in Post; file writes run on their ring, and a
  // notification on this link waits for them: the link may close (and the
  // next request take a new one) only once none is in flight.
  bool Idle() const override { return file_writes_->None(); }
  void Retire() override {}

 private:
  void PostSlices(const PostContext& ctx, const std::shared_ptr<EngineTarget>& target,
                  const std::vector<Slice>& slices, BatchState::Completer& done,
                  FileOpGroups& file_ops) {
    // A post's slices mostly fall in one remote region and one local one:
    // the last remote region stays pinned (for the rest of the post) and the
    // last local region's kind is kept, instead of a registry lookup each.
    RegionPin last_pin;
    MemoryRegistry::Found last_local;
    for (const Slice& s : slices) {
      if (!target) {
        done.Complete(s.request, 1, UnavailableError("peer engine " + peer_id_ + " was shut down"));
        continue;
      }
      const Region* r = last_pin.region();
      if (r == nullptr || s.remote < r->addr || s.remote - r->addr > r->length ||
          s.length > r->length - (s.remote - r->addr)) {
        auto pin = target->registry().PinExported(s.remote, s.length, "remote range");
        if (!pin.ok()) {
          done.Complete(s.request, 1, pin.status().WithPrefix("peer " + peer_id_ + " refused"));
          continue;
        }
        last_pin = std::move(*pin);
        r = last_pin.region();
      }
      void* remote = reinterpret_cast<void*>(s.remote);
      const MemoryKind remote_kind = r->kind;
      MemoryKind local_kind;
      if (self_->registry().ever_non_cpu()) {
        const uint64_t local = reinterpret_cast<uint64_t>(s.local);
        if (last_local.length == 0 || local < last_local.addr ||
            local - last_local.addr > last_local.length ||
            s.length > last_local.length - (local - last_local.addr)) {
          MemoryRegistry::Found found;
          last_local = self_->registry().Check(local, s.length, "local buffer", &found).ok()
                           ? found
                           : MemoryRegistry::Found{};
        }
        local_kind = last_local.kind;
      }
      if (remote_kind.type() == MemoryKind::Type::kFile ||
          local_kind.type() == MemoryKind::Type::kFile) {
        // File I/O: queued on the file's ring below, completed by its thread
        // (the op takes the pin of the remote region with it).
        Status queued =
            AddFileOp(ctx, *target, s, std::move(last_pin), remote_kind, local_kind, &file_ops);
        if (!queued.ok()) done.Complete(s.request, 1, queued);
        continue;
      }
      // A read stores into this engine's memory: not once its batch was
      // cancelled (BatchState::BeginLanding).
      if (s.opcode == Opcode::kRead && !ctx.batch->BeginLanding()) {
        done.Complete(s.request, 1, CancelledError("the request's batch was cancelled"));
        continue;
      }
      Status copied;
      if (remote_kind.cpu_accessible() && local_kind.cpu_accessible()) {
        if (s.opcode == Opcode::kWrite) {
          std::memmove(remote, s.local, s.length);
        } else {
          std::memmove(s.local, remote, s.length);
        }
      } else if (s.opcode == Opcode::kWrite) {
        copied = CopyMemory(remote_kind, remote, local_kind, s.local, s.length);
      } else {
        copied = CopyMemory(local_kind, s.local, remote_kind, remote, s.length);
      }
      if (s.opcode == Opcode::kRead) ctx.batch->EndLanding();
      done.Complete(s.request, 1, copied);
    }
  }

  // Queues the file op of slice `s`: between a file region (the peer's, or
  // this engine's own local buffer) and cpu or GPU memory on the other side.
  // The op holds both regions' pins and the batch's landing (so a cancelled
  // batch moves no byte more), and completes the slice from the file's ring.
  // GPU memory is staged through a host buffer: copied off the device here
  // before a file write; copied onto it from the ring's thread after a file
  // read, only while the batch may still land data.
  Status AddFileOp(const PostContext& ctx, const EngineTarget& target, const Slice& s,
                   RegionPin remote_pin, MemoryKind remote_kind, MemoryKind local_kind,
                   FileOpGroups* groups) {
    const bool remote_file = remote_kind.type() == MemoryKind::Type::kFile;
    const MemoryKind other = remote_file ? local_kind : remote_kind;
    const bool gpu = other.type() == MemoryKind::Type::kCuda;
    // The driver of the engine whose GPU memory it is.
    const CudaDriver* driver = gpu ? (remote_file ? self_.get() : &target)->cuda_driver() : nullptr;
    if (!other.cpu_accessible() && (!gpu || driver == nullptr)) {
      return UnimplementedError("cannot move bytes between file and " + other.Name() +
                                " memory in this build");
    }
    RegionPin file_pin;
    RegionPin other_pin;
    char* buf = nullptr;
    uint64_t file_addr = 0;
    bool write_file = false;
    const uint64_t local = reinterpret_cast<uint64_t>(s.local);
    if (remote_file) {
      file_pin = std::move(remote_pin);
      buf = s.local;
      file_addr = s.remote;
      write_file = s.opcode == Opcode::kWrite;
    } else {
      FERRY_ASSIGN_OR_RETURN(file_pin, self_->registry().Pin(local, s.length, "local buffer"));
      other_pin = std::move(remote_pin);
      buf = reinterpret_cast<char*>(s.remote);
      file_addr = local;
      write_file = s.opcode == Opcode::kRead;
    }
    const storage::FileSegment& file = *file_pin.region()->file;
    std::shared_ptr<char> host;  // GPU memory's bytes, page-aligned (O_DIRECT)
    char* device = nullptr;
    if (gpu) {
      FERRY_ASSIGN_OR_RETURN(host, gpu_copies_->HostBuffer(*driver, s.length));
      device = buf;
      buf = host.get();
      if (write_file) {
        FERRY_RETURN_IF_ERROR(gpu_copies_->Copy(*driver, other.device(), buf, device, s.length)
                                  .WithPrefix("copying " + std::to_string(s.length) +
                                              " bytes off " + other.Name() + " for a file"));
      }
    }
    FERRY_ASSIGN_OR_RETURN(storage::FileOp op, file.MakeOp(write_file, buf, file_addr, s.length));
    // A read for GPU memory lands in the host buffer; the copy onto the
    // device takes the landing instead (below).
    const bool to_device = gpu && !write_file;
    op.landing = to_device ? nullptr : ctx.batch;
    op.pins.push_back(std::move(file_pin));
    if (!remote_file) op.pins.push_back(std::move(other_pin));
    if (write_file) file_writes_->Add();
    transport_ops_->Add();
    op.done = [batch = ctx.batch, request = s.request, writes = write_file ? file_writes_ : nullptr,
               all = transport_ops_, to_device, copies = gpu_copies_, driver,
               ordinal = other.device(), device, host, length = s.length](const Status& status) {
      Status st = status;
      if (st.ok() && to_device) {
        if (!batch->BeginLanding()) {
          st = CancelledError("the request's batch was cancelled");
        } else {
          st = copies->Copy(*driver, ordinal, device, host.get(), length)
                   .WithPrefix("copying " + std::to_string(length) +
                               " bytes of a file onto cuda:" + std::to_string(ordinal));
          batch->EndLanding();
        }
      }
      batch->CompleteSlice(request, st);
      if (writes) writes->Done();
      all->Done();  // last: the transport's shutdown may end once it is done
    };
    storage::FileIo* io = &file.io();
    if (groups->empty() || groups->back().first != io) {
      groups->emplace_back(io, std::vector<storage::FileOp>());
    }
    groups->back().second.push_back(std::move(op));
    return OkStatus();
  }

  const std::shared_ptr<EngineTarget> self_;
  const std::shared_ptr<FileOpCount> transport_ops_;  // every file op of the transport
  const std::shared_ptr<FileOpCount> file_writes_ = std::make_shared<FileOpCount>();
  const std::shared_ptr<GpuCopies> gpu_copies_ = std::make_shared<GpuCopies>();
  std::weak_ptr<EngineTarget> target_;
  std::string peer_id_;
};

class LocalTransport : public Transport {
 public:
  // Listed in the process's directory while it lives, so engines of this
  // process can reach its target.
  LocalTransport(TransportCaps caps, std::shared_ptr<EngineTarget> self)
      : Transport(std::move(caps)), self_(std::move(self)) {
    LocalDirectory::Get().Add(self_);
  }
  ~LocalTransport() override { Shutdown(); }
  // Its kinds, and GPU memory to and from file regions (staged through host
  // memory: AddFileOp). Other GPU routes stay with the transports that
  // have them (cuda_ipc; the GPU staging of shm and tcp).
  bool Handles(MemoryKind local, MemoryKind remote) const override {
    using T = MemoryKind::Type;
    return Transport::Handles(local, remote) ||
           (local.type() == T::kCuda && remote.type() == T::kFile) ||
           (local.type() == T::kFile && remote.type() == T::kCuda);
  }
  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({"local", std::to_string(ProcessToken())});
  }
  bool CanReach(const wire::PeerDescriptor& peer) const override {
    return peer.process_token == ProcessToken() && peer.FindTransport("local") != nullptr &&
           LocalDirectory::Get().Find(peer.instance_id) != nullptr;
  }
  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo> info, uint16_t,
                                              Clock::time_point) override {
    const wire::PeerDescriptor& peer = info->desc();
    std::shared_ptr<EngineTarget> t = LocalDirectory::Get().Find(peer.instance_id);
    if (!t) {
      return UnavailableError("peer " + peer.peer_id +
                              " is not an engine of this process (local transport)");
    }
    return std::shared_ptr<PeerLink>(
        std::make_shared<LocalLink>(self_, t, peer.peer_id, file_ops_));
  }
  // Out of the directory; then waits for this engine's file ops still on a
  // ring (its own, or another engine's for that engine's files): their
  // completions finish this engine's batches, which must not outlive it.
  // Each ends with its I/O, or fails once its ring's owner is destroyed.
  void Shutdown() override {
    LocalDirectory::Get().Remove(self_->instance_id());
    file_ops_->Wait();
  }

 private:
  const std::shared_ptr<EngineTarget> self_;
  const std::shared_ptr<FileOpCount> file_ops_ = std::make_shared<FileOpCount>();
};

}  // namespace

TransportCaps LocalCaps() {
  TransportCaps c;
  c.name = "local";
  c.reach = Reach::kSameProcess;
  // Copies go through CopyMemory, which reaches the test kind too; file
  // regions (of either engine) through their io_uring ring.
  c.memory_kinds = {MemoryKind::Type::kCpu, MemoryKind::Type::kTestOpaque, MemoryKind::Type::kFile};
  c.max_slice = 1u << 30;
  return c;
}

StatusOr<std::unique_ptr<Transport>> MakeLocalTransport(const TransportContext& ctx) {
  return std::unique_ptr<Transport>(std::make_unique<LocalTransport>(LocalCaps(), ctx.target));
}

}  // namespace ferry::internal
