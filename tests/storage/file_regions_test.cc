// File regions (Engine::RegisterFile, issue 30): the bytes of cpu memory
// written to a range of a file and read back, through this engine's own
// segment (the local transport) and a peer's over tcp and shm (the target does the
// I/O); this engine's own file regions to and from a peer's memory over tcp and
// shm (staged on this side); and the bad inputs and faults: a range past the end of the file, a
// read-only registration written, a file truncated under its registration,
// the caller's descriptor closed, the device full, a cancelled batch.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.h"
#include "tests/testing/buffer.h"
#include "tests/testing/pattern.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/transport_params.h"
#include "transport/stream/connection.h"

namespace ferry::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr std::chrono::milliseconds kWait{60000};

// A file of `size` zero bytes in a fresh temporary folder (removed with it).
// Runs `reqs` as one batch of `engine`'s and returns each request's final
// status (none may still be pending after the wait).
std::vector<Status> RunBatch(Engine& engine, const std::vector<TransferRequest>& reqs) {
  auto batch = engine.AllocateBatch(reqs.size());
  EXPECT_OK(batch);
  if (!batch.ok()) return {};
  EXPECT_OK(engine.Submit(*batch, reqs));
  (void)engine.WaitBatch(*batch, kWait);
  std::vector<Status> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto st = engine.GetTransferStatus(*batch, i);
    EXPECT_OK(st);
    EXPECT_NE(st->state, TransferState::kPending) << "request " << i;
    out.push_back(st->status);
  }
  EXPECT_OK(engine.FreeBatch(*batch));
  return out;
}

class TempFile {
 public:
  explicit TempFile(uint64_t size, const std::string& dir = "") {
    dir_ = dir.empty() ? MakeDir() : dir;
    path_ = dir_ + "/kv.bin";
    UniqueFd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    EXPECT_TRUE(fd.ok()) << path_ << ": " << std::strerror(errno);
    EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0) << std::strerror(errno);
    owns_dir_ = dir.empty();
  }
  ~TempFile() {
    std::error_code ec;
    if (owns_dir_) {
      std::filesystem::remove_all(dir_, ec);
    } else {
      std::filesystem::remove(path_, ec);
    }
  }
  const std::string& path() const { return path_; }

  // The file's bytes [offset, offset + length).
  std::vector<unsigned char> Read(uint64_t offset, uint64_t length) const {
    std::vector<unsigned char> out(length);
    UniqueFd fd(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    const ssize_t n = ::pread(fd.get(), out.data(), length, static_cast<off_t>(offset));
    out.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return out;
  }

  static std::string MakeDir() {
    std::string t = (std::filesystem::temp_directory_path() / "ferry-files-XXXXXX").string();
    return ::mkdtemp(t.data()) != nullptr ? t : std::string();
  }

 private:
  struct UniqueFd {
    explicit UniqueFd(int f) : fd_(f) {}
    ~UniqueFd() {
      if (fd_ >= 0) ::close(fd_);
    }
    int get() const { return fd_; }
    bool ok() const { return fd_ >= 0; }
    int fd_;
  };
  std::string dir_, path_;
  bool owns_dir_ = true;
};

// One request of a test: where in memory, where in the file region.
struct Piece {
  uint64_t mem_off = 0;
  uint64_t file_off = 0;
  uint64_t length = 0;
};

// Scattered pieces: aligned ones (O_DIRECT on file systems that have it)
// and unaligned ones (through the page cache).
std::vector<Piece> MixedPieces() {
  return {{0, 0, 4096},           {8192, 16384, 65536}, {4096, 4096, 4096},
          {100000, 200003, 777},  {81920, 98304, 8192}, {262144, 262144, 262144},
          {200000, 150001, 12345}};
}

// The initiator and, for "tcp" and "shm", a second engine that owns the
// file; for "local", the initiator owns it and reaches it through its own
// segment.
class FileRegionsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
    ASSERT_NO_FATAL_FAILURE(Start(Options()));
  }

  // The engines' options: the parameter's transport, on loopback.
  EngineOptions Options() const {
    EngineOptions o;
    o.transport = GetParam();
    o.listen_host = "127.0.0.1";
    o.transfer_timeout = kWait;
    return o;
  }

  // (Re)starts the initiator and, but for "local", the file's owner with
  // `o`, and opens the owner's segment.
  void Start(const EngineOptions& o) {
    initiator_.reset();
    peer_.reset();
    ASSERT_OK_AND_ASSIGN(initiator_, Engine::Create(o));
    if (GetParam() == "local") {
      owner_ = initiator_.get();
    } else {
      ASSERT_OK_AND_ASSIGN(peer_, Engine::Create(o));
      owner_ = peer_.get();
    }
    ASSERT_OK_AND_ASSIGN(segment_, initiator_->OpenSegment(owner_->PeerId()));
  }

  // Registers `size` bytes of cpu memory with the initiator.
  unsigned char* Memory(size_t size) {
    buffers_.push_back(std::make_unique<AlignedBuffer>(size));
    unsigned char* p = buffers_.back()->data();
    EXPECT_OK(initiator_->RegisterMemory(p, size, "cpu"));
    return p;
  }

  // Registers the file with the owner and fetches the owner's descriptor
  // again (prepared lists check against it).
  StatusOr<uint64_t> RegisterFile(const FileRegion& r) {
    auto base = owner_->RegisterFile(r);
    if (!base.ok()) return base.status();
    auto q = initiator_->QuerySegment(segment_);
    if (!q.ok()) return q.status();
    return reinterpret_cast<uint64_t>(*base);
  }

  // Runs one batch of `op` requests; each request's final status.
  std::vector<Status> Run(Opcode op, unsigned char* mem, uint64_t file_base,
                          const std::vector<Piece>& pieces) {
    std::vector<TransferRequest> reqs;
    for (const Piece& p : pieces)
      reqs.push_back({op, mem + p.mem_off, segment_, file_base + p.file_off, p.length});
    return RunBatch(*initiator_, reqs);
  }

  // Buffers first: freed only once the engines (whose threads read and
  // write them) are gone.
  std::vector<std::unique_ptr<AlignedBuffer>> buffers_;
  std::unique_ptr<Engine> initiator_, peer_;
  Engine* owner_ = nullptr;
  SegmentHandle segment_;
};

INSTANTIATE_TEST_SUITE_P(Transports, FileRegionsTest, ::testing::Values("local", "tcp", "shm"),
                         [](const auto& info) { return info.param; });

