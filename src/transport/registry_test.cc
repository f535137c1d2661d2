// The transport registry (built-in list, ListTransports), what the seam's
// types answer (Transport::Handles, PeerInfo), and the memory-domain hook:
// TransportSet with a fake keyed transport under a MemoryRegistry.
#include "transport/registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/memory_registry.h"
#include "base/target.h"
#include "base/transport.h"
#include "ferry/cuda.h"
#include "ferry/options.h"
#include "ferry/transports.h"
#include "tests/testing/status_matchers.h"
#include "transport/context.h"
#include "wire/descriptor.h"

namespace ferry::internal {
namespace {

using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// ---------------------------------------------------------------- registry

TEST(Registry, BuiltinTransportsAreLocalCudaIpcShmFabricTcpInThatOrder) {
  std::vector<std::string> names;
  for (const TransportEntry& e : BuiltinTransports()) names.emplace_back(e.caps().name);
  EXPECT_THAT(names, ElementsAre("local", "cuda_ipc", "shm", "fabric", "tcp"));
  EXPECT_EQ(TransportNames(), "local, cuda_ipc, shm, fabric, tcp");
}

TEST(Registry, FindTransportAgreesWithTheList) {
  const auto all = BuiltinTransports();
  for (const TransportEntry& e : all) {
    const TransportEntry* found = FindTransport(e.caps().name);
    ASSERT_NE(found, nullptr) << e.caps().name;
    EXPECT_EQ(found, &e) << e.caps().name;
  }
  EXPECT_EQ(FindTransport("rdma"), nullptr);
  EXPECT_EQ(FindTransport(""), nullptr);
  EXPECT_EQ(FindTransport("TCP"), nullptr);
  EXPECT_EQ(FindTransport("auto"), nullptr);
}

TEST(Registry, ListTransportsDescribesEachBuiltinTransport) {
  const std::vector<TransportInfo> list = ListTransports();
  ASSERT_EQ(list.size(), 5u);
  EXPECT_EQ(list[0].name, "local");
  EXPECT_EQ(list[0].reach, "same process");
  EXPECT_THAT(list[0].memory_kinds, ElementsAre("cpu", "test-opaque", "file"));
  EXPECT_EQ(list[1].name, "cuda_ipc");
  EXPECT_EQ(list[1].reach, "same host");
  EXPECT_THAT(list[1].memory_kinds, ElementsAre("cpu", "cuda"));
  EXPECT_TRUE(list[1].needs_region_keys);  // the allocations' IPC handles
  EXPECT_EQ(list[2].name, "shm");
  EXPECT_EQ(list[2].reach, "same host");
  EXPECT_THAT(list[2].memory_kinds, ElementsAre("cpu"));
  EXPECT_EQ(list[3].name, "fabric");
  EXPECT_EQ(list[3].reach, "network");
  EXPECT_THAT(list[3].memory_kinds, ElementsAre("cpu"));
  EXPECT_TRUE(list[3].needs_region_keys);  // the provider's remote keys
  EXPECT_EQ(list[4].name, "tcp");
  EXPECT_EQ(list[4].reach, "network");
  EXPECT_THAT(list[4].memory_kinds, ElementsAre("cpu"));
  for (size_t i : {0, 2, 4}) EXPECT_FALSE(list[i].needs_region_keys) << list[i].name;
  // Always available (shm depends on this machine's ptrace settings, fabric
  // on libfabric, cuda_ipc on a CUDA driver).
  EXPECT_EQ(list[0].unavailable, "");
  EXPECT_EQ(list[4].unavailable, "");
  if (!DescribeCuda().available) {
    EXPECT_NE(list[1].unavailable, "");
  }
  // The same order and names as the internal list.
  const auto builtin = BuiltinTransports();
  ASSERT_EQ(builtin.size(), list.size());
  for (size_t i = 0; i < list.size(); ++i) EXPECT_EQ(list[i].name, builtin[i].caps().name);
}

TEST(Registry, ReachNames) {
  EXPECT_EQ(ReachName(Reach::kSameProcess), "same process");
  EXPECT_EQ(ReachName(Reach::kSameHost), "same host");
  EXPECT_EQ(ReachName(Reach::kNetwork), "network");
}

// ------------------------------------------------------- a fake transport

// What a fake transport did, kept outside it (registry entries are plain
// function pointers).
struct FakeState {
  int register_calls = 0;
  int unregister_calls = 0;
  std::map<uint64_t, int> live;   // region addr -> registrations not yet undone
  bool bogus_unregister = false;  // unregistered a region it never registered
  uint64_t fail_at = 0;           // RegisterRegion of a region at this addr fails (0: never)
  std::vector<uint64_t> unregistered;

