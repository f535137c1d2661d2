#include "transport/shm/mapped_segments.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "common/fd_limit.h"
#include "common/log.h"

namespace ferry::internal::shm {

// ---- the target's slot table ---------------------------------------------------

namespace {

// "PID:FD:DEV:INO:SLOTS" of a table.
std::string TableEndpoint(int fd, uint32_t slots) {
  struct stat st {};
  ::fstat(fd, &st);
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%d:%d:%" PRIu64 ":%" PRIu64 ":%u", static_cast<int>(::getpid()),
                fd, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), slots);
  return buf;
}

}  // namespace

StatusOr<std::unique_ptr<SlotTable>> SlotTable::Create(uint32_t slots,
                                                       std::chrono::milliseconds revoke_wait) {
  FERRY_ASSIGN_OR_RETURN(
      SharedMemory mem, SharedMemory::Create(uint64_t{slots} * sizeof(MapSlot), "ferry-shm-slots"));
  return std::unique_ptr<SlotTable>(new SlotTable(std::move(mem), slots, revoke_wait));
}

SlotTable::SlotTable(SharedMemory mem, uint32_t slots, std::chrono::milliseconds revoke_wait)
    : mem_(std::move(mem)),
      slots_(slots),
      revoke_wait_(revoke_wait),
      endpoint_(TableEndpoint(mem_.fd(), slots)) {
  own_.resize(1);  // the header's slot is never published
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&header().alive, &attr);
  pthread_mutexattr_destroy(&attr);
  alive_ = std::thread([this] { HoldAlive(); });
  std::unique_lock<std::mutex> lock(alive_mu_);
  alive_cv_.wait(lock, [&] { return held_; });  // peers may look once the table is advertised
}

SlotTable::~SlotTable() { Close(); }

void SlotTable::HoldAlive() {
  pthread_mutex_lock(&header().alive);
  std::unique_lock<std::mutex> lock(alive_mu_);
  held_ = true;
  alive_cv_.notify_all();
  alive_cv_.wait(lock, [&] { return closing_; });
  pthread_mutex_unlock(&header().alive);
}

void SlotTable::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint32_t i = 1; i < own_.size(); ++i) {
      if (own_[i].live) RevokeSlot(i);
    }
  }
  {
    std::lock_guard<std::mutex> lock(alive_mu_);
    closing_ = true;
  }
  alive_cv_.notify_all();
  if (alive_.joinable()) alive_.join();
}

std::optional<uint64_t> SlotTable::Publish(const Region& region) {
  if (!region.shared || !region.exported) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t i;
  if (!free_.empty()) {
    i = free_.back();
    free_.pop_back();
  } else if (next_ < slots_) {
    i = next_++;
    own_.resize(next_);
  } else {
    if (!full_logged_) {
      FERRY_LOG(kWarning, "all " << slots_
                                 << " slots for same-host mapped regions are in use: peers copy "
                                    "to and from the regions registered from now on through "
                                    "this engine");
      full_logged_ = true;
    }
    return std::nullopt;
  }
  MapSlot& s = slot(i);
  const SharedBacking& b = *region.shared;
  s.fd.store(b.fd());
  s.addr.store(region.addr);
  s.length.store(region.length);
  s.offset.store(b.offset);
  s.dev.store(b.dev);
  s.ino.store(b.ino);
  s.generation.store(own_[i].generation);
  s.state.store(kSlotLive);  // after the fields: a peer that sees it live reads them
  own_[i].live = true;
  return uint64_t{own_[i].generation} << 32 | i;
}

void SlotTable::Revoke(uint64_t key) {
  const uint32_t i = static_cast<uint32_t>(key);
  std::lock_guard<std::mutex> lock(mu_);
  if (i == 0 || i >= own_.size() || !own_[i].live ||
      own_[i].generation != static_cast<uint32_t>(key >> 32)) {
    return;
  }
  RevokeSlot(i);
}

void SlotTable::RevokeSlot(uint32_t i) {
  MapSlot& s = slot(i);
  s.state.store(kSlotRevoked);
  // Peers that counted themselves in before the store copy until they count
  // out; every later one sees the revocation.
  const auto deadline = std::chrono::steady_clock::now() + revoke_wait_;
  auto pause = std::chrono::microseconds(10);
  bool drained = true;
  while (s.active.load() != 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      FERRY_LOG(kWarning, "unregistering shared memory at 0x"
                              << std::hex << s.addr.load() << std::dec
                              << ": a same-host peer still counts " << s.active.load()
                              << " copies through its mapping after " << revoke_wait_.count()
                              << " ms (it may have died mid-copy); going on, and the slot is "
                                 "not used again");
      drained = false;
      break;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  own_[i].generation += 1;
  own_[i].live = false;
  s.generation.store(own_[i].generation);
  s.fd.store(-1);
  s.state.store(kSlotFree);
  if (drained) free_.push_back(i);
}

// ---- the initiator's mappings ------------------------------------------------

namespace {

// /proc/PID/fd/FD, opened read-write: the same file the peer has open.
StatusOr<UniqueFd> OpenPeerFd(int pid, int fd, const std::string& what) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // Non-blocking, no controlling tty: whatever the number names (a peer
  // may have written garbage), opening it must not wait or act.
  UniqueFd f(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!f.valid()) {
    return DescriptorError(StatusCode::kFailedPrecondition, what + ": opening " + path, errno);
  }
  return f;
}

}  // namespace

