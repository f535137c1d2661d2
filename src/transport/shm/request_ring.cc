#include "transport/shm/request_ring.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/fd_limit.h"
#include "common/tsan_sync.h"

namespace ferry::internal::shm {
namespace {

// ThreadSanitizer follows synchronisation by address, and the two sides of
// a ring map it at different addresses (in the tests both live in one
// process), so it would not see a position's release pair with its
// acquire. Under TSan each ring's positions also release and acquire a
// cell keyed by the memfd's inode (common/tsan_sync.h).

// The shared words, read and written as atomics (both processes map them).
template <typename T>
std::atomic_ref<T> Shared(T& word) {
  return std::atomic_ref<T>(word);
}

bool PowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

StatusOr<UniqueFd> NewEventFd() {
  UniqueFd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid())
    return DescriptorError(StatusCode::kUnavailable, "a request ring's eventfd", errno);
  return fd;
}

// Descriptor `fd` of the process behind `pidfd`, duplicated into this one.
StatusOr<UniqueFd> TakeFd(int pidfd, uint32_t fd, const std::string& what) {
  UniqueFd mine(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, static_cast<int>(fd), 0)));
  if (!mine.valid()) {
    return DescriptorError(StatusCode::kFailedPrecondition,
                           "same-host request ring: cannot take " + what + " (descriptor " +
                               std::to_string(fd) + ", pidfd_getfd)",
                           errno);
  }
  return mine;
}

// Whether `fd` is an eventfd.
bool IsEventFd(int fd) {
  char path[64], target[64] = {};
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(path, target, sizeof(target) - 1);
  return n > 0 && std::string_view(target, static_cast<size_t>(n)) == "anon_inode:[eventfd]";
}

// Copies `len` bytes between a ring's data (at position `pos`, wrapping)
// and `iov`, starting `skip` bytes into it. to_ring: from iov into the ring.
void CopyIov(char* ring, uint32_t capacity, uint64_t pos, const iovec* iov, int n, size_t skip,
             size_t len, bool to_ring) {
  const uint64_t mask = capacity - 1;
  for (int i = 0; i < n && len > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    char* p = static_cast<char*>(iov[i].iov_base) + skip;
    size_t left = std::min(iov[i].iov_len - skip, len);
    skip = 0;
    len -= left;
    while (left > 0) {
      const uint64_t at = pos & mask;
      const size_t chunk = std::min<uint64_t>(left, capacity - at);
      if (to_ring) {
        std::memcpy(ring + at, p, chunk);
      } else {
        std::memcpy(p, ring + at, chunk);
      }
      p += chunk;
      pos += chunk;
      left -= chunk;
    }
  }
}

size_t IovBytes(const iovec* iov, int n) {
  size_t total = 0;
  for (int i = 0; i < n; ++i) total += iov[i].iov_len;
  return total;
}

}  // namespace

RequestRing::RequestRing(char* base, uint32_t capacity, int side, UniqueFd own_wake,
                         UniqueFd peer_wake)
    : header_(reinterpret_cast<RingHeader*>(base)),
      data_(base + kRingHeaderBytes),
      capacity_(capacity),
      side_(side),
      own_wake_(std::move(own_wake)),
      peer_wake_(std::move(peer_wake)) {}

RequestRing::~RequestRing() = default;

StatusOr<std::unique_ptr<RequestRing>> RequestRing::Create(uint32_t capacity) {
  if (!PowerOfTwo(capacity) || capacity < kRingMinCapacity || capacity > kRingMaxCapacity) {
    return InvalidArgumentError("request ring capacity " + std::to_string(capacity) +
                                " is not a power of two in [" + std::to_string(kRingMinCapacity) +
                                ", " + std::to_string(kRingMaxCapacity) + "]");
  }
  FERRY_ASSIGN_OR_RETURN(SharedMemory mem,
                         SharedMemory::Create(RingMappingBytes(capacity), "ferry-request-ring"));
  FERRY_ASSIGN_OR_RETURN(UniqueFd mine, NewEventFd());
  FERRY_ASSIGN_OR_RETURN(UniqueFd theirs, NewEventFd());
  auto* h = new (mem.data()) RingHeader{};
  h->magic = kRingMagic;
  h->version = kRingVersion;
  h->capacity = capacity;
  // Until a consumer polls, its producer signals.
  h->ring[0].consumer_sleeping = 1;
  h->ring[1].consumer_sleeping = 1;
  std::unique_ptr<RequestRing> ring(new RequestRing(static_cast<char*>(mem.data()), capacity, 0,
                                                    std::move(mine), std::move(theirs)));
  struct stat st {};
  if (::fstat(mem.fd(), &st) == 0) ring->sync_key_ = static_cast<uint64_t>(st.st_ino) * 4;
  ring->owned_ = std::move(mem);
  return ring;
}