  int LiveCount() const {
    int n = 0;
    for (const auto& [addr, count] : live) n += count;
    return n;
  }
};

constexpr uint64_t kKeySalt = 0x5eed000000000000ull;
uint64_t KeyFor(uint64_t addr) { return addr ^ kKeySalt; }

class FakeTransport : public Transport {
 public:
  FakeTransport(TransportCaps caps, FakeState* state) : Transport(std::move(caps)), state_(state) {}

  void Describe(wire::PeerDescriptor* self) const override {
    self->transports.push_back({std::string(Name()), "fake-endpoint"});
  }
  bool CanReach(const wire::PeerDescriptor&) const override { return false; }
  StatusOr<std::shared_ptr<PeerLink>> Connect(std::shared_ptr<const PeerInfo>, uint16_t,
                                              Clock::time_point) override {
    return UnimplementedError("fake transport connects nowhere");
  }
  StatusOr<std::vector<wire::RegionKey>> RegisterRegion(const Region& region) override {
    ++state_->register_calls;
    if (state_->fail_at != 0 && region.addr == state_->fail_at) {
      return ResourceExhaustedError("device out of memory registrations");
    }
    ++state_->live[region.addr];
    return std::vector<wire::RegionKey>{{std::string(Name()), KeyFor(region.addr)}};
  }
  void UnregisterRegion(const Region& region) override {
    ++state_->unregister_calls;
    state_->unregistered.push_back(region.addr);
    auto it = state_->live.find(region.addr);
    if (it == state_->live.end() || it->second == 0) {
      state_->bogus_unregister = true;
      return;
    }
    --it->second;
  }
  void Shutdown() override {}

