#include "stitch/chaos/client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stitch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

RequestRecord Read(const std::string& route, const Reply& reply) {
  RequestRecord r;
  r.route = route;
  r.stream = reply.stream;
  ReadReply(reply, r);
  return r;
}

Reply Whole(int status, std::string body) {
  Reply reply;
  reply.status = status;
  reply.body = std::move(body);
  return reply;
}

Reply Stream(std::vector<std::string> events, bool cut = false) {
  Reply reply;
  reply.status = 200;
  reply.stream = true;
  reply.event_stream = true;
  reply.events = std::move(events);
  reply.cut = cut;
  return reply;
}

constexpr const char* kGenerate =
    R"({"text":"Hi","output_ids":[72,105],"meta_info":{"weight_version_start":4,"weight_version_end":5}})";

TEST(ReadReplyTest, AStampedAnswerIsAnsweredWithItsStampsAndOutput) {
  const RequestRecord g = Read("generate", Whole(200, kGenerate));
  EXPECT_EQ(g.outcome, Outcome::kAnswered);
  EXPECT_EQ(g.start, 4);
  EXPECT_EQ(g.end, 5);
  EXPECT_THAT(g.tokens, ElementsAre(72, 105));
  const RequestRecord c = Read(
      "completions",
      Whole(200, R"({"choices":[{"text":"Hi"}],"weight_version_start":3,"weight_version_end":3})"));
  EXPECT_EQ(c.outcome, Outcome::kAnswered);
  EXPECT_EQ(c.text, "Hi");
  EXPECT_EQ(c.start, 3);
}

// The spans of a whole answer, and of a stream its last event's (each
// event's are those so far), are kept as given.
TEST(ReadReplyTest, SpansAreKeptAsAnswered) {
  const RequestRecord g = Read(
      "generate", Whole(200, R"({"output_ids":[1,2],"meta_info":{"weight_version_start":4,)"
                             R"("weight_version_end":5,"weight_version_spans":[[0,4],[1,5]]}})"));
  EXPECT_EQ(g.spans, "[[0,4],[1,5]]");
  const RequestRecord s =
      Read("completions",
           Stream({R"({"choices":[{"text":"a"}],"weight_version_start":3,"weight_version_end":3,)"
                   R"("weight_version_spans":[[0,3]]})",
                   R"({"choices":[{"text":"b"}],"weight_version_start":3,"weight_version_end":4,)"
                   R"("weight_version_spans":"unknown"})",
                   "[DONE]"}));
  EXPECT_EQ(s.outcome, Outcome::kAnswered);
  EXPECT_EQ(s.spans, "unknown");
  EXPECT_TRUE(Read("generate", Whole(200, kGenerate)).spans.empty());
}

TEST(ParseSpansTest, SpansRiseWithinTheStamps) {
  auto ok = ParseSpans("[[0,4],[3,6]]", 4, 6);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (VersionSpans{{0, 4}, {3, 6}}));
  EXPECT_THAT(ParseSpans("[[0,3]]", 4, 6).status().message(), HasSubstr("outside the stamps"));
  EXPECT_THAT(ParseSpans("[[0,5],[3,4]]", 4, 6).status().message(), HasSubstr("rise"));
  EXPECT_THAT(ParseSpans("[[0,4],[0,5]]", 4, 6).status().message(), HasSubstr("rise"));
  EXPECT_FALSE(ParseSpans("[[0]]", 4, 6).ok());
  EXPECT_FALSE(ParseSpans("{}", 4, 6).ok());
}

TEST(ReadReplyTest, AnAnswerWithoutStampsOrWithABadBodyFailed) {
  const RequestRecord unstamped = Read("generate", Whole(200, R"({"output_ids":[1]})"));
  EXPECT_EQ(unstamped.outcome, Outcome::kFailed);
  EXPECT_THAT(unstamped.error, HasSubstr("without weight_version_start/end"));
  EXPECT_EQ(Read("generate", Whole(200, "not json")).outcome, Outcome::kFailed);
}

TEST(ReadReplyTest, RefusalsAndBrokenCallsAreRetryableOthersFailed) {
  EXPECT_EQ(Read("generate", Whole(409, "{}")).outcome, Outcome::kRetryable);
  EXPECT_EQ(Read("generate", Whole(503, "{}")).outcome, Outcome::kRetryable);
  EXPECT_EQ(Read("generate", Whole(429, "{}")).outcome, Outcome::kRetryable);
  const RequestRecord error = Read("generate", Whole(500, R"({"type":"HandlerError"})"));
  EXPECT_EQ(error.outcome, Outcome::kFailed);
  EXPECT_THAT(error.error, HasSubstr("HTTP 500"));
  EXPECT_EQ(Read("generate", Whole(401, "{}")).outcome, Outcome::kFailed);

  Reply refused;
  refused.error = "connect failed: Connection refused";
  EXPECT_EQ(Read("generate", refused).outcome, Outcome::kRetryable);
  Reply silent;
  silent.error = "no response within 60 s";
  silent.timed_out = true;
  EXPECT_EQ(Read("generate", silent).outcome, Outcome::kFailed);
  Reply left;
  left.left = true;
  left.error = "cancelled";
  EXPECT_EQ(Read("generate", left).outcome, Outcome::kClientLeft);
}

