#include "metadata/entries.h"

#include <algorithm>

namespace ferry::internal {

Status CheckClusterName(std::string_view cluster) {
  const bool ok = !cluster.empty() && cluster.size() <= 128 &&
                  std::all_of(cluster.begin(), cluster.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
                  });
  if (ok) return OkStatus();
  return InvalidArgumentError("metadata_cluster '" + std::string(cluster) +
                              "' must be 1 to 128 letters, digits, '.', '_' or '-'");
}

std::string SegmentKeyPrefix(std::string_view cluster) {
  return std::string(cluster) + "/segments/";
}

std::string SegmentKey(std::string_view cluster, std::string_view name) {
  return SegmentKeyPrefix(cluster) + std::string(name);
}

std::optional<std::string> NameOfKey(std::string_view prefix, std::string_view key) {
  if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return std::nullopt;
  return std::string(key.substr(prefix.size()));
}

Status CheckClaim(const wire::PeerDescriptor& self, const std::string& key,
                  const std::string& existing, const std::string& where,
                  const std::string& expires_hint) {
  auto holder = wire::DecodeDescriptor(existing);
  if (!holder.ok()) {
    return AlreadyExistsError("segment name '" + self.engine_name + "' is taken in " + where +
                              " by a value that is not a descriptor this build reads (key '" + key +
                              "': " + holder.status().message() + ")" + expires_hint);
  }
  if (holder->instance_id == self.instance_id) return OkStatus();
  return AlreadyExistsError("segment name '" + self.engine_name + "' is held by engine " +
                            holder->peer_id + " (instance " + std::to_string(holder->instance_id) +
                            ") in " + where + expires_hint);
}

StatusOr<wire::PeerDescriptor> DecodeEntry(std::string_view name, const std::string& key,
                                           const std::string& value, const std::string& where) {
  auto desc = wire::DecodeDescriptor(value);
  if (!desc.ok()) {
    return DataLossError("the value under key '" + key + "' in " + where +
                         " is not a descriptor: " + desc.status().message());
  }
  if (desc->engine_name != name) {
    return DataLossError("the value under key '" + key + "' in " + where +
                         " is the descriptor of engine '" + desc->engine_name + "'");
  }
  return desc;
}

namespace {
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int B64Digit(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace

std::string Base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const size_t n = std::min<size_t>(3, in.size() - i);
    uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    if (n > 1) v |= uint32_t(uint8_t(in[i + 1])) << 8;
    if (n > 2) v |= uint8_t(in[i + 2]);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += n > 1 ? kB64[(v >> 6) & 63] : '=';
    out += n > 2 ? kB64[v & 63] : '=';
  }
  return out;
}

std::optional<std::string> Unbase64(std::string_view in) {
  if (in.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3);
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    const int pad = last ? (in[i + 3] == '=') + (in[i + 2] == '=' && in[i + 3] == '=') : 0;
    uint32_t v = 0;
    for (size_t j = 0; j < 4; ++j) {
      const int d = j >= 4 - static_cast<size_t>(pad) ? 0 : B64Digit(in[i + j]);
      if (d < 0) return std::nullopt;
      v = (v << 6) | static_cast<uint32_t>(d);
    }
    if ((pad == 2 && (v & 0xffff) != 0) || (pad == 1 && (v & 0xff) != 0))
      return std::nullopt;  // not canonical
    out += static_cast<char>(v >> 16);
    if (pad < 2) out += static_cast<char>((v >> 8) & 255);
    if (pad < 1) out += static_cast<char>(v & 255);
  }
  return out;
}

std::optional<uint64_t> InstanceOfEntry(const std::string& value) {
  auto desc = wire::DecodeDescriptor(value);
  if (!desc.ok()) return std::nullopt;
  return desc->instance_id;
}

}  // namespace ferry::internal