StatusOr<std::unique_ptr<RequestRing>> RequestRing::Take(int pidfd, const HelloRing& fds,
                                                         const std::string& peer) {
  const uint32_t cap = fds.capacity;
  if (!PowerOfTwo(cap) || cap < kRingMinCapacity || cap > kRingMaxCapacity) {
    return DataLossError("same-host request ring of " + peer + ": capacity " + std::to_string(cap) +
                         " is not a power of two in [" + std::to_string(kRingMinCapacity) + ", " +
                         std::to_string(kRingMaxCapacity) + "]");
  }
  FERRY_ASSIGN_OR_RETURN(UniqueFd memfd, TakeFd(pidfd, fds.memfd, "the rings' memfd of " + peer));
  FERRY_ASSIGN_OR_RETURN(UniqueFd mine,
                         TakeFd(pidfd, fds.target_wake, "the target's eventfd of " + peer));
  FERRY_ASSIGN_OR_RETURN(UniqueFd theirs,
                         TakeFd(pidfd, fds.initiator_wake, "the initiator's eventfd of " + peer));
  if (!IsEventFd(mine.get()) || !IsEventFd(theirs.get())) {
    return FailedPreconditionError("same-host request ring of " + peer +
                                   ": a descriptor named as an eventfd is not one");
  }
  struct stat st {};
  if (::fstat(memfd.get(), &st) != 0) {
    return DescriptorError(StatusCode::kFailedPrecondition,
                           "same-host request ring of " + peer + ": fstat of its memfd", errno);
  }
  // PeerMapping checks the seal against shrinking and the size.
  FERRY_ASSIGN_OR_RETURN(
      std::unique_ptr<PeerMapping> map,
      PeerMapping::Open(memfd.get(), 0, RingMappingBytes(cap), static_cast<uint64_t>(st.st_dev),
                        static_cast<uint64_t>(st.st_ino), "the request rings of " + peer));
  if (static_cast<uint64_t>(st.st_size) != RingMappingBytes(cap)) {
    return FailedPreconditionError("same-host request ring of " + peer + ": its memfd holds " +
                                   std::to_string(st.st_size) + " bytes, not " +
                                   std::to_string(RingMappingBytes(cap)));
  }
  auto* h = reinterpret_cast<RingHeader*>(map->data());
  if (Shared(h->magic).load() != kRingMagic || Shared(h->version).load() != kRingVersion ||
      Shared(h->capacity).load() != cap) {
    return FailedPreconditionError("same-host request ring of " + peer +
                                   ": its header is not a version " + std::to_string(kRingVersion) +
                                   " ring of " + std::to_string(cap) + " bytes");
  }
  std::unique_ptr<RequestRing> ring(
      new RequestRing(map->data(), cap, 1, std::move(mine), std::move(theirs)));
  ring->taken_ = std::move(map);
  ring->sync_key_ = static_cast<uint64_t>(st.st_ino) * 4;
  return ring;
}

std::unique_ptr<RequestRing> RequestRing::OverMemory(void* mapping, uint32_t capacity, int side,
                                                     UniqueFd own_wake, UniqueFd peer_wake) {
  return std::unique_ptr<RequestRing>(new RequestRing(static_cast<char*>(mapping), capacity, side,
                                                      std::move(own_wake), std::move(peer_wake)));
}

HelloRing RequestRing::fds() const {
  HelloRing f;
  f.memfd = static_cast<uint32_t>(owned_.fd());
  f.initiator_wake = static_cast<uint32_t>(own_wake_.get());
  f.target_wake = static_cast<uint32_t>(peer_wake_.get());
  f.capacity = capacity_;
  return f;
}