 private:
  FakeState* const state_;
};

// Two keyed fakes ("fake", "fake2"), one without keys ("plain") and one whose
// factory fails ("broken"), each with its own state.
FakeState g_fake, g_fake2, g_plain;

TransportCaps FakeCaps() {
  TransportCaps c;
  c.name = "fake";
  c.reach = Reach::kNetwork;
  c.needs_region_keys = true;
  c.max_slice = 4096;
  return c;
}
TransportCaps Fake2Caps() {
  TransportCaps c = FakeCaps();
  c.name = "fake2";
  return c;
}
TransportCaps PlainCaps() {
  TransportCaps c = FakeCaps();
  c.name = "plain";
  c.needs_region_keys = false;
  return c;
}
TransportCaps BrokenCaps() {
  TransportCaps c = FakeCaps();
  c.name = "broken";
  return c;
}
std::string Available() { return ""; }
StatusOr<std::unique_ptr<Transport>> MakeFake(const TransportContext&) {
  return std::unique_ptr<Transport>(std::make_unique<FakeTransport>(FakeCaps(), &g_fake));
}
StatusOr<std::unique_ptr<Transport>> MakeFake2(const TransportContext&) {
  return std::unique_ptr<Transport>(std::make_unique<FakeTransport>(Fake2Caps(), &g_fake2));
}
StatusOr<std::unique_ptr<Transport>> MakePlain(const TransportContext&) {
  return std::unique_ptr<Transport>(std::make_unique<FakeTransport>(PlainCaps(), &g_plain));
}
StatusOr<std::unique_ptr<Transport>> MakeBroken(const TransportContext&) {
  return UnavailableError("broken transport has no device");
}

constexpr TransportEntry kFakeEntry{FakeCaps, Available, MakeFake};
constexpr TransportEntry kFake2Entry{Fake2Caps, Available, MakeFake2};
constexpr TransportEntry kPlainEntry{PlainCaps, Available, MakePlain};
constexpr TransportEntry kBrokenEntry{BrokenCaps, Available, MakeBroken};

// A started TransportSet over `entries`.
class TransportSetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fake = FakeState{};
    g_fake2 = FakeState{};
    g_plain = FakeState{};
    options_.io_threads = 1;
  }
  void TearDown() override {
    if (set_) set_->Shutdown();
  }
  Status StartWith(std::vector<TransportEntry> entries) {
    entries_ = std::move(entries);
    FERRY_ASSIGN_OR_RETURN(set_, TransportSet::Create(options_, entries_));
    TransportContext ctx;
    ctx.options = &options_;
    ctx.target = std::make_shared<EngineTarget>(kInstance, "127.0.0.1:1");
    ctx.peer_id = set_->peer_id();
    ctx.instance_id = kInstance;
    return set_->Start(ctx);
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const auto& t : set_->transports()) out.emplace_back(t->Name());
    return out;
  }

  static constexpr uint64_t kInstance = 0xabcdef;
  EngineOptions options_;
  std::vector<TransportEntry> entries_;
  std::unique_ptr<TransportSet> set_;
  MemoryRegistry registry_;
  // Registered memory is never touched: these are addresses only.
  alignas(64) char buf_[4][256] = {};
  uint64_t Addr(int i) const { return reinterpret_cast<uint64_t>(buf_[i]); }
  MemoryRegion Mr(int i) { return MemoryRegion{buf_[i], sizeof(buf_[i]), "cpu"}; }
};

TEST_F(TransportSetTest, StartCreatesTheGivenTransportsInOrder) {
  ASSERT_THAT(StartWith({kFakeEntry, kPlainEntry, kFake2Entry}), IsOk());
  EXPECT_THAT(Names(), ElementsAre("fake", "plain", "fake2"));
  EXPECT_THAT(set_->peer_id(), HasSubstr("127.0.0.1:"));
  wire::PeerDescriptor self;
  set_->Describe(&self);
  ASSERT_EQ(self.transports.size(), 3u);
  EXPECT_EQ(self.transports[0].name, "fake");
  EXPECT_EQ(self.transports[2].name, "fake2");
}

TEST_F(TransportSetTest, TransportThatFailsToStartIsLeftOutUnlessForced) {
  ASSERT_THAT(StartWith({kBrokenEntry, kFakeEntry}), IsOk());
  EXPECT_THAT(Names(), ElementsAre("fake"));
  set_->Shutdown();
  set_.reset();

  options_.transport = "broken";
  EXPECT_THAT(StartWith({kBrokenEntry, kFakeEntry}),
              StatusIs(StatusCode::kUnavailable, HasSubstr("no device")));
}

TEST_F(TransportSetTest, RegisterPutsTheTransportsKeyIntoTheRegion) {
  ASSERT_THAT(StartWith({kFakeEntry}), IsOk());
  MemoryRegion mr = Mr(0);
  const MemoryKind cpu = MemoryKind::Cpu();
  ASSERT_THAT(registry_.Register({&mr, 1}, {&cpu, 1}, set_.get()), IsOk());
  EXPECT_EQ(g_fake.register_calls, 1);
  EXPECT_EQ(g_fake.live[Addr(0)], 1);

  const std::vector<wire::RegionEntry> snap = registry_.Snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].addr, Addr(0));
  EXPECT_EQ(snap[0].kind, "cpu");
  EXPECT_THAT(snap[0].keys, ElementsAre(wire::RegionKey{"fake", KeyFor(Addr(0)), {}}));

  // Unregister undoes the transport's registration once.
  ASSERT_THAT(registry_.Unregister(Addr(0), set_.get()), IsOk());
  EXPECT_EQ(g_fake.unregister_calls, 1);
  EXPECT_THAT(g_fake.unregistered, ElementsAre(Addr(0)));
  EXPECT_EQ(g_fake.LiveCount(), 0);
  EXPECT_FALSE(g_fake.bogus_unregister);
  EXPECT_THAT(registry_.Snapshot(), IsEmpty());
}

