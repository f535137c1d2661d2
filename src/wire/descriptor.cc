#include "wire/descriptor.h"

#include <algorithm>
#include <cstdlib>

#include "wire/byte_io.h"
#include "wire/frame.h"

namespace ferry::wire {

bool PeerDescriptor::HasFeature(std::string_view f) const {
  return std::find(features.begin(), features.end(), f) != features.end();
}

const TransportEndpoint* PeerDescriptor::FindTransport(std::string_view name) const {
  for (const auto& t : transports) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

uint16_t LowestFormatFor(const PeerDescriptor& d) {
  for (const auto& r : d.regions) {
    for (const auto& k : r.keys) {
      if (!k.value.empty()) return 3;
    }
  }
  return 2;
}

void EncodeDescriptor(const PeerDescriptor& d, std::string* out, uint16_t format) {
  ByteWriter w(out);
  w.U16(format);
  w.Str(d.engine_name);
  w.Str(d.peer_id);
  w.U64(d.instance_id);
  w.U64(d.process_token);
  w.Str(d.hostname);
  w.U32(d.pid);
  w.Str(d.version);
  w.U16(d.wire_min);
  w.U16(d.wire_max);
  w.U16(static_cast<uint16_t>(d.transports.size()));
  for (const auto& t : d.transports) {
    w.Str(t.name);
    w.Str(t.endpoint);
  }
  w.U16(static_cast<uint16_t>(d.features.size()));
  for (const auto& f : d.features) w.Str(f);
  w.U32(static_cast<uint32_t>(d.regions.size()));
  for (const auto& r : d.regions) {
    w.U64(r.addr);
    w.U64(r.length);
    w.Str(r.location);
    if (format >= 2) {
      w.Str(r.kind);
      const auto carried = [&](const RegionKey& k) { return format >= 3 || k.value.empty(); };
      w.U16(static_cast<uint16_t>(std::count_if(r.keys.begin(), r.keys.end(), carried)));
      for (const auto& k : r.keys) {
        if (!carried(k)) continue;
        w.Str(k.transport);
        w.U64(k.key);
        if (format >= 3) w.Str(k.value);
      }
    }
  }
}

StatusOr<PeerDescriptor> DecodeDescriptor(std::string_view bytes) {
  ByteReader r(bytes);
  PeerDescriptor d;
  uint16_t format = 0;
  if (!r.U16(&format)) return DataLossError("empty peer descriptor");
  if (format < kDescriptorFormatMin || format > kDescriptorFormatMax) {
    return FailedPreconditionError("peer descriptor format " + std::to_string(format) +
                                   " is not supported (this engine reads formats " +
                                   std::to_string(kDescriptorFormatMin) + ".." +
                                   std::to_string(kDescriptorFormatMax) + ")");
  }
  d.format = format;
  uint16_t nt = 0, nf = 0;
  uint32_t nr = 0;
  bool ok = r.Str(&d.engine_name) && r.Str(&d.peer_id) && r.U64(&d.instance_id) &&
            r.U64(&d.process_token) && r.Str(&d.hostname) && r.U32(&d.pid) && r.Str(&d.version) &&
            r.U16(&d.wire_min) && r.U16(&d.wire_max) && r.U16(&nt);
  for (uint16_t i = 0; ok && i < nt; ++i) {
    TransportEndpoint t;
    ok = r.Str(&t.name) && r.Str(&t.endpoint);
    d.transports.push_back(std::move(t));
  }
  ok = ok && r.U16(&nf);
  for (uint16_t i = 0; ok && i < nf; ++i) {
    std::string f;
    ok = r.Str(&f);
    d.features.push_back(std::move(f));
  }
  ok = ok && r.U32(&nr);
  // Each region takes at least 18 bytes: refuse counts the input cannot hold.
  if (ok && nr > r.remaining() / 18) ok = false;
  for (uint32_t i = 0; ok && i < nr; ++i) {
    RegionEntry reg;
    ok = r.U64(&reg.addr) && r.U64(&reg.length) && r.Str(&reg.location);
    if (ok && format >= 2) {
      uint16_t nk = 0;
      ok = r.Str(&reg.kind) && r.U16(&nk);
      // Each key takes at least 10 bytes (12 in format 3).
      if (ok && nk > r.remaining() / (format >= 3 ? 12 : 10)) ok = false;
      for (uint16_t k = 0; ok && k < nk; ++k) {
        RegionKey key;
        ok = r.Str(&key.transport) && r.U64(&key.key) && (format < 3 || r.Str(&key.value));
        if (ok && key.value.size() > kMaxRegionKeyValue) ok = false;
        reg.keys.push_back(std::move(key));
      }
    }
    d.regions.push_back(std::move(reg));
  }
  if (!ok || r.remaining() != 0) return DataLossError("malformed peer descriptor");
  if (d.wire_min > d.wire_max) {
    return DataLossError("peer descriptor has an empty wire version range " +
                         std::to_string(d.wire_min) + ".." + std::to_string(d.wire_max));
  }
  return d;
}

StatusOr<uint16_t> NegotiateWireVersion(const PeerDescriptor& local, const PeerDescriptor& remote) {
  uint16_t lo = std::max(local.wire_min, remote.wire_min);
  uint16_t hi = std::min(local.wire_max, remote.wire_max);
  if (lo <= hi) return hi;
  auto range = [](const PeerDescriptor& d) {
    return std::to_string(d.wire_min) + ".." + std::to_string(d.wire_max);
  };
  std::string older = remote.wire_max < local.wire_min ? "peer " + remote.peer_id
                                                       : "this engine (" + local.peer_id + ")";
  return FailedPreconditionError("no common wire protocol version: peer " + remote.peer_id + " ('" +
                                 remote.engine_name + "', ferry " + remote.version +
                                 ") speaks wire versions " + range(remote) + ", this engine " +
                                 local.peer_id + " (ferry " + local.version + ") speaks " +
                                 range(local) + "; upgrade " + older);
}

void EncodeHandshakeResponse(const Status& s, const PeerDescriptor& d, std::string* out,
                             uint16_t format) {
  EncodeStatus(s, out);
  EncodeDescriptor(d, out, format);
}

std::string DescriptorFormatsFeature(uint16_t min, uint16_t max) {
  return "descriptor-formats:" + std::to_string(min) + ".." + std::to_string(max);
}

uint16_t AnswerFormat(const PeerDescriptor& request, uint16_t max_self) {
  constexpr std::string_view kPrefix = "descriptor-formats:";
  uint16_t best = kDescriptorFormatMin;
  for (const auto& f : request.features) {
    if (f.substr(0, kPrefix.size()) != kPrefix) continue;
    const std::string range = f.substr(kPrefix.size());
    const size_t dots = range.find("..");
    if (dots == std::string::npos) continue;
    const long hi = std::strtol(range.c_str() + dots + 2, nullptr, 10);
    const long lo = std::strtol(range.c_str(), nullptr, 10);
    const long common = std::min<long>(hi, std::min<long>(max_self, kDescriptorFormatMax));
    if (lo <= common && common >= kDescriptorFormatMin) best = static_cast<uint16_t>(common);
  }
  return best;
}

void EncodeExportedMetadata(const PeerDescriptor& d, std::string* out, uint16_t format) {
  {
    ByteWriter w(out);
    w.U32(kExportedMetadataMagic);
    w.U16(1);
  }
  EncodeDescriptor(d, out, format);
}

StatusOr<PeerDescriptor> DecodeExportedMetadata(std::string_view bytes) {
  ByteReader r(bytes);
  uint32_t magic = 0;
  uint16_t version = 0;
  if (!r.U32(&magic) || magic != kExportedMetadataMagic) {
    return InvalidArgumentError("not Ferry agent metadata (" + std::to_string(bytes.size()) +
                                " bytes without the FRMD magic)");
  }
  if (!r.U16(&version) || version != 1) {
    return FailedPreconditionError("agent metadata of version " + std::to_string(version) +
                                   " (this build reads version 1)");
  }
  auto d = DecodeDescriptor(bytes.substr(6));
  if (!d.ok() && d.status().code() == StatusCode::kDataLoss) {
    return InvalidArgumentError("damaged agent metadata: " + std::string(d.status().message()));
  }
  return d;
}

StatusOr<std::pair<Status, PeerDescriptor>> DecodeHandshakeResponse(std::string_view body) {
  ByteReader r(body);
  uint8_t code;
  std::string msg;
  if (!r.U8(&code) || !r.Str(&msg)) return DataLossError("malformed handshake response");
  size_t status_len = body.size() - r.remaining();
  Status s;
  FERRY_RETURN_IF_ERROR(DecodeStatus(body.substr(0, status_len), &s));
  FERRY_ASSIGN_OR_RETURN(PeerDescriptor d, DecodeDescriptor(body.substr(status_len)));
  return std::make_pair(std::move(s), std::move(d));
}

}  // namespace ferry::wire
