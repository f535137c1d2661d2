#include "core/prepared.h"

#include <algorithm>

#include "common/net.h"
#include "ferry/limits.h"

namespace ferry::internal {

namespace {

std::string RowName(size_t row, const DescRow& r, uint64_t k) {
  std::string s = "row " + std::to_string(row);
  if (r.count > 1) s += " (entry " + std::to_string(k) + " of its " + std::to_string(r.count) + ")";
  return s;
}

}  // namespace

namespace {

// A row's own checks: lengths, counts, strides and that no entry wraps
// around the address space (`total`: the entries of the rows before it).
Status CheckRow(const DescRow& r, uint64_t total) {
  if (r.length == 0) return InvalidArgumentError("length is zero");
  if (r.count == 0) return InvalidArgumentError("count is zero");
  if (r.count > 1 && r.stride == 0) {
    return InvalidArgumentError("stride is zero with count " + std::to_string(r.count));
  }
  if (r.count > kMaxDescListEntries - total) {
    return InvalidArgumentError("the list has more than " + std::to_string(kMaxDescListEntries) +
                                " entries");
  }
  // The last entry's end must not wrap: addr + (count-1)*stride + length.
  const uint64_t span_minus_len = (r.count - 1) * r.stride;
  if ((r.count > 1 && span_minus_len / (r.count - 1) != r.stride) ||
      r.addr + span_minus_len < r.addr ||
      r.addr + span_minus_len + r.length < r.addr + span_minus_len) {
    return InvalidArgumentError(FormatRange(r.addr, r.length) + " with stride " +
                                std::to_string(r.stride) + " x " + std::to_string(r.count) +
                                " wraps around the address space");
  }
  return OkStatus();
}

}  // namespace

template <class Find>
StatusOr<std::shared_ptr<DescList>> DescList::Build(std::span<const DescRow> rows, Find find) {
  if (rows.empty()) return InvalidArgumentError("empty descriptor list");
  auto list = std::make_shared<DescList>();
  if (rows.size() <= kMaxDescListEntries &&
      std::all_of(rows.begin(), rows.end(), [](const DescRow& r) { return r.count == 1; })) {
    FERRY_RETURN_IF_ERROR(list->BuildPlain(rows, find));
    return list;
  }
  list->rows_.reserve(rows.size());
  list->tags_.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    Status s = CheckRow(rows[i], list->entries_);
    if (!s.ok()) return s.WithPrefix("row " + std::to_string(i));
    FERRY_RETURN_IF_ERROR(list->AddRow(i, rows[i], find));
    list->entries_ += rows[i].count;
  }
  list->first_entry_.reserve(list->rows_.size());
  uint64_t next = 0;
  for (const DescRow& r : list->rows_) {
    list->first_entry_.push_back(next);
    next += r.count;
  }
  return list;
}

// Plain rows: one entry each, written straight into their place.
template <class Find>
Status DescList::BuildPlain(std::span<const DescRow> rows, Find& find) {
  plain_ = std::make_unique_for_overwrite<Span[]>(rows.size());
  plain_tags_ = std::make_unique_for_overwrite<uint32_t[]>(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const DescRow& r = rows[i];
    if (r.length == 0) return InvalidArgumentError("row " + std::to_string(i) + ": length is zero");
    if (r.addr + r.length < r.addr) {
      return InvalidArgumentError("row " + std::to_string(i) + ": " +
                                  FormatRange(r.addr, r.length) +
                                  " wraps around the address space");
    }
    auto tag = find(r.addr, r.length);
    if (!tag.ok()) return tag.status().WithPrefix("row " + std::to_string(i));
    plain_[i] = {r.addr, r.length};
    plain_tags_[i] = *tag;
  }
  entries_ = rows.size();
  return OkStatus();
}

// A strided row whose first and last entries share a region lies in it
// whole (a region is contiguous); otherwise its entries are checked, and
// kept, one by one.
template <class Find>
Status DescList::AddRow(size_t i, const DescRow& r, Find& find) {
  auto first = find(r.addr, r.length);
  if (!first.ok()) return first.status().WithPrefix(RowName(i, r, 0));
  if (r.count == 1) {
    rows_.push_back(r);
    tags_.push_back(*first);
    return OkStatus();
  }
  auto whole = find(r.addr, (r.count - 1) * r.stride + r.length);
  if (whole.ok()) {
    rows_.push_back(r);
    tags_.push_back(*whole);
    return OkStatus();
  }
  for (uint64_t k = 0; k < r.count; ++k) {
    const uint64_t a = r.addr + k * r.stride;
    auto tag = find(a, r.length);
    if (!tag.ok()) return tag.status().WithPrefix(RowName(i, r, k));
    rows_.push_back({a, r.length, 0, 1});
    tags_.push_back(*tag);
  }
  return OkStatus();
}

StatusOr<std::shared_ptr<const DescList>> DescList::Local(std::span<const DescRow> rows,
                                                          const MemoryRegistry& registry) {
  std::vector<MemoryKind> kinds;
  std::vector<std::pair<uint64_t, uint64_t>> regions;
  const uint64_t unregistrations = registry.unregistrations();
  MemoryRegistry::Found region;
  region.length = 0;
  uint32_t region_tag = 0;
  auto find = [&](uint64_t addr, uint64_t length) -> StatusOr<uint32_t> {
    if (addr >= region.addr && length <= region.length &&
        addr - region.addr <= region.length - length) {
      return region_tag;
    }
    Status s = registry.Check(addr, length, "local range", &region);
    if (!s.ok()) {
      region.length = 0;
      return NotFoundError(std::string(s.message()));
    }
    auto it = std::find(regions.begin(), regions.end(), std::make_pair(region.addr, region.length));
    if (it == regions.end()) {
      it = regions.insert(regions.end(), {region.addr, region.length});
      kinds.push_back(region.kind);
    }
    region_tag = static_cast<uint32_t>(it - regions.begin());
    return region_tag;
  };
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<DescList> list, Build(rows, find));
  list->kinds_ = std::move(kinds);
  list->regions_ = std::move(regions);
  list->unregistrations_ = unregistrations;
  return std::shared_ptr<const DescList>(std::move(list));
}