TEST_P(FileRegionsTest, WriteThenReadBack) {
  constexpr size_t kFile = 1 << 20, kMem = 1 << 20;
  TempFile file(kFile);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  unsigned char* src = Memory(kMem);
  unsigned char* dst = Memory(kMem);
  FillPattern(src, kMem, 7);
  const std::vector<Piece> pieces = MixedPieces();
  for (const Status& s : Run(Opcode::kWrite, src, base, pieces)) EXPECT_OK(s);
  for (const Piece& p : pieces) {
    const std::vector<unsigned char> got = file.Read(p.file_off, p.length);
    ASSERT_EQ(got.size(), p.length);
    EXPECT_EQ(std::memcmp(got.data(), src + p.mem_off, p.length), 0)
        << "file bytes at " << p.file_off;
  }
  for (const Status& s : Run(Opcode::kRead, dst, base, pieces)) EXPECT_OK(s);
  for (const Piece& p : pieces) {
    EXPECT_EQ(std::memcmp(dst + p.mem_off, src + p.mem_off, p.length), 0)
        << "read back at file offset " << p.file_off;
  }
  // Telemetry: each op counted once, as direct (aligned, where the file
  // system has O_DIRECT) or buffered; the unaligned pieces are buffered.
  const EngineMetrics m = owner_->GetMetrics();
  EXPECT_EQ(m.file_direct_ops + m.file_buffered_ops, 2 * pieces.size());
  EXPECT_GE(m.file_buffered_ops, 4u);
  uint64_t bytes = 0;
  for (const Piece& p : pieces) bytes += 2 * p.length;
  EXPECT_EQ(m.file_direct_bytes + m.file_buffered_bytes, bytes);
  // Where the file system has O_DIRECT, the aligned pieces used it (over
  // tcp too: the target stages them in page-aligned buffers).
  struct statx sx {};
  if (::statx(AT_FDCWD, file.path().c_str(), 0, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN) != 0 && sx.stx_dio_offset_align != 0 &&
      sx.stx_dio_offset_align <= 4096 && sx.stx_dio_mem_align <= 4096) {
    EXPECT_GE(m.file_direct_ops, 2 * 4u) << "4 pieces are 4 KiB-aligned in memory and file";
  }
  EXPECT_OK(owner_->UnregisterMemory(reinterpret_cast<void*>(base)));
  // Gone: a transfer naming it is refused.
  TransferRequest r{Opcode::kRead, dst, segment_, base, 4096};
  EXPECT_THAT(initiator_->TransferSync(r), IsError());
}

TEST_P(FileRegionsTest, RegionAtAnOffsetOfTheFile) {
  TempFile file(256 << 10);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base,
                       RegisterFile({.path = file.path(), .offset = 65536, .length = 131072}));
  unsigned char* src = Memory(8192);
  FillPattern(src, 8192, 3);
  TransferRequest r{Opcode::kWrite, src, segment_, base + 4096, 8192};
  ASSERT_OK(initiator_->TransferSync(r));
  const auto got = file.Read(65536 + 4096, 8192);
  EXPECT_EQ(std::memcmp(got.data(), src, 8192), 0);
  // The region's end is its end, not the file's.
  r.remote_addr = base + 131072 - 4096;
  EXPECT_THAT(initiator_->TransferSync(r), StatusIs(StatusCode::kInvalidArgument));
}

TEST_P(FileRegionsTest, ReadOnlyRangePastTheEndOfTheFileIsRefusedNamingIt) {
  TempFile file(65536);
  EXPECT_THAT(
      owner_->RegisterFile(
          {.path = file.path(), .offset = 4096, .length = 65536, .writable = false}),
      StatusIs(StatusCode::kInvalidArgument,
               AllOf(HasSubstr(file.path()), HasSubstr("past its end"), MentionsNumber(65536))));
  EXPECT_THAT(owner_->RegisterFile({.path = file.path(), .offset = 65536}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr(file.path())));
  EXPECT_THAT(owner_->RegisterFile({.path = file.path() + ".missing"}),
              StatusIs(StatusCode::kNotFound, HasSubstr(".missing")));
  EXPECT_THAT(owner_->RegisterFile({}), StatusIs(StatusCode::kInvalidArgument));
}

// A writable region past the end (NIXL registers a new, empty file and
// writes it): a write there extends the file; a read of bytes never written
// fails FAILED_PRECONDITION naming the file and the offset.
TEST_P(FileRegionsTest, WritableRangePastTheEndGrowsTheFileOnWrite) {
  TempFile file(0);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path(), .length = 65536}));
  unsigned char* mem = Memory(65536);
  TransferRequest r{Opcode::kRead, mem, segment_, base + 8192, 4096};
  EXPECT_THAT(initiator_->TransferSync(r),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(file.path()), HasSubstr("ends there"), HasSubstr("8192"))));
  FillPattern(mem, 16384, 9);
  r = {Opcode::kWrite, mem, segment_, base + 8192, 16384};
  ASSERT_OK(initiator_->TransferSync(r));
  const auto got = file.Read(8192, 16384);
  EXPECT_EQ(std::memcmp(got.data(), mem, 16384), 0);
  std::memset(mem, 0, 16384);
  r.opcode = Opcode::kRead;
  ASSERT_OK(initiator_->TransferSync(r));
  EXPECT_EQ(DescribePatternMismatch(mem, 16384, 9), "");
}

TEST_P(FileRegionsTest, ReadOnlyRegionWrittenIsRefusedOthersOfTheBatchComplete) {
  TempFile file(65536);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path(), .writable = false}));
  unsigned char* mem = Memory(65536);
  FillPattern(mem, 65536, 11);
  const std::vector<Status> w = Run(Opcode::kWrite, mem, base, {{0, 0, 4096}});
  EXPECT_THAT(w[0], StatusIs(StatusCode::kInvalidArgument,
                             AllOf(HasSubstr(file.path()), HasSubstr("read-only"))));
  EXPECT_EQ(file.Read(0, 4096), std::vector<unsigned char>(4096, 0)) << "nothing written";
  // Reads work, each request with its own status.
  for (const Status& s : Run(Opcode::kRead, mem, base, {{0, 0, 4096}, {8192, 100, 5000}}))
    EXPECT_OK(s);
  EXPECT_EQ(mem[0], 0);
}

TEST_P(FileRegionsTest, TruncatedUnderItsRegistrationFailsClearlyNothingElseTouched) {
  TempFile file(65536);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  unsigned char* mem = Memory(65536);
  FillPattern(mem, 65536, 5);
  ASSERT_EQ(::truncate(file.path().c_str(), 16384), 0);
  const std::vector<unsigned char> before(mem, mem + 65536);
  // One read inside what is left, one past it.
  const std::vector<Status> r = Run(Opcode::kRead, mem, base, {{0, 0, 4096}, {8192, 32768, 4096}});
  EXPECT_OK(r[0]);
  EXPECT_THAT(
      r[1], StatusIs(StatusCode::kFailedPrecondition,
                     AllOf(HasSubstr(file.path()), MentionsNumber(32768), HasSubstr("truncated"))));
  EXPECT_EQ(std::vector<unsigned char>(mem, mem + 4096), std::vector<unsigned char>(4096, 0));
  EXPECT_TRUE(std::equal(mem + 4096, mem + 65536, before.begin() + 4096))
      << "bytes outside the completed read changed";
}

