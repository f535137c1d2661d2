// Mapped segments (docs/architecture.md, "Mapped segments"): a same-host
// peer's shared memory (AllocateShared, MemoryRegion::fd) is mapped by the
// initiator, which copies itself. The whole conformance suite also runs over
// this path ("shm_mapped"); these are the cases particular to it: what
// registration refuses, that no request reaches the peer, a killed peer,
// and the unregistration guarantee against copies in flight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "tests/conformance/conformance_fixture.h"
#include "tests/integration/peer_process.h"

namespace ferry::test {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
constexpr size_t kLen = 256 * 1024;

EngineOptions Shm() { return ConformanceOptions("shm"); }

// Registration checks the descriptor it is given: nothing a peer could map
// unsafely (a file that may shrink, pages that are not the memory's) is
// accepted, and a refusal registers nothing.
TEST(SharedRegistration, RefusesDescriptorsThatAreNotTheMemorysSealedPages) {
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(ConformanceOptions("local")));
  AlignedBuffer shared(kLen, true), plain(kLen);
  MemoryRegion wrong_fd{plain.data(), kLen};
  wrong_fd.fd = shared.fd();
  EXPECT_THAT(engine->RegisterMemory({&wrong_fd, 1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("shared memory at")));
  MemoryRegion wrong_offset{shared.data(), kLen / 2};
  wrong_offset.fd = shared.fd();
  wrong_offset.fd_offset = 4096;
  EXPECT_THAT(engine->RegisterMemory({&wrong_offset, 1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("file offset")));
  int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, kLen), 0);
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, unsealed, 0);
  ASSERT_NE(p, MAP_FAILED);
  MemoryRegion not_sealed{p, kLen};
  not_sealed.fd = unsealed;
  EXPECT_THAT(engine->RegisterMemory({&not_sealed, 1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("F_SEAL_SHRINK")));
  // In a list: all or nothing, and the message says which region.
  std::vector<MemoryRegion> list = {{shared.data(), kLen}, not_sealed};
  list[0].fd = shared.fd();
  EXPECT_THAT(engine->RegisterMemory(list),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("region 1 of the list")));
  MemoryRegion good{shared.data(), kLen};
  good.fd = shared.fd();
  EXPECT_OK(engine->RegisterMemory({&good, 1}));
  EXPECT_OK(engine->UnregisterMemory(shared.data()));
  munmap(p, kLen);
  close(unsealed);
}

// Open descriptors of this process.
int OpenFds() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    (void)e;
    ++n;
  }
  return n;
}

// A pool carves one memfd into many registered buffers: the engine keeps
// one descriptor for the file, not one per buffer.
TEST(SharedRegistration, ManyRegionsOfOneFileHoldOneDescriptor) {
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(ConformanceOptions("shm")));
  constexpr size_t kPieces = 64, kPiece = 4096;
  AlignedBuffer arena(kPieces * kPiece, true);
  const int before = OpenFds();
  for (size_t i = 0; i < kPieces; ++i) {
    MemoryRegion r{arena.data() + i * kPiece, kPiece};
    r.fd = arena.fd();
    r.fd_offset = i * kPiece;
    ASSERT_OK(engine->RegisterMemory({&r, 1})) << "piece " << i;
  }
  EXPECT_LE(OpenFds(), before + 1);
  for (size_t i = 0; i < kPieces; ++i)
    ASSERT_OK(engine->UnregisterMemory(arena.data() + i * kPiece));
  EXPECT_LE(OpenFds(), before);
}

TEST(AllocateShared, RegisteredZeroFilledAndFreedOnce) {
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(ConformanceOptions("local")));
  EXPECT_THAT(engine->AllocateShared(0), StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK_AND_ASSIGN(void* p, engine->AllocateShared(10000));
  const auto* bytes = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < 10000; ++i) ASSERT_EQ(bytes[i], 0) << i;
  EXPECT_THAT(engine->RegisterMemory(p, 100), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_OK(engine->FreeShared(p));
  EXPECT_THAT(engine->FreeShared(p), StatusIs(StatusCode::kNotFound));
  int local = 0;
  EXPECT_THAT(engine->FreeShared(&local), StatusIs(StatusCode::kNotFound));
  // Left allocated: the engine unmaps it when it is destroyed.
  ASSERT_OK_AND_ASSIGN(void* left, engine->AllocateShared(4096));
  EXPECT_NE(left, nullptr);
}

