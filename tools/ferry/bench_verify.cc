// --verify: every byte of every block checked against a pattern. Writes: the
// target's buffer is poisoned before and checked after (over the control
// channel); reads: the target's buffer holds the kReadSeed pattern and the
// initiator checks what arrived.
#include <algorithm>
#include <cstdio>

#include "bench_phase.h"
#include "pattern.h"

namespace ferry::bench {

void Phase::Prepare(int t, Local& L, size_t i0, size_t i1, uint64_t seed) {
  const auto& entries = w_.batches[t];
  std::vector<Range> remote_writes;
  for (size_t i = i0; i < i1; ++i) {
    const Entry& e = entries[i];
    uint8_t* p = s_.local->data() + e.local_off;
    if (e.opcode == Opcode::kWrite) {
      FillPattern(p, e.remote_off, e.length, seed);
      remote_writes.push_back({e.remote_off, e.length});
    } else {
      FillPattern(p, e.remote_off, e.length, kReadSeed, /*complement=*/true);
    }
  }
  if (!remote_writes.empty()) L.control->Poison(seed, remote_writes);
}

void Phase::Check(int t, Local& L, size_t i0, size_t i1, uint64_t seed) {
  const auto& entries = w_.batches[t];
  if (o_.inject_mismatch && t == 0 && L.iteration == 1 && i0 == 0) InjectMismatch(L, seed);
  std::vector<Range> remote_writes;
  for (size_t i = i0; i < i1; ++i) {
    const Entry& e = entries[i];
    L.verified += e.length;
    if (e.opcode == Opcode::kWrite) {
      remote_writes.push_back({e.remote_off, e.length});
      continue;
    }
    uint64_t first = 0;
    uint64_t bad =
        CheckPattern(s_.local->data() + e.local_off, e.remote_off, e.length, kReadSeed, &first);
    if (bad > 0) {
      ReportMismatch(t, L, "read", i, bad, first);
      L.mismatches += bad;
      ++L.bad_blocks;
    }
  }
  if (!remote_writes.empty()) CheckWrites(t, L, i0, remote_writes, seed);
}

// --inject-mismatch: damages 16 bytes of thread 0's entry 0 where it landed
// (or 1 byte of a read).
void Phase::InjectMismatch(Local& L, uint64_t seed) {
  const Entry& e = w_.batches[0][0];
  if (e.opcode == Opcode::kWrite) {
    L.control->Poison(seed, {{e.remote_off, std::min<uint64_t>(16, e.length)}});
  } else {
    s_.local->data()[e.local_off] ^= 0x5a;
  }
}

// The target checks the writes' ranges; where bytes differ, each range is
// asked for again to count the blocks.
void Phase::CheckWrites(int t, Local& L, size_t i0, const std::vector<Range>& writes,
                        uint64_t seed) {
  uint64_t first = 0;
  uint64_t bad = L.control->Check(seed, writes, &first);
  if (bad == 0) return;
  uint64_t blocks = 0;
  for (const Range& r : writes) {
    uint64_t f = 0;
    if (L.control->Check(seed, {r}, &f) > 0) ++blocks;
  }
  ReportMismatch(t, L, "write", i0, bad, first);
  L.mismatches += bad;
  L.bad_blocks += blocks;
}

void Phase::ReportMismatch(int t, const Local& L, const char* dir, size_t index, uint64_t bad,
                           uint64_t first) {
  std::lock_guard<std::mutex> lock(mu_);
  if (++reports_ > 10) return;
  std::fprintf(stderr,
               "ferry bench: verify: thread %d batch %llu: %llu bytes differ (%s, from entry "
               "%zu); first bad byte at target offset %llu\n",
               t, static_cast<unsigned long long>(L.iteration),
               static_cast<unsigned long long>(bad), dir, index,
               static_cast<unsigned long long>(first));
}

}  // namespace ferry::bench
