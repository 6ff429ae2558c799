#include "stitch/net/server.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/sse.h"
#include "stitch/net/upstream.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using std::chrono::milliseconds;
using testing::Echo;
using testing::Get;
using testing::Harness;
using testing::Post;
using testing::RawSocket;
using testing::WaitUntil;

constexpr absl::Duration kWait = absl::Seconds(20);

TEST(HttpServerTest, RoundTripsGetAndPostWithHeadersAndBody) {
  Harness h(Echo);
  HttpRequest get = Get("/info?verbose=1");
  get.headers.Add("X-Test", "hello");
  auto r = h.Send(get);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->headers.Get("x-method"), "GET");
  EXPECT_EQ(r->headers.Get("X-TARGET"), "/info?verbose=1");
  EXPECT_EQ(r->headers.Get("x-test-echo"), "hello");
  EXPECT_EQ(r->body, "");

  std::string big(200000, 'x');
  for (size_t i = 0; i < big.size(); i += 7) big[i] = static_cast<char>('a' + i % 26);
  auto p = h.Send(Post("/generate", big));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->status, 200);
  EXPECT_EQ(p->headers.Get("x-method"), "POST");
  EXPECT_EQ(p->body, big);
  EXPECT_EQ(p->headers.Get("content-length"), std::to_string(big.size()));
}

TEST(HttpServerTest, SequentialRequestsReuseOneKeepAliveConnection) {
  Harness h(Echo);
  for (int i = 0; i < 20; ++i) {
    auto r = h.Send(Post("/n", std::to_string(i)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->body, std::to_string(i));
  }
  EXPECT_EQ(h.server->stats().connections_accepted, 1u);
  EXPECT_EQ(h.server->stats().requests, 20u);
  EXPECT_EQ(h.client->connections_opened(), 1u);
  EXPECT_EQ(h.client->idle_connections(), 1u);
}

TEST(HttpServerTest, BodyOverTheLimitGets413) {
  ServerOptions options;
  options.max_body_bytes = 1024;
  Harness h(Echo, options);
  auto small = h.Send(Post("/", std::string(1024, 'a')));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->status, 200) << small->body;

  auto r = h.Send(Post("/", std::string(4096, 'a')));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(r->headers.Get("content-type"), "application/json");
  EXPECT_NE(r->body.find("\"type\":\"PayloadTooLarge\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("1024"), std::string::npos) << r->body;

  // A chunked body has no length up front: the limit trips while reading it.
  RawSocket raw(h.server->port());
  ASSERT_TRUE(raw.connected());
  raw.Send("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" +
           std::string(2048, 'b') + "\r\n0\r\n\r\n");
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u) << answer;
}

// What a raw request gets: the answer up to the close.
std::string RawAnswer(uint16_t port, const std::string& request) {
  RawSocket raw(port);
  EXPECT_TRUE(raw.connected());
  raw.Send(request);
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed) << answer;
  return answer;
}

// A handler only ever sees "/path?query": a proxy must never pass on a
// CONNECT, `OPTIONS *` or an absolute URL (the upstream call would fail and
// the proxy would blame a healthy upstream).
TEST(HttpServerTest, TargetsThatAreNotPathsAndConnectGet400) {
  std::atomic<int> handled{0};
  Harness h([&](HttpExchange& ex) {
    ++handled;
    return Echo(ex);
  });
  for (const std::string request : {
           "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
           "CONNECT /tunnel HTTP/1.1\r\nHost: x\r\n\r\n",
           "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
           "GET http://example.com/get_model_info HTTP/1.1\r\nHost: example.com\r\n\r\n",
           "POST http://example.com/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
       }) {
    const std::string answer = RawAnswer(h.server->port(), request);
    EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << request << " -> " << answer;
    EXPECT_NE(answer.find("\"type\":\"BadRequest\""), std::string::npos) << answer;
  }
  EXPECT_EQ(handled.load(), 0);
  EXPECT_EQ(h.server->stats().requests, 0u);
  auto fine = h.Send(Get("/x?y=1"));
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->status, 200);
}

// A server whose handler holds each request to /hold until its gate opens
// (the others are answered at once), counting the requests handed to it.
struct HoldingServer {
  explicit HoldingServer(ServerOptions options)
      : h(
            [this](HttpExchange& ex) -> awaitable<void> {
              ++handled;
              if (ex.request().target == "/hold") co_await h.gate->Wait();
              co_await Echo(ex);
            },
            std::move(options)) {}
  std::atomic<int> handled{0};
  Harness h;
};

