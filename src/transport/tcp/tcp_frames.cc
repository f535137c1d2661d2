#include "transport/tcp/tcp_frames.h"

#include <algorithm>

namespace ferry::internal::tcp {

void TcpFrameEncoder::Encode(Opcode op, const Slice* slices, size_t n, uint64_t bytes,
                             uint16_t wire_version, stream::RequestFrame* r) const {
  r->type = op == Opcode::kWrite ? wire::FrameType::kWrite : wire::FrameType::kRead;
  std::string body;
  body.reserve(wire::EntriesSize(n));
  std::vector<wire::Entry> entries(n);
  for (size_t k = 0; k < n; ++k) entries[k] = {slices[k].remote, slices[k].length};
  wire::EncodeEntries(entries.data(), entries.size(), &body);
  wire::FrameHeader h;
  h.version = static_cast<uint8_t>(wire_version);
  h.type = r->type;
  if (op == Opcode::kWrite) {
    h.payload_len = static_cast<uint32_t>(bytes);
    r->payload.reserve(n);
    for (size_t k = 0; k < n; ++k)
      stream::AppendRange(&r->payload, slices[k].local, slices[k].length);
  }
  r->head = wire::BuildFrame(h, body);
}

bool TcpStreamService::Accepts(wire::FrameType t) const {
  return t == wire::FrameType::kWrite || t == wire::FrameType::kRead ||
         t == wire::FrameType::kNotify;
}

Status TcpStreamService::OnFrame(stream::Connection& c, const wire::FrameHeader& h,
                                 std::string_view body) {
  switch (h.type) {
    case wire::FrameType::kWrite:
      return ServeWrite(c, h, body);
    case wire::FrameType::kRead:
      return ServeRead(c, h, body);
    case wire::FrameType::kNotify:
      return ServeNotify(c, h, body);
    default:
      return DataLossError("unexpected frame on a tcp stream from " + c.peer_name());
  }
}

Status TcpStreamService::ServeWrite(stream::Connection& c, const wire::FrameHeader& h,
                                    std::string_view body) {
  FERRY_ASSIGN_OR_RETURN(std::vector<wire::Entry> entries, wire::DecodeEntries(body));
  uint64_t total = 0;
  for (const auto& e : entries) total += e.length;
  if (total != h.payload_len) {
    return DataLossError("write frame from " + c.peer_name() + " announces " +
                         std::to_string(h.payload_len) +
                         " payload bytes but its entries add up to " + std::to_string(total));
  }
  failures_.clear();
  pins_.clear();
  staged_.clear();
  stream::FrameReader& reader = c.reader();
  reader.ExpectPayload();
  // Pinned first (staged entries counted), then placed: the host buffer of
  // the staged entries is sized once, before any destination points into it.
  std::vector<int8_t> placed(entries.size(), 0);  // 0 failed, 1 host, 2 staged
  size_t staged_bytes = 0;
  const Region* last = nullptr;  // entries of a frame mostly share a region
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (!PinEntry(e.addr, e.length, i, &last, &pins_, &failures_, Staged::kFilesAndGpu).ok())
      continue;
    if (last->kind.cpu_accessible()) {
      placed[i] = 1;
      continue;
    }
    const size_t at = StagedOffset(staged_bytes, e.length);
    staged_.push_back({i, e.addr, last, at, e.length});
    staged_bytes = at + e.length;
    placed[i] = 2;
  }
  // (From the stream's pool: the last frame's buffer, once it is let go.)
  if (!staged_.empty()) staged_bytes_ = BufferFor(staged_, staged_bytes);
  size_t g = 0;
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (placed[i] == 0) {
      reader.AddDiscard(e.length);  // drain the bytes; nothing is written
    } else if (placed[i] == 1) {
      reader.AddDestination(reinterpret_cast<char*>(e.addr), e.length);
    } else {
      reader.AddDestination(staged_bytes_.get() + staged_[g++].offset, e.length);
    }
  }
  return OkStatus();
}

