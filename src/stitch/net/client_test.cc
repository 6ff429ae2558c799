#include "stitch/net/client.h"

#include <atomic>
#include <chrono>
#include <string>
#include <variant>

#include <gtest/gtest.h>
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "stitch/net/net_test_util.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using std::chrono::milliseconds;
using testing::Echo;
using testing::Get;
using testing::Harness;
using testing::Post;
using testing::ScriptedServer;

constexpr absl::Duration kWait = absl::Seconds(20);

// A handler that streams "partial", then holds the rest of the body until
// the client goes away.
struct PartialStream {
  absl::Notification saw_disconnect;
  HttpHandler Handler() {
    return [this](HttpExchange& ex) -> awaitable<void> {
      (void)co_await ex.BeginStream(200, HttpHeaders());
      (void)co_await ex.WriteChunk("partial");
      co_await ex.WaitDisconnected();
      saw_disconnect.Notify();
    };
  }
};

// A handler that holds the request until the client goes away.
struct Holder {
  absl::Notification started;
  absl::Notification saw_disconnect;
  HttpHandler Handler() {
    return [this](HttpExchange& ex) -> awaitable<void> {
      started.Notify();
      co_await ex.WaitDisconnected();
      saw_disconnect.Notify();
    };
  }
};

TEST(HttpClientTest, ConnectRefusedIsUnavailableAndNamesTheUrl) {
  EventLoop loop;
  HttpClient client(loop.executor());
  uint16_t port = testing::UnusedPort();
  auto r = loop.BlockOn(client.Send({"127.0.0.1", port}, Get("/server_info")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(
      r.status().message().find("GET http://127.0.0.1:" + std::to_string(port) + "/server_info"),
      std::string::npos)
      << r.status();
}

TEST(HttpClientTest, ResponseTimeoutIsDeadlineExceededAndClosesTheConnection) {
  Holder holder;
  Harness h(holder.Handler());
  CallOptions options;
  options.timeout = milliseconds(100);
  auto r = h.Send(Post("/generate", "{}"), options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_TRUE(holder.started.WaitForNotificationWithTimeout(kWait));
  ASSERT_TRUE(holder.saw_disconnect.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(h.client->idle_connections(), 0u);
}

TEST(HttpClientTest, StreamIdleTimeoutEndsARead) {
  PartialStream partial;
  Harness h(partial.Handler());
  CallOptions options;
  options.stream_idle_timeout = milliseconds(100);
  absl::Status second_read = h.client_loop.BlockOn([&]() -> awaitable<absl::Status> {
    auto stream = co_await h.client->SendStreamed(h.origin(), Post("/generate", "{}"), options);
    if (!stream.ok()) co_return stream.status();
    auto first = co_await stream->Read();
    EXPECT_TRUE(first.ok() && *first == "partial");
    auto second = co_await stream->Read();
    EXPECT_TRUE(stream->finished());
    co_return second.status();
  }());
  EXPECT_EQ(second_read.code(), absl::StatusCode::kDeadlineExceeded) << second_read;
  ASSERT_TRUE(partial.saw_disconnect.WaitForNotificationWithTimeout(kWait));
}

TEST(HttpClientTest, RetriesAnIdempotentRequestOnceWhenThePooledConnectionIsDead) {
  ScriptedServer upstream({
      [](int fd) {
        ScriptedServer::ReadHead(fd);
        ScriptedServer::Write(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
        ScriptedServer::ReadHead(fd);  // takes the second request, then hangs up
      },
      [](int fd) {
        ScriptedServer::ReadHead(fd);
        ScriptedServer::Write(fd, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
      },
  });
  EventLoop loop;
  HttpClient client(loop.executor());
  HttpOrigin origin{"127.0.0.1", upstream.port()};
  auto first = loop.BlockOn(client.Send(origin, Get("/a")));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->body, "first");
  auto second = loop.BlockOn(client.Send(origin, Get("/b")));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->body, "second");
  EXPECT_EQ(upstream.accepted(), 2);
  EXPECT_EQ(client.connections_opened(), 2u);
}

TEST(HttpClientTest, NeverResendsAPostThatMayHaveBeenReceived) {
  ScriptedServer upstream({
      [](int fd) {
        ScriptedServer::ReadHead(fd);
        ScriptedServer::Write(fd, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
        ScriptedServer::ReadHead(fd);  // takes the POST, then hangs up without answering
      },
  });
  EventLoop loop;
  HttpClient client(loop.executor());
  HttpOrigin origin{"127.0.0.1", upstream.port()};
  ASSERT_TRUE(loop.BlockOn(client.Send(origin, Get("/a"))).ok());
  CallOptions options;
  options.timeout = milliseconds(10000);  // a wrong retry would hang until this expires
  auto post = loop.BlockOn(client.Send(origin, Post("/generate", "{}"), options));
  ASSERT_FALSE(post.ok());
  EXPECT_EQ(post.status().code(), absl::StatusCode::kUnavailable) << post.status();
  EXPECT_EQ(client.connections_opened(), 1u);
}

TEST(HttpClientTest, CancellationThroughASlotClosesTheUpstreamConnection) {
  Holder holder;
  Harness h(holder.Handler());
  boost::asio::cancellation_signal signal;  // client loop thread only
  absl::StatusOr<HttpResponse> result;
  absl::Notification done;
  Spawn(h.client_loop.executor(),
        [](HttpClient* client, HttpOrigin origin, boost::asio::cancellation_signal* signal,
           absl::StatusOr<HttpResponse>* result, absl::Notification* done) -> awaitable<void> {
          *result = co_await boost::asio::co_spawn(
              co_await boost::asio::this_coro::executor,
              client->Send(origin, Post("/generate", "{}")),
              boost::asio::bind_cancellation_slot(signal->slot(), boost::asio::use_awaitable));
          done->Notify();
        }(&*h.client, h.origin(), &signal, &result, &done));
  ASSERT_TRUE(holder.started.WaitForNotificationWithTimeout(kWait));
  boost::asio::post(h.client_loop.executor(),
                    [&] { signal.emit(boost::asio::cancellation_type::terminal); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  ASSERT_TRUE(holder.saw_disconnect.WaitForNotificationWithTimeout(kWait));
}

TEST(HttpClientTest, AnAbortClosesTheCallsConnectionAndTheCallIsCancelled) {
  Holder holder;
  Harness h(holder.Handler());
  HttpCallAbort abort;  // client loop thread only
  absl::StatusOr<HttpResponse> result;
  absl::Notification done;
  Spawn(h.client_loop.executor(),
        [](HttpClient* client, HttpOrigin origin, HttpCallAbort* abort,
           absl::StatusOr<HttpResponse>* result, absl::Notification* done) -> awaitable<void> {
          CallOptions options;
          options.abort = abort;
          *result = co_await client->Send(origin, Post("/generate", "{}"), options);
          done->Notify();
        }(&*h.client, h.origin(), &abort, &result, &done));
  ASSERT_TRUE(holder.started.WaitForNotificationWithTimeout(kWait));
  EXPECT_FALSE(done.HasBeenNotified());
  boost::asio::post(h.client_loop.executor(), [&] { abort.Abort(); });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  // The upstream saw its client go, and nothing went back to the pool.
  ASSERT_TRUE(holder.saw_disconnect.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(h.client->idle_connections(), 0u);
}

TEST(HttpClientTest, AnAbortThatFiredBeforeTheCallKeepsItFromConnecting) {
  Harness h(Echo);
  HttpCallAbort abort;
  abort.Abort();
  CallOptions options;
  options.abort = &abort;
  auto r = h.Send(Post("/generate", "{}"), options);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_EQ(h.client->connections_opened(), 0u);
  EXPECT_EQ(h.server->stats().requests, 0u);
}

TEST(HttpClientTest, AnAbortAfterItsCallEndedLeavesThePooledConnectionAlone) {
  Harness h(Echo);
  HttpCallAbort abort;
  CallOptions options;
  options.abort = &abort;
  auto first = h.Send(Post("/one", "1"), options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(h.client->idle_connections(), 1u);
  // Fired after the call returned its connection to the pool: the pooled
  // connection must not be the one it closes.
  h.client_loop.BlockOn([](HttpCallAbort* a) -> awaitable<void> {
    a->Abort();
    co_return;
  }(&abort));
  auto second = h.Send(Post("/two", "2"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->body, "2");
  EXPECT_EQ(h.client->connections_opened(), 1u);
}

TEST(HttpClientTest, AnAbortDuringAStreamClosesItsConnectionAndTheReadIsCancelled) {
  PartialStream partial;
  Harness h(partial.Handler());
  HttpCallAbort abort;
  auto [first, second] =
      h.client_loop.BlockOn([&]() -> awaitable<std::pair<std::string, absl::Status>> {
        CallOptions options;
        options.abort = &abort;
        auto stream = co_await h.client->SendStreamed(h.origin(), Get("/s"), options);
        if (!stream.ok()) co_return std::pair{std::string(), stream.status()};
        auto chunk = co_await stream->Read();
        // Fired while the server holds the rest of the body.
        abort.Abort();
        auto rest = co_await stream->Read();
        EXPECT_TRUE(stream->finished());
        co_return std::pair{chunk.ok() ? *chunk : chunk.status().ToString(), rest.status()};
      }());
  EXPECT_EQ(first, "partial");
  EXPECT_EQ(second.code(), absl::StatusCode::kCancelled) << second;
  ASSERT_TRUE(partial.saw_disconnect.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(h.client->idle_connections(), 0u);
}

TEST(HttpClientTest, AStreamReadToItsEndLeavesItsAbort) {
  Harness h([](HttpExchange& ex) -> awaitable<void> {
    (void)co_await ex.BeginStream(200, HttpHeaders());
    (void)co_await ex.WriteChunk("all");
    (void)co_await ex.EndStream();
  });
  HttpCallAbort abort;
  CallOptions options;
  options.abort = &abort;
  std::string body = h.client_loop.BlockOn([&]() -> awaitable<std::string> {
    auto stream = co_await h.client->SendStreamed(h.origin(), Get("/s"), options);
    if (!stream.ok()) co_return stream.status().ToString();
    auto all = co_await stream->ReadAll();
    // The connection went back to the pool: an abort now must not close it.
    abort.Abort();
    co_return all.ok() ? *all : all.status().ToString();
  }());
  EXPECT_EQ(body, "all");
  auto again = h.Send(Get("/again"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(h.client->connections_opened(), 1u);
}

TEST(HttpClientTest, ComposesWithAwaitableOperators) {
  Holder holder;
  Harness h(holder.Handler());
  using namespace boost::asio::experimental::awaitable_operators;
  size_t winner = h.client_loop.BlockOn([&]() -> awaitable<size_t> {
    boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
    timer.expires_after(milliseconds(50));
    auto r = co_await (h.client->Send(h.origin(), Post("/generate", "{}")) ||
                       timer.async_wait(boost::asio::use_awaitable));
    co_return r.index();
  }());
  EXPECT_EQ(winner, 1u);  // the timer won; the request was cancelled
  ASSERT_TRUE(holder.saw_disconnect.WaitForNotificationWithTimeout(kWait));
}

TEST(HttpClientTest, ClosingAStreamEarlyClosesItsConnection) {
  PartialStream partial;
  Harness h(partial.Handler());
  std::string first = h.client_loop.BlockOn([&]() -> awaitable<std::string> {
    auto stream = co_await h.client->SendStreamed(h.origin(), Get("/s"));
    if (!stream.ok()) co_return stream.status().ToString();
    auto chunk = co_await stream->Read();
    stream->Close();
    EXPECT_TRUE(stream->finished());
    co_return chunk.ok() ? *chunk : chunk.status().ToString();
  }());
  EXPECT_EQ(first, "partial");
  ASSERT_TRUE(partial.saw_disconnect.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(h.client->idle_connections(), 0u);
}

TEST(HttpClientTest, ReadAllCollectsAStreamedBody) {
  Harness h([](HttpExchange& ex) -> awaitable<void> {
    (void)co_await ex.BeginStream(200, HttpHeaders());
    for (int i = 0; i < 100; ++i) (void)co_await ex.WriteChunk(std::to_string(i) + ",");
    (void)co_await ex.EndStream();
  });
  auto body = h.client_loop.BlockOn([&]() -> awaitable<absl::StatusOr<std::string>> {
    auto stream = co_await h.client->SendStreamed(h.origin(), Get("/s"));
    if (!stream.ok()) co_return stream.status();
    co_return co_await stream->ReadAll();
  }());
  ASSERT_TRUE(body.ok()) << body.status();
  std::string expected;
  for (int i = 0; i < 100; ++i) expected += std::to_string(i) + ",";
  EXPECT_EQ(*body, expected);
  EXPECT_EQ(h.client->idle_connections(), 1u);
}

TEST(HttpClientTest, ResponseBodyOverTheLimitIsResourceExhausted) {
  ClientOptions client_options;
  client_options.max_response_body_bytes = 1000;
  Harness h(Echo, {}, client_options);
  auto ok = h.Send(Post("/", std::string(1000, 'a')));
  ASSERT_TRUE(ok.ok()) << ok.status();
  auto r = h.Send(Post("/", std::string(5000, 'a')));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
}

TEST(HttpClientTest, MalformedResponseIsUnavailable) {
  ScriptedServer upstream({[](int fd) {
    ScriptedServer::ReadHead(fd);
    ScriptedServer::Write(fd, "SPDY/9 banana\r\n\r\n");
  }});
  EventLoop loop;
  HttpClient client(loop.executor());
  auto r = loop.BlockOn(client.Send({"127.0.0.1", upstream.port()}, Get("/")));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("malformed"), std::string::npos) << r.status();
}

TEST(HttpClientTest, IdleConnectionsPerOriginAreBounded) {
  int arrived = 0;
  Harness h(
      [&](HttpExchange& ex) -> awaitable<void> {
        if (++arrived == 5) h.gate->Open();
        co_await h.gate->Wait();
        (void)co_await ex.Respond(testing::Text(200, "ok"));
      },
      {}, ClientOptions{.max_idle_per_origin = 2});
  struct Shared {
    std::atomic<int> remaining{5};
    std::atomic<int> ok{0};
    absl::Notification done;
  } shared;
  for (int i = 0; i < 5; ++i) {
    Spawn(h.client_loop.executor(),
          [](HttpClient* client, HttpOrigin origin, Shared* shared) -> awaitable<void> {
            auto r = co_await client->Send(origin, Get("/"));
            if (r.ok() && r->status == 200) ++shared->ok;
            if (--shared->remaining == 0) shared->done.Notify();
          }(&*h.client, h.origin(), &shared));
  }
  ASSERT_TRUE(shared.done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(shared.ok.load(), 5);
  EXPECT_EQ(h.client->connections_opened(), 5u);
  EXPECT_EQ(h.client->idle_connections(), 2u);
}

TEST(HttpClientTest, ARequestThatWouldSplitItsHeadIsRefusedBeforeConnecting) {
  Harness h(Echo);
  HttpRequest evil = Get("/a");
  evil.headers.Add("X-Evil", "1\r\nX-Injected: yes");
  auto r = h.Send(evil);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  HttpRequest bad_target = Get("/a HTTP/1.1\r\nX-Injected: yes\r\n\r\nGET /b");
  r = h.Send(bad_target);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(h.client->connections_opened(), 0u);
  EXPECT_EQ(h.server->stats().requests, 0u);
  // A sound request on the same client still goes.
  auto ok = h.Send(Get("/fine"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->headers.Get("x-target"), "/fine");
}

TEST(HttpFetchTest, RunsOneRequestSynchronously) {
  Harness h(Echo);
  auto r = HttpFetch("POST", h.server->url() + "/wake?now=1", R"({"a":1})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, R"({"a":1})");
  EXPECT_EQ(r->headers.Get("x-target"), "/wake?now=1");

  auto bad = HttpFetch("GET", "https://example.com/");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);

  FetchOptions quick;
  quick.timeout = milliseconds(2000);
  auto refused = HttpFetch("GET", "http://127.0.0.1:" + std::to_string(testing::UnusedPort()) + "/",
                           {}, quick);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
}

}  // namespace
}  // namespace stitch