TEST_P(FileRegionsTest, DescriptorClosedByItsOwnerIsHarmless) {
  TempFile file(65536);
  const int fd = ::open(file.path().c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  uint64_t base = 0;
  FileRegion by_fd;
  by_fd.fd = fd;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile(by_fd));
  ASSERT_EQ(::close(fd), 0);  // the engine opened the file itself
  unsigned char* mem = Memory(8192);
  FillPattern(mem, 4096, 9);
  ASSERT_OK(initiator_->TransferSync({Opcode::kWrite, mem, segment_, base + 4096, 4096}));
  ASSERT_OK(initiator_->TransferSync({Opcode::kRead, mem + 4096, segment_, base + 4096, 4096}));
  EXPECT_EQ(std::memcmp(mem, mem + 4096, 4096), 0);
  EXPECT_EQ(std::memcmp(file.Read(4096, 4096).data(), mem, 4096), 0);
}

TEST_P(FileRegionsTest, DurableWritesComplete) {
  TempFile file(65536);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path(), .durable = true}));
  unsigned char* mem = Memory(65536);
  FillPattern(mem, 65536, 13);
  for (const Status& s : Run(Opcode::kWrite, mem, base, {{0, 0, 4096}, {4096, 10000, 3000}}))
    EXPECT_OK(s);
  EXPECT_EQ(std::memcmp(file.Read(10000, 3000).data(), mem + 4096, 3000), 0);
}

// A size-limited tmpfs: the write that finds no room fails
// RESOURCE_EXHAUSTED naming the file; what completed is in the file.
TEST_P(FileRegionsTest, DeviceFullIsResourceExhaustedEarlierEntriesIntact) {
  const std::string dir = TempFile::MakeDir();
  ASSERT_FALSE(dir.empty());
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=1m") != 0) {
    const int err = errno;
    std::filesystem::remove(dir);
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs (needs root or CAP_SYS_ADMIN): "
                 << std::strerror(err);
  }
  {
    TempFile file(4 << 20, dir);  // sparse: larger than the file system
    uint64_t base = 0;
    ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
    unsigned char* mem = Memory(2 << 20);
    FillPattern(mem, 2 << 20, 17);
    std::vector<Piece> pieces;
    for (uint64_t k = 0; k < 16; ++k) pieces.push_back({k * 131072, k * 131072, 131072});
    const std::vector<Status> r = Run(Opcode::kWrite, mem, base, pieces);
    size_t failed = 0;
    for (size_t k = 0; k < r.size(); ++k) {
      if (r[k].ok()) {
        EXPECT_EQ(std::memcmp(file.Read(pieces[k].file_off, 131072).data(), mem + pieces[k].mem_off,
                              131072),
                  0)
            << "entry " << k << " reported written";
        continue;
      }
      ++failed;
      EXPECT_THAT(r[k], StatusIs(StatusCode::kResourceExhausted,
                                 AllOf(HasSubstr(file.path()), HasSubstr("No space left"))))
          << "entry " << k;
    }
    EXPECT_GE(failed, 8u) << "2 MiB written to a 1 MiB file system";
    EXPECT_OK(owner_->UnregisterMemory(reinterpret_cast<void*>(base)));
  }
  EXPECT_EQ(::umount(dir.c_str()), 0) << std::strerror(errno);
  std::filesystem::remove(dir);
}

// A device error (EIO, injected on chosen file offsets: a disk's bad
// sectors) fails only the entries that touch them, DATA_LOSS naming the
// file, the offset and the kernel's word; the others of the batch complete.
TEST_P(FileRegionsTest, DeviceErrorFailsOnlyTheEntriesThatMeetIt) {
  EngineOptions o = Options();
  o.testing.file_eio_offsets = {20000, 65536};
  ASSERT_NO_FATAL_FAILURE(Start(o));
  TempFile file(131072);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  unsigned char* mem = Memory(131072);
  FillPattern(mem, 131072, 31);
  const std::vector<Piece> pieces = {
      {0, 0, 16384}, {16384, 16384, 16384}, {32768, 32768, 32768}, {65536, 65536, 4096}};
  const std::vector<Status> w = Run(Opcode::kWrite, mem, base, pieces);
  EXPECT_OK(w[0]);
  EXPECT_THAT(w[1],
              StatusIs(StatusCode::kDataLoss, AllOf(HasSubstr(file.path()), MentionsNumber(16384),
                                                    HasSubstr("Input/output error"))));
  EXPECT_OK(w[2]);
  EXPECT_THAT(w[3], StatusIs(StatusCode::kDataLoss,
                             AllOf(HasSubstr(file.path()),
                                   HasSubstr("write of 4096 bytes at offset 65536"))));
  EXPECT_EQ(std::memcmp(file.Read(32768, 32768).data(), mem + 32768, 32768), 0);
  const std::vector<Status> r = Run(Opcode::kRead, mem, base, {{0, 16384, 8192}});
  EXPECT_THAT(r[0], StatusIs(StatusCode::kDataLoss, HasSubstr("read of 8192 bytes")));
}