TEST(ReadReplyTest, AStreamIsAnsweredOnlyWhenEveryEventIsStampedUntilDone) {
  const std::string first =
      R"({"output_ids":[72],"meta_info":{"weight_version_start":4,"weight_version_end":4}})";
  const RequestRecord done = Read("generate", Stream({first, kGenerate, "[DONE]"}));
  EXPECT_EQ(done.outcome, Outcome::kAnswered);
  EXPECT_EQ(done.start, 4);
  EXPECT_EQ(done.end, 5);
  EXPECT_THAT(done.tokens, ElementsAre(72, 105));
  EXPECT_EQ(done.events, 3);

  const RequestRecord cut = Read("generate", Stream({first}, /*cut=*/true));
  EXPECT_EQ(cut.outcome, Outcome::kRetryable);
  EXPECT_FALSE(cut.start.has_value());
  EXPECT_EQ(Read("generate", Stream({first})).outcome, Outcome::kRetryable);

  const RequestRecord unvouched = Read(
      "generate",
      Stream(
          {first, R"({"type":"EngineUnavailable","message":"weights changed","retryable":true})"}));
  EXPECT_EQ(unvouched.outcome, Outcome::kRetryable);
  EXPECT_THAT(unvouched.error, HasSubstr("EngineUnavailable: weights changed"));

  const RequestRecord unstamped =
      Read("generate", Stream({first, R"({"output_ids":[72,105]})", "[DONE]"}));
  EXPECT_EQ(unstamped.outcome, Outcome::kFailed);
  const std::string earlier_start =
      R"({"output_ids":[72,105],"meta_info":{"weight_version_start":3,"weight_version_end":5}})";
  const RequestRecord disagree = Read("generate", Stream({first, earlier_start, "[DONE]"}));
  EXPECT_EQ(disagree.outcome, Outcome::kFailed);
  EXPECT_THAT(disagree.error, HasSubstr("streamed events disagree"));
}

TEST(ReadReplyTest, AStreamedCompletionIsItsDeltasJoined) {
  const RequestRecord c =
      Read("completions",
           Stream({R"({"choices":[{"text":"H"}],"weight_version_start":2,"weight_version_end":2})",
                   R"({"choices":[{"text":"i"}],"weight_version_start":2,"weight_version_end":3})",
                   "[DONE]"}));
  EXPECT_EQ(c.outcome, Outcome::kAnswered);
  EXPECT_EQ(c.text, "Hi");
  EXPECT_EQ(c.end, 3);
}

// vLLM's return_token_ids: each event carries its own tokens, which the
// transformers judge reads; /generate's output_ids are cumulative instead.
TEST(ReadReplyTest, ACompletionsTokenIdsAreKeptAndAStreamsAreJoined) {
  const RequestRecord whole = Read(
      "completions",
      Whole(
          200,
          R"({"choices":[{"text":"Hi","token_ids":[72,105]}],"weight_version_start":2,"weight_version_end":2})"));
  EXPECT_EQ(whole.outcome, Outcome::kAnswered);
  EXPECT_THAT(whole.tokens, ElementsAre(72, 105));
  const RequestRecord streamed = Read(
      "completions",
      Stream(
          {R"({"choices":[{"text":"H","token_ids":[72]}],"weight_version_start":2,"weight_version_end":2})",
           R"({"choices":[{"text":"i!","token_ids":[105,33]}],"weight_version_start":2,"weight_version_end":3})",
           "[DONE]"}));
  EXPECT_EQ(streamed.outcome, Outcome::kAnswered);
  EXPECT_THAT(streamed.tokens, ElementsAre(72, 105, 33));
  EXPECT_EQ(streamed.text, "Hi!");
  const RequestRecord generate = Read(
      "generate",
      Stream(
          {R"({"output_ids":[72],"meta_info":{"weight_version_start":2,"weight_version_end":2}})",
           R"({"output_ids":[72,105],"meta_info":{"weight_version_start":2,"weight_version_end":2}})",
           "[DONE]"}));
  EXPECT_THAT(generate.tokens, ElementsAre(72, 105));
  EXPECT_THAT(
      Read(
          "completions",
          Whole(
              200,
              R"({"choices":[{"text":"H","token_ids":["x"]}],"weight_version_start":2,"weight_version_end":2})"))
          .outcome,
      Outcome::kFailed);
}

}  // namespace
}  // namespace stitch
