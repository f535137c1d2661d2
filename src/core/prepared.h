// Prepared descriptor lists and the entries of prepared transfers
// (Engine::PrepareLocalList, PrepareRemoteList, MakeTransfer).
//
// A list keeps its rows as given (a strided row stays one row) plus, per
// row, what validation found: the local memory kind, or the index of the
// peer region (in the descriptor the list was checked against). Entry i is
// found from the rows directly, or with a binary search over the rows'
// first entries when some row is strided.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/memory_registry.h"
#include "base/transport.h"
#include "common/memory_kind.h"
#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::internal {

class DescList {
 public:
  struct Entry {
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t tag = 0;  // local: index into kinds() (one per local region used); remote: the peer
                       // region's index
  };

  // Checks every entry against this engine's registered memory.
  static StatusOr<std::shared_ptr<const DescList>> Local(std::span<const DescRow> rows,
                                                         const MemoryRegistry& registry);
  // Checks every entry against the peer's descriptor (its exported regions).
  static StatusOr<std::shared_ptr<const DescList>> Remote(std::span<const DescRow> rows,
                                                          std::shared_ptr<const PeerInfo> peer);

  bool remote() const { return peer_ != nullptr; }
  size_t entries() const { return entries_; }
  Entry At(size_t i) const;
  // Remote lists: the descriptor (and so the peer instance) checked against.
  const std::shared_ptr<const PeerInfo>& peer() const { return peer_; }
  // Local lists: the memory kind of each local region used, by tag.
  const std::vector<MemoryKind>& kinds() const { return kinds_; }
  // Local lists: whether every region the entries lie in is still
  // registered (checked again only once some region was unregistered since
  // the list was made). kFailedPrecondition naming the first that is not.
  Status StillRegistered(const MemoryRegistry& registry) const;

 private:
  // Expands the rows (their strides) and checks each: `find(addr, length)`
  // returns the tag or a Status naming the problem.
  template <class Find>
  static StatusOr<std::shared_ptr<DescList>> Build(std::span<const DescRow> rows, Find find);
  template <class Find>
  Status BuildPlain(std::span<const DescRow> rows, Find& find);
  template <class Find>
  Status AddRow(size_t i, const DescRow& r, Find& find);

  // A list of plain rows only (the common case: 1 M rows should cost about
  // a copy of them) keeps 20 bytes per row, written once, in `plain_` and
  // `plain_tags_`; any other list its rows in `rows_`, `tags_` and
  // `first_entry_` (each row's first entry, for the binary search).
  struct Span {
    uint64_t addr;
    uint64_t length;
  };
  std::unique_ptr<Span[]> plain_;
  std::unique_ptr<uint32_t[]> plain_tags_;
  std::vector<DescRow> rows_;
  std::vector<uint32_t> tags_;         // per row
  std::vector<uint64_t> first_entry_;  // per row
  size_t entries_ = 0;
  std::shared_ptr<const PeerInfo> peer_;
  std::vector<MemoryKind> kinds_;
  // Local lists: the distinct regions used ((addr, length), by tag), and the
  // registry's unregistration count when they were found.
  std::vector<std::pair<uint64_t, uint64_t>> regions_;
  uint64_t unregistrations_ = 0;
};

// One (merged) pair of a prepared transfer.
struct PreparedEntry {
  char* local = nullptr;
  uint64_t remote = 0;
  uint64_t length = 0;
  uint32_t region = kNoRegion;  // the peer region holding it
  uint8_t route = 0;            // index into PreparedPairs::kinds
};

struct PreparedPairs {
  std::vector<PreparedEntry> entries;
  // Distinct (local kind, remote kind) of the entries, by PreparedEntry::route.
  std::vector<std::pair<MemoryKind, MemoryKind>> kinds;
  uint64_t bytes = 0;
};

// Pairs local entry local_indices[k] with remote entry remote_indices[k],
// checking counts, ranges and lengths, and merges pairs that continue the
// previous one on both sides (same region and kinds).
StatusOr<PreparedPairs> PairEntries(const DescList& local, std::span<const uint32_t> local_indices,
                                    const DescList& remote,
                                    std::span<const uint32_t> remote_indices);

}  // namespace ferry::internal
