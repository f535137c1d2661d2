// The request rings on their own (request_ring.h): bytes in order across
// the wrap, a full ring and its wake-up, the sleeping consumer's wake-up,
// positions a peer scribbled over, and what the target checks when it takes
// a ring.
#include "transport/shm/request_ring.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace ferry::internal::shm {
namespace {

// Whether `fd` is readable now.
bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

UniqueFd SelfPidfd() {
  return UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)));
}

// An initiator's ring and the target's side of it, taken in this process.
struct Pair {
  std::unique_ptr<RequestRing> initiator;
  std::unique_ptr<RequestRing> target;
};
Pair MakePair(uint32_t capacity = kRingMinCapacity) {
  Pair p;
  auto made = RequestRing::Create(capacity);
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return p;
  p.initiator = *std::move(made);
  UniqueFd pidfd = SelfPidfd();
  auto taken = RequestRing::Take(pidfd.get(), p.initiator->fds(), "this process");
  EXPECT_TRUE(taken.ok()) << taken.status();
  if (taken.ok()) p.target = *std::move(taken);
  return p;
}

size_t WriteAll(RequestRing& r, const std::string& s) {
  iovec v{const_cast<char*>(s.data()), s.size()};
  auto n = r.Write(&v, 1);
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *n : 0;
}
std::string ReadUpTo(RequestRing& r, size_t max) {
  std::string out(max, '\0');
  iovec v{out.data(), out.size()};
  auto n = r.Read(&v, 1);
  EXPECT_TRUE(n.ok()) << n.status();
  out.resize(n.ok() ? *n : 0);
  return out;
}

TEST(RequestRing, CarriesBytesInOrderAcrossTheWrapBothWays) {
  Pair p = MakePair();
  ASSERT_TRUE(p.target);
  EXPECT_FALSE(p.initiator->Attached());
  p.target->MarkAttached();
  EXPECT_TRUE(p.initiator->Attached());
  // Odd sizes, so the positions wrap at every offset; scattered iovecs.
  uint64_t sent = 0, got = 0;
  for (int round = 0; round < 200; ++round) {
    const size_t len = 1 + (round * 977) % 3000;
    std::string msg(len, '\0');
    for (size_t i = 0; i < len; ++i) msg[i] = static_cast<char>((sent + i) * 131 % 251);
    iovec parts[3] = {{msg.data(), len / 3},
                      {msg.data() + len / 3, len / 3},
                      {msg.data() + 2 * (len / 3), len - 2 * (len / 3)}};
    RequestRing& from = round % 2 ? *p.initiator : *p.target;
    RequestRing& to = round % 2 ? *p.target : *p.initiator;
    auto n = from.Write(parts, 3);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_EQ(*n, len);
    ASSERT_TRUE(to.Readable());
    std::string back = ReadUpTo(to, 4096);
    ASSERT_EQ(back, msg) << "round " << round;
    EXPECT_FALSE(to.Readable());
    sent += len;
    got += back.size();
  }
  EXPECT_EQ(sent, got);
}

TEST(RequestRing, AFullRingTakesWhatFitsAndWakesTheProducerWhenThereIsRoom) {
  Pair p = MakePair();
  ASSERT_TRUE(p.target);
  p.initiator->ClearWake();
  const std::string big(kRingMinCapacity + 100, 'x');
  EXPECT_EQ(WriteAll(*p.initiator, big), kRingMinCapacity);
  EXPECT_EQ(WriteAll(*p.initiator, "more"), 0u);
  EXPECT_FALSE(Readable(p.initiator->wake_fd()));
  EXPECT_EQ(ReadUpTo(*p.target, 10).size(), 10u);  // room: the producer is told
  EXPECT_TRUE(Readable(p.initiator->wake_fd()));
  p.initiator->ClearWake();
  EXPECT_FALSE(Readable(p.initiator->wake_fd()));
  EXPECT_EQ(WriteAll(*p.initiator, "0123456789ab"), 10u);
  std::string all;
  while (p.target->Readable()) all += ReadUpTo(*p.target, 1000);
  EXPECT_TRUE(all == std::string(kRingMinCapacity - 10, 'x') + "0123456789") << all.size();
}

