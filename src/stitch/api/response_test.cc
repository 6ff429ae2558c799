#include "stitch/api/response.h"

#include <string>

#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "tests/support/json_object.h"

namespace stitch {
namespace {

namespace json = boost::json;

using testing::ParseObject;

TEST(StampingTest, GenerateIsStampedInsideMetaInfo) {
  json::object body = ParseObject(R"({"text":"x","meta_info":{"id":"a","weight_version":"9"}})");
  StampResponse(ApiRoute::kGenerate, body, VersionStamp{4, 5});
  const json::object& meta = body.at("meta_info").as_object();
  EXPECT_EQ(meta.at("weight_version_start").as_int64(), 4);
  EXPECT_EQ(meta.at("weight_version_end").as_int64(), 5);
  // The version the generation started on, as the original reports it.
  EXPECT_EQ(meta.at("weight_version").as_string(), "4");
  EXPECT_EQ(meta.at("id").as_string(), "a");
  EXPECT_FALSE(body.contains("weight_version_start"));

  json::object no_meta = ParseObject(R"({"text":"x"})");
  StampResponse(ApiRoute::kGenerate, no_meta, VersionStamp{2, 2});
  EXPECT_EQ(no_meta.at("meta_info").at("weight_version_end").as_int64(), 2);
}

TEST(StampingTest, OpenAiRoutesAreStampedAtTheTopLevel) {
  json::object body = ParseObject(R"({"id":"cmpl","choices":[]})");
  StampResponse(ApiRoute::kChatCompletions, body, VersionStamp{7, 8});
  EXPECT_EQ(body.at("weight_version_start").as_int64(), 7);
  EXPECT_EQ(body.at("weight_version_end").as_int64(), 8);
  EXPECT_FALSE(body.contains("meta_info"));
}

TEST(StampingTest, TheStampedEndVersionIsReadBack) {
  for (ApiRoute route : {ApiRoute::kGenerate, ApiRoute::kCompletions}) {
    json::object body = ParseObject(R"({"text":"x","meta_info":{"id":"a"}})");
    StampResponse(route, body, VersionStamp{3, 6});
    EXPECT_EQ(StampedEndVersion(json::serialize(body)), 6);
  }
  // A batch: the first document's.
  EXPECT_EQ(StampedEndVersion(R"([{"meta_info":{"weight_version_end":2}},{}])"), 2);
  // Nothing stamped, or not a stamp.
  EXPECT_EQ(StampedEndVersion(R"({"text":"x","meta_info":{}})"), std::nullopt);
  EXPECT_EQ(StampedEndVersion(R"({"weight_version_end":"2"})"), std::nullopt);
  EXPECT_EQ(StampedEndVersion("[]"), std::nullopt);
  EXPECT_EQ(StampedEndVersion("not json"), std::nullopt);
}

TEST(ResponseLabelTest, ResponseLabelsAreReadWhereEachRoutePutsThem) {
  auto label = [](std::string_view text) {
    boost::system::error_code ec;
    json::value v = json::parse(text, ec);
    EXPECT_FALSE(ec);
    return ResponseWeightLabel(v);
  };
  EXPECT_EQ(label(R"({"meta_info": {"weight_version": "5"}})"), "5");
  EXPECT_EQ(label(R"([{"meta_info": {"weight_version": "r/weight_v000005"}}, {}])"),
            "r/weight_v000005");
  EXPECT_EQ(label(R"({"choices": [], "metadata": {"weight_version": "5"}})"), "5");
  EXPECT_EQ(label(R"({"meta_info": {"weight_version": 5}})"), "5");
  EXPECT_EQ(label(R"({"meta_info": {"weight_version": null}})"), "");
  EXPECT_EQ(label(R"({"choices": []})"), std::nullopt);
  EXPECT_EQ(label(R"({"meta_info": {}})"), std::nullopt);
}

TEST(RestoreRidTest, TheClientsOwnIdComesBackWhereTheEnginesWas) {
  json::object generate = ParseObject(R"({"meta_info":{"id":"stitch-1-mine"}})");
  RestoreRid(ApiRoute::kGenerate, generate, "stitch-1-mine", "mine");
  EXPECT_EQ(generate.at("meta_info").at("id").as_string(), "mine");

  json::object chat = ParseObject(R"({"id":"chatcmpl-stitch-1-mine"})");
  RestoreRid(ApiRoute::kChatCompletions, chat, "stitch-1-mine", "mine");
  EXPECT_EQ(chat.at("id").as_string(), "chatcmpl-mine");

  json::object tokens = ParseObject(R"({"request_id":"generate-tokens-stitch-1-mine"})");
  RestoreRid(ApiRoute::kTokens, tokens, "stitch-1-mine", "mine");
  EXPECT_EQ(tokens.at("request_id").as_string(), "generate-tokens-mine");

  json::object other = ParseObject(R"({"meta_info":{"id":"someone-else"}})");
  RestoreRid(ApiRoute::kGenerate, other, "stitch-1-mine", "mine");
  EXPECT_EQ(other.at("meta_info").at("id").as_string(), "someone-else");
}

TEST(SpansTest, StampedAsPairsOrUnknownBesideTheVersions) {
  json::object generate = ParseObject(R"({"text":"x"})");
  StampSpans(ApiRoute::kGenerate, generate, VersionSpans{{0, 4}, {37, 5}});
  EXPECT_EQ(json::serialize(generate.at("meta_info").at("weight_version_spans")), "[[0,4],[37,5]]");
  json::object chat = ParseObject(R"({"id":"c"})");
  StampSpans(ApiRoute::kChatCompletions, chat, std::nullopt);
  EXPECT_EQ(chat.at("weight_version_spans").as_string(), "unknown");
}

TEST(SpansTest, ReportedSpansAreReadWhereTheyAreStampedAndChecked) {
  auto read = ReportedSpans(ApiRoute::kGenerate,
                            ParseObject(R"({"meta_info":{"weight_version_spans":[[0,1],[3,2]]}})"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, (VersionSpans{{0, 1}, {3, 2}}));
  read = ReportedSpans(ApiRoute::kCompletions, ParseObject(R"({"weight_version_spans":[]})"));
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, VersionSpans{});
  read = ReportedSpans(ApiRoute::kCompletions, ParseObject(R"({"text":"x"})"));
  ASSERT_TRUE(read.ok());
  EXPECT_FALSE(read->has_value());
  for (const char* bad :
       {R"({"weight_version_spans":[[1,1]]})", R"({"weight_version_spans":[[0,1],[0,2]]})",
        R"({"weight_version_spans":[[0,-1]]})", R"({"weight_version_spans":[[0,"1"]]})",
        R"({"weight_version_spans":{"0":1}})"}) {
    EXPECT_FALSE(ReportedSpans(ApiRoute::kCompletions, ParseObject(bad)).ok()) << bad;
  }
}

// SGLang's and vLLM's `weight_versions`, where each puts them, in labels.
TEST(SpansTest, EnginesWeightVersionsAreReadWhereEachEnginePutsThem) {
  auto read = EngineReportedSpans(
      ApiRoute::kGenerate, ParseObject(R"({"meta_info":{"completion_tokens":5,"weight_versions":[)"
                                       R"({"version":"r1/weight_v000001","start":0,"end":3},)"
                                       R"({"version":"r1/weight_v000002","start":3,"end":5}]}})"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, (LabelledSpans{{0, "r1/weight_v000001"}, {3, "r1/weight_v000002"}}));
  // An OpenAI answer of one choice: SGLang's `metadata`, or vLLM's choice.
  read = EngineReportedSpans(
      ApiRoute::kCompletions,
      ParseObject(R"({"choices":[{"text":"ab"}],"usage":{"completion_tokens":2},)"
                  R"("metadata":{"weight_versions":[{"version":"7","start":0,"end":2}]}})"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, (LabelledSpans{{0, "7"}}));
  read = EngineReportedSpans(
      ApiRoute::kChatCompletions,
      ParseObject(R"({"choices":[{"weight_versions":[{"version":"3","start":0,"end":1}]}]})"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, (LabelledSpans{{0, "3"}}));
  // Nothing generated: one empty span.
  read = EngineReportedSpans(
      ApiRoute::kGenerate,
      ParseObject(R"({"meta_info":{"completion_tokens":0,)"
                  R"("weight_versions":[{"version":"1","start":0,"end":0}]}})"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, LabelledSpans{});
  // The reference engine's pairs, labels being their numbers.
  read = EngineReportedSpans(ApiRoute::kCompletions,
                             ParseObject(R"({"weight_version_spans":[[0,1],[2,4]]})"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, (LabelledSpans{{0, "1"}, {2, "4"}}));
}

TEST(SpansTest, EnginesWeightVersionsThatDoNotCoverTheTokensOrOneChoiceAreNotUsed) {
  // SGLang's `metadata` describes the first choice alone.
  auto read = EngineReportedSpans(
      ApiRoute::kCompletions,
      ParseObject(R"({"choices":[{},{}],"usage":{"completion_tokens":4},)"
                  R"("metadata":{"weight_versions":[{"version":"1","start":0,"end":2}]}})"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_FALSE(read->has_value());
  for (const char* bad : {
           R"({"meta_info":{"weight_versions":[{"version":"1","start":1,"end":2}]}})",
           R"({"meta_info":{"weight_versions":[{"version":"1","start":0,"end":2},)"
           R"({"version":"2","start":1,"end":3}]}})",
           R"({"meta_info":{"weight_versions":[{"version":"1","start":0,"end":2},)"
           R"({"version":"2","start":3,"end":4}]}})",
           R"({"meta_info":{"weight_versions":[{"version":"1","start":0}]}})",
           R"({"meta_info":{"weight_versions":[{"version":null,"start":0,"end":1}]}})",
           R"({"meta_info":{"weight_versions":{"version":"1"}}})",
           // Spans that end before (or after) the tokens the answer reports.
           R"({"meta_info":{"completion_tokens":3,)"
           R"("weight_versions":[{"version":"1","start":0,"end":2}]}})",
           R"({"usage":{"completion_tokens":2},"weight_version_spans":[[0,1],[2,2]]})",
       }) {
    EXPECT_FALSE(EngineReportedSpans(ApiRoute::kGenerate, ParseObject(bad)).ok() &&
                 EngineReportedSpans(ApiRoute::kCompletions, ParseObject(bad)).ok())
        << bad;
  }
}

TEST(SpansTest, CompletionTokensComeFromMetaInfoOutputIdsOrUsage) {
  EXPECT_EQ(ReportedCompletionTokens(ApiRoute::kGenerate,
                                     ParseObject(R"({"meta_info":{"completion_tokens":7}})")),
            7);
  EXPECT_EQ(ReportedCompletionTokens(ApiRoute::kGenerate, ParseObject(R"({"output_ids":[1,2]})")),
            2);
  EXPECT_EQ(ReportedCompletionTokens(ApiRoute::kChatCompletions,
                                     ParseObject(R"({"usage":{"completion_tokens":3}})")),
            3);
  EXPECT_EQ(ReportedCompletionTokens(ApiRoute::kChatCompletions, ParseObject(R"({"choices":[]})")),
            std::nullopt);
}

TEST(SpanDeriverTest, OneTokenEventsGiveExactSpansAcrossSeveralCommits) {
  SpanDeriver d(4);
  d.Observe(4, 1);
  d.Observe(4, 2);
  d.Observe(5, 3);  // the third token is the first under 5
  d.Observe(5, 3);  // no new token
  d.Observe(7, 4);
  EXPECT_EQ(d.spans(), (VersionSpans{{0, 4}, {2, 5}, {3, 7}}));
}

TEST(SpanDeriverTest, SeveralTokensUnderTheLabelTheyStartedOnAreExact) {
  SpanDeriver d(4);
  d.Observe(4, 10);  // a whole response labelled as at admission
  EXPECT_EQ(d.spans(), (VersionSpans{{0, 4}}));
  d.Observe(6, 10);  // the label moved between tokens
  d.Observe(6, 15);
  EXPECT_EQ(d.spans(), (VersionSpans{{0, 4}, {10, 6}}));
}

TEST(SpanDeriverTest, SeveralTokensUnderANewLabelHideWhereItChanged) {
  SpanDeriver d(4);
  d.Observe(4, 2);
  d.Observe(5, 5);
  EXPECT_EQ(d.spans(), std::nullopt);
  d.Observe(5, 6);  // once lost, never guessed again
  EXPECT_EQ(d.spans(), std::nullopt);
  SpanDeriver silent(4);
  silent.Observe(std::nullopt, 3);
  EXPECT_EQ(silent.spans(), std::nullopt);
  SpanDeriver uncounted(4);
  uncounted.Observe(4, std::nullopt);
  EXPECT_EQ(uncounted.spans(), std::nullopt);
}

}  // namespace
}  // namespace stitch
