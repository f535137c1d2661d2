#include "transport/shm/copy_service.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>

#include "common/fd_limit.h"
#include "common/log.h"
#include "transport/shm/copy_frames.h"
#include "transport/shm/request_ring.h"

namespace ferry::internal::shm {
namespace {

constexpr size_t kMaxIov = IOV_MAX < 1024 ? IOV_MAX : 1024;

// Reads the initiator's probe bytes out of its memory.
Status ProbePeer(const CopyOpenerConfig& cfg, int pid, const CopyHello& hello) {
  const std::string& self = cfg.policy.target->peer_id();
  const std::string who =
      "process " + std::to_string(pid) + " (" + hello.hello.initiator_peer_id + ")";
  if (cfg.refuse) {
    return FailedPreconditionError("same-host transport: engine " + self +
                                   " refuses to copy to or from " + who + " (testing option)");
  }
  std::string seen(hello.probe.size(), '\0');
  iovec local{seen.data(), seen.size()};
  iovec remote{reinterpret_cast<void*>(hello.probe_addr), hello.probe.size()};
  ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
  if (n < 0) {
    return FailedPreconditionError(
        "same-host transport: engine " + self + " cannot reach the memory of " + who +
        " (process_vm_readv: " + ErrnoString(errno) +
        "); it needs ptrace access to that process: the same user with Yama ptrace_scope 0, or "
        "CAP_SYS_PTRACE");
  }
  if (static_cast<size_t>(n) != seen.size() || seen != hello.probe) {
    return FailedPreconditionError("same-host transport: the memory of " + who +
                                   " does not hold the probe it announced (another process, or "
                                   "another pid namespace?)");
  }
  return OkStatus();
}

// Moves the bytes of `run` (entries that passed validation, in order) between
// this process and `pid` with process_vm_readv (write: the bytes come from
// the initiator) or process_vm_writev (read). Both sides' iovecs describe the
// same bytes in the same order, so each merges its adjacent ranges on its
// own. A short count stops at the first range the kernel could not reach:
// that entry fails, the copy resumes after it.
void CopyRun(int pid, bool write, const std::vector<CopyEntry>& entries,
             const std::vector<uint32_t>& run, const std::string& peer,
             std::vector<wire::EntryFailure>* failures) {
  std::vector<iovec> mine, theirs;
  size_t first = 0;
  while (first < run.size()) {
    mine.clear();
    theirs.clear();
    uint64_t total = 0;
    for (size_t k = first; k < run.size(); ++k) {
      const CopyEntry& e = entries[run[k]];
      stream::AppendRange(&mine, reinterpret_cast<void*>(e.addr), e.length);
      stream::AppendRange(&theirs, reinterpret_cast<void*>(e.peer_addr), e.length);
      total += e.length;
    }
    ssize_t n;
    do {
      n = write
              ? ::process_vm_readv(pid, mine.data(), mine.size(), theirs.data(), theirs.size(), 0)
              : ::process_vm_writev(pid, mine.data(), mine.size(), theirs.data(), theirs.size(), 0);
    } while (n < 0 && errno == EINTR);
    if (n >= 0 && static_cast<uint64_t>(n) == total) return;
    const int err = n < 0 ? errno : EFAULT;
    if (n < 0 && err != EFAULT) {
      // The process is gone (ESRCH) or no longer ours to reach (EPERM): every
      // entry left fails the same way.
      for (size_t k = first; k < run.size(); ++k) {
        failures->push_back({run[k], StatusCode::kUnavailable,
                             std::string(write ? "copying from " : "copying to ") + peer +
                                 " failed: " + ErrnoString(err)});
      }
      return;
    }
    // The entry holding byte `done` failed; the ones before it are complete.
    uint64_t done = n < 0 ? 0 : static_cast<uint64_t>(n);
    size_t k = first;
    while (done >= entries[run[k]].length) done -= entries[run[k]].length, ++k;
    const CopyEntry& bad = entries[run[k]];
    char where[32];
    std::snprintf(where, sizeof(where), "0x%llx", static_cast<unsigned long long>(bad.peer_addr));
    failures->push_back({run[k], StatusCode::kInvalidArgument,
                         std::string(write ? "source" : "destination") + " range at " + where +
                             " (" + std::to_string(bad.length) + " bytes) of " + peer +
                             " could not be copied: " + ErrnoString(EFAULT)});
    first = k + 1;
  }
}

// Copies the staged entries (their bytes at `host` + offset) between this
// process and the initiator, `pid` (from_initiator: into `host`), whose
// addresses `theirs` lists in the same order; in runs of at most kMaxIov.
// Failures (by entry index) into `failures`; returns which failed.
std::vector<bool> CopyStaged(int pid, bool from_initiator,
                             const std::vector<stream::TargetService::StagedEntry>& staged,
                             const std::vector<uint64_t>& theirs, char* host,
                             const std::string& peer, std::vector<wire::EntryFailure>* failures) {
  std::vector<CopyEntry> via(staged.size());
  for (size_t k = 0; k < staged.size(); ++k) {
    via[k] = {reinterpret_cast<uint64_t>(host + staged[k].offset), staged[k].length, theirs[k]};
  }
  std::vector<wire::EntryFailure> failed;
  std::vector<uint32_t> run;
  for (size_t first = 0; first < via.size(); first += kMaxIov) {
    run.clear();
    for (size_t k = first; k < std::min(via.size(), first + kMaxIov); ++k)
      run.push_back(static_cast<uint32_t>(k));
    CopyRun(pid, from_initiator, via, run, peer, &failed);
  }
  std::vector<bool> bad(staged.size(), false);
  for (wire::EntryFailure& f : failed) {
    bad[f.index] = true;
    f.index = staged[f.index].index;
    failures->push_back(std::move(f));
  }
  return bad;
}

// Keeps the entries of `staged` (and their `theirs`) that are not `bad`.
void Keep(const std::vector<bool>& bad, std::vector<stream::TargetService::StagedEntry>* staged,
          std::vector<uint64_t>* theirs) {
  size_t kept = 0;
  for (size_t k = 0; k < staged->size(); ++k) {
    if (bad[k]) continue;
    (*staged)[kept] = (*staged)[k];
    (*theirs)[kept] = (*theirs)[k];
    ++kept;
  }
  staged->resize(kept);
  theirs->resize(kept);
}

}  // namespace

bool CanReadProcess(int pid) {
  // Opening /proc/PID/mem takes the same ptrace access check
  // (PTRACE_MODE_ATTACH) as process_vm_readv, and reads nothing.
  UniqueFd mem(::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC));
  return mem.valid();
}

