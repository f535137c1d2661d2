#include "common/tsan_sync.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif
#ifdef FERRY_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
extern "C" void __tsan_read_range(void* addr, unsigned long size);
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace ferry::internal {
namespace {

#ifdef FERRY_TSAN
char tsan_cells[4096];

uint64_t Fnv(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The address's bytes that name it (family, port, address; a unix path).
std::string Name(const sockaddr_storage& a, socklen_t len) {
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    return std::string(reinterpret_cast<const char*>(&in.sin_port), 2) +
           std::string(reinterpret_cast<const char*>(&in.sin_addr), 4);
  }
  if (a.ss_family == AF_INET6) {
    const auto& in = reinterpret_cast<const sockaddr_in6&>(a);
    return std::string(reinterpret_cast<const char*>(&in.sin6_port), 2) +
           std::string(reinterpret_cast<const char*>(&in.sin6_addr), 16);
  }
  if (a.ss_family == AF_UNIX && len > offsetof(sockaddr_un, sun_path)) {
    const auto& un = reinterpret_cast<const sockaddr_un&>(a);
    return std::string(un.sun_path, len - offsetof(sockaddr_un, sun_path));
  }
  return std::string();
}
#endif

}  // namespace

void TsanRelease([[maybe_unused]] uint64_t key) {
#ifdef FERRY_TSAN
  __tsan_release(&tsan_cells[key % sizeof(tsan_cells)]);
#endif
}

void TsanAcquire([[maybe_unused]] uint64_t key) {
#ifdef FERRY_TSAN
  __tsan_acquire(&tsan_cells[key % sizeof(tsan_cells)]);
#endif
}

void TsanBeforeSend([[maybe_unused]] uint64_t key, [[maybe_unused]] const iovec* iov,
                    [[maybe_unused]] int n) {
#ifdef FERRY_TSAN
  for (int i = 0; i < n; ++i) __tsan_read_range(iov[i].iov_base, iov[i].iov_len);
  TsanRelease(key);
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
}

void TsanAfterSend() {
#ifdef FERRY_TSAN
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}

uint64_t TsanSocketKey([[maybe_unused]] int fd) {
#ifdef FERRY_TSAN
  sockaddr_storage self{}, peer{};
  socklen_t self_len = sizeof(self), peer_len = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) {
    return 0;
  }
  std::string a = Name(self, self_len), b = Name(peer, peer_len);
  if (self.ss_family == AF_UNIX) return Fnv(a.empty() ? b : a) | 1;  // the bound end's path
  if (a > b) std::swap(a, b);
  return Fnv(a + "|" + b) | 1;
#else
  return 0;
#endif
}

}  // namespace ferry::internal
