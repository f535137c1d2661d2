// Shared pieces of the transport conformance suite: the list of transports
// and a pair of engines in one process, both forced to one transport.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/same_host.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/transport_params.h"

namespace ferry::test {

// The transports the conformance suite runs against: every one the registry
// lists (src/transport/registry.cc), so a new transport runs the suite
// without a change here. The fabric transport runs once per provider:
// "fabric_tcp" (tcp;ofi_rxm). Not "fabric_shm": Ferry refuses libfabric
// 1.17's shm provider by design (tests/transport/fabric_rails_test.cc,
// FabricProviders.LibfabricShmBefore118IsRefusedWithTheReason), and on one
// host Ferry's own shm transport does that job.
inline constexpr const char* kFabricProviders[] = {"tcp"};
inline const std::vector<std::string> kTransports = [] {
  std::vector<std::string> names;
  for (const TransportInfo& t : ListTransports()) {
    // cuda_ipc reaches only GPU memory of another process: its cases are the
    // GPU ones of the multi-process suite (tests/integration/gpu_test.cc).
    if (t.name == "cuda_ipc") continue;
    if (t.name != "fabric") {
      names.push_back(t.name);
      continue;
    }
    for (const char* p : kFabricProviders) names.push_back("fabric_" + std::string(p));
  }
  // shm again with the target's buffers in shared memory: the initiator
  // maps them and copies itself (docs/architecture.md, "Mapped segments").
  // And with its frames on the unix sockets instead of the request rings.
  if (std::find(names.begin(), names.end(), "shm") != names.end()) {
    names.push_back("shm_mapped");
    names.push_back("shm_socket");
  }
  return names;
}();

// The transports that reach a peer's file regions, run with the target's
// buffers in file regions (Engine::RegisterFile; each buffer a file of its
// own in $TMPDIR): the suites whose cases apply to files instantiate these
// too ("FileTargets/...").
inline const std::vector<std::string> kFileTargets = {"local_file", "shm_file", "tcp_file"};
// The transports that move this engine's own file regions to and from a
// peer (staged through host buffers: storage/file_staging.h), run with the
// initiator's buffers in file regions of its own ("LocalFiles/...").
inline const std::vector<std::string> kLocalFiles = {"shm_local_files", "tcp_local_files",
                                                     "fabric_tcp_local_files"};

// Generous bounds; no test asserts how fast anything is.
inline constexpr std::chrono::milliseconds kTransferTimeout{60000};
inline constexpr std::chrono::milliseconds kWaitTimeout{120000};

inline EngineOptions ConformanceOptions(const std::string& param) {
  EngineOptions o;
  SetTransportOptions(param, &o);
  o.listen_host = "127.0.0.1";
  o.listen_port = 0;
  o.transfer_timeout = kTransferTimeout;
  return o;
}

// One request of a scatter: local buffer offset, remote buffer offset, length.
struct Piece {
  uint64_t local_off = 0;
  uint64_t remote_off = 0;
  uint64_t length = 0;
};

// Two engines ("initiator" and "target") on one transport; the initiator has
// opened the target's segment.
class EnginePair {
 public:
  void Start(const std::string& transport) {
    FERRY_SKIP_UNLESS_TRANSPORT_WORKS(transport);
    Start(transport, ConformanceOptions(transport), ConformanceOptions(transport));
  }
  // With options of the caller's; the target's buffers as test parameter
  // `param` says: shared memory ("shm_mapped"), file regions ("*_file"), or
  // plain memory; the initiator's as file regions with "*_local_files".
  void Start(const std::string& param, const EngineOptions& initiator_options,
             const EngineOptions& target_options) {
    share_target_memory_ = SharesTargetMemory(param);
    target_files_ = TargetsFiles(param);
    initiator_files_ = InitiatorFiles(param);
    Start(initiator_options, target_options);
  }
  void Start(const EngineOptions& initiator_options, const EngineOptions& target_options) {
    auto a = Engine::Create(initiator_options);
    ASSERT_THAT(GetStatus(a), IsOk())
        << "creating the initiator engine, transport " << initiator_options.transport;
    initiator_ = std::move(a).value();
    auto b = Engine::Create(target_options);
    ASSERT_THAT(GetStatus(b), IsOk())
        << "creating the target engine, transport " << target_options.transport;
    target_ = std::move(b).value();
    auto seg = initiator_->OpenSegment(target_->PeerId());
    ASSERT_THAT(GetStatus(seg), IsOk())
        << "opening " << target_->PeerId() << ", transport " << initiator_options.transport;
    segment_ = *seg;
  }

