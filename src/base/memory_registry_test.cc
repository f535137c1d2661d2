#include "base/memory_registry.h"

#include <gtest/gtest.h>

#include <thread>

namespace ferry::internal {
namespace {

Status Reg(MemoryRegistry& r, uint64_t addr, size_t len) {
  MemoryRegion m{reinterpret_cast<void*>(addr), len, "*"};
  return r.Register({&m, 1});
}

TEST(MemoryRegistry, RegisterLookupUnregister) {
  MemoryRegistry r;
  ASSERT_TRUE(Reg(r, 0x1000, 0x1000).ok());
  ASSERT_TRUE(Reg(r, 0x3000, 0x100).ok());
  EXPECT_TRUE(r.Check(0x1000, 0x1000, "x").ok());
  EXPECT_TRUE(r.Check(0x1fff, 1, "x").ok());
  EXPECT_FALSE(r.Check(0x1fff, 2, "x").ok());  // crosses the end
  EXPECT_FALSE(r.Check(0x2000, 1, "x").ok());  // gap
  EXPECT_FALSE(r.Check(0xfff, 2, "x").ok());
  EXPECT_FALSE(r.Check(0x3000, ~0ull, "x").ok());  // overflow
  EXPECT_EQ(r.size(), 2u);
  EXPECT_TRUE(r.Unregister(0x1000).ok());
  EXPECT_FALSE(r.Check(0x1000, 1, "x").ok());
  EXPECT_EQ(r.Unregister(0x1000).code(), StatusCode::kNotFound);
}

TEST(MemoryRegistry, DistinctCodesForBadRegistrations) {
  MemoryRegistry r;
  ASSERT_TRUE(Reg(r, 0x1000, 0x1000).ok());
  EXPECT_EQ(Reg(r, 0x1800, 0x1000).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Reg(r, 0x800, 0x1000).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Reg(r, 0x1000, 0x10).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Reg(r, 0x800, 0x2000).code(), StatusCode::kAlreadyExists);  // covers it
  EXPECT_TRUE(Reg(r, 0x2000, 0x10).ok());                               // adjacent is fine
  EXPECT_EQ(Reg(r, 0x9000, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Reg(r, 0, 10).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Unregister(0x1001).code(), StatusCode::kNotFound);
  Status s = Reg(r, 0x1800, 0x1000);
  EXPECT_NE(s.message().find("[0x1800, 0x2800)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s;
}

TEST(MemoryRegistry, ListIsAllOrNothing) {
  MemoryRegistry r;
  std::vector<MemoryRegion> list = {{reinterpret_cast<void*>(0x1000), 0x100, "*"},
                                    {reinterpret_cast<void*>(0x5000), 0x100, "*"},
                                    {reinterpret_cast<void*>(0x1080), 0x100, "*"}};
  EXPECT_EQ(r.Register(list).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(r.size(), 0u);
  list.pop_back();
  EXPECT_TRUE(r.Register(list).ok());
  EXPECT_EQ(r.Snapshot().size(), 2u);
}

TEST(MemoryRegistry, SnapshotKeepsRegistrationOrder) {
  MemoryRegistry r;
  ASSERT_TRUE(Reg(r, 0x9000, 0x100).ok());
  ASSERT_TRUE(Reg(r, 0x1000, 0x100).ok());
  ASSERT_TRUE(Reg(r, 0x5000, 0x100).ok());
  auto snap = r.Snapshot();
  ASSERT_EQ(snap.size(), 3u);
  EXPECT_EQ(snap[0].addr, 0x9000u);
  EXPECT_EQ(snap[1].addr, 0x1000u);
  EXPECT_EQ(snap[2].addr, 0x5000u);
}

TEST(MemoryRegistry, UnregisterWaitsForPins) {
  MemoryRegistry r;
  ASSERT_TRUE(Reg(r, 0x1000, 0x1000).ok());
  auto pin = r.Pin(0x1100, 0x10, "remote range");
  ASSERT_TRUE(pin.ok());
  std::atomic<bool> done{false};
  std::thread t([&] {
    EXPECT_TRUE(r.Unregister(0x1000).ok());
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(done.load());  // still pinned
  { RegionPin drop = std::move(*pin); }
  t.join();
  EXPECT_TRUE(done.load());
  EXPECT_FALSE(r.Pin(0x1100, 0x10, "remote range").ok());
}

// A hook's BeforeUnregister refusal (a transport whose failed operation may
// still touch the memory) keeps the region registered and reaches the
// caller with the range; OnUnregister runs only once it agrees.
TEST(MemoryRegistry, AHookThatRefusesBeforeUnregisterKeepsTheRegion) {
  struct Hooks : RegionHooks {
    bool refuse = true;
    int unregistered = 0;
    Status OnRegister(Region&) override { return OkStatus(); }
    Status BeforeUnregister(const Region&, std::chrono::steady_clock::time_point) override {
      return refuse ? FailedPreconditionError("still in use") : OkStatus();
    }
    void OnUnregister(const Region&) override { ++unregistered; }
  } hooks;
  MemoryRegistry r;
  MemoryRegion m{reinterpret_cast<void*>(0x1000), 0x1000, "*"};
  ASSERT_TRUE(r.Register({&m, 1}, {}, &hooks).ok());
  const Status refused = r.Unregister(0x1000, &hooks, std::chrono::steady_clock::now());
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("still in use"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("0x1000"), std::string::npos) << refused.message();
  EXPECT_TRUE(r.Check(0x1000, 0x1000, "x").ok()) << "the region went";
  EXPECT_EQ(hooks.unregistered, 0);
  hooks.refuse = false;
  EXPECT_TRUE(r.Unregister(0x1000, &hooks, std::chrono::steady_clock::now()).ok());
  EXPECT_FALSE(r.Check(0x1000, 1, "x").ok());
  EXPECT_EQ(hooks.unregistered, 1);
  EXPECT_EQ(r.Unregister(0x1000, &hooks).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ferry::internal