// Request bodies count against one budget from their header until their
// handler returns: past it, a 503 that never reads (or keeps) the body.
TEST(HttpServerTest, BodiesHeldAtOnceAreBoundedWithA503) {
  ServerOptions options;
  options.max_body_bytes = 4000;
  options.max_total_body_bytes = 6000;
  options.max_client_body_share = 1.0;  // one client here; its share is tested below
  HoldingServer held_server(options);
  Harness& h = held_server.h;
  std::atomic<int>& handled = held_server.handled;
  auto post = [](const std::string& target, size_t size) {
    return absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: x\r\nContent-Length: ", size,
                        "\r\n\r\n", std::string(size, 'p'));
  };

  RawSocket held(h.server->port());  // 4000 bytes, held by its handler
  ASSERT_TRUE(held.connected());
  held.Send(post("/hold", 4000));
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 1; }));
  EXPECT_EQ(h.server->stats().body_bytes_held, 4000u);

  // 4000 more would pass 6000: refused, the body unread and uncounted.
  std::string answer = RawAnswer(h.server->port(), post("/", 4000));
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_NE(answer.find("Retry-After: 1\r\n"), std::string::npos) << answer;
  EXPECT_NE(answer.find("\"type\":\"Overloaded\""), std::string::npos) << answer;
  EXPECT_NE(answer.find("\"retryable\":true"), std::string::npos) << answer;
  EXPECT_NE(answer.find("6000"), std::string::npos) << answer;
  // With Expect: 100-continue, the client is told before it sends anything.
  answer = RawAnswer(h.server->port(),
                     "POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                     "Content-Length: 3000\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  // A chunked body is counted as it arrives: 1500 fit, 1000 more do not.
  answer = RawAnswer(h.server->port(),
                     "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5dc\r\n" +
                         std::string(1500, 'c') + "\r\n3e8\r\n" + std::string(1000, 'c') +
                         "\r\n0\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_EQ(handled.load(), 1);
  EXPECT_EQ(h.server->stats().refused_over_budget, 3u);
  EXPECT_EQ(h.server->stats().body_bytes_held, 4000u);
  // What fits still passes.
  auto small = h.Send(Post("/", std::string(2000, 's')));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->status, 200) << small->body;

  // Once the held request is answered, its bytes are free again.
  h.gate->Open();
  EXPECT_EQ(held.ReadUntil("pppp").rfind("HTTP/1.1 200", 0), 0u);
  ASSERT_TRUE(WaitUntil([&] { return h.server->stats().body_bytes_held == 0; }));
  auto big = h.Send(Post("/", std::string(4000, 'b')));
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(big->status, 200);
  // (Its handler returns just after the answer went out.)
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().body_bytes_held == 0; }));
}

std::string PostHead(const std::string& target, size_t length, const std::string& extra = "") {
  return absl::StrCat("POST ", target, " HTTP/1.1\r\nHost: x\r\n", extra,
                      "Content-Length: ", length, "\r\n\r\n");
}

// One client address holds at most its share of the budget: a second
// client still gets in.
TEST(HttpServerTest, OneClientHoldsAtMostItsShareOfTheBodyBudget) {
  ServerOptions options;
  options.max_body_bytes = 4000;
  options.max_total_body_bytes = 10000;
  options.max_client_body_share = 0.5;
  HoldingServer held_server(options);
  Harness& h = held_server.h;
  std::atomic<int>& handled = held_server.handled;
  RawSocket held(h.server->port(), "127.0.0.2");
  ASSERT_TRUE(held.connected());
  held.Send(PostHead("/hold", 4000) + std::string(4000, 'p'));
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 1; }));
  // 4000 + 2000 passes 127.0.0.2's share of 5000, though not the budget.
  RawSocket more(h.server->port(), "127.0.0.2");
  more.Send(PostHead("/", 2000));
  const std::string answer = more.ReadUntil("\r\n\r\n");
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_NE(answer.find("this client 4000"), std::string::npos) << answer;
  auto other = h.Send(Post("/", std::string(4000, 'o')));  // from 127.0.0.1
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->status, 200);
  h.gate->Open();
  EXPECT_EQ(held.ReadUntil("pppp").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().body_bytes_held == 0; }));
}

