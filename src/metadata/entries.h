// What the key-value stores (etcd, Redis, HTTP) have in common: the key
// layout, the claim rule and how a value read from a service is checked.
//
// Key layout: "<cluster>/segments/<engine name>" (cluster: the
// metadata_cluster option, default "ferry"), value: the engine's descriptor
// as wire::EncodeDescriptor bytes (the highest format this engine writes;
// docs/wire-format.md). One key per engine; its regions, keys and endpoints
// are all in the value.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "ferry/status.h"
#include "wire/descriptor.h"

namespace ferry::internal {

// kInvalidArgument unless `cluster` is 1..128 of [A-Za-z0-9._-].
Status CheckClusterName(std::string_view cluster);

std::string SegmentKeyPrefix(std::string_view cluster);  // "<cluster>/segments/"
std::string SegmentKey(std::string_view cluster, std::string_view name);
// The engine name in a key under `prefix`, or nullopt for another key.
std::optional<std::string> NameOfKey(std::string_view prefix, std::string_view key);

// Whether `self` may take `key`, which holds `existing`: the same instance
// (a republish) may; anything else is kAlreadyExists naming the holder and
// `where` (e.g. "the etcd cluster at etcd://..."). `expires_hint` is added to
// the message ("; if that engine is gone, its entry expires within 7 s").
Status CheckClaim(const wire::PeerDescriptor& self, const std::string& key,
                  const std::string& existing, const std::string& where,
                  const std::string& expires_hint = "");

// Decodes the value read under `key` for segment `name`: kDataLoss naming
// the key and `where` when it is not a descriptor or not `name`'s.
StatusOr<wire::PeerDescriptor> DecodeEntry(std::string_view name, const std::string& key,
                                           const std::string& value, const std::string& where);

// Base64 (RFC 4648, padded), as etcd's JSON carries keys and values.
std::string Base64(std::string_view in);
// Strict: canonical alphabet, padding only at the end; nullopt otherwise.
std::optional<std::string> Unbase64(std::string_view in);

// The instance id in an encoded descriptor, or nullopt when it does not
// decode (watchers compare instances without trusting the bytes).
std::optional<uint64_t> InstanceOfEntry(const std::string& value);

}  // namespace ferry::internal