// A stopped peer process serves no request, yet writes to and reads from
// its shared buffer complete: the initiator copies through its own mapping.
// The same transfers with map_shared_memory = 0 go through the peer and wait
// for it.
TEST(MappedSegments, CopiesNeedNoRequestToThePeer) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  PeerProcess peer;
  ASSERT_TRUE(peer.Start(FERRY_TEST_PEER_PATH, {"--size", std::to_string(kLen), "--shared", "1"}));
  AlignedBuffer src(kLen), back(kLen);
  EngineOptions through_peer = Shm();
  through_peer.map_shared_memory = false;
  through_peer.transfer_timeout = std::chrono::milliseconds(300);
  ASSERT_OK_AND_ASSIGN(auto mapped, Engine::Create(Shm()));
  ASSERT_OK_AND_ASSIGN(auto unmapped, Engine::Create(through_peer));
  for (Engine* e : {mapped.get(), unmapped.get()}) {
    ASSERT_OK(e->RegisterMemory(src.data(), kLen));
    ASSERT_OK(e->RegisterMemory(back.data(), kLen));
  }
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, mapped->OpenSegment(peer.peer_id()));
  ASSERT_OK_AND_ASSIGN(SegmentHandle useg, unmapped->OpenSegment(peer.peer_id()));
  // Both links open while the peer runs.
  FillPattern(src.data(), kLen, 5, 0);
  ASSERT_OK(unmapped->TransferSync({Opcode::kRead, back.data(), useg, peer.buffer_addr(), 64}));
  ASSERT_OK(mapped->TransferSync({Opcode::kRead, back.data(), seg, peer.buffer_addr(), 64}));

  ASSERT_TRUE(peer.Freeze());
  EXPECT_OK(mapped->TransferSync({Opcode::kWrite, src.data(), seg, peer.buffer_addr(), kLen}));
  EXPECT_OK(mapped->TransferSync({Opcode::kRead, back.data(), seg, peer.buffer_addr(), kLen}));
  EXPECT_EQ(std::memcmp(src.data(), back.data(), kLen), 0);
  // Its deadline passes, or its link is closed for the request that timed
  // out first (which of the two the request reports depends on the order).
  EXPECT_THAT(unmapped->TransferSync({Opcode::kWrite, src.data(), useg, peer.buffer_addr(), 4096}),
              AnyOf(StatusIs(StatusCode::kDeadlineExceeded),
                    StatusIs(StatusCode::kUnavailable, HasSubstr("timed out"))));
  peer.Signal(SIGCONT);
  EXPECT_EQ(peer.Call("CHECK 5"), "OK");
}

uint64_t Fnv(const unsigned char* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Memory the peer allocates after this engine fetched its descriptor is
// still mapped: the first request outside every region it knows fetches the
// descriptor again (once), and from then on copies need the peer no more.
TEST(MappedSegments, RegionsRegisteredAfterTheHandshakeAreMappedToo) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  PeerProcess peer;
  ASSERT_TRUE(peer.Start(FERRY_TEST_PEER_PATH, {"--size", "65536", "--shared", "1"}));
  AlignedBuffer src(kLen);
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(Shm()));
  ASSERT_OK(engine->RegisterMemory(src.data(), kLen));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine->OpenSegment(peer.peer_id()));
  ASSERT_OK(engine->TransferSync({Opcode::kWrite, src.data(), seg, peer.buffer_addr(), 4096}));
  const std::string reply = peer.Call("SHARED " + std::to_string(kLen));
  ASSERT_TRUE(reply.starts_with("SHARED 0x")) << reply;
  const uint64_t late = std::stoull(reply.substr(7), nullptr, 16);
  FillPattern(src.data(), kLen, 9, 0);
  ASSERT_OK(engine->TransferSync({Opcode::kWrite, src.data(), seg, late, 4096}));  // refetches
  ASSERT_TRUE(peer.Freeze());
  EXPECT_OK(engine->TransferSync({Opcode::kWrite, src.data(), seg, late, kLen}));
  peer.Signal(SIGCONT);
  char addr[32];
  std::snprintf(addr, sizeof(addr), "0x%llx", static_cast<unsigned long long>(late));
  EXPECT_EQ(peer.Call("SUM " + std::string(addr) + " " + std::to_string(kLen)),
            "SUM " + std::to_string(Fnv(src.data(), kLen)));
}