// A declared Content-Length reserves nothing: clients from several
// addresses that declare large bodies and send none hold none of the
// budget, and a body that arrives meanwhile is read and answered.
TEST(HttpServerTest, ADeclaredLengthHoldsNothingUntilItsBytesArrive) {
  ServerOptions options;
  options.max_body_bytes = 4000;
  options.max_total_body_bytes = 8000;
  Harness h(Echo, options);
  std::vector<std::unique_ptr<RawSocket>> idle;
  for (const char* address : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
    for (int i = 0; i < 3; ++i) {
      idle.push_back(std::make_unique<RawSocket>(h.server->port(), address));
      ASSERT_TRUE(idle.back()->connected());
      // The server says "go on" once it has judged the head.
      idle.back()->Send(PostHead("/", 4000, "Expect: 100-continue\r\n"));
      const std::string answer = idle.back()->ReadUntil("\r\n\r\n");
      EXPECT_EQ(answer.rfind("HTTP/1.1 100 Continue", 0), 0u) << address << ": " << answer;
    }
  }
  EXPECT_EQ(h.server->stats().body_bytes_held, 0u);
  EXPECT_EQ(h.server->stats().refused_over_budget, 0u);
  auto fine = h.Send(Post("/", std::string(4000, 'f')));
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->status, 200);
  // Bytes that arrive count: one idle client sends 3000 of its 4000.
  idle.front()->Send(std::string(3000, 'i'));
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().body_bytes_held == 3000u; }));
  EXPECT_EQ(h.server->stats().body_bytes_held_without_credential, 3000u);
}

// Requests that present the credential may use the whole budget; the
// others stop at the part open to them, and each address among them at an
// equal split of it once several hold bodies.
TEST(HttpServerTest, StrangersFromManyAddressesLeaveTheCredentialsShare) {
  ServerOptions options;
  options.max_body_bytes = 4000;
  options.max_total_body_bytes = 12000;  // 9000 open to strangers, 3000 kept
  options.reserved_body_share = 0.25;
  options.max_client_body_share = 0.5;
  options.holds_credential = [](const HttpRequest& head) {
    return head.headers.Get("x-key") == "k";
  };
  HoldingServer held_server(options);
  Harness& h = held_server.h;
  std::atomic<int>& handled = held_server.handled;
  std::vector<std::unique_ptr<RawSocket>> held;
  auto hold = [&](const char* address, size_t size, const std::string& extra = "") {
    held.push_back(std::make_unique<RawSocket>(h.server->port(), address));
    held.back()->Send(PostHead("/hold", size, extra) + std::string(size, 'h'));
  };
  auto refused = [&](const char* address, size_t size) {
    RawSocket socket(h.server->port(), address);
    socket.Send(PostHead("/", size) + std::string(size, 'r'));
    return socket.ReadUntil("\r\n\r\n").rfind("HTTP/1.1 503", 0) == 0;
  };
  hold("127.0.0.2", 4000);  // alone: up to its share, 4500
  hold("127.0.0.3", 2000);
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 2; }));
  // A third address gets a third of the open 9000, not half of it.
  EXPECT_TRUE(refused("127.0.0.4", 3500));
  hold("127.0.0.4", 3000);
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 3; }));
  EXPECT_EQ(h.server->stats().body_bytes_held_without_credential, 9000u);
  // The open part is full, for a fourth address too...
  EXPECT_TRUE(refused("127.0.0.5", 100));
  // ...but not for a request with the credential, from any address.
  hold("127.0.0.5", 3000, "x-key: k\r\n");
  ASSERT_TRUE(WaitUntil([&] { return handled.load() == 4; }));
  EXPECT_EQ(h.server->stats().body_bytes_held, 12000u);
  EXPECT_EQ(h.server->stats().body_bytes_held_without_credential, 9000u);
  h.gate->Open();
  for (auto& socket : held) EXPECT_EQ(socket->ReadUntil("hhhh").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().body_bytes_held == 0; }));
  EXPECT_EQ(h.server->stats().body_bytes_held_without_credential, 0u);
}

// A body that trickles in is cut once the grace is over, and what it held
// is free again; a body at the minimum rate or better is read.
TEST(HttpServerTest, ABodySlowerThanTheMinimumRateIsCut) {
  ServerOptions options;
  options.min_body_bytes_per_second = 10000;
  options.min_body_rate_grace = std::chrono::milliseconds(200);
  Harness h(Echo, options);
  RawSocket slow(h.server->port());
  ASSERT_TRUE(slow.connected());
  slow.Send(PostHead("/", 1 << 20) + "x");
  // (Not waited for while held: on a loaded machine the cut may come first.)
  bool closed = false;
  const std::string answer = slow.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer, "");
  // Counted as the cut connection ends, which may be just after the close.
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().slow_bodies_cut == 1u; }));
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().body_bytes_held == 0; }));
  auto fine = h.Send(Post("/", std::string(100000, 'f')));
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->status, 200);
}

