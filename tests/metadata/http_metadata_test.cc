// What only the HTTP store has (the behaviour every store shares is in
// metadata_stores_test.cc): `ferry metadata-server` exits cleanly on SIGTERM,
// malformed http:// URLs and an unreachable server are clear errors at
// engine creation.
#ifdef FERRY_HAVE_HTTP_METADATA

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "ferry/ferry.h"
#include "tests/testing/child_process.h"
#include "tests/testing/services.h"
#include "tests/testing/status_matchers.h"

#ifndef FERRY_CLI_PATH
#error "FERRY_CLI_PATH must name the ferry executable"
#endif

namespace ferry::test {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

EngineOptions Options(const std::string& url) {
  EngineOptions o;
  o.transport = "tcp";
  o.listen_host = "127.0.0.1";
  o.metadata = url;
  o.local_name = "prefill-0";
  o.connect_timeout = 1s;
  return o;
}

TEST(HttpMetadataTest, ServerExitsZeroOnSigtermAndEnginesThenCannotReachIt) {
  ChildProcess server;
  ASSERT_TRUE(server.Start(FERRY_CLI_PATH, {"metadata-server", "--port", "0"}));
  std::string line;
  ASSERT_TRUE(server.ReadLine(&line, 30s));
  const std::string prefix = "metadata-server listening on 127.0.0.1:";
  ASSERT_EQ(line.rfind(prefix, 0), 0u) << line;
  const std::string url = "http://127.0.0.1:" + line.substr(prefix.size()) + "/metadata";
  auto e = Engine::Create(Options(url));
  ASSERT_OK(e.status());
  std::unique_ptr<Engine> prefill = std::move(e).value();
  ASSERT_EQ(server.Terminate(), 0) << "the server must exit 0 on SIGTERM";
  EXPECT_THAT(prefill->OpenSegment("decode-9").status(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("metadata service")));
  prefill.reset();  // Remove fails quietly; the refresh thread stops
}

TEST(HttpMetadataTest, MalformedUrlsAndAnUnreachableServerAreClearErrors) {
  for (const std::string url :
       {"http://", "http://:8080/metadata", "http://127.0.0.1:99999/metadata",
        "http://127.0.0.1:abc/metadata", "https://127.0.0.1:8080/metadata",
        "http://127.0.0.1:8080/metadata?key=x"}) {
    EXPECT_THAT(Engine::Create(Options(url)).status(),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(url)))
        << url;
  }
  const std::vector<uint16_t> free_port = FreeLoopbackPorts(1);
  ASSERT_EQ(free_port.size(), 1u);
  const std::string url = "http://127.0.0.1:" + std::to_string(free_port[0]) + "/metadata";
  EXPECT_THAT(
      Engine::Create(Options(url)).status(),
      StatusIs(StatusCode::kUnavailable, HasSubstr("cannot reach the metadata service at " + url)));
}

}  // namespace
}  // namespace ferry::test

#endif  // FERRY_HAVE_HTTP_METADATA