std::optional<stream::RequestFrame> LendReadHook::OnReply(
    const stream::RequestFrame& r, uint64_t seq, const std::vector<wire::StagedLend>& staged,
    std::vector<wire::EntryFailure>* failures) const {
  // The entries the target lent: those it did not refuse.
  std::vector<bool> refused(r.slices.size(), false);
  for (const auto& f : *failures) {
    if (f.index < refused.size()) refused[f.index] = true;
  }
  std::vector<CopyEntry> entries(r.slices.size());
  std::vector<uint32_t> run;
  run.reserve(r.slices.size());
  for (uint32_t i = 0; i < r.slices.size(); ++i) {
    const Slice& s = r.slices[i];
    entries[i] = {reinterpret_cast<uint64_t>(s.local), s.length, s.remote};
    if (!refused[i]) run.push_back(i);
  }
  // Entries of file regions: the target read them into memory of its own.
  for (const wire::StagedLend& st : staged) entries[st.index].peer_addr = st.addr;
  pollfd exited{pidfd_.get(), POLLIN, 0};
  if (::poll(&exited, 1, 0) != 0) {
    for (uint32_t i : run) {
      failures->push_back(
          {i, StatusCode::kUnavailable,
           "process " + std::to_string(pid_) + " of " + peer_ + " has exited; nothing was copied"});
    }
  } else {
    for (size_t first = 0; first < run.size(); first += kMaxIov) {
      std::vector<uint32_t> part(
          run.begin() + static_cast<std::ptrdiff_t>(first),
          run.begin() + static_cast<std::ptrdiff_t>(std::min(run.size(), first + kMaxIov)));
      // Each copy stores into this engine's memory: not once the batch was
      // cancelled (BatchState::BeginLanding).
      if (r.batch && !r.batch->BeginLanding()) {
        for (uint32_t i : part)
          failures->push_back({i, StatusCode::kCancelled, "the request's batch was cancelled"});
        continue;
      }
      CopyRun(pid_, /*from_peer=*/true, entries, part, peer_, failures);
      if (r.batch) r.batch->EndLanding();
    }
  }
  stream::RequestFrame back;
  back.type = wire::FrameType::kCopyReturn;
  std::string body;
  EncodeCopyReturn(seq, &body);
  wire::FrameHeader h;
  h.version = static_cast<uint8_t>(wire_version_);
  h.type = back.type;
  back.head = wire::BuildFrame(h, body);
  back.deadline = r.deadline;
  return back;
}

