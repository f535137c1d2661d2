// The metadata registry (metadata/registry.h): the table's order, which
// backend takes which connection string, and the errors MakeMetadataStore
// gives before any store runs (unknown strings, backends this build lacks,
// bad cluster names). No service is needed.
#include "metadata/registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/metadata.h"
#include "tests/testing/status_matchers.h"

namespace ferry::internal {
namespace {

using ::ferry::test::IsOk;
using ::ferry::test::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// One connection string of each backend, in the table's order.
const std::vector<std::pair<std::string, std::string>>& Examples() {
  static const std::vector<std::pair<std::string, std::string>> kExamples = {
      {"p2p", ""},
      {"p2p", "P2PHANDSHAKE"},
      {"memory", "memory://unit"},
      {"http", "http://127.0.0.1:1/metadata"},
      {"http", "https://127.0.0.1:1"},
      {"etcd", "etcd://127.0.0.1:1"},
      {"etcd", "127.0.0.1:1,127.0.0.2:2"},
      {"redis", "redis://:pw@127.0.0.1:1/0"},
      {"redis", "rediss://127.0.0.1:1"},
  };
  return kExamples;
}

TEST(MetadataRegistry, TableListsEveryBackendOnceInAFixedOrder) {
  std::vector<std::string> names;
  for (const MetadataBackend& b : MetadataBackends()) names.emplace_back(b.name);
  EXPECT_THAT(names, ElementsAre("p2p", "memory", "http", "etcd", "redis"));
}

TEST(MetadataRegistry, ListMetadataBackendsIsTheTable) {
  const std::vector<MetadataBackendInfo> listed = ListMetadataBackends();
  const auto table = MetadataBackends();
  ASSERT_EQ(listed.size(), table.size());
  for (size_t i = 0; i < listed.size(); ++i) {
    SCOPED_TRACE(listed[i].name);
    EXPECT_EQ(listed[i].name, table[i].name);
    EXPECT_EQ(listed[i].form, table[i].form);
    EXPECT_EQ(listed[i].description, table[i].description);
    EXPECT_EQ(listed[i].built, table[i].lacks().empty());
    EXPECT_EQ(listed[i].missing, table[i].lacks());
  }
}

TEST(MetadataRegistry, EachConnectionStringIsTakenByExactlyOneBackend) {
  for (const auto& [backend, url] : Examples()) {
    SCOPED_TRACE(url);
    int takers = 0;
    for (const MetadataBackend& b : MetadataBackends()) takers += b.takes(url) ? 1 : 0;
    EXPECT_EQ(takers, 1);
    EXPECT_EQ(MetadataBackendName(url), backend);
    EXPECT_EQ(MetadataBackendOf(url), backend);
  }
  for (const std::string url : {"foo://h:1", "h:abc", "h:1,", ":1", "memory:/x", "p2phandshake"}) {
    EXPECT_EQ(MetadataBackendName(url), "") << url;
    EXPECT_EQ(FindMetadataBackend(url), nullptr) << url;
  }
}

TEST(MetadataRegistry, UnknownStringsAreInvalidArgumentsListingEveryFormWithoutThePassword) {
  auto store = MakeMetadataStore("zookeeper://alice:secret@h:2181", MetadataContext{});
  EXPECT_THAT(store, StatusIs(StatusCode::kInvalidArgument,
                              AllOf(HasSubstr("'zookeeper://alice:***@h:2181'"),
                                    HasSubstr("unknown kind of connection string"),
                                    Not(HasSubstr("secret")))));
  for (const MetadataBackend& b : MetadataBackends()) {
    EXPECT_THAT(store, StatusIs(StatusCode::kInvalidArgument, HasSubstr(std::string(b.form))));
  }
}

TEST(MetadataRegistry, NotBuiltErrorSaysWhatToInstallWithoutThePassword) {
  const MetadataBackend fake{"fake",       "fake://H",
                             "a stand-in", [](std::string_view) { return true; },
                             true,         [] { return std::string_view("libfake-dev"); },
                             nullptr};
  EXPECT_THAT(NotBuiltError("fake://u:pw@h", fake),
              StatusIs(StatusCode::kUnimplemented,
                       AllOf(HasSubstr("metadata 'fake://u:***@h'"),
                             HasSubstr("this build has no fake metadata client"),
                             HasSubstr("install libfake-dev and rebuild"), Not(HasSubstr("pw@")))));
}

TEST(MetadataRegistry, BackendsThisBuildLacksAreUnimplementedNamingThePackages) {
  for (const auto& [backend, url] : Examples()) {
    const MetadataBackend* b = FindMetadataBackend(url);
    ASSERT_NE(b, nullptr) << url;
    if (b->lacks().empty()) continue;  // built here: its own tests cover it
    EXPECT_THAT(MakeMetadataStore(url, MetadataContext{}),
                StatusIs(StatusCode::kUnimplemented, HasSubstr(std::string(b->lacks()))))
        << url;
    EXPECT_THAT(b->make(url, MetadataContext{}), StatusIs(StatusCode::kUnimplemented)) << url;
  }
}

TEST(MetadataRegistry, KeyedBackendsCheckTheClusterNameFirst) {
  MetadataContext ctx;
  ctx.cluster = "no spaces";
  for (const MetadataBackend& b : MetadataBackends()) {
    SCOPED_TRACE(b.name);
    EXPECT_EQ(b.keyed, b.name != "p2p");
  }
  EXPECT_THAT(MakeMetadataStore("memory://unit", ctx),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no spaces")));
}

TEST(MetadataRegistry, MemoryNeedsAClusterName) {
  EXPECT_THAT(
      MakeMetadataStore("memory://", MetadataContext{}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("names no cluster (memory://NAME)")));
  EXPECT_THAT(MakeMetadataStore("memory://unit", MetadataContext{}), IsOk());
}

}  // namespace
}  // namespace ferry::internal
