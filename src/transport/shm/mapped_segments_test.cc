// Mapped segments' two sides in one process: the target's slot table and
// an initiator's mappings of it, including a peer that writes garbage into
// the table (it must never make the initiator copy outside a mapped region
// of the right file, nor hang the target's revocation).
#include "transport/shm/mapped_segments.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "tests/testing/status_matchers.h"

namespace ferry::internal::shm {
namespace {

using ferry::test::IsOk;
using ferry::test::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kLen = 64 * 1024;

// A registered region of shared memory, as the registry would hold it.
struct SharedRegion {
  SharedMemory mem;
  Region region;
  static std::unique_ptr<SharedRegion> Make(uint64_t length = kLen) {
    auto r = std::make_unique<SharedRegion>();
    auto mem = SharedMemory::Create(length, "mapped-test");
    EXPECT_TRUE(mem.ok()) << mem.status();
    r->mem = *std::move(mem);
    r->region.addr = reinterpret_cast<uint64_t>(r->mem.data());
    r->region.length = length;
    auto backing = VerifySharedMapping(r->mem.data(), length, r->mem.fd(), 0);
    EXPECT_TRUE(backing.ok()) << backing.status();
    r->region.shared = *backing;
    return r;
  }
};

TEST(MappedSegments, PublishMapCopyRevoke) {
  auto table = SlotTable::Create(8);
  ASSERT_TRUE(table.ok()) << table.status();
  auto r = SharedRegion::Make();
  std::optional<uint64_t> key = (*table)->Publish(r->region);
  ASSERT_TRUE(key.has_value());
  auto maps = PeerMaps::Open((*table)->Endpoint(), ::getpid(), "test peer");
  ASSERT_TRUE(maps.ok()) << maps.status();
  std::shared_ptr<const MappedRegion> m = (*maps)->Find(*key);
  ASSERT_NE(m, nullptr);
  ASSERT_TRUE(m->Begin());
  // Bounds: inside, the last byte, one past, before, wrapping lengths.
  const uint64_t base = r->region.addr;
  char* p = m->Translate(base + 100, 50);
  ASSERT_NE(p, nullptr);
  std::memcpy(p, "through the mapping", 19);
  EXPECT_EQ(std::memcmp(static_cast<char*>(r->mem.data()) + 100, "through the mapping", 19), 0);
  EXPECT_NE(m->Translate(base + kLen - 1, 1), nullptr);
  EXPECT_EQ(m->Translate(base + kLen - 1, 2), nullptr);
  EXPECT_EQ(m->Translate(base - 1, 2), nullptr);
  EXPECT_EQ(m->Translate(base + 8, UINT64_MAX), nullptr);
  EXPECT_EQ(m->Translate(UINT64_MAX, 1), nullptr);
  m->End();

  // Not shared or not exported: no key (peers copy through the target).
  Region plain;
  plain.addr = 4096;
  plain.length = 4096;
  EXPECT_FALSE((*table)->Publish(plain).has_value());
  r->region.exported = false;
  EXPECT_FALSE((*table)->Publish(r->region).has_value());
  r->region.exported = true;

  // Revoked: Begin refuses, and the stale key maps nothing once forgotten;
  // the slot's next region has a new key.
  (*table)->Revoke(*key);
  EXPECT_FALSE(m->Begin());
  (*maps)->Forget(*key);
  EXPECT_EQ((*maps)->Find(*key), nullptr);
  std::optional<uint64_t> again = (*table)->Publish(r->region);
  ASSERT_TRUE(again.has_value());
  EXPECT_NE(*again, *key);
  EXPECT_NE((*maps)->Find(*again), nullptr);

  // The target runs while its table is open; closed (its engine shut
  // down), it is gone for good, and its regions are revoked.
  EXPECT_TRUE((*maps)->PeerRuns());
  std::shared_ptr<const MappedRegion> last = (*maps)->Find(*again);
  (*table)->Close();
  EXPECT_FALSE((*maps)->PeerRuns());
  EXPECT_FALSE((*maps)->PeerRuns());
  EXPECT_FALSE(last->Begin());
}

TEST(MappedSegments, MalformedOrForeignEndpointsAreRefused) {
  auto table = SlotTable::Create(8);
  ASSERT_TRUE(table.ok());
  for (const char* bad :
       {"", "1:2:3", "x:1:2:3:4", "1:2:3:4:0", "1:-1:3:4:5", "1:2:3:4:5:6", "1:2:3:4:99999999"}) {
    EXPECT_THAT(PeerMaps::Open(bad, ::getpid(), "p").status(),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("malformed")))
        << bad;
  }
  // Slot 0 is the header, never a region.
  auto maps = PeerMaps::Open((*table)->Endpoint(), ::getpid(), "p");
  ASSERT_TRUE(maps.ok());
  EXPECT_EQ((*maps)->Find(0), nullptr);
  // Another process's table (the pid that answers the socket differs).
  EXPECT_THAT(PeerMaps::Open((*table)->Endpoint(), ::getpid() + 1, "p").status(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("answers its socket")));
  // The right pid but another file's identity.
  std::string ep = (*table)->Endpoint();
  ep = ep.substr(0, ep.rfind(':'));
  ep = ep.substr(0, ep.rfind(':')) + ":12345:" + std::to_string(kMapSlots);
  EXPECT_THAT(PeerMaps::Open(ep, ::getpid(), "p").status(),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not the one advertised")));
}

// A peer scribbles over the shared table while this process maps and copies
// through it: every mapping it gets is bounded by what it mapped (ASan
// checks each store), and revoking with a garbage count returns (bounded).
TEST(MappedSegments, GarbageInTheTableNeverLeadsOutsideAMapping) {
  auto table = SlotTable::Create(4, std::chrono::milliseconds(20));
  ASSERT_TRUE(table.ok());
  auto r = SharedRegion::Make();
  std::optional<uint64_t> key = (*table)->Publish(r->region);
  ASSERT_TRUE(key.has_value());
  // The hostile peer's own view of the table.
  unsigned int pid = 0, slots = 0;
  int fd = -1;
  unsigned long long dev = 0, ino = 0;
  ASSERT_EQ(std::sscanf((*table)->Endpoint().c_str(), "%u:%d:%llu:%llu:%u", &pid, &fd, &dev, &ino,
                        &slots),
            5);
  auto view = PeerMapping::Open(fd, 0, slots * sizeof(MapSlot), dev, ino, "table");
  ASSERT_TRUE(view.ok()) << view.status();
  auto* table_raw = reinterpret_cast<unsigned char*>((*view)->data());
  unsigned char* raw = table_raw + sizeof(MapSlot) * static_cast<uint32_t>(*key);  // its slot
  unsigned char good[sizeof(MapSlot)];
  std::memcpy(good, raw, sizeof(MapSlot));
  std::mt19937_64 rng(20261204);
  int mapped = 0;
  for (int round = 0; round < 400; ++round) {
    // Garbage over a random part of slot 0 (sometimes keeping the good
    // fields, so some rounds still map a real file), or of every slot.
    std::memcpy(raw, good, sizeof(MapSlot));
    const size_t from = rng() % sizeof(MapSlot), n = 1 + rng() % (sizeof(MapSlot) - from);
    for (size_t i = 0; i < n; ++i) raw[from + i] = static_cast<unsigned char>(rng());
    if (round % 10 == 0) {
      for (size_t i = 0; i < slots * sizeof(MapSlot); ++i)
        raw[i] = static_cast<unsigned char>(rng());
    }
    const uint64_t probe_key = round % 3 == 0 ? rng() : (rng() % 8) << 32 | (rng() % 6);
    // A new initiator each round (a link caches what a key maps to).
    auto maps = PeerMaps::Open((*table)->Endpoint(), ::getpid(), "test peer");
    ASSERT_TRUE(maps.ok());
    (void)(*maps)->PeerRuns();  // whatever the header holds: an answer, no crash
    for (uint64_t k : {*key, probe_key}) {
      std::shared_ptr<const MappedRegion> m = (*maps)->Find(k);
      if (m == nullptr || !m->Begin()) continue;
      ++mapped;
      for (int i = 0; i < 8; ++i) {
        const uint64_t at = r->region.addr + (rng() % (2 * kLen)) - kLen / 2;
        const uint64_t len = 1 + rng() % kLen;
        if (char* p = m->Translate(at, len)) std::memset(p, 0x5a, len);  // ASan: in bounds
      }
      m->End();
    }
  }
  EXPECT_GT(mapped, 0) << "no round mapped the real region";
  // A garbage count of copies in flight: the revocation gives up after its
  // bound instead of hanging, and the engine goes on.
  std::memcpy(raw, good, sizeof(MapSlot));
  reinterpret_cast<MapSlot*>(raw)->active.store(7);
  (*table)->Revoke(*key);
  EXPECT_EQ(reinterpret_cast<MapSlot*>(raw)->state.load(), kSlotFree);
  auto r2 = SharedRegion::Make();
  EXPECT_TRUE((*table)->Publish(r2->region).has_value()) << "the table still publishes";
}

TEST(SharedMapping, VerifyRefusesWhatAPeerCouldNotMapSafely) {
  // Unsealed memfd.
  int fd = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kLen), 0);
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_THAT(VerifySharedMapping(p, kLen, fd, 0).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("F_SEAL_SHRINK")));
  munmap(p, kLen);
  close(fd);

  auto shared = SharedMemory::Create(kLen, "verify");
  ASSERT_TRUE(shared.ok());
  EXPECT_THAT(VerifySharedMapping(shared->data(), kLen, shared->fd(), 0).status(), IsOk());
  // The wrong offset, a range past the file, memory that is not this file.
  EXPECT_THAT(VerifySharedMapping(shared->data(), 4096, shared->fd(), 4096).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("file offset")));
  EXPECT_THAT(VerifySharedMapping(shared->data(), kLen, shared->fd(), 8192).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("past the end")));
  std::vector<char> heap(kLen);
  EXPECT_THAT(VerifySharedMapping(heap.data(), 4096, shared->fd(), 0).status(),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(VerifySharedMapping(shared->data(), kLen, 1 << 20, 0).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cannot be examined")));
  // A range that runs past the mapping into unmapped space.
  auto small = SharedMemory::Create(4096, "small");
  ASSERT_TRUE(small.ok());
  EXPECT_THAT(VerifySharedMapping(small->data(), 4096, small->fd(), 0).status(), IsOk());
  EXPECT_THAT(SharedMemory::Create(0, "zero").status(), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace ferry::internal::shm