void CopyFrameEncoder::Encode(Opcode op, const Slice* slices, size_t n, uint64_t,
                              uint16_t wire_version, stream::RequestFrame* r) const {
  r->type = op == Opcode::kWrite
                ? wire::FrameType::kCopyWrite
                : (lend_ ? wire::FrameType::kCopyLendRead : wire::FrameType::kCopyRead);
  if (op == Opcode::kRead && lend_) r->hook = lend_;
  std::string body;
  body.reserve(8 + CopyEntriesSize(n));
  // kCopyLendRead: the u64 the stream fills in (ReplyHook), then the entries.
  if (r->type == wire::FrameType::kCopyLendRead) body.append(8, '\0');
  std::vector<CopyEntry> entries(n);
  for (size_t k = 0; k < n; ++k) {
    entries[k] = {slices[k].remote, slices[k].length, reinterpret_cast<uint64_t>(slices[k].local)};
  }
  EncodeCopyEntries(entries.data(), entries.size(), &body);
  wire::FrameHeader h;
  h.version = static_cast<uint8_t>(wire_version);
  h.type = r->type;
  r->head = wire::BuildFrame(h, body);
}

Status OpenCopyStream(const CopyOpenerConfig& cfg, stream::Connection& c,
                      const wire::FrameHeader& h, std::string_view body) {
  FERRY_ASSIGN_OR_RETURN(CopyHello hello, DecodeCopyHello(body));
  Status result = stream::CheckHello(cfg.policy, hello.hello);
  const int pid = c.peer_pid();
  if (result.ok() && pid == 0) {
    result = FailedPreconditionError(
        "same-host transport: engine " + cfg.policy.target->peer_id() +
        " cannot tell which process this stream comes from (not a unix socket, or a process of "
        "another pid namespace)");
  }
  UniqueFd pidfd;
  if (result.ok()) {
    // Taken before the probe, so the probe checks the very process the
    // pidfd follows (the pid cannot be recycled while the pidfd is open and
    // the process alive).
    // (syscall: Debian 12's <sys/pidfd.h> lacks C linkage for C++.)
    pidfd = UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd.valid()) {
      result = DescriptorError(
          StatusCode::kFailedPrecondition,
          "same-host transport: cannot follow process " + std::to_string(pid) + " (pidfd_open)",
          errno);
    }
  }
  if (result.ok()) result = ProbePeer(cfg, pid, hello);
  // Request rings offered: taken, and marked so before the answer (the
  // initiator reads the mark once it has the answer). A ring that cannot be
  // taken leaves the stream on its socket.
  std::unique_ptr<RequestRing> ring;
  if (result.ok() && hello.ring && cfg.rings) {
    auto taken = RequestRing::Take(pidfd.get(), *hello.ring, hello.hello.initiator_peer_id);
    if (taken.ok()) {
      ring = *std::move(taken);
      ring->MarkAttached();
    } else {
      FERRY_LOG(kInfo, "same-host stream from " << hello.hello.initiator_peer_id
                                                << " stays on its socket: " << taken.status());
    }
  }
  std::string reply;
  wire::EncodeStatus(result, &reply);
  c.QueueReply(wire::FrameType::kStreamHelloAck, h.seq, std::move(reply));
  if (ring) c.UseChannelAfterReplies(std::move(ring));
  if (result.ok()) {
    c.Serve(std::make_shared<CopyStreamService>(cfg.policy.target, pid, std::move(pidfd),
                                                (h.flags & wire::kHelloFlagLendStaged) != 0),
            hello.hello.wire_version,
            hello.hello.initiator_peer_id + " (same-host stream " +
                std::to_string(hello.hello.stream_index) + ", pid " + std::to_string(pid) + ")");
    stream::ArrangeIdleClose(cfg.policy, h, c);
  }
  return OkStatus();
}

