#include "stitch/net/auth.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/server.h"

namespace stitch {
namespace {

using ::testing::HasSubstr;
using testing::RawSocket;

class TokenFile {
 public:
  explicit TokenFile(const std::string& contents) {
    std::string pattern = (std::filesystem::temp_directory_path() / "auth-XXXXXX").string();
    const int fd = ::mkstemp(pattern.data());
    ::close(fd);
    path_ = pattern;
    std::ofstream(path_) << contents;
  }
  ~TokenFile() { std::filesystem::remove(path_); }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

TEST(AuthTest, ATokenComesFromItsFileOrTheEnvironment) {
  TokenFile file("  s3cret-token \n");
  EXPECT_EQ(LoadBearerToken(file.path(), "STITCH_AUTH_TEST_UNSET", "--auth-token-file").value(),
            "s3cret-token");
  ::setenv("STITCH_AUTH_TEST_TOKEN", "from-env", 1);
  EXPECT_EQ(LoadBearerToken("", "STITCH_AUTH_TEST_TOKEN", "--auth-token-file").value(), "from-env");
  // A file wins over the environment.
  EXPECT_EQ(LoadBearerToken(file.path(), "STITCH_AUTH_TEST_TOKEN", "--auth-token-file").value(),
            "s3cret-token");
  ::unsetenv("STITCH_AUTH_TEST_TOKEN");
  EXPECT_EQ(LoadBearerToken("", "STITCH_AUTH_TEST_TOKEN", "--auth-token-file").value(), "");
}

TEST(AuthTest, UnreadableEmptyOrMultiLineTokensAreRefused) {
  auto missing = LoadBearerToken("/nonexistent/token", "X", "--auth-token-file");
  EXPECT_THAT(missing.status().message(), HasSubstr("--auth-token-file: cannot read"));
  TokenFile empty("\n");
  EXPECT_THAT(LoadBearerToken(empty.path(), "X", "--auth-token-file").status().message(),
              HasSubstr("must hold one non-empty line"));
  TokenFile two("a\nb\n");
  EXPECT_FALSE(LoadBearerToken(two.path(), "X", "--auth-token-file").ok());
}

TEST(AuthTest, OnlyTheExactBearerTokenIsAccepted) {
  auto with = [](std::string value) {
    HttpHeaders h;
    h.Set("Authorization", value);
    return h;
  };
  EXPECT_TRUE(PresentsBearerToken(with("Bearer abc123"), "abc123"));
  EXPECT_TRUE(PresentsBearerToken(with("bearer abc123"), "abc123"));
  EXPECT_FALSE(PresentsBearerToken(with("Bearer abc12"), "abc123"));
  EXPECT_FALSE(PresentsBearerToken(with("Bearer abc1234"), "abc123"));
  EXPECT_FALSE(PresentsBearerToken(with("Bearer abd123"), "abc123"));
  EXPECT_FALSE(PresentsBearerToken(with("Basic abc123"), "abc123"));
  EXPECT_FALSE(PresentsBearerToken(with("abc123"), "abc123"));
  EXPECT_FALSE(PresentsBearerToken(HttpHeaders{}, "abc123"));
  EXPECT_EQ(BearerValue("abc"), "Bearer abc");
}

// A router whose POST /wake needs the token "tok".
HttpRouter WakeRouter() {
  HttpRouter router;
  router.Add(
      "POST", "/wake",
      [](HttpExchange& ex) -> boost::asio::awaitable<void> {
        (void)co_await ex.Respond(JsonResponse(200, "{}"));
      },
      "tok");
  return router;
}

TEST(AuthTest, AGuardedRouteAnswers401WithoutTheToken) {
  EventLoop loop;
  HttpRouter router = WakeRouter();
  router.Add("GET", "/open", [](HttpExchange& ex) -> boost::asio::awaitable<void> {
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  });
  // The router answers by itself, and at the header with its TokenCheck.
  for (bool at_head : {false, true}) {
    ServerOptions options;
    if (at_head) options.head_check = router.TokenCheck();
    auto server = HttpServer::Start(loop.executor(), options, router.AsHandler());
    ASSERT_TRUE(server.ok()) << server.status();
    const std::string url = (*server)->url();

    auto refused = HttpFetch("POST", url + "/wake", "{}");
    ASSERT_TRUE(refused.ok()) << refused.status();
    EXPECT_EQ(refused->status, 401);
    EXPECT_THAT(refused->body, HasSubstr("\"type\":\"Unauthorized\""));
    EXPECT_THAT(refused->body, HasSubstr("POST /wake needs the bearer token"));
    EXPECT_EQ(refused->headers.Get("WWW-Authenticate"), "Bearer");

    FetchOptions wrong;
    wrong.headers.Set("Authorization", "Bearer nope");
    EXPECT_EQ(HttpFetch("POST", url + "/wake", "{}", wrong)->status, 401);
    FetchOptions right;
    right.headers.Set("Authorization", "Bearer tok");
    EXPECT_EQ(HttpFetch("POST", url + "/wake", "{}", right)->status, 200);
    EXPECT_EQ(HttpFetch("GET", url + "/open")->status, 200);
    EXPECT_EQ((*server)->stats().refused_at_head, at_head ? 2u : 0u);
    loop.BlockOn((*server)->Shutdown());
  }
}

// With two, the first would decide here and another hop might read the
// other: right-then-wrong and wrong-then-right are both refused.
TEST(AuthTest, TwoAuthorizationHeadersAreABadRequest) {
  EventLoop loop;
  HttpRouter router = WakeRouter();
  ServerOptions options;
  options.head_check = router.TokenCheck();
  auto server = HttpServer::Start(loop.executor(), options, router.AsHandler());
  ASSERT_TRUE(server.ok()) << server.status();
  for (const char* pair : {"Authorization: Bearer tok\r\nAuthorization: Bearer nope\r\n",
                           "Authorization: Bearer nope\r\nauthorization: Bearer tok\r\n"}) {
    RawSocket socket((*server)->port());
    ASSERT_TRUE(socket.connected());
    socket.Send(
        absl::StrCat("POST /wake HTTP/1.1\r\nHost: x\r\n", pair, "Content-Length: 2\r\n\r\n{}"));
    const std::string answer = socket.ReadUntil("\r\n\r\n");
    EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 400")) << pair;
  }
  loop.BlockOn((*server)->Shutdown());
}

}  // namespace
}  // namespace stitch