  Engine& initiator() { return *initiator_; }
  // Destroys the initiator engine (its buffers stay allocated).
  void DestroyInitiator() { initiator_.reset(); }
  // Destroys the target engine (its buffers stay allocated).
  void DestroyTarget() { target_.reset(); }
  Engine& target() { return *target_; }
  SegmentHandle segment() const { return segment_; }

  // Whether the target's buffers are file regions (the parameter says so:
  // "tcp_file"...). Cases that do not apply to files skip themselves.
  bool TargetFiles() const { return target_files_; }

  // A zeroed buffer that lives as long as the engines, registered with
  // `engine` unless it is null. Null (after a test failure) if registering
  // failed. The target's buffers are shared memory, registered with their
  // memfd, when the transport parameter says so ("shm_mapped"); or files
  // ("*_file"): then the pointer returned is a shared mapping of the file,
  // through which the test sees its bytes, and transfers name the region
  // by Addr(pointer); the same for the initiator's buffers with
  // "*_local_files". `exported` false: registered for `engine`'s own use.
  unsigned char* Alloc(size_t size, Engine* engine, bool exported = true) {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine != nullptr && ((target_files_ && engine == target_.get()) ||
                              (initiator_files_ && engine == initiator_.get()))) {
      files_.push_back({std::make_unique<FileBuffer>(size), 0});
      FileRegion region;
      region.fd = files_.back().file->fd();
      region.length = size;
      region.exported = exported;
      auto addr = engine->RegisterFile(region);
      EXPECT_THAT(GetStatus(addr), IsOk()) << "registering a file of " << size << " bytes";
      if (!addr.ok()) return nullptr;
      files_.back().addr = reinterpret_cast<uintptr_t>(*addr);
      return files_.back().file->data();
    }
    const bool shared = share_target_memory_ && engine != nullptr && engine == target_.get();
    buffers_.push_back(std::make_unique<AlignedBuffer>(size, shared));
    unsigned char* p = buffers_.back()->data();
    if (engine != nullptr) {
      MemoryRegion region{p, size};
      region.fd = buffers_.back()->fd();
      region.exported = exported;
      const Status s = engine->RegisterMemory({&region, 1});
      EXPECT_THAT(s, IsOk()) << "registering " << size << " bytes";
      if (!s.ok()) return nullptr;
    }
    return p;
  }

  // The address transfers name `p` by: `p` itself, or for a byte of a file
  // buffer (Alloc) the address of that byte in the file region.
  uint64_t Addr(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* b = static_cast<const unsigned char*>(p);
    for (const FileTarget& f : files_) {
      const unsigned char* data = f.file->data();
      if (b >= data && b <= data + f.file->size()) return f.addr + static_cast<uint64_t>(b - data);
    }
    return reinterpret_cast<uintptr_t>(p);
  }

  // `n` requests of `len` bytes between `local` (the initiator's, Alloc)
  // and `remote` (the target's), writes and reads in turn, none touching
  // another's bytes.
  std::vector<TransferRequest> WritesAndReads(const unsigned char* local,
                                              const unsigned char* remote, size_t n, uint64_t len) {
    std::vector<TransferRequest> reqs;
    for (size_t k = 0; k < n; ++k) {
      reqs.push_back({k % 2 == 0 ? Opcode::kWrite : Opcode::kRead,
                      reinterpret_cast<void*>(Addr(local + k * len)), segment_,
                      Addr(remote + k * len), len});
    }
    return reqs;
  }

  // A new engine with `options` reads 4 KiB at `remote` (the target's,
  // Alloc): the target still serves.
  void ExpectTargetServesANewEngine(const EngineOptions& options, const unsigned char* remote) {
    auto again = Engine::Create(options);
    ASSERT_THAT(GetStatus(again), IsOk()) << "creating another initiator";
    auto seg = (*again)->OpenSegment(target_->PeerId());
    ASSERT_THAT(GetStatus(seg), IsOk()) << "opening the target from another initiator";
    AlignedBuffer buf(4096);
    ASSERT_THAT((*again)->RegisterMemory(buf.data(), 4096, "cpu"), IsOk());
    EXPECT_THAT((*again)->TransferSync({Opcode::kRead, buf.data(), *seg, Addr(remote), 4096}),
                IsOk());
  }