TEST(RequestRing, AnArmedConsumerIsWokenOnceAndAPollingOneNever) {
  Pair p = MakePair();
  ASSERT_TRUE(p.target);
  p.target->ClearWake();  // a new ring signals until its consumer polls
  p.target->DisarmRead();
  ASSERT_EQ(WriteAll(*p.initiator, "a"), 1u);
  EXPECT_FALSE(Readable(p.target->wake_fd())) << "a polling consumer needs no signal";
  EXPECT_FALSE(p.target->ArmRead()) << "bytes are waiting: do not sleep";
  EXPECT_EQ(ReadUpTo(*p.target, 8), "a");
  EXPECT_TRUE(p.target->ArmRead());
  ASSERT_EQ(WriteAll(*p.initiator, "b"), 1u);
  EXPECT_TRUE(Readable(p.target->wake_fd()));
  p.target->ClearWake();
  ASSERT_EQ(WriteAll(*p.initiator, "c"), 1u);
  EXPECT_FALSE(Readable(p.target->wake_fd())) << "one signal per sleep";
  EXPECT_EQ(ReadUpTo(*p.target, 8), "bc");
}

TEST(RequestRing, PositionsAPeerScribbledOverAreRefusedNamingThem) {
  std::vector<char> mem(RingMappingBytes(kRingMinCapacity), 0);
  auto* h = reinterpret_cast<RingHeader*>(mem.data());
  auto reader = RequestRing::OverMemory(mem.data(), kRingMinCapacity, 1, UniqueFd(), UniqueFd());
  auto writer = RequestRing::OverMemory(mem.data(), kRingMinCapacity, 0, UniqueFd(), UniqueFd());
  // The peer claims more bytes than the ring holds.
  h->ring[0].tail = kRingMinCapacity + 1;
  char buf[64];
  iovec v{buf, sizeof(buf)};
  auto r = reader->Read(&v, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("write position"), std::string::npos) << r.status();
  // ...or moves its read position past what was written, or backwards.
  h->ring[0].head = 12345;
  iovec w{buf, 8};
  auto s = writer->Write(&w, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("read position"), std::string::npos) << s.status();
  // A position within bounds is taken: only garbage bytes come out, from
  // inside the ring.
  h->ring[0].head = 0;
  h->ring[0].tail = kRingMinCapacity;
  std::string all;
  while (reader->Readable()) all += ReadUpTo(*reader, 1000);
  EXPECT_EQ(all.size(), kRingMinCapacity);
}

TEST(RequestRing, TakeChecksWhatTheHelloNames) {
  auto made = RequestRing::Create(kRingMinCapacity);
  ASSERT_TRUE(made.ok()) << made.status();
  RequestRing& ring = **made;
  UniqueFd pidfd = SelfPidfd();
  ASSERT_TRUE(pidfd.valid());
  HelloRing good = ring.fds();
  // A capacity that is not the ring's.
  HelloRing bad = good;
  bad.capacity = kRingMinCapacity * 2;
  auto t = RequestRing::Take(pidfd.get(), bad, "peer A");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("peer A"), std::string::npos) << t.status();
  bad.capacity = 5000;  // not a power of two
  EXPECT_FALSE(RequestRing::Take(pidfd.get(), bad, "peer A").ok());
  // An eventfd that is the memfd.
  bad = good;
  bad.target_wake = good.memfd;
  t = RequestRing::Take(pidfd.get(), bad, "peer A");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("eventfd"), std::string::npos) << t.status();
  // A descriptor the peer does not have.
  bad = good;
  bad.memfd = 1000000;
  t = RequestRing::Take(pidfd.get(), bad, "peer A");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("memfd"), std::string::npos) << t.status();
  // A memfd that is not sealed against shrinking: one of a plain file.
  char path[] = "/tmp/ferry-ring-XXXXXX";
  UniqueFd file(::mkstemp(path));
  ASSERT_TRUE(file.valid());
  ::unlink(path);
  ASSERT_EQ(::ftruncate(file.get(), static_cast<off_t>(RingMappingBytes(kRingMinCapacity))), 0);
  bad = good;
  bad.memfd = static_cast<uint32_t>(file.get());
  t = RequestRing::Take(pidfd.get(), bad, "peer A");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("seal"), std::string::npos) << t.status();
  // And the good one.
  EXPECT_TRUE(RequestRing::Take(pidfd.get(), good, "peer A").ok());
}

}  // namespace
}  // namespace ferry::internal::shm