StatusOr<std::shared_ptr<PeerMaps>> PeerMaps::Open(const std::string& endpoint, int pid,
                                                   std::string label) {
  int ep_pid = 0, fd = -1;
  unsigned long long dev = 0, ino = 0;
  unsigned int slots = 0;
  char tail = 0;
  if (std::sscanf(endpoint.c_str(), "%d:%d:%llu:%llu:%u%c", &ep_pid, &fd, &dev, &ino, &slots,
                  &tail) != 5 ||
      fd < 0 || slots == 0 || slots > (1u << 24)) {
    return InvalidArgumentError("peer " + label + " advertises a malformed " + kMapEndpoint +
                                " endpoint '" + endpoint + "'");
  }
  if (ep_pid != pid) {
    return FailedPreconditionError("peer " + label + " advertises its slot table in process " +
                                   std::to_string(ep_pid) + ", but process " + std::to_string(pid) +
                                   " answers its socket");
  }
  const std::string what = "the slot table of " + label;
  FERRY_ASSIGN_OR_RETURN(UniqueFd f, OpenPeerFd(pid, fd, what));
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<PeerMapping> table,
      PeerMapping::Open(f.get(), 0, uint64_t{slots} * sizeof(MapSlot), dev, ino, what));
  return std::shared_ptr<PeerMaps>(new PeerMaps(pid, std::move(table), slots, std::move(label)));
}

std::shared_ptr<const MappedRegion> PeerMaps::Find(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = maps_.find(key);
  if (it != maps_.end()) return it->second;
  const uint32_t index = static_cast<uint32_t>(key);
  auto mapped = Map(index, static_cast<uint32_t>(key >> 32));
  if (!mapped.ok()) {
    FERRY_LOG(kInfo, "copies to and from region slot "
                         << index << " of " << label_
                         << " go through the peer: " << mapped.status());
    maps_.emplace(key, nullptr);
    return nullptr;
  }
  maps_.emplace(key, *mapped);
  return *mapped;
}

bool PeerMaps::PeerRuns() {
  if (gone_.load(std::memory_order_relaxed)) return false;
  auto* header = reinterpret_cast<TableHeader*>(table_->data());
  const int r = pthread_mutex_trylock(&header->alive);
  if (r == EBUSY) return true;
  // Ours now: the holder died (EOWNERDEAD), or let go when its engine shut
  // down (0). Either way the target is gone; let the next one see it too.
  if (r == EOWNERDEAD) pthread_mutex_consistent(&header->alive);
  if (r == 0 || r == EOWNERDEAD) pthread_mutex_unlock(&header->alive);
  gone_.store(true, std::memory_order_relaxed);
  return false;
}

void PeerMaps::Forget(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = maps_.find(key);
  if (it != maps_.end()) it->second = nullptr;
}

StatusOr<std::shared_ptr<const MappedRegion>> PeerMaps::Map(uint32_t index, uint32_t generation) {
  if (index == 0 || index >= slots_) return InvalidArgumentError("no such slot");
  MapSlot& s = slot(index);
  if (s.state.load() != kSlotLive || s.generation.load() != generation) {
    return NotFoundError("the region was unregistered");
  }
  const int fd = s.fd.load();
  const uint64_t addr = s.addr.load(), length = s.length.load(), offset = s.offset.load();
  const uint64_t dev = s.dev.load(), ino = s.ino.load();
  // (Not FormatRange: memory_registry.cc is not among the fuzz targets' sources.)
  char range[64];
  std::snprintf(range, sizeof(range), "[0x%" PRIx64 ", 0x%" PRIx64 ")", addr, addr + length);
  const std::string what = "region " + std::string(range) + " of " + label_;
  if (fd < 0) return NotFoundError(what + " has no descriptor");
  FERRY_ASSIGN_OR_RETURN(UniqueFd f, OpenPeerFd(pid_, fd, what));
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<PeerMapping> m,
                         PeerMapping::Open(f.get(), offset, length, dev, ino, what));
  // Fields read while the slot was live in this generation, and still are:
  // they described this region (a reused slot has a new generation).
  if (s.state.load() != kSlotLive || s.generation.load() != generation) {
    return NotFoundError(what + " was unregistered while it was being mapped");
  }
  return std::make_shared<const MappedRegion>(&s, generation, addr, std::move(m));
}

}  // namespace ferry::internal::shm