// Once CancelBatch returns, no byte of the batch moves any more: reads from
// the file into memory queued behind a ring of depth 1.
TEST_P(FileRegionsTest, NoByteLandsAfterCancelReturns) {
  EngineOptions o = Options();
  o.file_queue_depth = 1;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  constexpr size_t kEntries = 256, kLen = 65536;
  TempFile file(kEntries * kLen);
  {
    std::vector<unsigned char> bytes(kEntries * kLen);
    FillPattern(bytes.data(), bytes.size(), 21);
    const int fd = ::open(file.path().c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  unsigned char* mem = Memory(kEntries * kLen);
  std::vector<TransferRequest> reqs;
  for (size_t k = 0; k < kEntries; ++k)
    reqs.push_back({Opcode::kRead, mem + k * kLen, segment_, base + k * kLen, kLen});
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator_->AllocateBatch(kEntries));
  ASSERT_OK(initiator_->Submit(batch, reqs));
  ASSERT_OK(initiator_->CancelBatch(batch));
  const std::vector<unsigned char> after_cancel(mem, mem + kEntries * kLen);
  // A later read through the same ring (FIFO at depth 1) runs after every
  // op of the cancelled batch was started or dropped.
  unsigned char* probe = Memory(kLen);
  ASSERT_OK(initiator_->TransferSync({Opcode::kRead, probe, segment_, base, kLen}));
  EXPECT_TRUE(std::equal(after_cancel.begin(), after_cancel.end(), mem))
      << "bytes of the cancelled batch landed after CancelBatch returned";
  size_t cancelled = 0;
  for (size_t k = 0; k < kEntries; ++k) {
    ASSERT_OK_AND_ASSIGN(TransferStatus st, initiator_->GetTransferStatus(batch, k));
    ASSERT_NE(st.state, TransferState::kPending);
    if (st.state == TransferState::kFailed) {
      EXPECT_THAT(st.status, StatusIs(StatusCode::kCancelled));
      ++cancelled;
    } else {
      const auto want = file.Read(k * kLen, kLen);
      EXPECT_EQ(std::memcmp(mem + k * kLen, want.data(), kLen), 0) << "completed entry " << k;
    }
  }
  EXPECT_OK(initiator_->FreeBatch(batch));
  RecordProperty("cancelled", static_cast<int>(cancelled));
}

// Prepared lists and transfers reach file regions like memory: KV pages
// (scattered, strided rows) written with a notification, which arrives
// only once the bytes are in the file, then read back.
TEST_P(FileRegionsTest, PreparedTransferWithNotification) {
  constexpr uint64_t kPage = 16384, kPages = 32;
  TempFile file(2 * kPages * kPage);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  unsigned char* mem = Memory(kPages * kPage);
  FillPattern(mem, kPages * kPage, 29);
  const DescRow local_rows[] = {{reinterpret_cast<uint64_t>(mem), kPage, kPage, kPages}};
  // Every other page of the file.
  const DescRow remote_rows[] = {{base, kPage, 2 * kPage, kPages}};
  ASSERT_OK_AND_ASSIGN(DescListHandle local, initiator_->PrepareLocalList(local_rows));
  ASSERT_OK_AND_ASSIGN(DescListHandle remote, initiator_->PrepareRemoteList(segment_, remote_rows));
  std::vector<uint32_t> idx(kPages);
  for (uint32_t k = 0; k < kPages; ++k) idx[k] = k;
  ASSERT_OK_AND_ASSIGN(TransferHandle t,
                       initiator_->MakeTransfer(Opcode::kWrite, local, idx, remote, idx,
                                                Notification{"", "kv", "pages written"}));
  ASSERT_OK(initiator_->PostTransfer(t));
  ASSERT_OK(initiator_->WaitTransfer(t, kWait));
  // The notification came after the data: the file holds every page.
  std::vector<Notification> got = owner_->GetNotifications();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "pages written");
  for (uint64_t k = 0; k < kPages; ++k) {
    EXPECT_EQ(std::memcmp(file.Read(2 * k * kPage, kPage).data(), mem + k * kPage, kPage), 0)
        << "page " << k;
  }
  unsigned char* back = Memory(kPages * kPage);
  const DescRow back_rows[] = {{reinterpret_cast<uint64_t>(back), kPage, kPage, kPages}};
  ASSERT_OK_AND_ASSIGN(DescListHandle back_list, initiator_->PrepareLocalList(back_rows));
  ASSERT_OK_AND_ASSIGN(TransferHandle r,
                       initiator_->MakeTransfer(Opcode::kRead, back_list, idx, remote, idx));
  ASSERT_OK(initiator_->PostTransfer(r));
  ASSERT_OK(initiator_->WaitTransfer(r, kWait));
  EXPECT_EQ(std::memcmp(back, mem, kPages * kPage), 0);
  EXPECT_OK(initiator_->ReleaseTransfer(t));
  EXPECT_OK(initiator_->ReleaseTransfer(r));
}

// One batch mixes the owner's memory and its file region (to the same peer,
// in one submit): each entry lands where its address says.
TEST_P(FileRegionsTest, OneBatchOfMemoryAndFileEntries) {
  TempFile file(65536);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  AlignedBuffer owner_mem(65536);
  ASSERT_OK(owner_->RegisterMemory(owner_mem.data(), 65536, "cpu"));
  ASSERT_OK(initiator_->QuerySegment(segment_).status());
  unsigned char* mem = Memory(65536);
  FillPattern(mem, 65536, 37);
  std::vector<TransferRequest> reqs;
  for (uint64_t k = 0; k < 8; ++k) {
    const uint64_t remote = (k % 2 == 0 ? base : owner_mem.addr()) + k * 8192;
    reqs.push_back({Opcode::kWrite, mem + k * 8192, segment_, remote, 8192});
  }
  ASSERT_OK(initiator_->TransferSync(reqs));
  for (uint64_t k = 0; k < 8; ++k) {
    const std::vector<unsigned char> got =
        k % 2 == 0 ? file.Read(k * 8192, 8192)
                   : std::vector<unsigned char>(owner_mem.data() + k * 8192,
                                                owner_mem.data() + (k + 1) * 8192);
    EXPECT_EQ(std::memcmp(got.data(), mem + k * 8192, 8192), 0)
        << "entry " << k << (k % 2 == 0 ? " (file)" : " (memory)");
  }
  EXPECT_OK(owner_->UnregisterMemory(owner_mem.data()));
}

// Over a stream the target answers a frame of file entries once its file
// I/O is done, and serves later frames meanwhile; the answers still go
// back in frame order (an answer out of order would close the stream, and
// its requests fail). One stream, one entry a frame: file and memory
// frames alternate, reads and writes.
TEST_P(FileRegionsTest, FileAndMemoryFramesOnOneStreamAnswerInOrder) {
  if (GetParam() == "local") GTEST_SKIP() << "local has no streams";
  EngineOptions o = Options();
  o.tcp_streams = 1;
  o.max_frame_entries = 1;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  constexpr uint64_t kN = 256, kLen = 16384;
  TempFile file(kN * kLen);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  AlignedBuffer owner_mem(kN * kLen);
  ASSERT_OK(owner_->RegisterMemory(owner_mem.data(), kN * kLen, "cpu"));
  ASSERT_OK(initiator_->QuerySegment(segment_).status());
  unsigned char* mem = Memory(2 * kN * kLen);
  FillPattern(mem, kN * kLen, 41);
  auto remote = [&](uint64_t k) { return (k % 2 == 0 ? base : owner_mem.addr()) + k * kLen; };
  std::vector<TransferRequest> writes, reads;
  for (uint64_t k = 0; k < kN; ++k) {
    writes.push_back({Opcode::kWrite, mem + k * kLen, segment_, remote(k), kLen});
    reads.push_back({Opcode::kRead, mem + (kN + k) * kLen, segment_, remote(k), kLen});
  }
  ASSERT_OK(initiator_->TransferSync(writes));
  ASSERT_OK(initiator_->TransferSync(reads));
  EXPECT_EQ(std::memcmp(mem, mem + kN * kLen, kN * kLen), 0) << "read back differs";
  for (uint64_t k = 0; k < kN; k += 2) {
    EXPECT_EQ(std::memcmp(file.Read(k * kLen, kLen).data(), mem + k * kLen, kLen), 0)
        << "entry " << k;
  }
  EXPECT_OK(owner_->UnregisterMemory(owner_mem.data()));
}

