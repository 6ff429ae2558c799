#include "stitch/api/headers.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

HttpHeaders ClientRequest() {
  return HttpHeaders{{"Host", "gateway:9000"},         {"Content-Length", "12"},
                     {"Expect", "100-continue"},       {"Content-Type", "application/json"},
                     {"Accept-Encoding", "gzip"},      {"X-Session-Id", "s-1"},
                     {"Transfer-Encoding", "chunked"}, {"Authorization", "Bearer t"}};
}

TEST(HeadersTest, AHopThatPassesBodiesUnchangedKeepsTheirTypeAndEncoding) {
  const HttpHeaders out = RequestHeadersToForward(ClientRequest(), BodyRelay::kUnchanged);
  EXPECT_FALSE(out.Has("host"));
  EXPECT_FALSE(out.Has("content-length"));
  EXPECT_FALSE(out.Has("expect"));
  EXPECT_FALSE(out.Has("transfer-encoding"));
  EXPECT_EQ(out.Get("content-type"), "application/json");
  EXPECT_EQ(out.Get("accept-encoding"), "gzip");
  EXPECT_EQ(out.Get("x-session-id"), "s-1");
  EXPECT_EQ(out.Get("authorization"), "Bearer t");
}

TEST(HeadersTest, AHopThatRewritesBodiesSetsTheirTypeAndWantsThemUncompressed) {
  const HttpHeaders out = RequestHeadersToForward(ClientRequest(), BodyRelay::kRewritten);
  EXPECT_FALSE(out.Has("host"));
  EXPECT_FALSE(out.Has("expect"));
  EXPECT_FALSE(out.Has("content-type"));
  EXPECT_FALSE(out.Has("accept-encoding"));
  EXPECT_EQ(out.Get("x-session-id"), "s-1");
  EXPECT_EQ(out.Get("authorization"), "Bearer t");
}

TEST(HeadersTest, ResponsesLoseTheirLengthAndARewrittenBodyItsEncoding) {
  const HttpHeaders from{{"Content-Length", "5"},
                         {"Content-Encoding", "gzip"},
                         {"Content-Type", "application/json"},
                         {"Connection", "close"},
                         {"X-Engine", "1"}};
  const HttpHeaders unchanged = ResponseHeadersToRelay(from, BodyRelay::kUnchanged);
  EXPECT_FALSE(unchanged.Has("content-length"));
  EXPECT_FALSE(unchanged.Has("connection"));
  EXPECT_EQ(unchanged.Get("content-encoding"), "gzip");
  EXPECT_EQ(unchanged.Get("x-engine"), "1");
  HttpHeaders copy = from;
  const HttpHeaders rewritten = ResponseHeadersToRelay(std::move(copy), BodyRelay::kRewritten);
  EXPECT_FALSE(rewritten.Has("content-encoding"));
  EXPECT_EQ(rewritten.Get("content-type"), "application/json");
  EXPECT_EQ(rewritten.Get("x-engine"), "1");
}

TEST(HeadersTest, EventStreamsAreKnownByTheirContentType) {
  EXPECT_TRUE(IsEventStream(HttpHeaders{{"Content-Type", "text/event-stream"}}));
  EXPECT_TRUE(IsEventStream(HttpHeaders{{"content-type", "text/event-stream; charset=utf-8"}}));
  EXPECT_FALSE(IsEventStream(HttpHeaders{{"Content-Type", "application/json"}}));
  EXPECT_FALSE(IsEventStream(HttpHeaders{}));
}

}  // namespace
}  // namespace stitch