// Strangers are refused at the header: slow bodies without the token hold
// nothing, so a request with it still gets in.
TEST(HttpServerTest, TheHeadCheckRunsBeforeAnyBodyIsHeld) {
  ServerOptions options;
  options.max_body_bytes = 4000;
  options.max_total_body_bytes = 8000;
  options.max_client_body_share = 1.0;
  options.head_check = [](const HttpRequest& head) -> std::optional<HttpResponse> {
    if (head.headers.Get("x-key") == "k") return std::nullopt;
    return JsonResponse(401, JsonErrorBody("Unauthorized", "no key"));
  };
  Harness h(Echo, options);
  std::vector<std::unique_ptr<RawSocket>> strangers;
  for (int i = 0; i < 4; ++i) {
    strangers.push_back(std::make_unique<RawSocket>(h.server->port()));
    strangers.back()->Send(PostHead("/", 4000) + "s");
    const std::string answer = strangers.back()->ReadUntil("\r\n\r\n");
    EXPECT_EQ(answer.rfind("HTTP/1.1 401", 0), 0u) << answer;
  }
  EXPECT_EQ(h.server->stats().body_bytes_held, 0u);
  EXPECT_EQ(h.server->stats().refused_at_head, 4u);
  HttpRequest keyed = Post("/", std::string(4000, 'k'));
  keyed.headers.Set("x-key", "k");
  auto answer = h.Send(keyed);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->status, 200);
}

TEST(HttpServerTest, ABodyBudgetBelowThePerRequestLimitIsRefusedAtStart) {
  EventLoop loop;
  ServerOptions options;
  options.max_body_bytes = 4096;
  options.max_total_body_bytes = 1024;
  auto server = HttpServer::Start(loop.executor(), options, Echo);
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(server.status()));
}

TEST(HttpServerTest, MalformedRequestGets400AndClose) {
  Harness h(Echo);
  RawSocket raw(h.server->port());
  ASSERT_TRUE(raw.connected());
  raw.Send("THIS IS NOT HTTP\r\n\r\n");
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 400", 0), 0u) << answer;
  EXPECT_NE(answer.find("BadRequest"), std::string::npos) << answer;
  EXPECT_EQ(h.server->stats().requests, 0u);
}

TEST(HttpServerTest, OversizedHeaderGets431) {
  ServerOptions options;
  options.max_header_bytes = 1024;
  Harness h(Echo, options);
  RawSocket raw(h.server->port());
  raw.Send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'h') + "\r\n\r\n");
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 431", 0), 0u) << answer;
}

TEST(HttpServerTest, StalledHeaderIsClosedAfterTheHeaderTimeout) {
  ServerOptions options;
  options.header_timeout = milliseconds(100);
  Harness h(Echo, options);
  RawSocket raw(h.server->port());
  raw.Send("GET / HTTP/1.1\r\nHost: x\r\n");  // never finished
  auto start = std::chrono::steady_clock::now();
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer, "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(h.server->stats().requests, 0u);
}

