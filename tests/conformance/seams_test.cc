// The engine through its seams: memory kinds (with the test kind the CPU
// must not touch), descriptor formats of older builds, and a metadata store
// that resolves names (memory://) and watches for restarts.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/status_matchers.h"

namespace ferry::test {
namespace {

constexpr size_t kSize = 64 << 10;

EngineOptions Options(const std::string& transport) {
  EngineOptions o;
  o.transport = transport;
  o.listen_host = "127.0.0.1";
  o.transfer_timeout = std::chrono::milliseconds(30000);
  o.testing.allow_test_memory_kind = true;
  return o;
}

// Pages the CPU must not touch while a transfer runs (PROT_NONE); the test
// fills and checks them by lifting the protection in between.
class OpaquePages {
 public:
  OpaquePages() {
    p_ = static_cast<unsigned char*>(
        ::mmap(nullptr, kSize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(p_, MAP_FAILED);
  }
  ~OpaquePages() { ::munmap(p_, kSize); }
  unsigned char* data() const { return p_; }
  void Fill(unsigned char v) {
    ::mprotect(p_, kSize, PROT_READ | PROT_WRITE);
    std::memset(p_, v, kSize);
    ::mprotect(p_, kSize, PROT_NONE);
  }
  std::vector<unsigned char> Copy() {
    ::mprotect(p_, kSize, PROT_READ);
    std::vector<unsigned char> out(p_, p_ + kSize);
    ::mprotect(p_, kSize, PROT_NONE);
    return out;
  }

 private:
  unsigned char* p_ = nullptr;
};

std::unique_ptr<Engine> Make(const EngineOptions& o) {
  auto e = Engine::Create(o);
  EXPECT_THAT(GetStatus(e), IsOk());
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(MemoryKinds, TestKindMovesThroughTheLocalTransportsCopyFunctions) {
  auto initiator = Make(Options("auto"));
  auto target = Make(Options("auto"));
  ASSERT_TRUE(initiator && target);
  OpaquePages opaque;
  AlignedBuffer cpu(kSize);
  ASSERT_THAT(initiator->RegisterMemory(opaque.data(), kSize, "test-opaque"), IsOk());
  ASSERT_THAT(target->RegisterMemory(cpu.data(), kSize, "cpu"), IsOk());
  auto seg = initiator->OpenSegment(target->PeerId());
  ASSERT_THAT(GetStatus(seg), IsOk());
  // The peer advertises its region's kind.
  auto info = initiator->QuerySegment(*seg);
  ASSERT_THAT(GetStatus(info), IsOk());
  ASSERT_EQ(info->regions.size(), 1u);
  EXPECT_EQ(info->regions[0].kind, "cpu");

  opaque.Fill(0xab);
  ASSERT_THAT(initiator->TransferSync({Opcode::kWrite, opaque.data(), *seg, cpu.addr(), kSize}),
              IsOk());
  EXPECT_EQ(cpu.data()[0], 0xab);
  EXPECT_EQ(cpu.data()[kSize - 1], 0xab);
  std::memset(cpu.data(), 0x5c, kSize);
  ASSERT_THAT(
      initiator->TransferSync({Opcode::kRead, opaque.data() + 4096, *seg, cpu.addr(), 8192}),
      IsOk());
  const auto seen = opaque.Copy();
  EXPECT_EQ(seen[4095], 0xab);
  EXPECT_EQ(seen[4096], 0x5c);
  EXPECT_EQ(seen[4096 + 8191], 0x5c);
  EXPECT_EQ(seen[4096 + 8192], 0xab);
}

TEST(MemoryKinds, ATransportThatCannotTouchTheKindIsNeverPicked) {
  // Forced tcp between two engines: tcp reaches only cpu memory, so a
  // request from test-kind memory is refused before anything moves (had tcp
  // been picked, sendmsg would have failed on the PROT_NONE pages).
  auto initiator = Make(Options("tcp"));
  auto target = Make(Options("tcp"));
  ASSERT_TRUE(initiator && target);
  OpaquePages opaque;
  AlignedBuffer cpu(kSize);
  ASSERT_THAT(initiator->RegisterMemory(opaque.data(), kSize, "test-opaque"), IsOk());
  ASSERT_THAT(target->RegisterMemory(cpu.data(), kSize, "cpu"), IsOk());
  auto seg = initiator->OpenSegment(target->PeerId());
  ASSERT_THAT(GetStatus(seg), IsOk());
  Status s = initiator->TransferSync({Opcode::kWrite, opaque.data(), *seg, cpu.addr(), 4096});
  EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_NE(s.message().find("test-opaque"), std::string::npos) << s;
  EXPECT_NE(s.message().find("tcp"), std::string::npos) << s;
  // cpu to cpu still goes over tcp.
  AlignedBuffer src(kSize);
  ASSERT_THAT(initiator->RegisterMemory(src.data(), kSize), IsOk());
  std::memset(src.data(), 7, kSize);
  EXPECT_THAT(initiator->TransferSync({Opcode::kWrite, src.data(), *seg, cpu.addr(), kSize}),
              IsOk());
  EXPECT_EQ(cpu.data()[100], 7);
}

TEST(MemoryKinds, ATcpTargetRefusesRangesInMemoryItCannotTouch) {
  // An initiator of descriptor format 1 does not learn the peer's region
  // kinds, so it sends over tcp; the target must refuse, naming the kind,
  // and write nothing.
  EngineOptions old = Options("tcp");
  old.testing.descriptor_format_max = 1;
  auto initiator = Make(old);
  auto target = Make(Options("tcp"));
  ASSERT_TRUE(initiator && target);
  OpaquePages opaque;
  opaque.Fill(0x11);
  AlignedBuffer src(kSize);
  std::memset(src.data(), 0x22, kSize);
  ASSERT_THAT(initiator->RegisterMemory(src.data(), kSize), IsOk());
  ASSERT_THAT(target->RegisterMemory(opaque.data(), kSize, "test-opaque"), IsOk());
  auto seg = initiator->OpenSegment(target->PeerId());
  ASSERT_THAT(GetStatus(seg), IsOk());
  auto info = initiator->QuerySegment(*seg);
  ASSERT_THAT(GetStatus(info), IsOk());
  EXPECT_EQ(info->regions[0].kind, "cpu");  // format 1 carries no kinds
  const uint64_t remote = reinterpret_cast<uintptr_t>(opaque.data());
  Status s = initiator->TransferSync({Opcode::kWrite, src.data(), *seg, remote, 4096});
  EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(s.message().find("test-opaque memory"), std::string::npos) << s;
  EXPECT_EQ(opaque.Copy()[0], 0x11);
}

TEST(MemoryKinds, GpuMemoryIsRefusedClearlyWithoutTheCudaKind) {
  auto e = Make(Options("auto"));
  ASSERT_TRUE(e);
  AlignedBuffer b(4096);
  Status s = e->RegisterMemory(b.data(), 4096, "cuda:0");
  const CudaInfo cuda = DescribeCuda();
  if (!cuda.available) {
    // No driver here: the registration says so, naming the library.
    EXPECT_THAT(s, StatusIs(StatusCode::kFailedPrecondition));
    EXPECT_NE(s.message().find("libcuda.so.1"), std::string::npos) << s;
  } else {
    // A driver: host memory is not GPU memory of cuda:0.
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument));
    EXPECT_NE(s.message().find("starts in host memory"), std::string::npos) << s;
  }
  EXPECT_THAT(e->RegisterMemory(b.data(), 4096, "test-opaque"), IsOk());  // allowed by the options
  EngineOptions plain;
  auto p = Make(plain);
  ASSERT_TRUE(p);
  AlignedBuffer c(4096);
  EXPECT_THAT(p->RegisterMemory(c.data(), 4096, "test-opaque"),
              StatusIs(StatusCode::kInvalidArgument));
}

class DescriptorFormats : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(DescriptorFormats, EnginesOfEitherFormatTalk) {
  EngineOptions a = Options("tcp"), b = Options("tcp");
  a.testing.descriptor_format_max = static_cast<uint16_t>(GetParam().first);
  b.testing.descriptor_format_max = static_cast<uint16_t>(GetParam().second);
  auto initiator = Make(a);
  auto target = Make(b);
  ASSERT_TRUE(initiator && target);
  AlignedBuffer src(kSize), dst(kSize);
  std::memset(src.data(), 0x3c, kSize);
  ASSERT_THAT(initiator->RegisterMemory(src.data(), kSize), IsOk());
  ASSERT_THAT(target->RegisterMemory(dst.data(), kSize), IsOk());
  auto seg = initiator->OpenSegment(target->PeerId());
  ASSERT_THAT(GetStatus(seg), IsOk());
  ASSERT_THAT(initiator->TransferSync({Opcode::kWrite, src.data(), *seg, dst.addr(), kSize}),
              IsOk());
  EXPECT_EQ(dst.data()[kSize - 1], 0x3c);
  auto info = initiator->QuerySegment(*seg);
  ASSERT_THAT(GetStatus(info), IsOk());
  ASSERT_EQ(info->regions.size(), 1u);
  EXPECT_EQ(info->regions[0].addr, dst.addr());
}

INSTANTIATE_TEST_SUITE_P(OldAndNew, DescriptorFormats,
                         ::testing::Values(std::make_pair(1, 2), std::make_pair(2, 1),
                                           std::make_pair(1, 1), std::make_pair(2, 2)));

EngineOptions InCluster(const std::string& cluster, const std::string& name) {
  EngineOptions o = Options("tcp");
  o.metadata = "memory://" + cluster;
  o.local_name = name;
  return o;
}

TEST(MetadataStore, NamesThatAreNotHostPortResolveThroughAStore) {
  auto decode = Make(InCluster("names", "decode-0"));
  auto prefill = Make(InCluster("names", "prefill-0"));
  ASSERT_TRUE(decode && prefill);
  AlignedBuffer src(kSize), dst(kSize);
  std::memset(src.data(), 0x42, kSize);
  ASSERT_THAT(prefill->RegisterMemory(src.data(), kSize), IsOk());
  ASSERT_THAT(decode->RegisterMemory(dst.data(), kSize), IsOk());
  auto seg = prefill->OpenSegment("decode-0");
  ASSERT_THAT(GetStatus(seg), IsOk());
  // Published after registration: the region is in the descriptor.
  auto info = prefill->QuerySegment(*seg);
  ASSERT_THAT(GetStatus(info), IsOk());
  ASSERT_EQ(info->regions.size(), 1u);
  ASSERT_THAT(prefill->TransferSync({Opcode::kWrite, src.data(), *seg, dst.addr(), kSize}), IsOk());
  EXPECT_EQ(dst.data()[0], 0x42);
  EXPECT_THAT(GetStatus(prefill->OpenSegment("nobody")), StatusIs(StatusCode::kUnavailable));
  // P2P has no names but host:port, and says so.
  auto p2p = Make(Options("tcp"));
  ASSERT_TRUE(p2p);
  auto bad = p2p->OpenSegment("decode-0");
  EXPECT_THAT(GetStatus(bad), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_NE(GetStatus(bad).message().find("host:port"), std::string::npos) << GetStatus(bad);
}

TEST(MetadataStore, TwoLiveEnginesCannotClaimOneName) {
  auto first = Make(InCluster("claims", "decode-0"));
  ASSERT_TRUE(first);
  auto second = Engine::Create(InCluster("claims", "decode-0"));
  EXPECT_THAT(GetStatus(second), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_NE(GetStatus(second).message().find(first->PeerId()), std::string::npos)
      << GetStatus(second);
  first.reset();  // removes its entry on a clean shutdown
  EXPECT_THAT(GetStatus(Engine::Create(InCluster("claims", "decode-0"))), IsOk());
}

TEST(MetadataStore, AWatchedRestartIsReachedAtItsNewInstance) {
  auto prefill = Make(InCluster("restart", "prefill-0"));
  auto decode = Make(InCluster("restart", "decode-0"));
  ASSERT_TRUE(prefill && decode);
  AlignedBuffer src(kSize), dst1(kSize), dst2(kSize);
  std::memset(src.data(), 0x61, kSize);
  ASSERT_THAT(prefill->RegisterMemory(src.data(), kSize), IsOk());
  ASSERT_THAT(decode->RegisterMemory(dst1.data(), kSize), IsOk());
  auto seg = prefill->OpenSegment("decode-0");
  ASSERT_THAT(GetStatus(seg), IsOk());
  ASSERT_THAT(prefill->TransferSync({Opcode::kWrite, src.data(), *seg, dst1.addr(), kSize}),
              IsOk());
  auto before = prefill->QuerySegment(*seg);
  ASSERT_THAT(GetStatus(before), IsOk());
  // The decode engine restarts under the same name with another buffer.
  decode.reset();
  decode = Make(InCluster("restart", "decode-0"));
  ASSERT_TRUE(decode);
  ASSERT_THAT(decode->RegisterMemory(dst2.data(), kSize), IsOk());
  ASSERT_THAT(prefill->TransferSync({Opcode::kWrite, src.data(), *seg, dst2.addr(), kSize}),
              IsOk());
  EXPECT_EQ(dst2.data()[kSize - 1], 0x61);
  auto after = prefill->QuerySegment(*seg);
  ASSERT_THAT(GetStatus(after), IsOk());
  EXPECT_NE(after->instance_id, before->instance_id);
}

}  // namespace
}  // namespace ferry::test
