#include "stitch/net/http.h"

#include <gtest/gtest.h>

#include "stitch/net/sse.h"

namespace stitch {
namespace {

TEST(HttpHeadersTest, LookupIgnoresCaseAndKeepsOrder) {
  HttpHeaders h;
  h.Add("Content-Type", "application/json");
  h.Add("X-Multi", "a");
  h.Add("x-multi", "b");
  EXPECT_EQ(h.Get("content-type"), "application/json");
  EXPECT_EQ(h.Get("CONTENT-TYPE"), "application/json");
  EXPECT_EQ(h.Get("X-MULTI"), "a");
  EXPECT_FALSE(h.Get("missing").has_value());
  EXPECT_EQ(h.size(), 3u);
}

TEST(HttpHeadersTest, SetReplacesEveryFieldOfTheName) {
  HttpHeaders h{{"X-A", "1"}, {"Other", "o"}, {"x-a", "2"}};
  h.Set("X-a", "3");
  EXPECT_EQ(h.size(), 2u);
  EXPECT_EQ(h.Get("x-A"), "3");
  EXPECT_EQ(h.fields()[0].second, "3");
  h.Set("New", "n");
  EXPECT_EQ(h.Get("new"), "n");
  EXPECT_EQ(h.Remove("X-A"), 1u);
  EXPECT_EQ(h.Remove("X-A"), 0u);
  EXPECT_FALSE(h.Has("x-a"));
}

TEST(HttpHeadersTest, CopyHeadersKeepsTheOrderOfWhatItDoesNotDrop) {
  const HttpHeaders many{{"A", "1"},
                         {"Content-Length", "3"},
                         {"B", "2"},
                         {"C", "3"},
                         {"Connection", "x"},
                         {"D", "4"},
                         {"E", "5"},
                         {"F", "6"},
                         {"G", "a value long enough to live on the heap"}};
  auto drop = [](std::string_view name) { return IsFramingHeader(name); };
  const HttpHeaders copied = CopyHeaders(many, drop);
  EXPECT_EQ(many.size(), 9u);
  HttpHeaders source = many;
  const HttpHeaders moved = CopyHeaders(std::move(source), drop);
  for (const HttpHeaders* h : {&copied, &moved}) {
    ASSERT_EQ(h->size(), 7u);
    EXPECT_EQ(h->fields()[0], HttpHeaders::Field("A", "1"));
    EXPECT_EQ(h->fields()[1], HttpHeaders::Field("B", "2"));
    EXPECT_EQ(h->fields()[3], HttpHeaders::Field("D", "4"));
    EXPECT_EQ(h->Get("g"), "a value long enough to live on the heap");
    EXPECT_FALSE(h->Has("content-length"));
    EXPECT_FALSE(h->Has("connection"));
  }
  EXPECT_TRUE(source.empty());  // NOLINT(bugprone-use-after-move): Release() leaves it empty
}

TEST(HttpHeadersTest, FramingHeadersAreRecognised) {
  EXPECT_TRUE(IsFramingHeader("Content-Length"));
  EXPECT_TRUE(IsFramingHeader("transfer-encoding"));
  EXPECT_TRUE(IsFramingHeader("CONNECTION"));
  EXPECT_FALSE(IsFramingHeader("Content-Type"));
  EXPECT_FALSE(IsFramingHeader("Host"));
}

TEST(ParseHttpUrlTest, AcceptsHttpUrls) {
  auto u = ParseHttpUrl("http://127.0.0.1:30000/generate?x=1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->origin.host, "127.0.0.1");
  EXPECT_EQ(u->origin.port, 30000);
  EXPECT_EQ(u->target, "/generate?x=1");
  EXPECT_EQ(u->ToString(), "http://127.0.0.1:30000/generate?x=1");

  auto bare = ParseHttpUrl("http://engine.local");
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->origin.host, "engine.local");
  EXPECT_EQ(bare->origin.port, 80);
  EXPECT_EQ(bare->target, "/");

  auto query = ParseHttpUrl("http://h:1?q=1");
  ASSERT_TRUE(query.ok()) << query.status();
  EXPECT_EQ(query->target, "/?q=1");

  auto v6 = ParseHttpUrl("HTTP://[::1]:8080/a");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->origin.host, "::1");
  EXPECT_EQ(v6->origin.ToString(), "http://[::1]:8080");
}

TEST(ParseHttpUrlTest, RefusesWhatItCannotServe) {
  for (const char* bad :
       {"https://h/x", "ftp://h", "h:80/x", "/relative", "http://:80/x", "http://h:0/",
        "http://h:70000/", "http://u:p@h/", "http://h/#frag", "http://h:x/", "http://h:80x", ""}) {
    auto u = ParseHttpUrl(bad);
    EXPECT_FALSE(u.ok()) << bad;
    if (!u.ok()) {
      EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(u.status().message().find(bad), std::string::npos) << u.status();
    }
  }
}

TEST(HttpTest, TargetPathDropsTheQuery) {
  EXPECT_EQ(TargetPath("/generate?stream=1"), "/generate");
  EXPECT_EQ(TargetPath("/a/b"), "/a/b");
  EXPECT_EQ(TargetPath("/"), "/");
}

TEST(HttpTest, TargetQueryParamDecodesOneParameter) {
  EXPECT_EQ(TargetQueryParam("/pause?mode=keep&x=1", "mode"), "keep");
  EXPECT_EQ(TargetQueryParam("/pause?x=1&mode=a%20b", "mode"), "a b");
  EXPECT_EQ(TargetQueryParam("/pause?mode", "mode"), "");
  EXPECT_EQ(TargetQueryParam("/pause?modes=keep", "mode"), std::nullopt);
  EXPECT_EQ(TargetQueryParam("/pause", "mode"), std::nullopt);
}

TEST(HttpTest, JsonErrorBodyIsNestedAndEscapes) {
  EXPECT_EQ(JsonErrorBody("Bad", "a \"quoted\"\nline"),
            R"({"error":{"type":"Bad","message":"a \"quoted\"\nline"}})");
  EXPECT_EQ(JsonErrorBody("EngineUnavailable", "gone", true),
            R"({"error":{"type":"EngineUnavailable","message":"gone","retryable":true}})");
  HttpResponse r = JsonResponse(409, "{}");
  EXPECT_EQ(r.status, 409);
  EXPECT_EQ(r.headers.Get("content-type"), "application/json");
  EXPECT_EQ(StatusReason(503), "Service Unavailable");
}