// One stream, and a batch whose staging is larger than the target lets one
// stream hold (Connection::kHeldHighBytes): the target stops reading the
// stream while its file I/O holds too much, reads on as it finishes (over
// the socket and, for shm, the request rings), and over shm the initiator's
// lend returns still reach it. Every byte lands, both ways; the staging
// stays within the bound (the metrics' peak), and once the lends are
// returned, nothing stays held.
TEST_P(FileRegionsTest, BatchBeyondTheTargetsStagingBoundMovesEveryByte) {
  if (GetParam() == "local") GTEST_SKIP() << "local has no streams";
  EngineOptions o = Options();
  o.tcp_streams = 1;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  constexpr uint64_t kLen = 32768, kN = 3072;  // 96 MiB of KV pages
  static_assert(kN * kLen > internal::stream::Connection::kHeldHighBytes);
  TempFile file(kN * kLen);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  unsigned char* mem = Memory(2 * kN * kLen);
  FillPattern(mem, kN * kLen, 43);
  // Page k of memory goes to a scattered page of the file.
  auto slot = [](uint64_t k) { return (k * 1237) % kN; };
  std::vector<TransferRequest> writes, reads;
  for (uint64_t k = 0; k < kN; ++k) {
    writes.push_back({Opcode::kWrite, mem + k * kLen, segment_, base + slot(k) * kLen, kLen});
    reads.push_back({Opcode::kRead, mem + (kN + k) * kLen, segment_, base + slot(k) * kLen, kLen});
  }
  ASSERT_OK(initiator_->TransferSync(writes));
  // The bound, plus the frame that crossed it and the one being received
  // (frames of at most max_frame_bytes).
  const uint64_t bound =
      internal::stream::Connection::kHeldHighBytes + 2 * uint64_t{Options().max_frame_bytes};
  const EngineMetrics after_writes = owner_->GetMetrics();
  EXPECT_GT(after_writes.target_staging_bytes_peak, 0u);
  EXPECT_LE(after_writes.target_staging_bytes_peak, bound)
      << "the target staged more than one stream may hold";
  for (uint64_t k = 0; k < kN; k += 97) {
    EXPECT_EQ(std::memcmp(file.Read(slot(k) * kLen, kLen).data(), mem + k * kLen, kLen), 0)
        << "page " << k;
  }
  ASSERT_OK(initiator_->TransferSync(reads));
  EXPECT_EQ(std::memcmp(mem, mem + kN * kLen, kN * kLen), 0) << "read back differs";
  // Reads too: the initiator keeps at most file_read_window unanswered, and
  // returns each lend with its next frame.
  EXPECT_LE(owner_->GetMetrics().target_staging_bytes_peak, bound)
      << "the target staged more than one stream may hold for the reads";
  // shm: the last lends go back with the stream's next request or after an
  // idle tick; then nothing is held.
  ASSERT_OK(initiator_->TransferSync({Opcode::kRead, mem, segment_, base, kLen}));
  for (int i = 0; i < 2000 && owner_->GetMetrics().target_staging_bytes != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(owner_->GetMetrics().target_staging_bytes, 0u);
}

// The initiator goes away while the target still has its file writes in
// the ring: their answers have no stream left and are dropped; the target
// keeps serving (a new initiator's writes and reads work).
TEST_P(FileRegionsTest, InitiatorGoneWithFileIoInFlightLeavesTheTargetServing) {
  if (GetParam() == "local") GTEST_SKIP() << "local has no streams";
  constexpr uint64_t kN = 64, kLen = 65536;
  TempFile file(kN * kLen);
  uint64_t base = 0;
  ASSERT_OK_AND_ASSIGN(base, RegisterFile({.path = file.path()}));
  {
    unsigned char* mem = Memory(kN * kLen);
    FillPattern(mem, kN * kLen, 43);
    std::vector<TransferRequest> reqs;
    for (uint64_t k = 0; k < kN; ++k)
      reqs.push_back({Opcode::kWrite, mem + k * kLen, segment_, base + k * kLen, kLen});
    auto batch = initiator_->AllocateBatch(kN);
    ASSERT_OK(batch);
    ASSERT_OK(initiator_->Submit(*batch, reqs));
    initiator_.reset();  // not waited for
  }
  ASSERT_OK_AND_ASSIGN(initiator_, Engine::Create(Options()));
  ASSERT_OK_AND_ASSIGN(segment_, initiator_->OpenSegment(owner_->PeerId()));
  unsigned char* mem = Memory(2 * kLen);
  FillPattern(mem, kLen, 47);
  ASSERT_OK(initiator_->TransferSync({Opcode::kWrite, mem, segment_, base, kLen}));
  ASSERT_OK(initiator_->TransferSync({Opcode::kRead, mem + kLen, segment_, base, kLen}));
  EXPECT_EQ(std::memcmp(mem, mem + kLen, kLen), 0);
}

// The engine that owns the file is destroyed with reads perhaps still queued
// on its ring: those fail CANCELLED (nothing hangs), and the initiator's
// batch finishes.
TEST(FileRegionsShutdown, QueuedFileOpsFailWhenTheOwnerIsDestroyed) {
  EngineOptions o;
  o.transport = "local";
  o.listen_host = "127.0.0.1";
  o.file_queue_depth = 1;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> a, Engine::Create(o));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> b, Engine::Create(o));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, a->OpenSegment(b->PeerId()));
  constexpr size_t kEntries = 256, kLen = 65536;
  TempFile file(kEntries * kLen);
  void* base = nullptr;
  ASSERT_OK_AND_ASSIGN(base, b->RegisterFile({.path = file.path()}));
  AlignedBuffer mem(kEntries * kLen);
  ASSERT_OK(a->RegisterMemory(mem.data(), mem.size(), "cpu"));
  std::vector<TransferRequest> reqs;
  for (size_t k = 0; k < kEntries; ++k)
    reqs.push_back({Opcode::kRead, mem.data() + k * kLen, seg,
                    reinterpret_cast<uint64_t>(base) + k * kLen, kLen});
  ASSERT_OK_AND_ASSIGN(BatchId batch, a->AllocateBatch(kEntries));
  ASSERT_OK(a->Submit(batch, reqs));
  b.reset();
  (void)a->WaitBatch(batch, kWait);
  // Each request finished: completed (its bytes in place) or failed
  // CANCELLED; how many of each depends on how far the ring got.
  for (size_t k = 0; k < kEntries; ++k) {
    ASSERT_OK_AND_ASSIGN(TransferStatus st, a->GetTransferStatus(batch, k));
    ASSERT_NE(st.state, TransferState::kPending) << "request " << k;
    if (st.state == TransferState::kFailed) {
      EXPECT_THAT(st.status, StatusIs(StatusCode::kCancelled)) << "request " << k;
    }
  }
  EXPECT_OK(a->FreeBatch(batch));
}

