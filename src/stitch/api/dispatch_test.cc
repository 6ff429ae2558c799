#include "stitch/api/dispatch.h"

#include <atomic>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/server.h"

namespace stitch {
namespace {

using ::testing::HasSubstr;
using testing::RawSocket;

TEST(DispatchTest, VersionedPostsBlockedRoutesAndTheRestGoWhereTheyBelong) {
  EventLoop loop;
  std::atomic<int> blocked{0};
  std::string last;  // the loop's thread only, read after each answer
  ApiHandlers handlers;
  handlers.versioned = [&](HttpExchange& ex, ApiRoute route) -> boost::asio::awaitable<void> {
    last = "versioned " + std::string(RoutePath(route));
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  };
  handlers.other = [&](HttpExchange& ex) -> boost::asio::awaitable<void> {
    last = "other " + ex.request().method + " " + ex.request().target;
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  };
  handlers.blocked_why = "not here";
  handlers.on_blocked = [&] { ++blocked; };
  HttpRouter router;
  router.SetFallback([&](HttpExchange& ex) { return DispatchApiRequest(ex, handlers); });
  auto server = HttpServer::Start(loop.executor(), ServerOptions{}, router.AsHandler());
  ASSERT_TRUE(server.ok()) << server.status();

  auto call = [&](std::string method, std::string target) {
    auto r = HttpFetch(method, (*server)->url() + target, method == "POST" ? "{}" : "");
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpResponse{};
  };
  EXPECT_EQ(call("POST", "/v1/chat/completions").status, 200);
  EXPECT_EQ(last, "versioned /v1/chat/completions");
  EXPECT_EQ(call("GET", "/generate").status, 200);
  EXPECT_EQ(last, "other GET /generate");
  EXPECT_EQ(call("GET", "/v1/models?x=1").status, 200);
  EXPECT_EQ(last, "other GET /v1/models?x=1");
  const HttpResponse refused = call("POST", "/update_weights_from_disk/");
  EXPECT_EQ(refused.status, 403);
  EXPECT_THAT(refused.body, HasSubstr("RouteBlocked"));
  EXPECT_THAT(refused.body,
              HasSubstr("/update_weights_from_disk/ is an engine control route: not here"));
  EXPECT_EQ(blocked, 1);

  // Encoded, dotted and doubled forms of a control route are refused too,
  // and what is forwarded is the canonical target.
  EXPECT_EQ(call("POST", "/%70ause_generation").status, 403);
  EXPECT_EQ(call("POST", "/v1/../%75pdate_weights_from_disk").status, 403);
  EXPECT_EQ(call("POST", "//flush_cache").status, 403);
  EXPECT_EQ(blocked, 4);
  EXPECT_EQ(call("GET", "/%67et_model_info?q=%41").status, 200);
  EXPECT_EQ(last, "other GET /get_model_info?q=%41");
  EXPECT_EQ(call("POST", "/v1//chat/completions").status, 200);
  EXPECT_EQ(last, "versioned /v1/chat/completions");
  loop.BlockOn((*server)->Shutdown());
}

// Targets an engine could read otherwise than the sidecar never go on.
TEST(DispatchTest, FragmentsAndUndecodableEscapesAreRefusedWith400) {
  EventLoop loop;
  int forwarded = 0;
  ApiHandlers handlers;
  handlers.versioned = [&](HttpExchange& ex, ApiRoute) -> boost::asio::awaitable<void> {
    ++forwarded;
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  };
  handlers.other = [&](HttpExchange& ex) -> boost::asio::awaitable<void> {
    ++forwarded;
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  };
  HttpRouter router;
  router.SetFallback([&](HttpExchange& ex) { return DispatchApiRequest(ex, handlers); });
  auto server = HttpServer::Start(loop.executor(), ServerOptions{}, router.AsHandler());
  ASSERT_TRUE(server.ok()) << server.status();
  for (const char* target : {"/flush_cache#f", "/flush_cache?%zz", "/%70ause%zz", "/a%00"}) {
    RawSocket socket((*server)->port());
    ASSERT_TRUE(socket.connected());
    socket.Send(
        absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"));
    const std::string answer = socket.ReadUntil("\r\n\r\n");
    EXPECT_THAT(answer, ::testing::StartsWith("HTTP/1.1 400")) << target;
  }
  EXPECT_EQ(forwarded, 0);
  loop.BlockOn((*server)->Shutdown());
}

}  // namespace
}  // namespace stitch
