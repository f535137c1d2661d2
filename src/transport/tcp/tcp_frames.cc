#include "transport/tcp/tcp_frames.h"

namespace ferry::internal::tcp {

void TcpFrameEncoder::Encode(Opcode op, const Slice* slices, size_t n, uint64_t bytes, uint16_t wire_version,
                             stream::RequestFrame* r) const {
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
    for (size_t k = 0; k < n; ++k) stream::AppendRange(&r->payload, slices[k].local, slices[k].length);
  }
  r->head = wire::BuildFrame(h, body);
}

bool TcpStreamService::Accepts(wire::FrameType t) const {
  return t == wire::FrameType::kWrite || t == wire::FrameType::kRead || t == wire::FrameType::kNotify;
}

Status TcpStreamService::OnFrame(stream::Connection& c, const wire::FrameHeader& h, std::string_view body) {
  switch (h.type) {
    case wire::FrameType::kWrite: return ServeWrite(c, h, body);
    case wire::FrameType::kRead: return ServeRead(c, h, body);
    case wire::FrameType::kNotify: return ServeNotify(c, h, body);
    default: return DataLossError("unexpected frame on a tcp stream from " + c.peer_name());
  }
}

Status TcpStreamService::ServeWrite(stream::Connection& c, const wire::FrameHeader& h, std::string_view body) {
  FERRY_ASSIGN_OR_RETURN(std::vector<wire::Entry> entries, wire::DecodeEntries(body));
  uint64_t total = 0;
  for (const auto& e : entries) total += e.length;
  if (total != h.payload_len) {
    return DataLossError("write frame from " + c.peer_name() + " announces " + std::to_string(h.payload_len) +
                         " payload bytes but its entries add up to " + std::to_string(total));
  }
  failures_.clear();
  pins_.clear();
  stream::FrameReader& reader = c.reader();
  reader.ExpectPayload();
  const Region* last = nullptr;  // entries of a frame mostly share a region
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (!PinEntry(e.addr, e.length, i, &last, &pins_, &failures_).ok()) {
      reader.AddDiscard(e.length);  // drain the bytes; nothing is written
      continue;
    }
    reader.AddDestination(reinterpret_cast<char*>(e.addr), e.length);
  }
  return OkStatus();
}

Status TcpStreamService::OnPayload(stream::Connection& c, const wire::FrameHeader& h) {
  // A kWrite payload has landed: release the regions and acknowledge.
  pins_.clear();
  wire::Reply rep;
  rep.failures = std::move(failures_);
  failures_.clear();
  std::string body;
  wire::EncodeReply(rep, &body);
  c.QueueReply(wire::FrameType::kAck, h.seq, std::move(body));
  return OkStatus();
}

Status TcpStreamService::ServeRead(stream::Connection& c, const wire::FrameHeader& h, std::string_view body) {
  FERRY_ASSIGN_OR_RETURN(std::vector<wire::Entry> entries, wire::DecodeEntries(body));
  wire::Reply rep;
  std::vector<iovec> payload;
  std::vector<RegionPin> pins;
  const Region* last = nullptr;
  for (uint32_t i = 0; i < entries.size(); ++i) {
    const wire::Entry& e = entries[i];
    if (!PinEntry(e.addr, e.length, i, &last, &pins, &rep.failures).ok()) continue;
    stream::AppendRange(&payload, reinterpret_cast<void*>(e.addr), e.length);
  }
  std::string reply;
  wire::EncodeReply(rep, &reply);
  c.QueueReply(wire::FrameType::kReadData, h.seq, std::move(reply), std::move(payload), std::move(pins));
  return OkStatus();
}

}  // namespace ferry::internal::tcp
