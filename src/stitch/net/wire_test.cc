#include "stitch/net/wire.h"

#include <string>

#include <gtest/gtest.h>

namespace stitch::net_internal {
namespace {

// The head FormatResponseHead writes into an empty string, or its error.
std::string ResponseHead(unsigned version, int status, const HttpHeaders& headers, Framing framing,
                         size_t body_size, bool keep_alive, bool* close) {
  std::string head;
  const absl::Status s =
      FormatResponseHead(version, status, headers, framing, body_size, keep_alive, close, head);
  return s.ok() ? head : "error: " + s.ToString();
}

TEST(WireTest, ResponseHeadCarriesTheFieldsTheLengthAndNoFramingFromTheHandler) {
  HttpHeaders headers{{"Content-Type", "application/json"},
                      {"Content-Length", "999"},
                      {"Transfer-Encoding", "chunked"},
                      {"X-Trace", "a, b"}};
  bool close = false;
  EXPECT_EQ(ResponseHead(11, 200, headers, Framing::kLength, 17, /*keep_alive=*/true, &close),
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Trace: a, b\r\n"
            "Content-Length: 17\r\n\r\n");
  EXPECT_FALSE(close);
}

TEST(WireTest, ResponseHeadSaysHowTheConnectionEnds) {
  bool close = false;
  // HTTP/1.1 keeps the connection unless told otherwise.
  EXPECT_EQ(ResponseHead(11, 503, {}, Framing::kLength, 0, /*keep_alive=*/false, &close),
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  // HTTP/1.0 closes unless told otherwise.
  EXPECT_EQ(ResponseHead(10, 200, {}, Framing::kLength, 2, /*keep_alive=*/true, &close),
            "HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n");
  // A handler's "Connection: close" closes after this answer.
  EXPECT_EQ(ResponseHead(11, 200, {{"Connection", "keep-alive, close"}}, Framing::kLength, 0, true,
                         &close),
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(close);
}

TEST(WireTest, NoContentHasNoLength) {
  bool close = false;
  EXPECT_EQ(ResponseHead(11, 204, {}, Framing::kNone, 0, true, &close),
            "HTTP/1.1 204 No Content\r\n\r\n");
}

TEST(WireTest, AStreamedBodyIsChunkedOrEndsWithAnHttp10Connection) {
  HttpHeaders headers{{"Content-Type", "text/event-stream"}, {"Content-Length", "5"}};
  bool close = false;
  EXPECT_EQ(ResponseHead(11, 200, headers, Framing::kStreamed, 0, true, &close),
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\n\r\n");
  EXPECT_FALSE(close);
  EXPECT_EQ(ResponseHead(10, 200, headers, Framing::kStreamed, 0, true, &close),
            "HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n");
  EXPECT_TRUE(close);
}

TEST(WireTest, AStatusWithoutAKnownReasonHasAnEmptyOne) {
  bool close = false;
  EXPECT_EQ(ResponseHead(11, 299, {}, Framing::kLength, 0, true, &close),
            "HTTP/1.1 299 \r\nContent-Length: 0\r\n\r\n");
}

TEST(WireTest, FieldsThatWouldSplitTheHeadAreRefused) {
  const HttpHeaders bad[] = {
      {{"X-Ok", "1"}, {"X-Evil", "a\r\nSet-Cookie: stolen"}},
      {{"X-Evil", std::string("a\0b", 3)}},
      {{"X Evil", "1"}},
      {{"X-Evil:", "1"}},
      {{"", "1"}},
  };
  for (const HttpHeaders& headers : bad) {
    std::string head = "unchanged";
    bool close = false;
    absl::Status s = AppendFields(headers, false, head, &close);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_EQ(head, "unchanged");
    head.clear();
    s = FormatResponseHead(11, 200, headers, Framing::kLength, 0, true, &close, head);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    head.clear();
    s = FormatRequestHead("GET", "/", headers, "h:1", 0, head);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  }
}

TEST(WireTest, RequestHeadNamesTheHostAndTheLengthWhenThereIsABody) {
  std::string head;
  ASSERT_TRUE(
      FormatRequestHead(
          "POST", "/generate?x=1",
          {{"Content-Type", "application/json"}, {"Host", "elsewhere:1"}, {"Connection", "close"}},
          "127.0.0.1:8000", 12, head)
          .ok());
  EXPECT_EQ(head,
            "POST /generate?x=1 HTTP/1.1\r\nContent-Type: application/json\r\n"
            "Host: 127.0.0.1:8000\r\nContent-Length: 12\r\n\r\n");
  // A GET without a body says nothing of length; a POST without one says 0.
  head.clear();
  ASSERT_TRUE(FormatRequestHead("GET", "/health", {}, "h:1", 0, head).ok());
  EXPECT_EQ(head, "GET /health HTTP/1.1\r\nHost: h:1\r\n\r\n");
  head.clear();
  ASSERT_TRUE(FormatRequestHead("POST", "/flush_cache", {}, "h:1", 0, head).ok());
  EXPECT_EQ(head, "POST /flush_cache HTTP/1.1\r\nHost: h:1\r\nContent-Length: 0\r\n\r\n");
}

TEST(WireTest, RequestLineIsChecked) {
  std::string head;
  EXPECT_TRUE(absl::IsInvalidArgument(FormatRequestHead("", "/", {}, "h:1", 0, head)));
  EXPECT_TRUE(absl::IsInvalidArgument(FormatRequestHead("GE T", "/", {}, "h:1", 0, head)));
  EXPECT_TRUE(absl::IsInvalidArgument(FormatRequestHead("GET", "health", {}, "h:1", 0, head)));
  EXPECT_TRUE(absl::IsInvalidArgument(FormatRequestHead("GET", "/a b", {}, "h:1", 0, head)));
  EXPECT_TRUE(absl::IsInvalidArgument(FormatRequestHead("GET", "/a\r\nX: y", {}, "h:1", 0, head)));
  EXPECT_EQ(head, "");
}

}  // namespace
}  // namespace stitch::net_internal