bool RequestRing::Attached() const {
  return Shared(header_->attached).load(std::memory_order_acquire) == 1;
}

void RequestRing::MarkAttached() { Shared(header_->attached).store(1, std::memory_order_release); }

void RequestRing::Signal() {
  if (!peer_wake_.valid()) return;
  const uint64_t one = 1;
  // EAGAIN (the counter is full) leaves it readable: the wake-up is there.
  [[maybe_unused]] ssize_t w = ::write(peer_wake_.get(), &one, sizeof(one));
}

StatusOr<size_t> RequestRing::Write(const iovec* iov, int n) {
  RingControl& c = tx();
  const size_t want = IovBytes(iov, n);
  size_t done = 0;
  while (done < want) {
    const uint64_t head = Shared(c.head).load(std::memory_order_acquire);
    TsanAcquire(sync_key_ + 2 * side_ + 1);
    const uint64_t used = tail_ - head;
    if (used > capacity_) {
      return DataLossError("same-host request ring: the peer's read position " +
                           std::to_string(head) + " is not within " + std::to_string(capacity_) +
                           " bytes behind the write position " + std::to_string(tail_));
    }
    const size_t room = std::min<uint64_t>(capacity_ - used, want - done);
    if (room == 0) {
      // Full: ask the consumer for a signal, then look again (it may have
      // read in between and not seen the request).
      Shared(c.producer_waiting).store(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (Shared(c.head).load(std::memory_order_acquire) != head) {
        Shared(c.producer_waiting).store(0, std::memory_order_relaxed);
        continue;
      }
      break;
    }
    CopyIov(tx_data(), capacity_, tail_, iov, n, /*skip=*/done, room, /*to_ring=*/true);
    tail_ += room;
    done += room;
    TsanRelease(sync_key_ + 2 * side_);
    Shared(c.tail).store(tail_, std::memory_order_release);
  }
  if (done > 0) {
    // Published: a consumer about to sleep gets a signal (its flag and our
    // position are each written, then the other read: one sees the other).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (Shared(c.consumer_sleeping).load(std::memory_order_relaxed) != 0 &&
        Shared(c.consumer_sleeping).exchange(0) != 0) {
      Signal();
    }
  }
  return done;
}

StatusOr<size_t> RequestRing::Read(const iovec* iov, int n) {
  RingControl& c = rx();
  const uint64_t tail = Shared(c.tail).load(std::memory_order_acquire);
  TsanAcquire(sync_key_ + 2 * (1 - side_));
  const uint64_t avail = tail - head_;
  if (avail > capacity_) {
    return DataLossError("same-host request ring: the peer's write position " +
                         std::to_string(tail) + " is not within " + std::to_string(capacity_) +
                         " bytes ahead of the read position " + std::to_string(head_));
  }
  const size_t got = std::min<uint64_t>(avail, IovBytes(iov, n));
  if (got == 0) return size_t{0};
  CopyIov(rx_data(), capacity_, head_, iov, n, /*skip=*/0, got, /*to_ring=*/false);
  head_ += got;
  TsanRelease(sync_key_ + 2 * (1 - side_) + 1);
  Shared(c.head).store(head_, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (Shared(c.producer_waiting).load(std::memory_order_relaxed) != 0 &&
      Shared(c.producer_waiting).exchange(0) != 0) {
    Signal();
  }
  return got;
}

bool RequestRing::Readable() const {
  return Shared(rx().tail).load(std::memory_order_acquire) != head_;
}

bool RequestRing::ArmRead() {
  Shared(rx().consumer_sleeping).store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (Readable()) {
    Shared(rx().consumer_sleeping).store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void RequestRing::DisarmRead() {
  if (Shared(rx().consumer_sleeping).load(std::memory_order_relaxed) != 0) {
    Shared(rx().consumer_sleeping).store(0, std::memory_order_relaxed);
  }
}

void RequestRing::WakeSelf() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(own_wake_.get(), &one, sizeof(one));
}

void RequestRing::ClearWake() {
  uint64_t v;
  [[maybe_unused]] ssize_t r = ::read(own_wake_.get(), &v, sizeof(v));
}

}  // namespace ferry::internal::shm