cuda::SyncCopies& TcpStreamService::Copies() {
  if (!copies_) copies_ = std::make_unique<cuda::SyncCopies>(*target().cuda_driver());
  return *copies_;
}

std::shared_ptr<char> TcpStreamService::BufferFor(const std::vector<StagedEntry>& staged,
                                                  size_t n) const {
  const bool gpu = std::any_of(staged.begin(), staged.end(), [](const StagedEntry& e) {
    return e.region->kind.type() == MemoryKind::Type::kCuda;
  });
  return gpu && pinned_gpu_staging_ ? GpuStagingBytes(n) : StagingBytes(n);
}

void TcpStreamService::CopyGpu(const std::vector<StagedEntry>& staged, char* host, bool to_device,
                               std::vector<wire::EntryFailure>* failures) {
  auto failed = [&](const StagedEntry& e, Status s) {
    s = s.WithPrefix("peer " + target().peer_id() + ": copying the bytes of " +
                     FormatRange(e.addr, e.length) + (to_device ? " to" : " off") +
                     " cuda:" + std::to_string(e.region->kind.device()));
    failures->push_back({e.index, s.code(), std::string(s.message())});
  };
  std::vector<const StagedEntry*> queued;
  for (const StagedEntry& e : staged) {
    if (e.region->kind.type() != MemoryKind::Type::kCuda) continue;
    char* device = reinterpret_cast<char*>(e.addr);
    const int ordinal = e.region->kind.device();
    Status s = to_device ? Copies().Queue(ordinal, device, host + e.offset, e.length)
                         : Copies().Queue(ordinal, host + e.offset, device, e.length);
    if (s.ok()) {
      queued.push_back(&e);
    } else {
      failed(e, std::move(s));
    }
  }
  if (queued.empty()) return;
  // A failed wait fails every entry queued on that device: which of its
  // copies failed is not known.
  const std::map<int, Status> waited = Copies().WaitAll();
  for (const StagedEntry* e : queued) {
    auto it = waited.find(e->region->kind.device());
    if (it != waited.end() && !it->second.ok()) failed(*e, it->second);
  }
  if (failures->size() > 1) SortByEntry(failures);
}

Status TcpStreamService::OnPayload(stream::Connection& c, const wire::FrameHeader& h) {
  // A kWrite payload has landed: staged entries go on to the device or the
  // file, then the regions are released and the frame acknowledged.
  CopyGpu(staged_, staged_bytes_.get(), /*to_device=*/true, &failures_);
  if (HasFiles(staged_)) {
    // The file writes go on while later frames are read; the reply waits
    // in its place (Connection::ReserveReply), holding the frame's regions
    // and buffer, which the next frame does not reuse.
    struct Held {
      std::vector<RegionPin> pins;
      std::vector<wire::EntryFailure> failures;
      std::shared_ptr<char> host;
    };
    auto held = std::make_shared<Held>(Held{std::move(pins_), std::move(failures_), staged_bytes_});
    const std::vector<StagedEntry> staged = std::move(staged_);
    staged_.clear();
    pins_.clear();
    failures_.clear();
    staged_bytes_.reset();
    const uint64_t holds = staged.back().offset + staged.back().length;  // the buffer's use
    StartFileIo(
        staged, held->host.get(), /*write=*/true,
        [place = c.ReserveReply(holds), seq = h.seq, held](std::vector<wire::EntryFailure> f) {
          wire::Reply rep;
          rep.failures = std::move(held->failures);
          rep.failures.insert(rep.failures.end(), f.begin(), f.end());
          SortByEntry(&rep.failures);
          std::string body;
          wire::EncodeReply(rep, &body);
          stream::Connection::FinishReply(place, wire::FrameType::kAck, seq, std::move(body), {},
                                          std::move(held->pins), held->host);
        });
    return OkStatus();
  }
  staged_.clear();
  staged_bytes_.reset();  // back to the pool
  SortByEntry(&failures_);
  pins_.clear();
  wire::Reply rep;
  rep.failures = std::move(failures_);
  failures_.clear();
  std::string body;
  wire::EncodeReply(rep, &body);
  c.QueueReply(wire::FrameType::kAck, h.seq, std::move(body));
  return OkStatus();
}