bool CopyStreamService::Accepts(wire::FrameType t) const {
  return t == wire::FrameType::kCopyWrite || t == wire::FrameType::kCopyRead ||
         t == wire::FrameType::kCopyLendRead || t == wire::FrameType::kCopyReturn ||
         t == wire::FrameType::kNotify;
}

Status CopyStreamService::OnFrame(stream::Connection& c, const wire::FrameHeader& h,
                                  std::string_view body) {
  switch (h.type) {
    case wire::FrameType::kCopyWrite:
      return ServeCopy(c, h, body, /*write=*/true);
    case wire::FrameType::kCopyRead:
      return ServeCopy(c, h, body, /*write=*/false);
    case wire::FrameType::kCopyLendRead:
      return ServeCopy(c, h, body, /*write=*/false, /*lend=*/true);
    case wire::FrameType::kCopyReturn:
      return ServeReturn(c, h, body);
    case wire::FrameType::kNotify:
      return ServeNotify(c, h, body);
    default:
      return DataLossError("unexpected frame on a same-host stream from " + c.peer_name());
  }
}

Status CopyStreamService::ServeCopy(stream::Connection& c, const wire::FrameHeader& h,
                                    std::string_view body, bool write, bool lend) {
  std::vector<CopyEntry> entries;
  if (lend) {
    FERRY_ASSIGN_OR_RETURN(CopyLend l, DecodeCopyLend(body));
    ReleaseLent(l.returned);
    entries = std::move(l.entries);
  } else {
    FERRY_ASSIGN_OR_RETURN(entries, DecodeCopyEntries(body));
  }
  // The process that said hello must still be the one behind the pid: once
  // it has exited (its socket may live on in a child), nothing is copied.
  pollfd exited{pidfd_.get(), POLLIN, 0};
  if (::poll(&exited, 1, 0) != 0) {
    return UnavailableError("process " + std::to_string(pid_) + " of " + c.peer_name() +
                            " has exited; closing its same-host stream");
  }
  wire::Reply rep;
  std::vector<RegionPin> pins;
  std::vector<uint32_t> run;
  run.reserve(entries.size());
  std::vector<StagedEntry> staged;  // file regions: through a buffer of this process
  size_t staged_bytes = 0;
  const Region* last = nullptr;
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const CopyEntry& e = entries[i];
    if (!PinEntry(e.addr, e.length, i, &last, &pins, &rep.failures, Staged::kFiles).ok()) continue;
    if (last->kind.type() == MemoryKind::Type::kFile) {
      if (lend && !lend_staged_) {
        rep.failures.push_back(
            {i, StatusCode::kFailedPrecondition,
             "peer " + target().peer_id() + " refused: remote range " +
                 FormatRange(e.addr, e.length) + " is in a file region, which " + c.peer_name() +
                 " cannot read over a same-host stream (its build does not take staged lends); "
                 "use tcp"});
        continue;
      }
      const size_t at = StagedOffset(staged_bytes, e.length);
      staged.push_back({i, e.addr, last, at, e.length});
      staged_bytes = at + e.length;
      continue;
    }
    if (lend) continue;           // the initiator copies
    if (run.size() == kMaxIov) {  // an entry needs at most one iovec on each side
      CopyRun(pid_, write, entries, run, c.peer_name(), &rep.failures);
      run.clear();
    }
    run.push_back(i);
  }
  if (!lend) CopyRun(pid_, write, entries, run, c.peer_name(), &rep.failures);
  RefuseOversizedStaging(&staged, &staged_bytes, &rep.failures);
  // Bounded: an initiator returns each lend as soon as it has copied.
  constexpr size_t kMaxLent = 65536;
  constexpr size_t kMaxLentStagedBytes = size_t{1} << 30;
  if (lend && (lent_.size() >= kMaxLent || lent_staged_bytes_ > kMaxLentStagedBytes)) {
    return ResourceExhaustedError(c.peer_name() + " holds " + std::to_string(lent_.size()) +
                                  " lent reads (" + std::to_string(lent_staged_bytes_) +
                                  " bytes of them staged from files) it never returned; "
                                  "closing its same-host stream");
  }
  auto held = std::make_shared<Held>();
  held->pins = std::move(pins);
  if (staged.empty()) {
    if (lend) lent_.push_back({h.seq, std::move(held), 0});
    held.reset();  // the bytes have moved (or are lent): release what this frame holds
    // Validation and copy failures were collected separately: the initiator
    // expects them in entry order.
    SortByEntry(&rep.failures);
    std::string reply;
    wire::EncodeReply(rep, &reply);
    c.QueueReply(wire::FrameType::kAck, h.seq, std::move(reply));
    return OkStatus();
  }
  ServeFileEntries(c, h.seq, write, lend, entries, std::move(staged), staged_bytes,
                   std::move(rep.failures), std::move(held));
  return OkStatus();
}

