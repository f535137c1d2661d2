#include "wire/frame.h"

#include <cstring>

#include "wire/byte_io.h"

namespace ferry::wire {
namespace {

bool KnownType(uint8_t t) {
  switch (static_cast<FrameType>(t)) {
    case FrameType::kHandshakeRequest:
    case FrameType::kHandshakeResponse:
    case FrameType::kStreamHello:
    case FrameType::kStreamHelloAck:
    case FrameType::kCopyHello:
    case FrameType::kAuthHello:
    case FrameType::kAuthChallenge:
    case FrameType::kAuthProof:
    case FrameType::kWrite:
    case FrameType::kRead:
    case FrameType::kNotify:
    case FrameType::kCopyWrite:
    case FrameType::kCopyRead:
    case FrameType::kCopyLendRead:
    case FrameType::kCopyReturn:
    case FrameType::kAck:
    case FrameType::kReadData:
    case FrameType::kGoAway:
    case FrameType::kLendAck:
      return true;
  }
  return false;
}

bool KnownCode(uint8_t c) {
  switch (static_cast<StatusCode>(c)) {
    case StatusCode::kOk:
    case StatusCode::kCancelled:
    case StatusCode::kUnknown:
    case StatusCode::kInvalidArgument:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kResourceExhausted:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kUnimplemented:
    case StatusCode::kInternal:
    case StatusCode::kUnavailable:
    case StatusCode::kDataLoss:
    case StatusCode::kUnauthenticated:
      return true;
  }
  return false;
}

Status Corrupt(std::string_view what) {
  return DataLossError("malformed " + std::string(what) + " from peer");
}

bool ReadStatus(ByteReader& r, Status* out) {
  uint8_t code;
  std::string msg;
  if (!r.U8(&code) || !r.Str(&msg)) return false;
  if (!KnownCode(code)) code = static_cast<uint8_t>(StatusCode::kUnknown);
  *out = Status(static_cast<StatusCode>(code), std::move(msg));
  return true;
}

bool ReadBytes(ByteReader& r, AuthBytes* out) {
  for (uint8_t& b : *out) {
    if (!r.U8(&b)) return false;
  }
  return true;
}

void WriteBytes(ByteWriter& w, const AuthBytes& b) {
  for (uint8_t x : b) w.U8(x);
}

void WriteStatus(ByteWriter& w, const Status& s) {
  w.U8(static_cast<uint8_t>(s.code()));
  std::string_view m = s.message();
  w.Str(m.substr(0, kMaxErrorMessage));
}

}  // namespace

void EncodeHeader(const FrameHeader& h, uint8_t out[kFrameHeaderSize]) {
  std::string s;
  s.reserve(kFrameHeaderSize);
  ByteWriter w(&s);
  w.U32(kFrameMagic);
  w.U8(h.version);
  w.U8(static_cast<uint8_t>(h.type));
  w.U16(h.flags);
  w.U32(h.body_len);
  w.U32(h.payload_len);
  w.U64(h.seq);
  std::memcpy(out, s.data(), kFrameHeaderSize);
}

StatusOr<FrameHeader> DecodeHeader(const uint8_t in[kFrameHeaderSize]) {
  ByteReader r(in, kFrameHeaderSize);
  uint32_t magic = 0;
  uint8_t type = 0;
  FrameHeader h;
  r.U32(&magic);
  r.U8(&h.version);
  r.U8(&type);
  r.U16(&h.flags);
  r.U32(&h.body_len);
  r.U32(&h.payload_len);
  r.U64(&h.seq);
  if (magic != kFrameMagic) return DataLossError("bad frame magic (not a Ferry peer?)");
  if (!KnownType(type)) return DataLossError("unknown frame type " + std::to_string(type));
  h.type = static_cast<FrameType>(type);
  bool handshake =
      h.type == FrameType::kHandshakeRequest || h.type == FrameType::kHandshakeResponse;
  uint32_t max_body = handshake                      ? kMaxHandshakeBody
                      : h.type == FrameType::kNotify ? kMaxNotifyBody
                                                     : kMaxDataBody;
  if (h.body_len > max_body) {
    return DataLossError("frame body of " + std::to_string(h.body_len) +
                         " bytes exceeds the limit of " + std::to_string(max_body));
  }
  if (h.payload_len > kMaxPayload) {
    return DataLossError("frame payload of " + std::to_string(h.payload_len) +
                         " bytes exceeds the limit of " + std::to_string(kMaxPayload));
  }
  if (h.payload_len != 0 && h.type != FrameType::kWrite && h.type != FrameType::kReadData) {
    return DataLossError("frame type " + std::to_string(type) + " cannot carry a payload");
  }
  return h;
}

void EncodeEntries(const Entry* entries, size_t count, std::string* out) {
  out->reserve(out->size() + EntriesSize(count));
  ByteWriter w(out);
  w.U32(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) {
    w.U64(entries[i].addr);
    w.U32(entries[i].length);
  }
}

StatusOr<std::vector<Entry>> DecodeEntries(std::string_view body) {
  ByteReader r(body);
  uint32_t n;
  if (!r.U32(&n)) return Corrupt("entry list");
  if (n == 0 || n > kMaxEntriesPerFrame || r.remaining() != static_cast<size_t>(n) * 12) {
    return Corrupt("entry list (count " + std::to_string(n) + ")");
  }
  std::vector<Entry> out(n);
  for (auto& e : out) {
    r.U64(&e.addr);
    r.U32(&e.length);
  }
  return out;
}

void EncodeReply(const Reply& rep, std::string* out) {
  ByteWriter w(out);
  WriteStatus(w, rep.status);
  w.U32(static_cast<uint32_t>(rep.failures.size()));
  for (const auto& f : rep.failures) {
    w.U32(f.index);
    WriteStatus(w, Status(f.code, f.message));
  }
}

StatusOr<Reply> DecodeReply(std::string_view body) {
  ByteReader r(body);
  Reply rep;
  uint32_t n;
  if (!ReadStatus(r, &rep.status) || !r.U32(&n)) return Corrupt("reply");
  if (n > kMaxEntriesPerFrame) return Corrupt("reply (failure count)");
  rep.failures.resize(n);
  for (auto& f : rep.failures) {
    Status s;
    if (!r.U32(&f.index) || !ReadStatus(r, &s)) return Corrupt("reply failure");
    f.code = s.ok() ? StatusCode::kUnknown : s.code();
    f.message = s.message();
  }
  for (size_t i = 1; i < rep.failures.size(); ++i) {
    if (rep.failures[i].index <= rep.failures[i - 1].index) {
      return DataLossError("malformed reply from peer: failed entry " +
                           std::to_string(rep.failures[i].index) + " listed after entry " +
                           std::to_string(rep.failures[i - 1].index) +
                           " (failures must be in increasing entry order)");
    }
  }
  if (r.remaining() != 0) return Corrupt("reply (trailing bytes)");
  return rep;
}

void EncodeLendAck(const LendAck& a, std::string* out) {
  std::string reply;
  EncodeReply(a.reply, &reply);
  ByteWriter w(out);
  w.U32(static_cast<uint32_t>(reply.size()));
  out->append(reply);
  w.U32(static_cast<uint32_t>(a.staged.size()));
  for (const StagedLend& s : a.staged) {
    w.U32(s.index);
    w.U64(s.addr);
  }
}

StatusOr<LendAck> DecodeLendAck(std::string_view body) {
  ByteReader head(body);
  uint32_t reply_len;
  if (!head.U32(&reply_len) || head.remaining() < reply_len) return Corrupt("lend ack");
  LendAck a;
  FERRY_ASSIGN_OR_RETURN(a.reply, DecodeReply(body.substr(4, reply_len)));
  ByteReader r(body.substr(4 + static_cast<size_t>(reply_len)));
  uint32_t n;
  if (!r.U32(&n)) return Corrupt("lend ack (staged count)");
  if (n > kMaxEntriesPerFrame) return Corrupt("lend ack (staged count " + std::to_string(n) + ")");
  if (r.remaining() != static_cast<size_t>(n) * 12) return Corrupt("lend ack (staged entries)");
  a.staged.resize(n);
  size_t f = 0;  // the failures are in increasing order too: one walk
  for (uint32_t k = 0; k < n; ++k) {
    StagedLend& s = a.staged[k];
    if (!r.U32(&s.index) || !r.U64(&s.addr)) return Corrupt("lend ack (staged entry)");
    if (k > 0 && s.index <= a.staged[k - 1].index) {
      return DataLossError("malformed lend ack from peer: staged entry " + std::to_string(s.index) +
                           " listed after entry " + std::to_string(a.staged[k - 1].index));
    }
    while (f < a.reply.failures.size() && a.reply.failures[f].index < s.index) ++f;
    if (f < a.reply.failures.size() && a.reply.failures[f].index == s.index) {
      return DataLossError("malformed lend ack from peer: entry " + std::to_string(s.index) +
                           " is listed both as failed and as staged");
    }
  }
  return a;
}

// The message: str (u16 length) when shorter than 65535 bytes; else u16
// 0xffff, u32 length, bytes (only peers with "notify-1m" are sent those).
void EncodeNotify(const NotifyBody& n, std::string* out) {
  ByteWriter w(out);
  w.Str(n.sender);
  w.Str(n.name);
  if (n.message.size() < 0xffff) {
    w.Str(n.message);
  } else {
    w.U16(0xffff);
    w.U32(static_cast<uint32_t>(n.message.size()));
    out->append(n.message);
  }
}

StatusOr<NotifyBody> DecodeNotify(std::string_view body) {
  ByteReader r(body);
  NotifyBody n;
  if (!r.Str(&n.sender) || !r.Str(&n.name)) return Corrupt("notification");
  const size_t at = body.size() - r.remaining();
  uint16_t short_len = 0;
  if (!r.U16(&short_len)) return Corrupt("notification");
  if (short_len != 0xffff) {
    ByteReader again(body.substr(at));
    if (!again.Str(&n.message) || again.remaining() != 0) return Corrupt("notification");
    return n;
  }
  uint32_t len = 0;
  // The long form is for messages of 65535 bytes or more only (one encoding
  // per message).
  if (!r.U32(&len) || len < 0xffff || r.remaining() != len) return Corrupt("notification");
  n.message.assign(body.substr(body.size() - len));
  return n;
}

void EncodeStreamHello(const StreamHello& h, std::string* out) {
  ByteWriter w(out);
  w.U64(h.initiator_instance);
  w.U64(h.target_instance);
  w.U16(h.wire_version);
  w.U16(h.stream_index);
  w.Str(h.initiator_peer_id);
}

StatusOr<StreamHello> DecodeStreamHello(std::string_view body) {
  ByteReader r(body);
  StreamHello h;
  if (!r.U64(&h.initiator_instance) || !r.U64(&h.target_instance) || !r.U16(&h.wire_version) ||
      !r.U16(&h.stream_index) || !r.Str(&h.initiator_peer_id) || r.remaining() != 0) {
    return Corrupt("stream hello");
  }
  return h;
}

void EncodeStatus(const Status& s, std::string* out) {
  ByteWriter w(out);
  WriteStatus(w, s);
}

Status DecodeStatus(std::string_view body, Status* out) {
  ByteReader r(body);
  if (!ReadStatus(r, out) || r.remaining() != 0) return Corrupt("status");
  return OkStatus();
}

void EncodeAuthHello(const AuthHello& h, std::string* out) {
  ByteWriter w(out);
  w.U8(h.mode);
  WriteBytes(w, h.nonce);
  w.Str(h.peer_id);
}

StatusOr<AuthHello> DecodeAuthHello(std::string_view body) {
  ByteReader r(body);
  AuthHello h;
  if (!r.U8(&h.mode) || !ReadBytes(r, &h.nonce) || !r.Str(&h.peer_id) || r.remaining() != 0) {
    return Corrupt("authentication hello");
  }
  return h;
}

void EncodeAuthChallenge(const AuthChallenge& c, std::string* out) {
  ByteWriter w(out);
  WriteStatus(w, c.status);
  w.U8(c.mode);
  WriteBytes(w, c.nonce);
  WriteBytes(w, c.mac);
}

StatusOr<AuthChallenge> DecodeAuthChallenge(std::string_view body) {
  ByteReader r(body);
  AuthChallenge c;
  if (!ReadStatus(r, &c.status) || !r.U8(&c.mode) || !ReadBytes(r, &c.nonce) ||
      !ReadBytes(r, &c.mac) || r.remaining() != 0) {
    return Corrupt("authentication challenge");
  }
  return c;
}

void EncodeAuthProof(const AuthProof& p, std::string* out) {
  ByteWriter w(out);
  WriteBytes(w, p.mac);
}

StatusOr<AuthProof> DecodeAuthProof(std::string_view body) {
  ByteReader r(body);
  AuthProof p;
  if (!ReadBytes(r, &p.mac) || r.remaining() != 0) return Corrupt("authentication proof");
  return p;
}

std::string BuildFrame(FrameHeader h, std::string_view body) {
  h.body_len = static_cast<uint32_t>(body.size());
  std::string out(kFrameHeaderSize, '\0');
  EncodeHeader(h, reinterpret_cast<uint8_t*>(out.data()));
  out.append(body);
  return out;
}

}  // namespace ferry::wire
