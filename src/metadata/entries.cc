#include "metadata/entries.h"

#include <algorithm>

namespace ferry::internal {

Status CheckClusterName(std::string_view cluster) {
  const bool ok = !cluster.empty() && cluster.size() <= 128 &&
                  std::all_of(cluster.begin(), cluster.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                           c == '_' || c == '-';
                  });
  if (ok) return OkStatus();
  return InvalidArgumentError("metadata_cluster '" + std::string(cluster) +
                              "' must be 1 to 128 letters, digits, '.', '_' or '-'");
}

std::string SegmentKeyPrefix(std::string_view cluster) { return std::string(cluster) + "/segments/"; }

std::string SegmentKey(std::string_view cluster, std::string_view name) {
  return SegmentKeyPrefix(cluster) + std::string(name);
}

std::optional<std::string> NameOfKey(std::string_view prefix, std::string_view key) {
  if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return std::nullopt;
  return std::string(key.substr(prefix.size()));
}

Status CheckClaim(const wire::PeerDescriptor& self, const std::string& key, const std::string& existing,
                  const std::string& where, const std::string& expires_hint) {
  auto holder = wire::DecodeDescriptor(existing);
  if (!holder.ok()) {
    return AlreadyExistsError("segment name '" + self.engine_name + "' is taken in " + where +
                              " by a value that is not a descriptor this build reads (key '" + key +
                              "': " + holder.status().message() + ")" + expires_hint);
  }
  if (holder->instance_id == self.instance_id) return OkStatus();
  return AlreadyExistsError("segment name '" + self.engine_name + "' is held by engine " + holder->peer_id +
                            " (instance " + std::to_string(holder->instance_id) + ") in " + where + expires_hint);
}

StatusOr<wire::PeerDescriptor> DecodeEntry(std::string_view name, const std::string& key, const std::string& value,
                                           const std::string& where) {
  auto desc = wire::DecodeDescriptor(value);
  if (!desc.ok()) {
    return DataLossError("the value under key '" + key + "' in " + where +
                         " is not a descriptor: " + desc.status().message());
  }
  if (desc->engine_name != name) {
    return DataLossError("the value under key '" + key + "' in " + where + " is the descriptor of engine '" +
                         desc->engine_name + "'");
  }
  return desc;
}

std::optional<uint64_t> InstanceOfEntry(const std::string& value) {
  auto desc = wire::DecodeDescriptor(value);
  if (!desc.ok()) return std::nullopt;
  return desc->instance_id;
}

}  // namespace ferry::internal