void CopyStreamService::ServeFileEntries(stream::Connection& c, uint64_t seq, bool write, bool lend,
                                         const std::vector<CopyEntry>& entries,
                                         std::vector<StagedEntry> staged, size_t staged_bytes,
                                         std::vector<wire::EntryFailure> failures,
                                         std::shared_ptr<Held> held) {
  held->host = StagingBytes(staged_bytes);
  char* const host = held->host.get();
  const int pid = pid_;
  const std::string peer = c.peer_name();
  std::vector<uint64_t> theirs;  // each staged entry's initiator address
  for (const StagedEntry& e : staged) theirs.push_back(entries[e.index].peer_addr);
  if (write) {
    // The initiator's bytes into the buffer now; the files then get those
    // that arrived.
    const std::vector<bool> bad =
        CopyStaged(pid, /*from_initiator=*/true, staged, theirs, host, peer, &failures);
    Keep(bad, &staged, &theirs);
  }
  if (lend) {
    // The buffer stays with the lend until the initiator has copied it.
    lent_staged_bytes_ += staged_bytes;
    lent_.push_back({seq, held, staged_bytes});
  }
  // The file I/O goes on while later frames are served; the reply waits in
  // its place (Connection::ReserveReply), holding the frame's regions and
  // buffer. Nothing below uses this service: the stream may close first.
  StartFileIo(
      staged, host, write,
      [place = c.ReserveReply(staged_bytes), seq, write, lend, pid, peer, staged, theirs, held,
       failures = std::move(failures)](std::vector<wire::EntryFailure> io_failed) mutable {
        std::vector<bool> bad(staged.size(), false);
        for (const wire::EntryFailure& f : io_failed) {
          for (size_t k = 0; k < staged.size(); ++k) bad[k] = bad[k] || staged[k].index == f.index;
        }
        failures.insert(failures.end(), io_failed.begin(), io_failed.end());
        std::vector<wire::StagedLend> lent;
        if (!write) {
          Keep(bad, &staged, &theirs);
          if (lend) {
            // The initiator copies them out of the buffer (kLendAck).
            for (const StagedEntry& e : staged)
              lent.push_back({e.index, reinterpret_cast<uint64_t>(held->host.get() + e.offset)});
          } else {
            // An initiator that does not lend (an older build): copied into it.
            CopyStaged(pid, /*from_initiator=*/false, staged, theirs, held->host.get(), peer,
                       &failures);
          }
        }
        SortByEntry(&failures);
        wire::Reply rep;
        rep.failures = std::move(failures);
        std::string body;
        if (!lent.empty()) {
          wire::EncodeLendAck({std::move(rep), std::move(lent)}, &body);
          stream::Connection::FinishReply(place, wire::FrameType::kLendAck, seq, std::move(body));
        } else {
          wire::EncodeReply(rep, &body);
          stream::Connection::FinishReply(place, wire::FrameType::kAck, seq, std::move(body));
        }
      });
}

void CopyStreamService::ReleaseLent(uint64_t up_to) {
  // Returns come in lending order; anything up to `up_to` was copied (or
  // given up on) by the initiator.
  while (!lent_.empty() && lent_.front().seq <= up_to) {
    lent_staged_bytes_ -= lent_.front().staged_bytes;
    lent_.pop_front();
  }
}

Status CopyStreamService::ServeReturn(stream::Connection& c, const wire::FrameHeader& h,
                                      std::string_view body) {
  FERRY_ASSIGN_OR_RETURN(uint64_t seq, DecodeCopyReturn(body));
  ReleaseLent(seq);
  std::string reply;
  wire::EncodeReply({}, &reply);
  c.QueueReply(wire::FrameType::kAck, h.seq, std::move(reply));
  return OkStatus();
}

}  // namespace ferry::internal::shm
