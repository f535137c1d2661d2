#include "transport/shm/copy_frames.h"

#include "wire/byte_io.h"

namespace ferry::internal::shm {

void EncodeCopyEntries(const CopyEntry* entries, size_t count, std::string* out) {
  out->reserve(out->size() + CopyEntriesSize(count));
  wire::ByteWriter w(out);
  w.U32(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) {
    w.U64(entries[i].addr);
    w.U32(entries[i].length);
    w.U64(entries[i].peer_addr);
  }
}

StatusOr<std::vector<CopyEntry>> DecodeCopyEntries(std::string_view body) {
  wire::ByteReader r(body);
  uint32_t n;
  if (!r.U32(&n)) return DataLossError("malformed copy entry list from peer");
  if (n == 0 || n > wire::kMaxEntriesPerFrame || r.remaining() != static_cast<size_t>(n) * 20) {
    return DataLossError("malformed copy entry list (count " + std::to_string(n) + ") from peer");
  }
  std::vector<CopyEntry> out(n);
  for (auto& e : out) {
    r.U64(&e.addr);
    r.U32(&e.length);
    r.U64(&e.peer_addr);
  }
  return out;
}

StatusOr<CopyLend> DecodeCopyLend(std::string_view body) {
  CopyLend out;
  wire::ByteReader r(body);
  if (!r.U64(&out.returned))
    return DataLossError("malformed lent read (" + std::to_string(body.size()) +
                         " bytes) from peer");
  FERRY_ASSIGN_OR_RETURN(out.entries, DecodeCopyEntries(body.substr(8)));
  return out;
}

void EncodeCopyReturn(uint64_t lend_seq, std::string* out) {
  wire::ByteWriter w(out);
  w.U64(lend_seq);
}

StatusOr<uint64_t> DecodeCopyReturn(std::string_view body) {
  wire::ByteReader r(body);
  uint64_t seq = 0;
  if (!r.U64(&seq) || r.remaining() != 0) {
    return DataLossError("malformed copy return (" + std::to_string(body.size()) +
                         " bytes) from peer");
  }
  return seq;
}

void EncodeCopyHello(const CopyHello& h, std::string* out) {
  wire::EncodeStreamHello(h.hello, out);
  wire::ByteWriter w(out);
  w.U64(h.probe_addr);
  w.Str(std::string_view(h.probe).substr(0, kMaxProbe));
  if (h.ring) {
    w.U32(h.ring->memfd);
    w.U32(h.ring->initiator_wake);
    w.U32(h.ring->target_wake);
    w.U32(h.ring->capacity);
  }
}

StatusOr<CopyHello> DecodeCopyHello(std::string_view body) {
  wire::ByteReader r(body);
  CopyHello h;
  if (!r.U64(&h.hello.initiator_instance) || !r.U64(&h.hello.target_instance) ||
      !r.U16(&h.hello.wire_version) || !r.U16(&h.hello.stream_index) ||
      !r.Str(&h.hello.initiator_peer_id) || !r.U64(&h.probe_addr) || !r.Str(&h.probe) ||
      h.probe.size() > kMaxProbe) {
    return DataLossError("malformed same-host stream hello from peer");
  }
  if (r.remaining() != 0) {
    HelloRing ring;
    if (!r.U32(&ring.memfd) || !r.U32(&ring.initiator_wake) || !r.U32(&ring.target_wake) ||
        !r.U32(&ring.capacity) || r.remaining() != 0) {
      return DataLossError("malformed same-host stream hello from peer (" +
                           std::to_string(body.size()) + " bytes)");
    }
    h.ring = ring;
  }
  return h;
}

}  // namespace ferry::internal::shm