TEST(SseTest, SplitsEventsAcrossArbitraryChunks) {
  const std::string stream =
      "data: {\"text\": \"a\"}\n\n"
      "event: x\r\ndata: two\r\ndata: lines\r\n\r\n"
      "\n"
      "data: [DONE]\n\n";
  // Feed one byte at a time: events must come out whole and in order.
  SseEventSplitter splitter;
  std::vector<std::string> events;
  for (char c : stream) {
    splitter.Append(std::string_view(&c, 1));
    while (auto e = splitter.Next()) events.push_back(*e);
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0], "data: {\"text\": \"a\"}\n");
  EXPECT_EQ(events[1], "event: x\ndata: two\ndata: lines\n");
  EXPECT_EQ(events[2], "data: [DONE]\n");
  EXPECT_EQ(SseData(events[0]), "{\"text\": \"a\"}");
  EXPECT_EQ(SseData(events[1]), "two\nlines");
  EXPECT_TRUE(splitter.pending().empty());
}

TEST(SseTest, KeepsAnIncompleteEventPending) {
  SseEventSplitter splitter;
  splitter.Append("data: 1\n\ndata: part");
  EXPECT_EQ(splitter.Next(), "data: 1\n");
  EXPECT_FALSE(splitter.Next().has_value());
  EXPECT_EQ(splitter.pending(), "data: part");
  splitter.Append("ial\n\n");
  EXPECT_EQ(splitter.Next(), "data: partial\n");
}

TEST(SseTest, DataFieldsAndFormatting) {
  EXPECT_FALSE(SseData("event: ping\n").has_value());
  EXPECT_EQ(SseData("data:no-space\n"), "no-space");
  EXPECT_EQ(SseData("data\n"), "");
  EXPECT_EQ(SseEvent("x"), "data: x\n\n");
  EXPECT_EQ(SseEvent("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(SseData(SseEvent("a\nb")), "a\nb");
}

}  // namespace
}  // namespace stitch
