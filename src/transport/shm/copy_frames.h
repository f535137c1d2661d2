// The same-host transport's own frame bodies (docs/wire-format.md,
// "Same-host streams"): the stream hello that carries a memory probe, and the
// entry lists that carry the initiator's addresses instead of payload. Frame
// types kCopyHello, kCopyWrite and kCopyRead (wire/frame.h). The decoders
// read bytes from a peer and are fuzzed (tests/fuzz/wire_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"
#include "wire/frame.h"

namespace ferry::internal::shm {

// One range of a kCopyWrite / kCopyRead body: the target's range and where
// the bytes are (write) or go (read) in the initiator's address space.
struct CopyEntry {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint64_t peer_addr = 0;
};

// kCopyWrite / kCopyRead body: u32 count, then count × {u64 addr, u32
// length, u64 peer_addr}.
void EncodeCopyEntries(const CopyEntry* entries, size_t count, std::string* out);
StatusOr<std::vector<CopyEntry>> DecodeCopyEntries(std::string_view body);
inline size_t CopyEntriesSize(size_t count) { return 4 + count * 20; }

// kCopyLendRead body: u64 returned (every lend of this stream with a sequence
// number up to it may be released; 0: none), then a CopyEntryList.
struct CopyLend {
  uint64_t returned = 0;
  std::vector<CopyEntry> entries;
};
StatusOr<CopyLend> DecodeCopyLend(std::string_view body);

// kCopyReturn body: u64 seq, the sequence number of the kCopyLendRead frame
// whose ranges the initiator has copied (or given up on).
void EncodeCopyReturn(uint64_t lend_seq, std::string* out);
StatusOr<uint64_t> DecodeCopyReturn(std::string_view body);

// The request rings a hello offers (request_ring.h): descriptors of the
// initiator's process, and the capacity of each ring.
struct HelloRing {
  uint32_t memfd = 0;
  uint32_t initiator_wake = 0;
  uint32_t target_wake = 0;
  uint32_t capacity = 0;
};

// kCopyHello body: a kStreamHello body, then u64 probe_addr and str probe:
// bytes the target must find at probe_addr in the initiator's memory,
// proving it can reach that process before any transfer relies on it; then,
// optionally (to a peer with the feature "shm-rings"), u32 memfd, u32
// initiator_wake, u32 target_wake, u32 capacity: request rings offered.
struct CopyHello {
  wire::StreamHello hello;
  uint64_t probe_addr = 0;
  std::string probe;  // at most kMaxProbe bytes
  std::optional<HelloRing> ring;
};
inline constexpr size_t kMaxProbe = 64;
void EncodeCopyHello(const CopyHello& h, std::string* out);
StatusOr<CopyHello> DecodeCopyHello(std::string_view body);

}  // namespace ferry::internal::shm