TEST_F(TransportSetTest, EveryKeyedTransportAddsItsKeyAndOthersAreNotAsked) {
  ASSERT_THAT(StartWith({kFakeEntry, kPlainEntry, kFake2Entry}), IsOk());
  std::vector<MemoryRegion> list = {Mr(0), Mr(1)};
  ASSERT_THAT(registry_.Register(list, {}, set_.get()), IsOk());
  const std::vector<wire::RegionEntry> snap = registry_.Snapshot();
  ASSERT_EQ(snap.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(snap[i].addr, Addr(i));
    EXPECT_THAT(snap[i].keys, ElementsAre(wire::RegionKey{"fake", KeyFor(Addr(i)), {}},
                                          wire::RegionKey{"fake2", KeyFor(Addr(i)), {}}));
  }
  EXPECT_EQ(g_fake.register_calls, 2);
  EXPECT_EQ(g_fake2.register_calls, 2);
  EXPECT_EQ(g_plain.register_calls, 0);  // needs no region keys: never asked

  ASSERT_THAT(registry_.Unregister(Addr(1), set_.get()), IsOk());
  EXPECT_THAT(g_fake.unregistered, ElementsAre(Addr(1)));
  EXPECT_THAT(g_fake2.unregistered, ElementsAre(Addr(1)));
  EXPECT_EQ(g_plain.unregister_calls, 0);
  ASSERT_EQ(registry_.Snapshot().size(), 1u);
  EXPECT_EQ(registry_.Snapshot()[0].addr, Addr(0));
}