// This engine's own file regions as the local side of requests to a peer's
// memory over tcp and shm (storage/file_staging.h: each slice through a
// host buffer of its own): a write reads the file and sends, a read
// receives and writes the file.
class LocalFilesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    FERRY_SKIP_UNLESS_TRANSPORT_WORKS(GetParam());
    ASSERT_NO_FATAL_FAILURE(Start(Options()));
  }
  EngineOptions Options() const {
    EngineOptions o;
    SetTransportOptions(GetParam(), &o);
    o.listen_host = "127.0.0.1";
    o.transfer_timeout = kWait;
    return o;
  }
  // The initiator (which owns the files) with `o`, and the peer.
  void Start(const EngineOptions& o) {
    initiator_.reset();
    peer_.reset();
    ASSERT_OK_AND_ASSIGN(initiator_, Engine::Create(o));
    ASSERT_OK_AND_ASSIGN(peer_, Engine::Create(Options()));
    ASSERT_OK_AND_ASSIGN(segment_, initiator_->OpenSegment(peer_->PeerId()));
  }
  // `size` bytes of the peer's memory, registered with it.
  unsigned char* PeerMemory(size_t size) {
    buffers_.push_back(std::make_unique<AlignedBuffer>(size));
    EXPECT_OK(peer_->RegisterMemory(buffers_.back()->data(), size, "cpu"));
    return buffers_.back()->data();
  }
  // One batch of `op` requests between the file region at `file_base`
  // (Piece::file_off) and the peer's memory `mem` (Piece::mem_off); each
  // request's final status.
  std::vector<Status> Run(Opcode op, uint64_t file_base, unsigned char* mem,
                          const std::vector<Piece>& pieces) {
    std::vector<TransferRequest> reqs;
    for (const Piece& p : pieces) {
      reqs.push_back({op, reinterpret_cast<void*>(file_base + p.file_off), segment_,
                      reinterpret_cast<uint64_t>(mem) + p.mem_off, p.length});
    }
    return RunBatch(*initiator_, reqs);
  }
  static void WriteFile(const TempFile& file, const std::vector<unsigned char>& bytes) {
    const int fd = ::open(file.path().c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }

  std::vector<std::unique_ptr<AlignedBuffer>> buffers_;
  std::unique_ptr<Engine> initiator_, peer_;
  SegmentHandle segment_;
};

INSTANTIATE_TEST_SUITE_P(Transports, LocalFilesTest, ::testing::Values("tcp", "shm", "fabric_tcp"),
                         [](const auto& info) { return info.param; });

// Scattered pieces, aligned (O_DIRECT) and not: the file's bytes to the
// peer's memory, then the peer's memory into the file; nothing else of
// either side touched.
TEST_P(LocalFilesTest, FileToPeerMemoryAndBack) {
  constexpr size_t kSize = 1 << 20;
  TempFile file(kSize);
  std::vector<unsigned char> bytes(kSize);
  FillPattern(bytes.data(), kSize, 41);
  ASSERT_NO_FATAL_FAILURE(WriteFile(file, bytes));
  void* base_ptr = nullptr;
  ASSERT_OK_AND_ASSIGN(base_ptr, initiator_->RegisterFile({.path = file.path()}));
  const uint64_t base = reinterpret_cast<uint64_t>(base_ptr);
  unsigned char* mem = PeerMemory(kSize);
  const std::vector<Piece> pieces = MixedPieces();
  for (const Status& s : Run(Opcode::kWrite, base, mem, pieces)) EXPECT_OK(s);
  std::vector<bool> written(kSize, false);
  for (const Piece& p : pieces) {
    EXPECT_EQ(std::memcmp(mem + p.mem_off, bytes.data() + p.file_off, p.length), 0)
        << "peer memory at " << p.mem_off;
    for (uint64_t k = 0; k < p.length; ++k) written[p.mem_off + k] = true;
  }
  for (size_t k = 0; k < kSize; ++k) {
    if (!written[k]) {
      ASSERT_EQ(mem[k], 0) << "peer byte " << k << " outside every piece";
    }
  }
  // The peer's memory, changed, read back into the file.
  FillPattern(mem, kSize, 43);
  for (const Status& s : Run(Opcode::kRead, base, mem, pieces)) EXPECT_OK(s);
  const std::vector<unsigned char> now = file.Read(0, kSize);
  ASSERT_EQ(now.size(), kSize);
  std::vector<bool> read(kSize, false);
  for (const Piece& p : pieces) {
    EXPECT_EQ(std::memcmp(now.data() + p.file_off, mem + p.mem_off, p.length), 0)
        << "file bytes at " << p.file_off;
    for (uint64_t k = 0; k < p.length; ++k) read[p.file_off + k] = true;
  }
  for (size_t k = 0; k < kSize; ++k) {
    if (!read[k]) {
      ASSERT_EQ(now[k], bytes[k]) << "file byte " << k << " outside every piece";
    }
  }
  // Both directions went through the initiator's ring.
  const EngineMetrics m = initiator_->GetMetrics();
  EXPECT_EQ(m.file_direct_ops + m.file_buffered_ops, 2 * pieces.size());
}

// A read into a read-only file region is refused naming the file; nothing
// of it is written, and the other requests of the batch complete.
TEST_P(LocalFilesTest, ReadIntoAReadOnlyFileIsRefusedOthersComplete) {
  TempFile file(65536);
  TempFile writable(65536);
  void* ro = nullptr;
  void* rw = nullptr;
  ASSERT_OK_AND_ASSIGN(ro, initiator_->RegisterFile({.path = file.path(), .writable = false}));
  ASSERT_OK_AND_ASSIGN(rw, initiator_->RegisterFile({.path = writable.path()}));
  unsigned char* mem = PeerMemory(65536);
  FillPattern(mem, 65536, 47);
  std::vector<TransferRequest> reqs = {
      {Opcode::kRead, ro, segment_, reinterpret_cast<uint64_t>(mem), 4096},
      {Opcode::kRead, rw, segment_, reinterpret_cast<uint64_t>(mem) + 4096, 8192}};
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator_->AllocateBatch(2));
  ASSERT_OK(initiator_->Submit(batch, reqs));
  (void)initiator_->WaitBatch(batch, kWait);
  ASSERT_OK_AND_ASSIGN(TransferStatus st, initiator_->GetTransferStatus(batch, 0));
  EXPECT_THAT(st.status, StatusIs(StatusCode::kInvalidArgument,
                                  AllOf(HasSubstr(file.path()), HasSubstr("read-only"))));
  ASSERT_OK_AND_ASSIGN(st, initiator_->GetTransferStatus(batch, 1));
  EXPECT_OK(st.status);
  EXPECT_OK(initiator_->FreeBatch(batch));
  EXPECT_EQ(file.Read(0, 4096), std::vector<unsigned char>(4096, 0)) << "nothing written";
  EXPECT_EQ(std::memcmp(writable.Read(0, 8192).data(), mem + 4096, 8192), 0);
}

