// fuzz_request_ring: the request rings of same-host streams
// (src/transport/shm/request_ring.h), whose shared positions and flags the
// peer can write at any time. The input is a script: each step writes a
// value the peer chose over a shared word, or has one side write or read a
// number of bytes. Whatever the peer writes, a side never copies more than
// it was asked, never more than the ring holds, reads and writes only the
// mapping and the buffers it was given (ASan), and a broken ring is
// reported as DATA_LOSS naming the position.
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_targets.h"
#include "transport/shm/request_ring.h"

namespace ferry::fuzz {
namespace {

namespace shm = ferry::internal::shm;
using ferry::internal::UniqueFd;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr uint32_t kCapacity = shm::kRingMinCapacity;

}  // namespace

void FuzzRequestRing(std::string_view in) {
  // Heap memory, so ASan sees any access past the rings.
  std::vector<char> mem(shm::RingMappingBytes(kCapacity), 0);
  auto* h = reinterpret_cast<shm::RingHeader*>(mem.data());
  h->magic = shm::kRingMagic;
  h->version = shm::kRingVersion;
  h->capacity = kCapacity;
  std::unique_ptr<shm::RequestRing> side[2] = {
      shm::RequestRing::OverMemory(mem.data(), kCapacity, 0, UniqueFd(), UniqueFd()),
      shm::RequestRing::OverMemory(mem.data(), kCapacity, 1, UniqueFd(), UniqueFd())};
  std::vector<char> src(3 * kCapacity), dst(3 * kCapacity);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7);
  size_t at = 0;
  auto byte = [&]() -> uint8_t { return at < in.size() ? static_cast<uint8_t>(in[at++]) : 0; };
  auto u64 = [&]() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{byte()} << (8 * i);
    return v;
  };
  while (at < in.size()) {
    const uint8_t op = byte();
    const int s = op & 1;
    shm::RingControl& c = h->ring[(op >> 1) & 1];
    switch ((op >> 2) % 6) {
      case 0:  // the peer writes a position
        __atomic_store_n((op & 0x80) ? &c.tail : &c.head, u64(), __ATOMIC_RELAXED);
        break;
      case 1:  // ... or a flag
        __atomic_store_n((op & 0x80) ? &c.producer_waiting : &c.consumer_sleeping,
                         static_cast<uint32_t>(u64()), __ATOMIC_RELAXED);
        break;
      case 2: {  // a side writes, in up to three pieces
        const size_t len = (uint64_t{byte()} << 8 | byte()) % src.size();
        iovec v[3] = {{src.data(), len / 3},
                      {src.data() + len / 3, len / 3},
                      {src.data() + 2 * (len / 3), len - 2 * (len / 3)}};
        auto n = side[s]->Write(v, 3);
        if (n.ok()) {
          Check(*n <= len);
        } else {
          Check(n.status().code() == ferry::StatusCode::kDataLoss);
          Check(n.status().message().find("position") != std::string::npos);
        }
        break;
      }
      case 3: {  // a side reads
        const size_t len = (uint64_t{byte()} << 8 | byte()) % dst.size();
        iovec v[2] = {{dst.data(), len / 2}, {dst.data() + len / 2, len - len / 2}};
        auto n = side[s]->Read(v, 2);
        if (n.ok()) {
          Check(*n <= len && *n <= kCapacity);
        } else {
          Check(n.status().code() == ferry::StatusCode::kDataLoss);
          Check(n.status().message().find("position") != std::string::npos);
        }
        break;
      }
      case 4:
        (void)side[s]->Readable();
        break;
      case 5:
        if (side[s]->ArmRead()) side[s]->DisarmRead();
        break;
    }
  }
}

}  // namespace ferry::fuzz