TEST_F(TransportSetTest, FailingRegisterRegionFailsTheRegistrationNamingTheTransport) {
  ASSERT_THAT(StartWith({kFakeEntry}), IsOk());
  g_fake.fail_at = Addr(0);
  MemoryRegion mr = Mr(0);
  EXPECT_THAT(
      registry_.Register({&mr, 1}, {}, set_.get()),
      StatusIs(StatusCode::kResourceExhausted,
               AllOf(HasSubstr("transport fake"), HasSubstr("out of memory registrations"))));
  EXPECT_EQ(registry_.size(), 0u);
  EXPECT_THAT(registry_.Snapshot(), IsEmpty());
  EXPECT_EQ(g_fake.LiveCount(), 0);
  EXPECT_EQ(g_fake.unregister_calls, 0);  // it registered nothing, so nothing to undo
  EXPECT_THAT(registry_.Check(Addr(0), 1, "buffer"), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(TransportSetTest, FailingRegisterRegionUndoesTheHooksAlreadyDone) {
  // Regions 0 and 1 in one list; fake2 refuses region 1. By then fake has
  // registered both regions and fake2 region 0: all three are undone.
  ASSERT_THAT(StartWith({kFakeEntry, kFake2Entry}), IsOk());
  g_fake2.fail_at = Addr(1);
  std::vector<MemoryRegion> list = {Mr(0), Mr(1)};
  EXPECT_THAT(registry_.Register(list, {}, set_.get()),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("transport fake2")));
  EXPECT_EQ(registry_.size(), 0u);
  EXPECT_EQ(g_fake.register_calls, 2);
  EXPECT_EQ(g_fake2.register_calls, 2);
  EXPECT_EQ(g_fake.LiveCount(), 0);
  EXPECT_EQ(g_fake2.LiveCount(), 0);
  EXPECT_THAT(g_fake.unregistered, ::testing::UnorderedElementsAre(Addr(0), Addr(1)));
  EXPECT_THAT(g_fake2.unregistered, ElementsAre(Addr(0)));
  EXPECT_FALSE(g_fake.bogus_unregister);
  EXPECT_FALSE(g_fake2.bogus_unregister);

  // Nothing half-registered stays behind: the same regions register later.
  g_fake2.fail_at = 0;
  ASSERT_THAT(registry_.Register(list, {}, set_.get()), IsOk());
  EXPECT_EQ(registry_.size(), 2u);
  EXPECT_EQ(g_fake.LiveCount(), 2);
  EXPECT_EQ(g_fake2.LiveCount(), 2);
  for (const auto& r : registry_.Snapshot()) EXPECT_EQ(r.keys.size(), 2u);
}

// ------------------------------------------------------- the seam's types

TEST(TransportHandles, ByTheMemoryKindsOfBothSides) {
  FakeState state;
  TransportCaps cpu_only = FakeCaps();
  FakeTransport t(cpu_only, &state);
  const MemoryKind cpu = MemoryKind::Cpu(), opaque = MemoryKind::TestOpaque();
  const MemoryKind cuda = MemoryKind::FromName("cuda:0"), unknown = MemoryKind::FromName("martian");
  EXPECT_TRUE(t.Handles(cpu, cpu));
  EXPECT_FALSE(t.Handles(cpu, opaque));
  EXPECT_FALSE(t.Handles(opaque, cpu));
  EXPECT_FALSE(t.Handles(cuda, cpu));

  TransportCaps both = FakeCaps();
  both.memory_kinds = {MemoryKind::Type::kCpu, MemoryKind::Type::kTestOpaque};
  FakeTransport u(both, &state);
  EXPECT_TRUE(u.Handles(cpu, opaque));
  EXPECT_TRUE(u.Handles(opaque, cpu));
  EXPECT_TRUE(u.Handles(opaque, opaque));
  EXPECT_FALSE(u.Handles(cpu, cuda));
  EXPECT_FALSE(u.Handles(unknown, cpu));
  EXPECT_FALSE(u.Handles(cpu, unknown));

  TransportCaps opaque_only = FakeCaps();
  opaque_only.memory_kinds = {MemoryKind::Type::kTestOpaque};
  FakeTransport v(opaque_only, &state);
  EXPECT_TRUE(v.Handles(opaque, opaque));
  EXPECT_FALSE(v.Handles(cpu, cpu));
}

wire::PeerDescriptor WithRegions(std::vector<wire::RegionEntry> regions) {
  wire::PeerDescriptor d;
  d.peer_id = "127.0.0.1:2";
  d.regions = std::move(regions);
  return d;
}

TEST(PeerInfo, FindRegionInsideAtTheEdgesAndStraddling) {
  PeerInfo p(WithRegions({{0x1000, 0x1000, "cpu", "cpu", {}}, {0x4000, 0x1000, "cpu", "cpu", {}}}));
  EXPECT_EQ(p.FindRegion(0x1000, 0x1000), 0u);  // all of it
  EXPECT_EQ(p.FindRegion(0x1800, 0x100), 0u);
  EXPECT_EQ(p.FindRegion(0x1fff, 1), 0u);             // last byte
  EXPECT_EQ(p.FindRegion(0x4f00, 0x100), 1u);         // up to the end exactly
  EXPECT_EQ(p.FindRegion(0x1f00, 0x200), kNoRegion);  // straddles the end
  EXPECT_EQ(p.FindRegion(0x1000, 0x1001), kNoRegion);
  EXPECT_EQ(p.FindRegion(0x4fff, 2), kNoRegion);
  EXPECT_EQ(p.FindRegion(0x2000, 1), kNoRegion);      // just past the first
  EXPECT_EQ(p.FindRegion(0x2800, 0x10), kNoRegion);   // between the regions
  EXPECT_EQ(p.FindRegion(0x3fff, 2), kNoRegion);      // into the second from before it
  EXPECT_EQ(p.FindRegion(0x10, 4), kNoRegion);        // before the first
  EXPECT_EQ(p.FindRegion(0x8000, 4), kNoRegion);      // after the last
  EXPECT_EQ(p.FindRegion(0x1800, ~0ull), kNoRegion);  // would wrap
}

TEST(PeerInfo, FindRegionWithUnsortedRegionsReturnsTheDescriptorsIndex) {
  PeerInfo p(WithRegions({{0x9000, 0x100, "cpu", "cpu", {}},
                          {0x1000, 0x100, "cpu", "cpu", {}},
                          {0x5000, 0x100, "cpu", "cpu", {}}}));
  EXPECT_EQ(p.FindRegion(0x1010, 0x10), 1u);
  EXPECT_EQ(p.FindRegion(0x5000, 0x100), 2u);
  EXPECT_EQ(p.FindRegion(0x90ff, 1), 0u);
  EXPECT_EQ(p.FindRegion(0x1100, 1), kNoRegion);
  EXPECT_EQ(p.FindRegion(0x50f0, 0x20), kNoRegion);
  EXPECT_EQ(p.FindRegion(0x8000, 1), kNoRegion);
}

TEST(PeerInfo, FindRegionWithNoRegions) {
  PeerInfo p(WithRegions({}));
  EXPECT_EQ(p.FindRegion(0x1000, 1), kNoRegion);
}

TEST(PeerInfo, KindOf) {
  PeerInfo p(WithRegions({{0x1000, 0x100, "cpu", "cpu", {}},
                          {0x2000, 0x100, "test-opaque", "test-opaque", {}},
                          {0x3000, 0x100, "x", "martian", {}},
                          {0x4000, 0x100, "cpu", "", {}}}));
  EXPECT_EQ(p.KindOf(0), MemoryKind::Cpu());
  EXPECT_TRUE(p.KindOf(0).cpu_accessible());
  EXPECT_EQ(p.KindOf(1), MemoryKind::TestOpaque());
  EXPECT_FALSE(p.KindOf(1).cpu_accessible());
  // A kind this build does not know: nothing may touch it as cpu memory.
  EXPECT_EQ(p.KindOf(2).type(), MemoryKind::Type::kUnknown);
  EXPECT_FALSE(p.KindOf(2).cpu_accessible());
  EXPECT_EQ(p.KindOf(3), MemoryKind::Cpu());  // format 1 carries no kind
  // kNoRegion (the target validates) and indexes past the end read as cpu.
  EXPECT_EQ(p.KindOf(kNoRegion), MemoryKind::Cpu());
  EXPECT_EQ(p.KindOf(17), MemoryKind::Cpu());
  EXPECT_EQ(p.KindOf(p.FindRegion(0x2010, 1)), MemoryKind::TestOpaque());
}

TEST(PeerInfo, KeyOf) {
  PeerInfo p(WithRegions({{0x1000, 0x100, "cpu", "cpu", {{"rdma", 7}, {"fake", 9}}},
                          {0x2000, 0x100, "cpu", "cpu", {}}}));
  EXPECT_EQ(p.KeyOf(0, "fake"), std::optional<uint64_t>(9));
  EXPECT_EQ(p.KeyOf(0, "rdma"), std::optional<uint64_t>(7));
  EXPECT_EQ(p.KeyOf(0, "tcp"), std::nullopt);
  EXPECT_EQ(p.KeyOf(1, "fake"), std::nullopt);
  EXPECT_EQ(p.KeyOf(kNoRegion, "fake"), std::nullopt);
  EXPECT_EQ(p.KeyOf(5, "fake"), std::nullopt);
}

}  // namespace
}  // namespace ferry::internal
