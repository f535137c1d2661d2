// The metadata registry: every store backend Ferry knows, built into this
// build or not, with how its connection strings look and its factory, in a
// fixed order (metadata.cc holds the table).
//
// Adding a backend: its folder under src/metadata/ with a CMakeLists.txt
// that adds its sources to the library, a function there returning its
// MetadataBackend entry (below), and one line in the table. A backend that
// needs an optional library compiles its entry always (NAME_backend.cc) and
// either its store (NAME_store.cc) or, without the library, NAME_missing.cc,
// whose StoreLacks function names the packages to install.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "ferry/status.h"
#include "metadata/metadata.h"

namespace ferry::internal {

struct MetadataBackend {
  using Factory = StatusOr<std::unique_ptr<MetadataStore>> (*)(std::string_view url,
                                                               const MetadataContext& ctx);

  std::string_view name;         // "etcd": what MetadataBackendName answers
  std::string_view form;         // how its connection strings look, for messages and `ferry info`
  std::string_view description;  // one line: what it is
  // Whether `url` is this backend's (its scheme; the rest is `make`'s to check).
  bool (*takes)(std::string_view url);
  // Whether its keys live under MetadataContext::cluster (checked before `make`).
  bool keyed;
  // "" where this build has the backend, else the packages it needs.
  std::string_view (*lacks)();
  // MakeMetadataStore calls it only where `lacks()` is ""; a missing
  // store's (NAME_missing.cc) returns NotBuiltError.
  Factory make;
};

// Whether `url` starts with `scheme` ("redis://"), for `takes`.
inline bool HasScheme(std::string_view url, std::string_view scheme) {
  return url.substr(0, scheme.size()) == scheme;
}

// `lacks` of the backends every build has.
inline std::string_view NothingLacking() { return ""; }

// Every backend, built or not, in the order `ferry info` lists them. No two
// take the same string.
std::span<const MetadataBackend> MetadataBackends();

// The backend whose `takes` accepts `url`, or null.
const MetadataBackend* FindMetadataBackend(std::string_view url);

// kUnimplemented: "metadata 'URL': this build has no NAME metadata client
// (install PACKAGES and rebuild)", the password in `url` hidden.
Status NotBuiltError(std::string_view url, const MetadataBackend& backend);

// Each backend's entry (defined in its folder).
MetadataBackend P2PBackend();
MetadataBackend MemoryBackend();
MetadataBackend HttpBackend();
MetadataBackend EtcdBackend();
MetadataBackend RedisBackend();

// Each store's factory, for the table and for tests that make one store
// directly. `url` is the whole connection string; kInvalidArgument naming it
// when it is malformed. In a build without the store's library,
// kUnimplemented (NotBuiltError).
StatusOr<std::unique_ptr<MetadataStore>> MakeP2PStore(std::string_view url,
                                                      const MetadataContext& ctx);
StatusOr<std::unique_ptr<MetadataStore>> MakeMemoryStore(std::string_view url,
                                                         const MetadataContext& ctx);
StatusOr<std::unique_ptr<MetadataStore>> MakeHttpStore(std::string_view url,
                                                       const MetadataContext& ctx);
StatusOr<std::unique_ptr<MetadataStore>> MakeEtcdStore(std::string_view url,
                                                       const MetadataContext& ctx);
StatusOr<std::unique_ptr<MetadataStore>> MakeRedisStore(std::string_view url,
                                                        const MetadataContext& ctx);

// What each optional store lacks in this build: "" in builds that have it
// (NAME_store.cc), else the packages to install (NAME_missing.cc).
std::string_view HttpStoreLacks();
std::string_view EtcdStoreLacks();
std::string_view RedisStoreLacks();

}  // namespace ferry::internal