TEST(HttpServerTest, IdleKeepAliveConnectionIsClosedAndTheClientReconnects) {
  ServerOptions options;
  options.idle_timeout = milliseconds(50);
  Harness h(Echo, options);
  ASSERT_TRUE(h.Send(Get("/1")).ok());
  ASSERT_TRUE(WaitUntil([&] { return h.server->stats().connections_active == 0; }));
  // The pooled connection is dead now: the client must notice and reconnect.
  auto r = h.Send(Get("/2"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->headers.Get("x-target"), "/2");
  EXPECT_EQ(h.server->stats().connections_accepted, 2u);
  EXPECT_EQ(h.client->connections_opened(), 2u);
}

TEST(HttpServerTest, StreamedEventsArriveOneByOne) {
  std::atomic<bool> second_sent{false};
  Harness h([&](HttpExchange& ex) -> awaitable<void> {
    HttpHeaders headers = testing::EventStreamHeaders();
    headers.Add("Cache-Control", "no-cache");
    absl::Status s = co_await ex.BeginStream(200, std::move(headers));
    if (s.ok()) s = co_await ex.WriteChunk(SseEvent("first"));
    co_await h.gate->Wait();  // opened by the client once it has the first event
    second_sent = true;
    if (s.ok()) s = co_await ex.WriteChunk(SseEvent("second"));
    if (s.ok()) s = co_await ex.WriteChunk(SseEvent("[DONE]"));
    if (s.ok()) s = co_await ex.EndStream();
    EXPECT_TRUE(s.ok()) << s;
  });

  std::vector<std::string> events;
  bool second_was_sent_before_first_arrived = true;
  CallOptions options;
  options.stream_idle_timeout = milliseconds(10000);
  absl::Status result = h.client_loop.BlockOn([&]() -> awaitable<absl::Status> {
    auto stream = co_await h.client->SendStreamed(h.origin(), Post("/generate", "{}"), options);
    if (!stream.ok()) co_return stream.status();
    EXPECT_EQ(stream->status(), 200);
    EXPECT_EQ(stream->headers().Get("content-type"), "text/event-stream");
    EXPECT_EQ(stream->headers().Get("transfer-encoding"), "chunked");
    SseEventSplitter splitter;
    for (;;) {
      auto chunk = co_await stream->Read();
      if (!chunk.ok()) co_return chunk.status();
      if (chunk->empty()) break;
      splitter.Append(*chunk);
      while (auto event = splitter.Next()) {
        events.push_back(*SseData(*event));
        if (events.size() == 1) {
          second_was_sent_before_first_arrived = second_sent.load();
          h.gate->Open();
        }
      }
    }
    EXPECT_TRUE(stream->finished());
    co_return absl::OkStatus();
  }());
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_FALSE(second_was_sent_before_first_arrived);
  EXPECT_EQ(events, (std::vector<std::string>{"first", "second", "[DONE]"}));
  // The stream ended cleanly, so its connection went back to the pool.
  EXPECT_EQ(h.client->idle_connections(), 1u);
  auto again = h.Send(Get("/after-stream"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(h.server->stats().connections_accepted, 1u);
}

TEST(HttpServerTest, HandlerSeesTheClientDisconnect) {
  absl::Notification started, disconnected;
  std::atomic<bool> flag_before{true}, flag_after{false};
  Harness h([&](HttpExchange& ex) -> awaitable<void> {
    flag_before = ex.disconnected();
    started.Notify();
    co_await ex.WaitDisconnected();
    flag_after = ex.disconnected();
    disconnected.Notify();
  });
  RawSocket raw(h.server->port());
  raw.Send("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kWait));
  EXPECT_FALSE(disconnected.HasBeenNotified());
  raw.Close();
  ASSERT_TRUE(disconnected.WaitForNotificationWithTimeout(kWait));
  EXPECT_FALSE(flag_before.load());
  EXPECT_TRUE(flag_after.load());
}

// How a proxying handler makes its upstream call.
using UpstreamCall = std::function<awaitable<absl::StatusOr<HttpResponse>>(
    HttpExchange& ex, HttpClient& client, const HttpOrigin& origin)>;

// A client disconnects while its request waits on an upstream server that
// never answers: the upstream call must end Cancelled and close its
// connection, so the upstream side knows too.
void ExpectADisconnectToEndTheUpstreamCall(const UpstreamCall& call) {
  absl::Notification upstream_started, upstream_saw_disconnect, proxy_done;
  absl::Status proxy_status;
  EventLoop upstream_loop;
  auto upstream =
      HttpServer::Start(upstream_loop.executor(), {}, [&](HttpExchange& ex) -> awaitable<void> {
        upstream_started.Notify();
        co_await ex.WaitDisconnected();
        upstream_saw_disconnect.Notify();
      });
  ASSERT_TRUE(upstream.ok()) << upstream.status();
  HttpOrigin upstream_origin{"127.0.0.1", (*upstream)->port()};

  Harness h([&](HttpExchange& ex) -> awaitable<void> {
    absl::StatusOr<HttpResponse> r = co_await call(ex, *h.loop_client, upstream_origin);
    proxy_status = r.status();
    proxy_done.Notify();
  });
  h.loop_client.emplace(h.loop.executor());

  RawSocket raw(h.server->port());
  raw.Send("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  ASSERT_TRUE(upstream_started.WaitForNotificationWithTimeout(kWait));
  raw.Close();
  ASSERT_TRUE(proxy_done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(proxy_status.code(), absl::StatusCode::kCancelled) << proxy_status;
  ASSERT_TRUE(upstream_saw_disconnect.WaitForNotificationWithTimeout(kWait));
}

TEST(HttpServerTest, ClientDisconnectCancelsTheProxiedUpstreamCall) {
  ExpectADisconnectToEndTheUpstreamCall(
      [](HttpExchange& ex, HttpClient& client, const HttpOrigin& origin) {
        return ex.CancelOnDisconnect(client.Send(origin, Post("/generate", ex.request().body)));
      });
}

TEST(HttpServerTest, ClientDisconnectAbortsTheProxiedUpstreamCall) {
  ExpectADisconnectToEndTheUpstreamCall(
      [](HttpExchange& ex, HttpClient& client, const HttpOrigin& origin) {
        return client.Send(origin, Post("/generate", ex.request().body), EndedWithTheClient(ex));
      });
}

// How a proxying handler relays a stream: it returns how the relay ended.
using StreamRelay = std::function<awaitable<absl::Status>(HttpExchange& ex, HttpClient& client,
                                                          const HttpOrigin& origin)>;

// Relays the upstream stream to the client with `options`.
awaitable<absl::Status> RelayStream(HttpExchange& ex, HttpClient& client, const HttpOrigin& origin,
                                    CallOptions options) {
  auto stream = co_await client.SendStreamed(origin, Post("/generate", "{}"), options);
  if (!stream.ok()) co_return stream.status();
  absl::Status s = co_await ex.BeginStream(stream->status(), stream->headers());
  while (s.ok()) {
    auto chunk = co_await stream->Read();
    if (!chunk.ok()) co_return chunk.status();
    if (chunk->empty()) co_return co_await ex.EndStream();
    s = co_await ex.WriteChunk(std::move(*chunk));
  }
  co_return s;
}

// A client disconnects while its stream waits on an upstream server that
// holds the rest of the body: the relay must end Cancelled and close the
// upstream connection.
void ExpectADisconnectToEndTheUpstreamStream(const StreamRelay& relay) {
  absl::Notification upstream_saw_disconnect, proxy_done;
  absl::Status proxy_status;
  EventLoop upstream_loop;
  auto upstream =
      HttpServer::Start(upstream_loop.executor(), {}, [&](HttpExchange& ex) -> awaitable<void> {
        (void)co_await ex.BeginStream(200, testing::EventStreamHeaders());
        (void)co_await ex.WriteChunk(SseEvent("token-1"));
        co_await ex.WaitDisconnected();
        upstream_saw_disconnect.Notify();
      });
  ASSERT_TRUE(upstream.ok()) << upstream.status();
  HttpOrigin upstream_origin{"127.0.0.1", (*upstream)->port()};

  Harness h([&](HttpExchange& ex) -> awaitable<void> {
    proxy_status = co_await relay(ex, *h.loop_client, upstream_origin);
    proxy_done.Notify();
  });
  h.loop_client.emplace(h.loop.executor());

  RawSocket raw(h.server->port());
  raw.Send("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  std::string got = raw.ReadUntil("token-1");
  EXPECT_NE(got.find("data: token-1"), std::string::npos) << got;
  EXPECT_FALSE(proxy_done.HasBeenNotified());
  raw.Close();
  ASSERT_TRUE(proxy_done.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(proxy_status.code(), absl::StatusCode::kCancelled) << proxy_status;
  ASSERT_TRUE(upstream_saw_disconnect.WaitForNotificationWithTimeout(kWait));
}

TEST(HttpServerTest, ClientDisconnectCancelsAProxiedStream) {
  ExpectADisconnectToEndTheUpstreamStream(
      [](HttpExchange& ex, HttpClient& client, const HttpOrigin& origin) {
        return ex.CancelOnDisconnect(RelayStream(ex, client, origin, CallOptions{}));
      });
}

TEST(HttpServerTest, ClientDisconnectAbortsAProxiedStream) {
  ExpectADisconnectToEndTheUpstreamStream(
      [](HttpExchange& ex, HttpClient& client, const HttpOrigin& origin) {
        return RelayStream(ex, client, origin, EndedWithTheClient(ex));
      });
}

TEST(HttpServerTest, OneThreadHoldsAThousandConcurrentSlowRequests) {
  constexpr int kRequests = 1000;
  int arrived = 0;  // server loop thread only
  Harness h([&](HttpExchange& ex) -> awaitable<void> {
    // Nobody is answered until every request is being handled at once.
    if (++arrived == kRequests) h.gate->Open();
    co_await h.gate->Wait();
    (void)co_await ex.Respond(testing::Text(200, ex.request().target));
  });

  struct Results {
    std::vector<int> status = std::vector<int>(kRequests, 0);
    std::atomic<int> remaining{kRequests};
    absl::Notification done;
  } results;
  for (int i = 0; i < kRequests; ++i) {
    Spawn(h.client_loop.executor(),
          [](HttpClient* client, HttpOrigin origin, Results* results, int i) -> awaitable<void> {
            CallOptions options;
            options.timeout = milliseconds(60000);
            auto r = co_await client->Send(origin, Get("/" + std::to_string(i)), options);
            results->status[i] = r.ok() && r->body == "/" + std::to_string(i) ? r->status : -1;
            if (--results->remaining == 0) results->done.Notify();
          }(&*h.client, h.origin(), &results, i));
  }
  ASSERT_TRUE(results.done.WaitForNotificationWithTimeout(absl::Seconds(120)));
  for (int i = 0; i < kRequests; ++i) ASSERT_EQ(results.status[i], 200) << "request " << i;
  EXPECT_EQ(h.server->stats().connections_accepted, static_cast<uint64_t>(kRequests));
  EXPECT_EQ(h.server->stats().requests, static_cast<uint64_t>(kRequests));
}

TEST(HttpServerTest, HandlerWithoutAResponseGets500) {
  Harness h([](HttpExchange& ex) -> awaitable<void> {
    if (ex.request().target == "/throw") throw std::runtime_error("boom");
    co_return;
  });
  auto silent = h.Send(Get("/silent"));
  ASSERT_TRUE(silent.ok()) << silent.status();
  EXPECT_EQ(silent->status, 500);
  EXPECT_NE(silent->body.find("HandlerError"), std::string::npos) << silent->body;
  auto thrown = h.Send(Get("/throw"));
  ASSERT_TRUE(thrown.ok()) << thrown.status();
  EXPECT_EQ(thrown->status, 500);
  EXPECT_NE(thrown->body.find("boom"), std::string::npos) << thrown->body;
}

TEST(HttpServerTest, AnAnswerWhoseHeaderWouldSplitItIsRefused) {
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streamed" : "whole");
    std::atomic<int> answer_code{-1};
    Harness h([&](HttpExchange& ex) -> awaitable<void> {
      HttpHeaders headers;
      headers.Add("X-Evil", "a\r\nSet-Cookie: stolen");
      // (GCC 12: no co_await inside a conditional expression, and no
      // aggregate temporary as an argument of an awaited call.)
      absl::Status s;
      if (stream) {
        s = co_await ex.BeginStream(200, std::move(headers));
      } else {
        HttpResponse r{200, std::move(headers), "ok"};
        s = co_await ex.Respond(std::move(r));
      }
      answer_code = static_cast<int>(s.code());
    });
    auto r = h.Send(Get("/x"));
    ASSERT_TRUE(r.ok()) << r.status();
    // Nothing of the refused answer went out; the handler then returned
    // without a response, which is answered for it.
    EXPECT_EQ(r->status, 500);
    EXPECT_FALSE(r->headers.Has("set-cookie"));
    EXPECT_FALSE(r->headers.Has("x-evil"));
    EXPECT_EQ(answer_code.load(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
}

TEST(HttpServerTest, AnyFinalStatusReachesTheClient) {
  Harness h([](HttpExchange& ex) -> awaitable<void> {
    HttpResponse r;
    r.status = 299;  // no reason phrase is known for it
    r.body = "odd";
    (void)co_await ex.Respond(std::move(r));
  });
  auto r = h.Send(Get("/x"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 299);
  EXPECT_EQ(r->body, "odd");
}

TEST(HttpServerTest, SecondResponseIsRefused) {
  absl::Status second;
  absl::Notification handled;
  Harness h([&](HttpExchange& ex) -> awaitable<void> {
    (void)co_await ex.Respond(testing::Text(201, "one"));
    second = co_await ex.Respond(testing::Text(200, "two"));
    handled.Notify();
  });
  auto r = h.Send(Get("/"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->body, "one");
  ASSERT_TRUE(handled.WaitForNotificationWithTimeout(kWait));
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(HttpServerTest, RouterDispatchesByMethodAndPath) {
  HttpRouter router;
  router.Add("GET", "/health", [](HttpExchange& ex) -> awaitable<void> {
    (void)co_await ex.Respond(JsonResponse(200, R"({"ready":true})"));
  });
  router.Add("POST", "/wake", [](HttpExchange& ex) -> awaitable<void> {
    (void)co_await ex.Respond(testing::Text(202, "woken"));
  });
  Harness h(router.AsHandler());
  auto health = h.Send(Get("/health?probe=1"));
  ASSERT_TRUE(health.ok());
  EXPECT_EQ(health->status, 200);
  auto wake = h.Send(Post("/wake", ""));
  ASSERT_TRUE(wake.ok());
  EXPECT_EQ(wake->status, 202);
  auto missing = h.Send(Get("/nope"));
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status, 404);
  EXPECT_NE(missing->body.find("NotFound"), std::string::npos);
  auto wrong = h.Send(Get("/wake"));
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->headers.Get("allow"), "POST");
}

// A handler that asks about its client starts a disconnect monitor: a read
// that stays pending while it runs. When it ends with the read still waiting
// for a byte, that read becomes the wait for the next request.
awaitable<void> WatchfulEcho(HttpExchange& ex) {
  if (ex.disconnected()) co_return;
  co_await Echo(ex);
}

// Sends requests for `targets` at once on one connection, the last with
// "Connection: close", and checks that each is answered, in order.
void ExpectPipelinedRequestsAnsweredInOrder(HttpHandler handler,
                                            const std::vector<std::string>& targets) {
  Harness h(std::move(handler));
  RawSocket raw(h.server->port());
  std::string requests;
  for (size_t i = 0; i < targets.size(); ++i) {
    absl::StrAppend(&requests, "GET ", targets[i], " HTTP/1.1\r\nHost: x\r\n",
                    i + 1 == targets.size() ? "Connection: close\r\n" : "", "\r\n");
  }
  raw.Send(requests);
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  size_t previous = 0;
  for (const std::string& target : targets) {
    size_t at = answer.find("X-Target: " + target);
    ASSERT_NE(at, std::string::npos) << target << " in " << answer;
    EXPECT_GT(at, previous) << target;
    previous = at;
  }
  EXPECT_EQ(h.server->stats().requests, targets.size());
}

TEST(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  ExpectPipelinedRequestsAnsweredInOrder(Echo, {"/first", "/second"});
}

TEST(HttpServerTest, AWatchedKeepAliveConnectionServesTheNextRequest) {
  Harness h(WatchfulEcho);
  RawSocket raw(h.server->port());
  for (int i = 0; i < 3; ++i) {
    // Each request is sent only once the previous answer is read, so it
    // reaches the server while the last monitor read is waiting.
    raw.Send(absl::StrCat("POST /n", i, " HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n", i));
    std::string answer = raw.ReadUntil(absl::StrCat("\r\n\r\n", i));
    EXPECT_NE(answer.find(absl::StrCat("X-Target: /n", i)), std::string::npos) << answer;
  }
  EXPECT_EQ(h.server->stats().requests, 3u);
  EXPECT_EQ(h.server->stats().connections_accepted, 1u);
  EXPECT_EQ(h.server->stats().connections_active, 1u);
  // A client that leaves ends its connection.
  raw.Close();
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().connections_active == 0; }));
}

TEST(HttpServerTest, AWatchedConnectionLeftIdleIsClosedAfterTheIdleTimeout) {
  ServerOptions options;
  options.idle_timeout = milliseconds(50);
  Harness h(WatchfulEcho, options);
  RawSocket raw(h.server->port());
  raw.Send("GET /once HTTP/1.1\r\nHost: x\r\n\r\n");
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_NE(answer.find("X-Target: /once"), std::string::npos) << answer;
  EXPECT_TRUE(WaitUntil([&] { return h.server->stats().connections_active == 0; }));
}

TEST(HttpServerTest, RequestsPipelinedBehindAWatchedOneAreAnsweredInOrder) {
  ExpectPipelinedRequestsAnsweredInOrder(WatchfulEcho, {"/first", "/second", "/third"});
}

TEST(HttpServerTest, Http10ClientGetsAnAnswerAndTheConnectionCloses) {
  Harness h(Echo);
  RawSocket raw(h.server->port());
  raw.Send("POST /old HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  bool closed = false;
  std::string answer = raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer.rfind("HTTP/1.0 200", 0), 0u) << answer;
  EXPECT_EQ(answer.substr(answer.size() - 3), "abc");
}

TEST(HttpServerTest, ExpectContinueIsHonoured) {
  Harness h(Echo);
  RawSocket raw(h.server->port());
  raw.Send("POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  std::string interim = raw.ReadUntil("\r\n\r\n");
  EXPECT_EQ(interim.rfind("HTTP/1.1 100 Continue", 0), 0u) << interim;
  raw.Send("hello");
  std::string answer = raw.ReadUntil("hello");
  EXPECT_NE(answer.find("HTTP/1.1 200 OK"), std::string::npos) << answer;
}

TEST(HttpServerTest, ShutdownDisconnectsRunningHandlersAndDrains) {
  absl::Notification started;
  std::atomic<bool> handler_saw_disconnect{false};
  Harness h([&](HttpExchange& ex) -> awaitable<void> {
    started.Notify();
    co_await ex.WaitDisconnected();
    handler_saw_disconnect = true;
  });
  RawSocket raw(h.server->port());
  raw.Send("GET /long HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kWait));
  h.loop.BlockOn(h.server->Shutdown());
  EXPECT_TRUE(handler_saw_disconnect.load());
  EXPECT_EQ(h.server->stats().connections_active, 0u);
  bool closed = false;
  raw.ReadUntilClosed(&closed);
  EXPECT_TRUE(closed);
  RawSocket late(h.server->port());
  EXPECT_FALSE(late.connected());
}

TEST(HttpServerTest, ListeningOnABusyPortIsUnavailable) {
  Harness h(Echo);
  ServerOptions options;
  options.port = h.server->port();
  auto second = HttpServer::Start(h.loop.executor(), options, Echo);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(std::to_string(options.port)), std::string::npos);
}

}  // namespace
}  // namespace stitch
