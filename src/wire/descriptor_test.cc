#include "wire/descriptor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

// The largest single allocation made while `g_track_allocations` is set: a
// decoder given a huge count must not allocate for it before checking it.
// Not under ThreadSanitizer: its runtime defines operator new and delete in
// the same object file as the array and aligned forms the program also uses,
// so a replacement here is a duplicate definition at link time (the cases that
// track allocations skip there; the AddressSanitizer pass runs them).
#if defined(__SANITIZE_THREAD__)
#define FERRY_TRACK_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TRACK_ALLOCATIONS 0
#endif
#endif
#ifndef FERRY_TRACK_ALLOCATIONS
#define FERRY_TRACK_ALLOCATIONS 1
#endif
namespace {
std::atomic<bool> g_track_allocations{false};
std::atomic<size_t> g_largest_allocation{0};
}  // namespace

#if FERRY_TRACK_ALLOCATIONS
void* operator new(size_t n) {
  if (g_track_allocations.load(std::memory_order_relaxed)) {
    size_t cur = g_largest_allocation.load(std::memory_order_relaxed);
    while (n > cur &&
           !g_largest_allocation.compare_exchange_weak(cur, n, std::memory_order_relaxed)) {
    }
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// Out of line: inlined into a `delete` of this file, GCC would take the free()
// for a mismatch with the operator new it sees.
__attribute__((noinline)) void operator delete(void* p) noexcept { std::free(p); }
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept { std::free(p); }
#endif

namespace ferry::wire {
namespace {

PeerDescriptor Sample() {
  PeerDescriptor d;
  d.engine_name = "prefill-0";
  d.peer_id = "127.0.0.1:15001";
  d.instance_id = 42;
  d.process_token = 7;
  d.hostname = "node1";
  d.pid = 1234;
  d.version = "0.1.0";
  d.wire_min = 1;
  d.wire_max = 1;
  d.transports = {{"tcp", "127.0.0.1:15001"}, {"local", "7"}};
  d.features = {"read", "write", "notify"};
  d.regions = {{0x10000, 4096, "cpu:0", "cpu", {}}, {0x20000, 1 << 20, "*", "cpu", {}}};
  return d;
}

TEST(Descriptor, RoundTrip) {
  std::string bytes;
  EncodeDescriptor(Sample(), &bytes);
  auto d = DecodeDescriptor(bytes);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->engine_name, "prefill-0");
  EXPECT_EQ(d->instance_id, 42u);
  EXPECT_EQ(d->transports.size(), 2u);
  EXPECT_TRUE(d->HasFeature("notify"));
  EXPECT_FALSE(d->HasFeature("auth"));
  ASSERT_NE(d->FindTransport("tcp"), nullptr);
  EXPECT_EQ(d->FindTransport("tcp")->endpoint, "127.0.0.1:15001");
  ASSERT_EQ(d->regions.size(), 2u);
  EXPECT_EQ(d->regions[1].length, 1u << 20);
}

TEST(Descriptor, EveryTruncationIsRejected) {
  std::string bytes;
  EncodeDescriptor(Sample(), &bytes);
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeDescriptor(bytes.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(DecodeDescriptor(bytes + "z").ok());
}

TEST(Descriptor, UnknownFormatNamesIt) {
  std::string bytes;
  EncodeDescriptor(Sample(), &bytes);
  bytes[0] = 9;
  auto d = DecodeDescriptor(bytes);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("format 9"), std::string::npos);
}

TEST(Descriptor, NegotiationPicksHighestCommonVersion) {
  PeerDescriptor a = Sample(), b = Sample();
  a.wire_min = 1;
  a.wire_max = 3;
  b.wire_min = 2;
  b.wire_max = 5;
  auto v = NegotiateWireVersion(a, b);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3);
}

TEST(Descriptor, NoCommonVersionNamesBothSides) {
  PeerDescriptor local = Sample(), remote = Sample();
  remote.peer_id = "127.0.0.1:16000";
  remote.wire_min = remote.wire_max = 2;
  auto v = NegotiateWireVersion(local, remote);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = v.status().message();
  EXPECT_NE(m.find("2..2"), std::string::npos) << m;
  EXPECT_NE(m.find("1..1"), std::string::npos) << m;
  EXPECT_NE(m.find("127.0.0.1:16000"), std::string::npos) << m;
  EXPECT_NE(m.find("upgrade this engine"), std::string::npos) << m;
}

using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

PeerDescriptor WithKindsAndKeys() {
  PeerDescriptor d = Sample();
  d.regions = {
      {0x10000, 4096, "cpu:0", "cpu", {}},
      {0x20000, 1 << 20, "test-opaque", "test-opaque", {{"fake", 0x1234}, {"rdma", ~0ull}}},
      {0x30000, 64, "cuda:1", "cuda:1", {{"fake", 7}}}};
  return d;
}

TEST(Descriptor, Format2RoundTripKeepsKindsAndKeys) {
  const PeerDescriptor in = WithKindsAndKeys();
  std::string bytes;
  EncodeDescriptor(in, &bytes, 2);
  ASSERT_EQ(bytes[0], 2);
  ASSERT_EQ(bytes[1], 0);
  ASSERT_OK_AND_ASSIGN(PeerDescriptor d, DecodeDescriptor(bytes));
  EXPECT_EQ(d.format, 2);
  EXPECT_EQ(d.regions, in.regions);
  EXPECT_EQ(d.engine_name, in.engine_name);
  EXPECT_EQ(d.features, in.features);
  // The default format is the highest.
  std::string dflt;
  EncodeDescriptor(in, &dflt);
  EXPECT_EQ(dflt[0], kDescriptorFormatMax);
}

TEST(Descriptor, Format3CarriesKeyValuesAndFormat2LeavesThoseKeysOut) {
  PeerDescriptor in = WithKindsAndKeys();
  const std::string handle(64, '\x5a');
  in.regions[2].keys.push_back({"cuda-ipc", 0x40, handle});
  EXPECT_EQ(LowestFormatFor(WithKindsAndKeys()), 2);
  EXPECT_EQ(LowestFormatFor(in), 3);
  std::string v3, v2;
  EncodeDescriptor(in, &v3, 3);
  ASSERT_EQ(v3[0], 3);
  ASSERT_OK_AND_ASSIGN(PeerDescriptor d3, DecodeDescriptor(v3));
  EXPECT_EQ(d3.format, 3);
  EXPECT_EQ(d3.regions, in.regions);
  EXPECT_EQ(d3.regions[2].keys[1].value, handle);
  // Format 2 has no values: the key that needs one is left out, the rest kept.
  EncodeDescriptor(in, &v2, 2);
  ASSERT_OK_AND_ASSIGN(PeerDescriptor d2, DecodeDescriptor(v2));
  EXPECT_EQ(d2.regions, WithKindsAndKeys().regions);
  // A value longer than format 3 allows is malformed.
  PeerDescriptor big = Sample();
  big.regions = {{0x10000,
                  64,
                  "cuda:0",
                  "cuda:0",
                  {{"cuda-ipc", 0, std::string(kMaxRegionKeyValue + 1, 'x')}}}};
  std::string vb;
  EncodeDescriptor(big, &vb, 3);
  EXPECT_THAT(DecodeDescriptor(vb), StatusIs(StatusCode::kDataLoss));
  big.regions[0].keys[0].value.resize(kMaxRegionKeyValue);
  vb.clear();
  EncodeDescriptor(big, &vb, 3);
  EXPECT_OK(DecodeDescriptor(vb));
}

TEST(Descriptor, Format1DropsKindsAndKeysAndReadsBackAsCpu) {
  const PeerDescriptor in = WithKindsAndKeys();
  std::string v1, v2;
  EncodeDescriptor(in, &v1, 1);
  EncodeDescriptor(in, &v2, 2);
  ASSERT_EQ(v1[0], 1);
  EXPECT_LT(v1.size(), v2.size());
  ASSERT_OK_AND_ASSIGN(PeerDescriptor d, DecodeDescriptor(v1));
  EXPECT_EQ(d.format, 1);
  ASSERT_EQ(d.regions.size(), in.regions.size());
  for (size_t i = 0; i < in.regions.size(); ++i) {
    EXPECT_EQ(d.regions[i].addr, in.regions[i].addr) << i;
    EXPECT_EQ(d.regions[i].length, in.regions[i].length) << i;
    EXPECT_EQ(d.regions[i].location, in.regions[i].location) << i;
    EXPECT_EQ(d.regions[i].kind, "cpu") << i;
    EXPECT_TRUE(d.regions[i].keys.empty()) << i;
  }
  // None of the kinds' or keys' bytes are in it.
  EXPECT_EQ(v1.find("rdma"), std::string::npos);
  EXPECT_EQ(v1.find("fake"), std::string::npos);
}

// Little-endian appenders written from docs/wire-format.md, independent of
// the encoder under test.
void PutU16(std::string* s, uint16_t v) {
  for (int i = 0; i < 2; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutStr(std::string* s, const std::string& v) {
  PutU16(s, static_cast<uint16_t>(v.size()));
  s->append(v);
}

// A format-1 descriptor as an old engine sends it, byte by byte.
std::string HandWrittenFormat1() {
  std::string b;
  PutU16(&b, 1);                      // format
  PutStr(&b, "decode-3");             // engine_name
  PutStr(&b, "10.0.0.7:15000");       // peer_id
  PutU64(&b, 0x1122334455667788ull);  // instance_id
  PutU64(&b, 99);                     // process_token
  PutStr(&b, "old-host");             // hostname
  PutU32(&b, 4321);                   // pid
  PutStr(&b, "0.0.9");                // version
  PutU16(&b, 1);                      // wire_min
  PutU16(&b, 1);                      // wire_max
  PutU16(&b, 2);                      // transports
  PutStr(&b, "tcp");
  PutStr(&b, "10.0.0.7:15000");
  PutStr(&b, "local");
  PutStr(&b, "99");
  PutU16(&b, 3);  // features (no descriptor-formats: an old build)
  PutStr(&b, "read");
  PutStr(&b, "write");
  PutStr(&b, "notify");
  PutU32(&b, 2);  // regions: { u64 addr, u64 length, str location }
  PutU64(&b, 0x7f0000000000ull);
  PutU64(&b, 1ull << 30);
  PutStr(&b, "cpu:0");
  PutU64(&b, 0x7f8000000000ull);
  PutU64(&b, 4096);
  PutStr(&b, "*");
  return b;
}

TEST(Descriptor, HandWrittenFormat1FromAnOldEngineDecodes) {
  const std::string bytes = HandWrittenFormat1();
  ASSERT_OK_AND_ASSIGN(PeerDescriptor d, DecodeDescriptor(bytes));
  EXPECT_EQ(d.format, 1);
  EXPECT_EQ(d.engine_name, "decode-3");
  EXPECT_EQ(d.peer_id, "10.0.0.7:15000");
  EXPECT_EQ(d.instance_id, 0x1122334455667788ull);
  EXPECT_EQ(d.process_token, 99u);
  EXPECT_EQ(d.hostname, "old-host");
  EXPECT_EQ(d.pid, 4321u);
  EXPECT_EQ(d.version, "0.0.9");
  EXPECT_EQ(d.wire_min, 1);
  EXPECT_EQ(d.wire_max, 1);
  ASSERT_EQ(d.transports.size(), 2u);
  EXPECT_EQ(d.transports[1].name, "local");
  EXPECT_EQ(d.transports[1].endpoint, "99");
  EXPECT_EQ(d.features, (std::vector<std::string>{"read", "write", "notify"}));
  ASSERT_EQ(d.regions.size(), 2u);
  EXPECT_EQ(d.regions[0], (RegionEntry{0x7f0000000000ull, 1ull << 30, "cpu:0", "cpu", {}}));
  EXPECT_EQ(d.regions[1], (RegionEntry{0x7f8000000000ull, 4096, "*", "cpu", {}}));
  // An old engine names no formats: it is answered in format 1.
  EXPECT_EQ(AnswerFormat(d), 1);
  // And this build writes format 1 exactly so.
  std::string again;
  EncodeDescriptor(d, &again, 1);
  EXPECT_EQ(again, bytes);
}

TEST(Descriptor, Format4IsRefusedNamingTheFormatsRead) {
  std::string bytes;
  EncodeDescriptor(Sample(), &bytes, 3);
  bytes[0] = 4;
  EXPECT_THAT(DecodeDescriptor(bytes), StatusIs(StatusCode::kFailedPrecondition,
                                                AllOf(HasSubstr("format 4"), HasSubstr("1..3"))));
  bytes[0] = 0;
  EXPECT_THAT(DecodeDescriptor(bytes),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("format 0")));
}

constexpr char kUntracked[] = "allocations are not tracked under ThreadSanitizer";
#define FERRY_SKIP_UNLESS_ALLOCATIONS_TRACKED() \
  if (!FERRY_TRACK_ALLOCATIONS) GTEST_SKIP() << kUntracked
// Decodes while tracking allocations; the largest one made.
size_t LargestAllocationDecoding(const std::string& bytes, Status* status) {
  g_largest_allocation.store(0);
  g_track_allocations.store(true);
  auto d = DecodeDescriptor(bytes);
  g_track_allocations.store(false);
  *status = d.status();
  return g_largest_allocation.load();
}

constexpr size_t kSmallAllocation = 64 * 1024;

TEST(Descriptor, RegionKeyCountTheInputCannotHoldIsDataLossWithoutAHugeAllocation) {
  FERRY_SKIP_UNLESS_ALLOCATIONS_TRACKED();
  PeerDescriptor in = Sample();
  in.regions = {{0x10000, 4096, "*", "cpu", {{"fake", 9}}}};
  std::string bytes;
  EncodeDescriptor(in, &bytes, 2);
  ASSERT_OK(DecodeDescriptor(bytes));
  // The last region ends with u16 k, then k × { str "fake", u64 }.
  const size_t count_at = bytes.size() - (2 + 2 + 4 + 8);
  ASSERT_EQ(bytes[count_at], 1);
  bytes[count_at] = '\xff';
  bytes[count_at + 1] = '\xff';  // 65535 keys in 14 bytes
  Status s;
  const size_t largest = LargestAllocationDecoding(bytes, &s);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_LT(largest, kSmallAllocation);
}

TEST(Descriptor, RegionCountTheInputCannotHoldIsDataLossWithoutAHugeAllocation) {
  FERRY_SKIP_UNLESS_ALLOCATIONS_TRACKED();
  PeerDescriptor in = Sample();
  in.regions.clear();
  std::string bytes;
  EncodeDescriptor(in, &bytes, 2);
  ASSERT_OK(DecodeDescriptor(bytes));
  // Ends with u32 n = 0; claim 2^32 - 1 regions, then give one.
  bytes.resize(bytes.size() - 4);
  PutU32(&bytes, 0xffffffffu);
  PutU64(&bytes, 0x1000);
  PutU64(&bytes, 16);
  PutStr(&bytes, "*");
  PutStr(&bytes, "cpu");
  PutU16(&bytes, 0);
  Status s;
  const size_t largest = LargestAllocationDecoding(bytes, &s);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss));
  EXPECT_LT(largest, kSmallAllocation);
}

TEST(Descriptor, AnswerFormatPicksTheHighestFormatBothRead) {
  EXPECT_EQ(DescriptorFormatsFeature(1, 2), "descriptor-formats:1..2");
  PeerDescriptor req = Sample();  // names no formats
  EXPECT_EQ(AnswerFormat(req), 1);

  req.features.push_back(DescriptorFormatsFeature(1, 2));
  EXPECT_EQ(AnswerFormat(req), 2);
  EXPECT_EQ(AnswerFormat(req, /*max_self=*/1), 1);  // an older responder
  EXPECT_EQ(AnswerFormat(req, /*max_self=*/2), 2);

  req.features.back() = "descriptor-formats:1..1";
  EXPECT_EQ(AnswerFormat(req), 1);
  req.features.back() = "descriptor-formats:1..5";  // a newer requester
  EXPECT_EQ(AnswerFormat(req), kDescriptorFormatMax);
}

TEST(Descriptor, AnswerFormatIgnoresGarbageFeatures) {
  for (const char* garbage :
       {"descriptor-formats:", "descriptor-formats:2", "descriptor-formats:x..y",
        "descriptor-formats:..", "descriptor-formats:9..7", "descriptor-formats",
        "Descriptor-Formats:1..2", "descriptor-formats1..2"}) {
    PeerDescriptor req = Sample();
    req.features.push_back(garbage);
    EXPECT_EQ(AnswerFormat(req), 1) << garbage;
    // Next to a real one, it does not get in the way.
    req.features.push_back(DescriptorFormatsFeature(1, 2));
    EXPECT_EQ(AnswerFormat(req), 2) << garbage;
  }
}

TEST(Descriptor, HandshakeResponseCarriesTheFormatItWasWrittenIn) {
  const PeerDescriptor in = WithKindsAndKeys();
  for (uint16_t format : {1, 2}) {
    std::string body;
    EncodeHandshakeResponse(OkStatus(), in, &body, format);
    ASSERT_OK_AND_ASSIGN(auto resp, DecodeHandshakeResponse(body));
    EXPECT_THAT(resp.first, IsOk());
    EXPECT_EQ(resp.second.format, format);
    EXPECT_EQ(resp.second.regions[1].kind, format == 2 ? "test-opaque" : "cpu");
    EXPECT_EQ(resp.second.regions[1].keys.size(), format == 2 ? 2u : 0u);
  }
}

}  // namespace
}  // namespace ferry::wire