  // Runs `pieces` as one batch of `op` requests between `local` (registered
  // with the initiator) and `remote` (registered with the target), submitted
  // in calls of at most `submit_chunk` requests, and checks:
  //   - every request completed and the batch counts add up;
  //   - each destination range holds its request's pattern;
  //   - every other destination byte is untouched;
  //   - the source is unchanged.
  void RunScatter(Opcode op, unsigned char* local, size_t local_size, unsigned char* remote,
                  size_t remote_size, const std::vector<Piece>& pieces, uint64_t seed,
                  size_t submit_chunk) {
    const uint64_t local_bg = Mix64(seed ^ 0x10ca1), remote_bg = Mix64(seed ^ 0x4e307e);
    std::vector<PatternRange> local_ranges, remote_ranges;
    for (size_t i = 0; i < pieces.size(); ++i) {
      local_ranges.push_back({pieces[i].local_off, pieces[i].length, RequestSeed(seed, i), 0});
      remote_ranges.push_back({pieces[i].remote_off, pieces[i].length, RequestSeed(seed, i), 0});
    }
    if (op == Opcode::kWrite) {
      FillLayout(local, local_size, local_ranges, local_bg);
      FillPattern(remote, remote_size, remote_bg);
    } else {
      FillPattern(local, local_size, local_bg);
      FillLayout(remote, remote_size, remote_ranges, remote_bg);
    }

    const uint64_t remote_addr = Addr(remote);
    const uint64_t local_addr = Addr(local);
    std::vector<TransferRequest> reqs;
    reqs.reserve(pieces.size());
    for (const Piece& p : pieces) {
      reqs.push_back({op, reinterpret_cast<void*>(local_addr + p.local_off), segment_,
                      remote_addr + p.remote_off, p.length});
    }
    const EngineMetrics before = target_->GetMetrics();
    const EngineMetrics initiator_before = initiator_->GetMetrics();
    auto batch_or = initiator_->AllocateBatch(reqs.size());
    ASSERT_THAT(GetStatus(batch_or), IsOk());
    const BatchId batch = *batch_or;
    for (size_t i = 0; i < reqs.size(); i += submit_chunk) {
      const size_t n = std::min(submit_chunk, reqs.size() - i);
      ASSERT_THAT(initiator_->Submit(batch, std::span(reqs).subspan(i, n)), IsOk())
          << "submitting requests [" << i << ", " << i + n << ")";
    }
    const Status waited = initiator_->WaitBatch(batch, kWaitTimeout);
    EXPECT_THAT(waited, IsOk());
    auto bs = initiator_->GetBatchStatus(batch);
    ASSERT_THAT(GetStatus(bs), IsOk());
    EXPECT_EQ(TransferStateName(bs->state), TransferStateName(TransferState::kCompleted));
    EXPECT_EQ(bs->submitted, reqs.size());
    EXPECT_EQ(bs->completed, reqs.size());
    EXPECT_EQ(bs->failed, 0u);
    EXPECT_THAT(bs->first_error, IsOk());
    if (!waited.ok()) {
      // Name the first few failed requests.
      int shown = 0;
      for (size_t i = 0; i < reqs.size() && shown < 5; ++i) {
        auto ts = initiator_->GetTransferStatus(batch, i);
        if (ts.ok() && ts->state != TransferState::kCompleted) {
          ADD_FAILURE() << "request " << i << " is " << TransferStateName(ts->state) << ": "
                        << ts->status;
          ++shown;
        }
      }
    }
    EXPECT_THAT(initiator_->FreeBatch(batch), IsOk());
    if (target_files_) {
      // The bytes went through the file (the target's ring), not through
      // the test's mapping of it.
      const EngineMetrics after = target_->GetMetrics();
      EXPECT_GT(after.file_direct_ops + after.file_buffered_ops,
                before.file_direct_ops + before.file_buffered_ops);
    }
    if (initiator_files_) {
      // The initiator's side went through its file (its ring).
      const EngineMetrics after = initiator_->GetMetrics();
      EXPECT_GT(after.file_direct_ops + after.file_buffered_ops,
                initiator_before.file_direct_ops + initiator_before.file_buffered_ops);
    }

    if (op == Opcode::kWrite) {
      EXPECT_TRUE(CheckLayout(remote, remote_size, remote_ranges, remote_bg)) << "remote (target)";
      EXPECT_TRUE(CheckLayout(local, local_size, local_ranges, local_bg)) << "local source changed";
    } else {
      EXPECT_TRUE(CheckLayout(local, local_size, local_ranges, local_bg)) << "local (destination)";
      EXPECT_TRUE(CheckLayout(remote, remote_size, remote_ranges, remote_bg))
          << "remote source changed";
    }
  }

 private:
  struct FileTarget {
    std::unique_ptr<FileBuffer> file;
    uint64_t addr;  // of the region
  };
  std::mutex mu_;
  bool share_target_memory_ = false;
  bool target_files_ = false;
  bool initiator_files_ = false;
  // Declared before the engines so it is destroyed after them.
  std::vector<std::unique_ptr<AlignedBuffer>> buffers_;
  std::vector<FileTarget> files_;
  std::unique_ptr<Engine> initiator_;
  std::unique_ptr<Engine> target_;
  SegmentHandle segment_;
};

}  // namespace ferry::test