StatusOr<std::shared_ptr<const DescList>> DescList::Remote(std::span<const DescRow> rows,
                                                           std::shared_ptr<const PeerInfo> peer) {
  const auto& regions = peer->desc().regions;
  uint32_t last = kNoRegion;
  auto find = [&](uint64_t addr, uint64_t length) -> StatusOr<uint32_t> {
    if (last != kNoRegion) {
      const wire::RegionEntry& r = regions[last];
      if (addr >= r.addr && length <= r.length && addr - r.addr <= r.length - length) return last;
    }
    const uint32_t found = peer->FindRegion(addr, length);
    if (found == kNoRegion) {
      return NotFoundError(
          "remote range " + FormatRange(addr, length) + " is outside every region " +
          peer->Label() + " registered (" + std::to_string(regions.size()) +
          " regions, as of its last handshake or imported metadata; QuerySegment or "
          "ImportMetadata fetches its current ones)");
    }
    last = found;
    return found;
  };
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<DescList> list, Build(rows, find));
  list->peer_ = std::move(peer);
  return std::shared_ptr<const DescList>(std::move(list));
}

DescList::Entry DescList::At(size_t i) const {
  if (plain_) return {plain_[i].addr, plain_[i].length, plain_tags_[i]};
  const size_t row =
      static_cast<size_t>(std::upper_bound(first_entry_.begin(), first_entry_.end(), uint64_t{i}) -
                          first_entry_.begin()) -
      1;
  const DescRow& r = rows_[row];
  return {r.addr + (i - first_entry_[row]) * r.stride, r.length, tags_[row]};
}

Status DescList::StillRegistered(const MemoryRegistry& registry) const {
  if (registry.unregistrations() == unregistrations_) return OkStatus();
  for (const auto& [addr, length] : regions_) {
    Status s = registry.Check(addr, length, "local region of a prepared list");
    if (!s.ok()) {
      return FailedPreconditionError(
          "the local region " + FormatRange(addr, length) +
          " of a prepared list was unregistered (or changed); prepare the list again");
    }
  }
  return OkStatus();
}

StatusOr<PreparedPairs> PairEntries(const DescList& local, std::span<const uint32_t> local_indices,
                                    const DescList& remote,
                                    std::span<const uint32_t> remote_indices) {
  if (local.remote())
    return InvalidArgumentError("the local list of a transfer is a remote (peer's) list");
  if (!remote.remote())
    return InvalidArgumentError("the remote list of a transfer is a local list");
  if (local_indices.size() != remote_indices.size()) {
    return InvalidArgumentError(std::to_string(local_indices.size()) + " local indices but " +
                                std::to_string(remote_indices.size()) + " remote indices");
  }
  if (local_indices.empty()) return InvalidArgumentError("a transfer of no entries");
  PreparedPairs out;
  out.entries.reserve(local_indices.size());
  uint32_t last_local_tag = 0xffffffffu, last_region = kNoRegion;
  uint8_t last_route = 0;
  const PeerInfo& peer = *remote.peer();
  for (size_t k = 0; k < local_indices.size(); ++k) {
    const uint32_t li = local_indices[k], ri = remote_indices[k];
    if (li >= local.entries()) {
      return InvalidArgumentError("pair " + std::to_string(k) + ": local index " +
                                  std::to_string(li) + " is out of range (the local list has " +
                                  std::to_string(local.entries()) + " entries)");
    }
    if (ri >= remote.entries()) {
      return InvalidArgumentError("pair " + std::to_string(k) + ": remote index " +
                                  std::to_string(ri) + " is out of range (the remote list has " +
                                  std::to_string(remote.entries()) + " entries)");
    }
    const DescList::Entry l = local.At(li), r = remote.At(ri);
    if (l.length != r.length) {
      return InvalidArgumentError("pair " + std::to_string(k) + ": local entry " +
                                  std::to_string(li) + " is " + std::to_string(l.length) +
                                  " bytes, remote entry " + std::to_string(ri) + " is " +
                                  std::to_string(r.length));
    }
    if (l.tag != last_local_tag || r.tag != last_region) {
      const std::pair<MemoryKind, MemoryKind> kinds{local.kinds()[l.tag], peer.KindOf(r.tag)};
      auto it = std::find(out.kinds.begin(), out.kinds.end(), kinds);
      if (it == out.kinds.end()) {
        if (out.kinds.size() == 255)
          return InvalidArgumentError("a transfer between more than 255 pairs of memory kinds");
        it = out.kinds.insert(out.kinds.end(), kinds);
      }
      last_route = static_cast<uint8_t>(it - out.kinds.begin());
    }
    out.bytes += l.length;
    if (!out.entries.empty()) {
      PreparedEntry& prev = out.entries.back();
      if (l.tag == last_local_tag && r.tag == prev.region &&
          prev.local + prev.length == reinterpret_cast<char*>(l.addr) &&
          prev.remote + prev.length == r.addr) {
        prev.length += l.length;
        continue;
      }
    }
    last_local_tag = l.tag;
    last_region = r.tag;
    out.entries.push_back({reinterpret_cast<char*>(l.addr), r.addr, l.length, r.tag, last_route});
  }
  return out;
}

}  // namespace ferry::internal