// A killed peer: the next transfer fails kUnavailable naming it, although
// its pages are still mapped here.
TEST(MappedSegments, KilledPeerIsUnavailableNamingIt) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  PeerProcess peer;
  ASSERT_TRUE(peer.Start(FERRY_TEST_PEER_PATH, {"--size", std::to_string(kLen), "--shared", "1"}));
  AlignedBuffer src(kLen);
  ASSERT_OK_AND_ASSIGN(auto engine, Engine::Create(Shm()));
  ASSERT_OK(engine->RegisterMemory(src.data(), kLen));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, engine->OpenSegment(peer.peer_id()));
  ASSERT_OK(engine->TransferSync({Opcode::kWrite, src.data(), seg, peer.buffer_addr(), kLen}));
  peer.Kill();
  const Status s =
      engine->TransferSync({Opcode::kWrite, src.data(), seg, peer.buffer_addr(), kLen});
  EXPECT_THAT(s, StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(s, IsError(HasSubstr(peer.peer_id())));
}

// UnregisterMemory while a peer writes through its mapping in a loop: once
// it returns, not one more byte lands (the buffer keeps what it held then),
// and later writes are refused as outside every region.
TEST(MappedSegments, UnregisterWaitsForCopiesAndRefusesLaterOnes) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  constexpr size_t kBig = 4 << 20;
  AlignedBuffer src(kBig), target_buf(kBig, true);
  ASSERT_OK_AND_ASSIGN(auto initiator, Engine::Create(Shm()));
  ASSERT_OK_AND_ASSIGN(auto target, Engine::Create(Shm()));
  ASSERT_OK(initiator->RegisterMemory(src.data(), kBig));
  MemoryRegion region{target_buf.data(), kBig};
  region.fd = target_buf.fd();
  ASSERT_OK(target->RegisterMemory({&region, 1}));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, initiator->OpenSegment(target->PeerId()));
  const uint64_t remote = target_buf.addr();

  std::atomic<int> written{0};
  std::atomic<int> refused{0};
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (unsigned char v = 1; !stop.load(); ++v) {
      std::memset(src.data(), v == 0 ? 1 : v, kBig);
      if (initiator->TransferSync({Opcode::kWrite, src.data(), seg, remote, kBig}).ok()) {
        written.fetch_add(1);
      } else {
        refused.fetch_add(1);
      }
    }
  });
  // Bounded waits: a writer that is never refused fails the test, not hangs it.
  const auto deadline = std::chrono::steady_clock::now() + kWaitTimeout;
  auto waits_for = [&](const std::atomic<int>& n) {
    while (n.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    return n.load() >= 3;
  };
  if (!waits_for(written)) {  // join the writer before failing
    stop.store(true);
    writer.join();
    FAIL() << "the writer never completed 3 writes";
  }
  EXPECT_OK(target->UnregisterMemory(target_buf.data()));
  std::vector<unsigned char> at_return(target_buf.data(), target_buf.data() + kBig);
  // Let the writer be refused a few times after the return.
  const bool were_refused = waits_for(refused);
  stop.store(true);
  writer.join();
  EXPECT_TRUE(were_refused) << "writes after UnregisterMemory returned were not refused";
  EXPECT_EQ(std::memcmp(at_return.data(), target_buf.data(), kBig), 0)
      << "bytes landed after UnregisterMemory returned";
  EXPECT_THAT(initiator->TransferSync({Opcode::kWrite, src.data(), seg, remote, kBig}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("not inside a registered")));
  EXPECT_EQ(std::memcmp(at_return.data(), target_buf.data(), kBig), 0);
}

}  // namespace
}  // namespace ferry::test