Status TcpStreamService::ServeRead(stream::Connection& c, const wire::FrameHeader& h,
                                   std::string_view body) {
  // What the reply needs, kept until it is queued: staged entries (GPU,
  // file) are read into a host buffer the reply keeps — all of them first (a
  // frame's file entries as one batch of the ring, while later frames are
  // served) — then the payload is put together in entry order.
  struct Read {
    std::vector<wire::Entry> entries;
    wire::Reply rep;
    std::vector<RegionPin> pins;
    std::vector<StagedEntry> staged;
    std::vector<int8_t> placed;  // 0 failed, 1 host, 2 staged
    std::shared_ptr<char> host;
  };
  auto r = std::make_shared<Read>();
  FERRY_ASSIGN_OR_RETURN(r->entries, wire::DecodeEntries(body));
  r->placed.assign(r->entries.size(), 0);
  size_t staged_bytes = 0;
  const Region* last = nullptr;
  for (uint32_t i = 0; i < r->entries.size(); ++i) {
    const wire::Entry& e = r->entries[i];
    if (!PinEntry(e.addr, e.length, i, &last, &r->pins, &r->rep.failures, Staged::kFilesAndGpu)
             .ok())
      continue;
    if (last->kind.cpu_accessible()) {
      r->placed[i] = 1;
      continue;
    }
    const size_t at = StagedOffset(staged_bytes, e.length);
    r->staged.push_back({i, e.addr, last, at, e.length});
    staged_bytes = at + e.length;
    r->placed[i] = 2;
  }
  RefuseOversizedStaging(&r->staged, &staged_bytes, &r->rep.failures);
  // Queues the reply with the entries that did not fail (`send`: how).
  auto reply = [](Read& r, auto send) {
    for (const wire::EntryFailure& f : r.rep.failures) r.placed[f.index] = 0;
    SortByEntry(&r.rep.failures);
    std::vector<iovec> payload;
    size_t g = 0;
    for (uint32_t i = 0; i < r.entries.size(); ++i) {
      const wire::Entry& e = r.entries[i];
      const bool is_staged = g < r.staged.size() && r.staged[g].index == i;
      if (r.placed[i] == 1) {
        stream::AppendRange(&payload, reinterpret_cast<void*>(e.addr), e.length);
      } else if (r.placed[i] == 2) {
        stream::AppendRange(&payload, r.host.get() + r.staged[g].offset, e.length);
      }
      if (is_staged) ++g;
    }
    std::string body;
    wire::EncodeReply(r.rep, &body);
    send(std::move(body), std::move(payload), std::move(r.pins), std::move(r.host));
  };
  if (!r->staged.empty()) {
    r->host = BufferFor(r->staged, staged_bytes);
    CopyGpu(r->staged, r->host.get(), /*to_device=*/false, &r->rep.failures);
    if (HasFiles(r->staged)) {
      StartFileIo(r->staged, r->host.get(), /*write=*/false,
                  [place = c.ReserveReply(staged_bytes), seq = h.seq, r,
                   reply](std::vector<wire::EntryFailure> f) {
                    r->rep.failures.insert(r->rep.failures.end(), f.begin(), f.end());
                    reply(*r, [&](std::string body, std::vector<iovec> payload,
                                  std::vector<RegionPin> pins, std::shared_ptr<char> host) {
                      stream::Connection::FinishReply(place, wire::FrameType::kReadData, seq,
                                                      std::move(body), std::move(payload),
                                                      std::move(pins), std::move(host));
                    });
                  });
      return OkStatus();
    }
  }
  reply(*r, [&](std::string body, std::vector<iovec> payload, std::vector<RegionPin> pins,
                std::shared_ptr<char> host) {
    c.QueueReply(wire::FrameType::kReadData, h.seq, std::move(body), std::move(payload),
                 std::move(pins), std::move(host));
  });
  return OkStatus();
}

}  // namespace ferry::internal::tcp
