#include "stitch/api/dispatch.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <span>
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

// A server on `loop` that routes every request through DispatchApiRequest
// with `handlers`, which must outlive it.
absl::StatusOr<std::unique_ptr<HttpServer>> StartDispatching(EventLoop& loop,
                                                             const ApiHandlers& handlers) {
  HttpRouter router;
  router.SetFallback([&handlers](HttpExchange& ex) { return DispatchApiRequest(ex, handlers); });
  return HttpServer::Start(loop.executor(), ServerOptions{}, router.AsHandler());
}

// Handlers for an SGLang engine that answer 200 and note in `last` where
// each request went ("versioned /generate", "other GET /health"), counting
// refusals in `refused`.
ApiHandlers Recording(std::string& last, std::atomic<int>& refused) {
  ApiHandlers handlers;
  handlers.versioned = [&last](HttpExchange& ex, ApiRoute route) -> boost::asio::awaitable<void> {
    last = "versioned " + std::string(RoutePath(route));
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  };
  handlers.other = [&last](HttpExchange& ex) -> boost::asio::awaitable<void> {
    last = "other " + ex.request().method + " " + ex.request().target;
    (void)co_await ex.Respond(JsonResponse(200, "{}"));
  };
  handlers.on_blocked = [&refused] { ++refused; };
  handlers.dialects = {EngineDialect::kSglang};
  return handlers;
}

// One request to `server`; a POST carries "{}".
HttpResponse Call(const HttpServer& server, const std::string& method, const std::string& target) {
  auto r = HttpFetch(method, server.url() + target, method == "POST" ? "{}" : "");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : HttpResponse{};
}

TEST(DispatchTest, VersionedPostsBlockedRoutesAndTheRestGoWhereTheyBelong) {
  EventLoop loop;
  std::atomic<int> blocked{0};
  std::string last;  // the loop's thread only, read after each answer
  ApiHandlers handlers = Recording(last, blocked);
  handlers.blocked_why = "not here";
  auto server = StartDispatching(loop, handlers);
  ASSERT_TRUE(server.ok()) << server.status();
  auto call = [&](const std::string& method, const std::string& target) {
    return Call(**server, method, target);
  };
  EXPECT_EQ(call("POST", "/v1/chat/completions").status, 200);
  EXPECT_EQ(last, "versioned /v1/chat/completions");
  const HttpResponse get = call("GET", "/generate");
  EXPECT_EQ(get.status, 405);
  EXPECT_THAT(get.body, HasSubstr("it is a versioned route: use POST"));
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

// Only the read-only routes of the engines behind the server are forwarded:
// a control route the block list lacks, a generation route that carries no
// version and any unnamed route are refused, each saying what to use.
TEST(DispatchTest, OnlyTheEnginesReadOnlyRoutesAreForwarded) {
  EventLoop loop;
  std::atomic<int> refused{0};
  std::string last;
  const ApiHandlers handlers = Recording(last, refused);
  auto server = StartDispatching(loop, handlers);
  ASSERT_TRUE(server.ok()) << server.status();
  auto call = [&](const std::string& method, const std::string& target) {
    return Call(**server, method, target);
  };
  for (const char* target :
       {"/health", "/get_model_info", "/v1/models", "/v1/models/policy", "/metrics", "/%68ealth"}) {
    last.clear();
    EXPECT_EQ(call("GET", target).status, 200) << target;
    EXPECT_FALSE(last.empty()) << target;
  }
  for (const char* target :
       {"/send_weights_to_remote_instance", "/slow_down", "/get_weights_by_name", "/open_session",
        "/configure_logging", "/tokenize", "/v1/models/", "/health/", "/HEALTH", "/anything"}) {
    const HttpResponse r = call("POST", target);
    EXPECT_EQ(r.status, 403) << target;
    EXPECT_THAT(r.body, HasSubstr("RouteNotForwarded")) << target;
    EXPECT_THAT(r.body, HasSubstr("is not forwarded to the engine")) << target;
    EXPECT_THAT(r.body, HasSubstr("/get_model_info")) << target;  // what to use
  }
  for (const char* target :
       {"/invocations", "/v1/responses", "/vertex_generate", "/generate_from_file"}) {
    const HttpResponse r = call("POST", target);
    EXPECT_EQ(r.status, 403) << target;
    EXPECT_THAT(r.body, HasSubstr("generates without a weight version")) << target;
    EXPECT_THAT(r.body, HasSubstr("POST /generate, /v1/completions")) << target;
  }
  EXPECT_EQ(refused, 14);
  loop.BlockOn((*server)->Shutdown());
}

// A server's own route that reaches dispatch (its router matched it only
// as spelled) is answered there, never forwarded: another spelling 404,
// another method on the exact path 405.
TEST(DispatchTest, OwnRoutesSpelledOtherwiseAreAnsweredNotForwarded) {
  EventLoop loop;
  std::atomic<int> refused{0};
  std::string last;
  ApiHandlers handlers = Recording(last, refused);
  handlers.own_routes = {{"POST", "/wake"}, {"GET", "/metrics"}};
  auto server = StartDispatching(loop, handlers);
  ASSERT_TRUE(server.ok()) << server.status();
  for (const char* target : {"/%77ake", "//wake", "/wake/", "/WAKE", "/v1/../wake"}) {
    const HttpResponse r = Call(**server, "POST", target);
    EXPECT_EQ(r.status, 404) << target;
    EXPECT_THAT(r.body, HasSubstr("spelled otherwise")) << target;
    EXPECT_THAT(r.body, HasSubstr("send POST /wake")) << target;
  }
  const HttpResponse method = Call(**server, "GET", "/wake");
  EXPECT_EQ(method.status, 405);
  EXPECT_EQ(method.headers.Get("allow"), "POST");
  // /metrics is a read-only engine route too: as its own route it is not
  // forwarded in any spelling.
  EXPECT_EQ(Call(**server, "GET", "/%6detrics").status, 404);
  EXPECT_EQ(last, "");
  EXPECT_EQ(refused, 0);
  loop.BlockOn((*server)->Shutdown());
}

TEST(RoutesTest, EachDialectForwardsItsOwnReadOnlyRoutes) {
  const EngineDialect sglang[] = {EngineDialect::kSglang};
  const EngineDialect vllm[] = {EngineDialect::kVllm};
  EXPECT_EQ(NotForwardedWhy("/tokenize", vllm), std::nullopt);
  EXPECT_NE(NotForwardedWhy("/tokenize", sglang), std::nullopt);
  EXPECT_EQ(NotForwardedWhy("/get_model_info", sglang), std::nullopt);
  EXPECT_NE(NotForwardedWhy("/get_model_info", vllm), std::nullopt);
  EXPECT_EQ(NotForwardedWhy("/get_model_info", kEngineDialects), std::nullopt);
  EXPECT_NE(NotForwardedWhy("/is_sleeping", kEngineDialects), std::nullopt);
  EXPECT_NE(NotForwardedWhy("/v1/models", std::span<const EngineDialect>()), std::nullopt);
  for (EngineDialect dialect : kEngineDialects) {
    const auto routes = ReadOnlyRoutes(dialect);
    EXPECT_TRUE(std::is_sorted(routes.begin(), routes.end())) << DialectName(dialect);
  }
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
  auto server = StartDispatching(loop, handlers);
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
