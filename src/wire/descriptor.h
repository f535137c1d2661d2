// PeerDescriptor: what an engine tells a peer about itself during the
// handshake. Layout in docs/wire-format.md ("Descriptor").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/status.h"
#include "ferry/types.h"

namespace ferry::wire {

// Descriptor formats this build reads and writes. Format 2 adds each
// region's memory kind and per-transport keys; format 3 a value of bytes to
// each key (a CUDA IPC handle). A handshake request is always written in
// format 1, which every build reads, and names the formats its sender reads
// in a feature ("descriptor-formats:1..3"); the responder answers in the
// highest format both read (format 1 to a builder that names none).
inline constexpr uint16_t kDescriptorFormatMin = 1;
inline constexpr uint16_t kDescriptorFormatMax = 3;
// The longest key value format 3 carries.
inline constexpr size_t kMaxRegionKeyValue = 1024;

// What a peer needs to reach a region through one transport (for example a
// fabric's remote key, or a CUDA IPC handle and the region's offset in its
// allocation). Transports without per-region keys add none. Written in
// format 2, a key with a value is left out (a build that reads only format 2
// has no transport that could use it).
struct RegionKey {
  RegionKey() = default;
  RegionKey(std::string t, uint64_t k, std::string v = {})
      : transport(std::move(t)), key(k), value(std::move(v)) {}
  std::string transport;
  uint64_t key = 0;
  std::string value;  // format 3; at most kMaxRegionKeyValue bytes
  friend bool operator==(const RegionKey&, const RegionKey&) = default;
};

// A registered region as a descriptor carries it.
struct RegionEntry {
  uint64_t addr = 0;
  uint64_t length = 0;
  std::string location;
  std::string kind = "cpu";     // MemoryKind::Name(); format 1: always "cpu"
  std::vector<RegionKey> keys;  // format 1: none
  friend bool operator==(const RegionEntry&, const RegionEntry&) = default;
};

struct TransportEndpoint {
  std::string name;      // "tcp", "local"
  std::string endpoint;  // "host:port" for tcp; process token for local
  // False for entries that describe a facility of a transport rather than a
  // transport ("shm-map": the shm transport's slot table of mapped
  // segments); they are not listed among the peer's transports.
  bool IsTransport() const { return name != "shm-map"; }
};

struct PeerDescriptor {
  std::string engine_name;
  std::string peer_id;  // "host:port"
  uint64_t instance_id = 0;
  uint64_t process_token = 0;  // equal for engines of one process
  std::string hostname;
  uint32_t pid = 0;
  std::string version;  // ferry::Version()
  uint16_t wire_min = 0;
  uint16_t wire_max = 0;
  std::vector<TransportEndpoint> transports;
  std::vector<std::string> features;
  std::vector<RegionEntry> regions;
  // The format it was decoded from (set by DecodeDescriptor).
  uint16_t format = kDescriptorFormatMax;

  bool HasFeature(std::string_view f) const;
  const TransportEndpoint* FindTransport(std::string_view name) const;
};

// The lowest format that carries everything of `d` (2, or 3 once a key has
// a value): what stores shared with older builds are written in.
uint16_t LowestFormatFor(const PeerDescriptor& d);
// Encodes in `format` (kDescriptorFormatMin..Max); format 1 leaves out the
// regions' kinds and keys.
void EncodeDescriptor(const PeerDescriptor& d, std::string* out,
                      uint16_t format = kDescriptorFormatMax);
// Reads any format in kDescriptorFormatMin..Max.
StatusOr<PeerDescriptor> DecodeDescriptor(std::string_view bytes);

// The feature a handshake request carries to say which formats its sender
// reads, and the format a responder answers in (the highest both read; 1 if
// the request names none). `max_self` lets tests play an older build.
std::string DescriptorFormatsFeature(uint16_t min, uint16_t max);
uint16_t AnswerFormat(const PeerDescriptor& request, uint16_t max_self = kDescriptorFormatMax);

// Highest wire version both ranges contain, or kFailedPrecondition naming
// both ranges and both peers.
StatusOr<uint16_t> NegotiateWireVersion(const PeerDescriptor& local, const PeerDescriptor& remote);

// Exported metadata (Engine::ExportMetadata): u32 magic "FRMD", u16 version
// (1), then the descriptor in any format (the exporter writes its highest).
// kInvalidArgument if the bytes are not exported metadata; a descriptor in a
// format this build does not read is kFailedPrecondition naming both.
inline constexpr uint32_t kExportedMetadataMagic = 0x444d5246;  // "FRMD" little-endian
void EncodeExportedMetadata(const PeerDescriptor& d, std::string* out,
                            uint16_t format = kDescriptorFormatMax);
StatusOr<PeerDescriptor> DecodeExportedMetadata(std::string_view bytes);

// kHandshakeResponse body: status, then the responder's descriptor.
void EncodeHandshakeResponse(const Status& s, const PeerDescriptor& d, std::string* out,
                             uint16_t format = kDescriptorFormatMax);
StatusOr<std::pair<Status, PeerDescriptor>> DecodeHandshakeResponse(std::string_view body);

}  // namespace ferry::wire
