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
  gpu_.clear();
  stream::FrameReader& reader = c.reader();
  reader.ExpectPayload();
  // Pinned first (GPU entries counted), then placed: the host buffer of the
  // GPU entries is sized once, before any destination points into it.
  std::vector<int8_t> placed(entries.size(), 0);  // 0 failed, 1 host, 2 GPU
  size_t gpu_bytes = 0;
  const Region* last = nullptr;  // entries of a frame mostly share a region
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (!PinEntry(e.addr, e.length, i, &last, &pins_, &failures_, /*allow_gpu=*/true).ok())
      continue;
    if (last->kind.type() == MemoryKind::Type::kCuda) {
      gpu_.push_back(
          {i, reinterpret_cast<char*>(e.addr), last->kind.device(), gpu_bytes, e.length});
      gpu_bytes += e.length;
      placed[i] = 2;
    } else {
      placed[i] = 1;
    }
  }
  if (gpu_bytes_.size() < gpu_bytes) gpu_bytes_.resize(gpu_bytes);
  size_t g = 0;
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (placed[i] == 0) {
      reader.AddDiscard(e.length);  // drain the bytes; nothing is written
    } else if (placed[i] == 1) {
      reader.AddDestination(reinterpret_cast<char*>(e.addr), e.length);
    } else {
      reader.AddDestination(gpu_bytes_.data() + gpu_[g++].offset, e.length);
    }
  }
  return OkStatus();
}

cuda::SyncCopies& TcpStreamService::Copies() {
  if (!copies_) copies_ = std::make_unique<cuda::SyncCopies>(*target().cuda_driver());
  return *copies_;
}

Status TcpStreamService::OnPayload(stream::Connection& c, const wire::FrameHeader& h) {
  // A kWrite payload has landed: GPU entries go on to the device, then the
  // regions are released and the frame acknowledged.
  for (const GpuEntry& e : gpu_) {
    Status s = Copies().Copy(e.ordinal, e.device, gpu_bytes_.data() + e.offset, e.length);
    if (!s.ok()) {
      s = s.WithPrefix("peer " + target().peer_id() + ": copying the bytes of " +
                       FormatRange(reinterpret_cast<uintptr_t>(e.device), e.length) +
                       " to cuda:" + std::to_string(e.ordinal));
      failures_.push_back({e.index, s.code(), std::string(s.message())});
    }
  }
  gpu_.clear();
  std::sort(
      failures_.begin(), failures_.end(),
      [](const wire::EntryFailure& a, const wire::EntryFailure& b) { return a.index < b.index; });
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
  FERRY_ASSIGN_OR_RETURN(std::vector<wire::Entry> entries, wire::DecodeEntries(body));
  wire::Reply rep;
  std::vector<iovec> payload;
  std::vector<RegionPin> pins;
  // GPU entries are copied off the device into a host buffer the reply keeps.
  std::shared_ptr<std::vector<char>> host;
  size_t host_used = 0;
  const Region* last = nullptr;
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (!PinEntry(e.addr, e.length, i, &last, &pins, &rep.failures, /*allow_gpu=*/true).ok())
      continue;
    if (last->kind.type() != MemoryKind::Type::kCuda) {
      stream::AppendRange(&payload, reinterpret_cast<void*>(e.addr), e.length);
      continue;
    }
    if (!host) {
      uint64_t total = 0;
      for (const auto& x : entries) total += x.length;
      host = std::make_shared<std::vector<char>>(total);
    }
    char* at = host->data() + host_used;
    host_used += e.length;
    Status s =
        Copies().Copy(last->kind.device(), at, reinterpret_cast<const void*>(e.addr), e.length);
    if (!s.ok()) {
      s = s.WithPrefix("peer " + target().peer_id() + ": copying the bytes of " +
                       FormatRange(e.addr, e.length) +
                       " off cuda:" + std::to_string(last->kind.device()));
      rep.failures.push_back({i, s.code(), std::string(s.message())});
      continue;
    }
    stream::AppendRange(&payload, at, e.length);
  }
  std::string reply;
  wire::EncodeReply(rep, &reply);
  c.QueueReply(wire::FrameType::kReadData, h.seq, std::move(reply), std::move(payload),
               std::move(pins), std::move(host));
  return OkStatus();
}

}  // namespace ferry::internal::tcp