// An I/O error of the local file fails the requests that meet it, naming
// the file and the offset; the others complete.
TEST_P(LocalFilesTest, DeviceErrorOfTheLocalFileFailsOnlyItsRequests) {
  EngineOptions o = Options();
  o.testing.file_eio_offsets = {65536};
  ASSERT_NO_FATAL_FAILURE(Start(o));
  TempFile file(131072);
  std::vector<unsigned char> bytes(131072);
  FillPattern(bytes.data(), bytes.size(), 53);
  ASSERT_NO_FATAL_FAILURE(WriteFile(file, bytes));
  void* base = nullptr;
  ASSERT_OK_AND_ASSIGN(base, initiator_->RegisterFile({.path = file.path()}));
  unsigned char* mem = PeerMemory(131072);
  const std::vector<Status> w = Run(Opcode::kWrite, reinterpret_cast<uint64_t>(base), mem,
                                    {{0, 0, 32768}, {65536, 65536, 4096}});
  EXPECT_OK(w[0]);
  EXPECT_EQ(std::memcmp(mem, bytes.data(), 32768), 0);
  EXPECT_THAT(w[1],
              StatusIs(StatusCode::kDataLoss, AllOf(HasSubstr(file.path()), MentionsNumber(65536),
                                                    HasSubstr("Input/output error"))));
  EXPECT_TRUE(std::all_of(mem + 65536, mem + 65536 + 4096, [](unsigned char c) { return c == 0; }))
      << "a failed file read sent bytes";
}

// Once CancelBatch returns, no byte of the cancelled reads reaches the
// local file: its bytes then are its bytes once every request ended.
TEST_P(LocalFilesTest, NoByteReachesTheFileAfterCancelReturns) {
  EngineOptions o = Options();
  o.file_queue_depth = 1;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  constexpr size_t kEntries = 256, kLen = 65536;
  TempFile file(kEntries * kLen);
  void* base_ptr = nullptr;
  ASSERT_OK_AND_ASSIGN(base_ptr, initiator_->RegisterFile({.path = file.path()}));
  const uint64_t base = reinterpret_cast<uint64_t>(base_ptr);
  unsigned char* mem = PeerMemory(kEntries * kLen);
  FillPattern(mem, kEntries * kLen, 59);
  std::vector<TransferRequest> reqs;
  for (size_t k = 0; k < kEntries; ++k) {
    reqs.push_back({Opcode::kRead, reinterpret_cast<void*>(base + k * kLen), segment_,
                    reinterpret_cast<uint64_t>(mem) + k * kLen, kLen});
  }
  ASSERT_OK_AND_ASSIGN(BatchId batch, initiator_->AllocateBatch(kEntries));
  ASSERT_OK(initiator_->Submit(batch, reqs));
  ASSERT_OK(initiator_->CancelBatch(batch));
  const std::vector<unsigned char> after_cancel = file.Read(0, kEntries * kLen);
  (void)initiator_->WaitBatch(batch, kWait);
  size_t cancelled = 0;
  for (size_t k = 0; k < kEntries; ++k) {
    ASSERT_OK_AND_ASSIGN(TransferStatus st, initiator_->GetTransferStatus(batch, k));
    ASSERT_NE(st.state, TransferState::kPending) << "request " << k;
    if (st.state == TransferState::kFailed) {
      EXPECT_THAT(st.status, StatusIs(StatusCode::kCancelled));
      ++cancelled;
    }
  }
  EXPECT_OK(initiator_->FreeBatch(batch));
  EXPECT_EQ(file.Read(0, kEntries * kLen), after_cancel)
      << "bytes of the cancelled batch reached the file after CancelBatch returned";
  RecordProperty("cancelled", static_cast<int>(cancelled));
}

// Destroying the engine that owns the files while staged slices of both
// directions are in flight (queued for staging buffers, in its ring, posted
// to the peer) returns: the transports fail what they hold, and the stager
// neither waits for answers that can no longer come nor posts to links that
// were shut down. The file keeps only whole pieces of the peer's bytes.
TEST_P(LocalFilesTest, EngineDestroyedWithStagedSlicesInFlight) {
  constexpr size_t kEntries = 512, kLen = 16384;
  TempFile file(kEntries * kLen);
  AlignedBuffer buffer(kEntries * kLen);
  unsigned char* mem = buffer.data();
  FillPattern(mem, kEntries * kLen, 61);
  for (int round = 0; round < 8; ++round) {
    if (round > 0) {
      ASSERT_NO_FATAL_FAILURE(Start(Options()));
    }
    ASSERT_OK(peer_->RegisterMemory(mem, kEntries * kLen, "cpu"));
    void* base_ptr = nullptr;
    ASSERT_OK_AND_ASSIGN(base_ptr, initiator_->RegisterFile({.path = file.path()}));
    const uint64_t base = reinterpret_cast<uint64_t>(base_ptr);
    // Writes of the first half of the file to the peer, reads of the
    // peer's second half into the file: two batches.
    for (Opcode op : {Opcode::kWrite, Opcode::kRead}) {
      std::vector<TransferRequest> reqs;
      for (size_t k = 0; k < kEntries / 2; ++k) {
        const size_t at = (op == Opcode::kWrite ? k : kEntries / 2 + k) * kLen;
        reqs.push_back({op, reinterpret_cast<void*>(base + at), segment_,
                        reinterpret_cast<uint64_t>(mem) + at, kLen});
      }
      ASSERT_OK_AND_ASSIGN(BatchId batch, initiator_->AllocateBatch(reqs.size()));
      ASSERT_OK(initiator_->Submit(batch, reqs));
    }
    initiator_.reset();  // with the batches in flight
    // Frames the initiator sent before it went may still be landing in the
    // peer's memory: unregistering it waits for them (and must return, the
    // sender being gone), so the buffer can be reused or freed after it.
    ASSERT_OK(peer_->UnregisterMemory(mem));
    const std::vector<unsigned char> now = file.Read(0, kEntries * kLen);
    for (size_t k = kEntries / 2; k < kEntries; ++k) {
      const unsigned char* piece = now.data() + k * kLen;
      const bool untouched =
          std::all_of(piece, piece + kLen, [](unsigned char c) { return c == 0; });
      ASSERT_TRUE(untouched || std::memcmp(piece, mem + k * kLen, kLen) == 0)
          << "round " << round << ": piece " << k << " is neither untouched nor the peer's bytes";
    }
  }
}

