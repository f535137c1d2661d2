#include "transport/fabric/fabric_messages.h"

#include "wire/byte_io.h"

namespace ferry::internal::fabric {

void EncodeMessage(const Message& m, std::string* out) {
  std::string body;
  if (m.type == MessageType::kNotify) {
    wire::EncodeNotify(m.notify, &body);
  } else {
    wire::EncodeStatus(m.status, &body);
  }
  const std::string_view addr = std::string_view(m.reply_to).substr(0, kMaxAddress);
  out->clear();
  out->reserve(kMessageHeader + addr.size() + body.size());
  wire::ByteWriter w(out);
  w.U32(kMessageMagic);
  w.U16(kMessageVersion);
  w.U8(static_cast<uint8_t>(m.type));
  w.U8(0);
  w.U64(m.seq);
  w.U32(static_cast<uint32_t>(body.size()));
  w.U16(static_cast<uint16_t>(addr.size()));
  w.U16(0);
  out->append(addr);
  out->append(body);
}

StatusOr<Message> DecodeMessage(std::string_view bytes) {
  wire::ByteReader r(bytes);
  uint32_t magic = 0, body_len = 0;
  uint16_t version = 0, addr_len = 0, reserved16 = 0;
  uint8_t type = 0, reserved8 = 0;
  Message m;
  if (!(r.U32(&magic) && r.U16(&version) && r.U8(&type) && r.U8(&reserved8) && r.U64(&m.seq) &&
        r.U32(&body_len) && r.U16(&addr_len) && r.U16(&reserved16))) {
    return InvalidArgumentError("fabric message of " + std::to_string(bytes.size()) +
                                " bytes is shorter than its 24-byte header");
  }
  if (magic != kMessageMagic)
    return DataLossError("fabric message has a wrong magic " + std::to_string(magic));
  if (version != kMessageVersion) {
    return FailedPreconditionError("fabric message version " + std::to_string(version) +
                                   " (this build reads " + std::to_string(kMessageVersion) + ")");
  }
  if (type != static_cast<uint8_t>(MessageType::kNotify) &&
      type != static_cast<uint8_t>(MessageType::kAck)) {
    return InvalidArgumentError("fabric message of unknown type " + std::to_string(type));
  }
  if (reserved8 != 0 || reserved16 != 0)
    return InvalidArgumentError("fabric message has non-zero reserved header bytes");
  m.type = static_cast<MessageType>(type);
  if (addr_len > kMaxAddress) {
    return InvalidArgumentError("fabric message carries a " + std::to_string(addr_len) +
                                "-byte address (at most " + std::to_string(kMaxAddress) + ")");
  }
  if (r.remaining() != size_t{addr_len} + body_len) {
    return InvalidArgumentError("fabric message says " + std::to_string(addr_len) +
                                " address and " + std::to_string(body_len) +
                                " body bytes follow its header, but " +
                                std::to_string(r.remaining()) + " do");
  }
  const std::string_view rest = bytes.substr(kMessageHeader);
  m.reply_to.assign(rest.substr(0, addr_len));
  const std::string_view body = rest.substr(addr_len);
  if (m.type == MessageType::kNotify) {
    if (m.reply_to.empty())
      return InvalidArgumentError("fabric notification without the sender's address");
    auto n = wire::DecodeNotify(body);
    if (!n.ok()) return n.status().WithPrefix("fabric notification");
    m.notify = std::move(*n);
  } else {
    Status decoded = wire::DecodeStatus(body, &m.status);
    if (!decoded.ok()) return decoded.WithPrefix("fabric acknowledgement");
  }
  return m;
}

// ---- the descriptor's endpoint string ----------------------------------------

namespace {

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

StatusOr<std::string> Unhex(std::string_view hex) {
  if (hex.size() % 2 != 0) return InvalidArgumentError("odd number of hex digits");
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    auto digit = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return InvalidArgumentError("not a hex digit");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace

std::string EncodeEndpoint(const FabricEndpoint& a) {
  std::string out = a.provider + "/" + std::to_string(a.format) + "/";
  for (size_t i = 0; i < a.rails.size(); ++i) out += (i == 0 ? "" : ",") + Hex(a.rails[i]);
  return out;
}

StatusOr<FabricEndpoint> DecodeEndpoint(std::string_view s) {
  const size_t a = s.find('/'), b = a == std::string_view::npos ? a : s.find('/', a + 1);
  if (b == std::string_view::npos)
    return InvalidArgumentError("fabric endpoint '" + std::string(s.substr(0, 64)) +
                                "' is not PROVIDER/FORMAT/HEX[,HEX...]");
  FabricEndpoint out;
  out.provider = std::string(s.substr(0, a));
  const std::string format(s.substr(a + 1, b - a - 1));
  if (format.empty() || format.size() > 9 ||
      format.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgumentError("fabric endpoint has a bad address format '" + format + "'");
  }
  out.format = static_cast<uint32_t>(std::stoul(format));
  std::string_view rest = s.substr(b + 1);
  for (;;) {
    const size_t comma = rest.find(',');
    auto raw = Unhex(rest.substr(0, comma));
    if (!raw.ok())
      return raw.status().WithPrefix("fabric endpoint address " + std::to_string(out.rails.size()));
    if (raw->empty())
      return InvalidArgumentError("fabric endpoint address " + std::to_string(out.rails.size()) +
                                  " is empty");
    out.rails.push_back(std::move(*raw));
    if (out.rails.size() > kMaxRails) {
      return InvalidArgumentError("fabric endpoint names more than " + std::to_string(kMaxRails) +
                                  " rails");
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

}  // namespace ferry::internal::fabric
