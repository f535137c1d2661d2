// The metadata services this Ferry can publish to and look peers up in
// (EngineOptions::metadata), as `ferry info` lists them.
#pragma once

#include <string>
#include <vector>

#include "ferry/export.h"

namespace ferry {

struct MetadataBackendInfo {
  std::string name;         // "p2p", "memory", "http", "etcd", "redis"
  std::string form;         // how a connection string looks: "etcd://HOST:PORT[,HOST:PORT...]"
  std::string description;  // one line: what it is
  bool built = false;       // false: this build lacks a library it needs
  std::string missing;      // when !built: what to install and rebuild with
};

// Every backend Ferry knows, built in or not, in a fixed order.
FERRY_API std::vector<MetadataBackendInfo> ListMetadataBackends();

// The backend a connection string selects ("p2p" for "" and "P2PHANDSHAKE",
// "etcd" for a bare "HOST:PORT"), or "" when no backend takes it. Does not
// check the rest of the string: Engine::Create does.
FERRY_API std::string MetadataBackendOf(const std::string& url);

// `url` with any password replaced by "***" ("redis://alice:***@h:6379/2"),
// for messages, logs and `ferry info`.
FERRY_API std::string RedactMetadataUrl(const std::string& url);

}  // namespace ferry