// A staged read that fails while its bytes still land later (the fabric
// provider keeps a read past its deadline in flight; played here by the
// fault link under the stagers, over tcp) keeps its staging buffer until
// they landed: the next slice staged on that transport, a write of another
// part of the file, gets a buffer of its own and sends the file's bytes
// (with the buffer reused, it sent the late read's bytes instead). The
// failed read's bytes never reach the file.
TEST(LocalFilesLateRead, AReadLandingAfterItFailedDoesNotReachAnotherSlicesBuffer) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("tcp");
  constexpr size_t kLen = 65536;
  TempFile file(2 * kLen);
  {
    std::vector<unsigned char> bytes(kLen);
    FillPattern(bytes.data(), kLen, 71);
    std::FILE* f = std::fopen(file.path().c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(kLen), SEEK_SET), 0);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, kLen, f), kLen);
    ASSERT_EQ(std::fclose(f), 0);
  }
  EngineOptions o;
  SetTransportOptions("tcp", &o);
  o.listen_host = "127.0.0.1";
  o.transfer_timeout = kWait;
  EngineOptions faulty = o;
  faulty.testing.link_faults.seed = 1;
  faulty.testing.link_faults.late_read_percent = 100;
  faulty.testing.link_faults.under_staging = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> initiator, Engine::Create(faulty));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> peer, Engine::Create(o));
  AlignedBuffer theirs(2 * kLen);
  FillPattern(theirs.data(), kLen, 72);
  std::memset(theirs.data() + kLen, 0, kLen);
  ASSERT_OK(peer->RegisterMemory(theirs.data(), 2 * kLen, "cpu"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, initiator->OpenSegment(peer->PeerId()));
  void* base_ptr = nullptr;
  ASSERT_OK_AND_ASSIGN(base_ptr, initiator->RegisterFile({.path = file.path()}));
  const uint64_t base = reinterpret_cast<uint64_t>(base_ptr);
  const uint64_t mem = reinterpret_cast<uint64_t>(theirs.data());

  std::vector<Status> got =
      RunBatch(*initiator, {{Opcode::kRead, reinterpret_cast<void*>(base), seg, mem, kLen}});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].code(), StatusCode::kDeadlineExceeded) << got[0];
  // The late read lands in its buffer just before this write is posted.
  got = RunBatch(*initiator,
                 {{Opcode::kWrite, reinterpret_cast<void*>(base + kLen), seg, mem + kLen, kLen}});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_OK(got[0]);
  EXPECT_EQ(std::memcmp(theirs.data() + kLen, file.Read(kLen, kLen).data(), kLen), 0)
      << "the write sent other bytes than the file's (the late read's, through a shared buffer)";
  EXPECT_EQ(file.Read(0, kLen), std::vector<unsigned char>(kLen, 0))
      << "the failed read's bytes reached the file";
  initiator.reset();
  ASSERT_OK(peer->UnregisterMemory(theirs.data()));
}

// A same-host initiator of a build that does not take staged lends (its
// hello leaves the flag out) still writes a peer's file regions over shm,
// but its reads of them (lent reads, which it would copy from the file
// region's reserved addresses) are refused, naming the range and saying to
// use tcp; its reads of memory in the same batch complete.
TEST(FileRegionsShm, AnOlderInitiatorsReadsOfFilesAreRefusedWithTheReason) {
  FERRY_SKIP_UNLESS_TRANSPORT_WORKS("shm");
  EngineOptions o;
  o.transport = "shm";
  o.listen_host = "127.0.0.1";
  EngineOptions old = o;
  old.testing.no_staged_lends = true;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> a, Engine::Create(old));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> b, Engine::Create(o));
  TempFile file(65536);
  void* base = nullptr;
  ASSERT_OK_AND_ASSIGN(base, b->RegisterFile({.path = file.path()}));
  AlignedBuffer theirs(65536);
  ASSERT_OK(b->RegisterMemory(theirs.data(), 65536, "cpu"));
  ASSERT_OK_AND_ASSIGN(SegmentHandle seg, a->OpenSegment(b->PeerId()));
  AlignedBuffer mem(65536);
  ASSERT_OK(a->RegisterMemory(mem.data(), 65536, "cpu"));
  FillPattern(mem.data(), 8192, 29);
  const uint64_t file_addr = reinterpret_cast<uint64_t>(base);
  ASSERT_OK(a->TransferSync({Opcode::kWrite, mem.data(), seg, file_addr, 8192}));
  EXPECT_EQ(std::memcmp(file.Read(0, 8192).data(), mem.data(), 8192), 0);
  FillPattern(theirs.data(), 4096, 31);
  std::memset(mem.data() + 16384, 0, 8192);
  auto batch = a->AllocateBatch(2);
  ASSERT_OK(batch);
  ASSERT_OK(a->Submit(*batch, std::vector<TransferRequest>{
                                  {Opcode::kRead, mem.data() + 16384, seg, file_addr, 4096},
                                  {Opcode::kRead, mem.data() + 32768, seg, theirs.addr(), 4096}}));
  (void)a->WaitBatch(*batch, kWait);
  ASSERT_OK_AND_ASSIGN(TransferStatus st, a->GetTransferStatus(*batch, 0));
  EXPECT_THAT(st.status, StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(st.status, IsError(HasSubstr("file region")));
  EXPECT_THAT(st.status, IsError(HasSubstr("use tcp")));
  EXPECT_THAT(st.status, IsError(MentionsNumber(file_addr)));
  ASSERT_OK_AND_ASSIGN(st, a->GetTransferStatus(*batch, 1));
  EXPECT_OK(st.status);
  EXPECT_EQ(std::memcmp(mem.data() + 32768, theirs.data(), 4096), 0);
  EXPECT_TRUE(std::all_of(mem.data() + 16384, mem.data() + 16384 + 4096, [](unsigned char c) {
    return c == 0;
  })) << "a refused read stored bytes";
  EXPECT_OK(a->FreeBatch(*batch));
}

// Local only: this engine's file region as the request's local side (file →
// memory with a write, memory → file with a read).
TEST(FileRegionsLocal, FileAsTheLocalBuffer) {
  EngineOptions o;
  o.transport = "local";
  o.listen_host = "127.0.0.1";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> e, Engine::Create(o));
  ASSERT_OK_AND_ASSIGN(SegmentHandle self, e->OpenSegment(e->PeerId()));
  TempFile file(65536);
  void* base = nullptr;
  ASSERT_OK_AND_ASSIGN(base, e->RegisterFile({.path = file.path()}));
  AlignedBuffer mem(65536);
  ASSERT_OK(e->RegisterMemory(mem.data(), 65536, "cpu"));
  FillPattern(mem.data(), 8192, 23);
  // memory → file: a read of the memory into the file region.
  ASSERT_OK(e->TransferSync({Opcode::kRead, base, self, mem.addr(), 8192}));
  EXPECT_EQ(std::memcmp(file.Read(0, 8192).data(), mem.data(), 8192), 0);
  // file → memory: a write of the file region into the memory.
  ASSERT_OK(e->TransferSync(
      {Opcode::kWrite, static_cast<char*>(base) + 1000, self, mem.addr() + 16384, 5000}));
  EXPECT_EQ(std::memcmp(mem.data() + 16384, mem.data() + 1000, 5000), 0);
}

}  // namespace
}  // namespace ferry::test
