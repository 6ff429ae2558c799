#include "stitch/api/request.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "tests/support/json_object.h"

namespace stitch {
namespace {

namespace json = boost::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::ParseObject;

// Tagging ---------------------------------------------------------------------

TEST(PromptPrefixTest, TheFirstBytesOfWhicheverPromptFieldIsGiven) {
  EXPECT_EQ(PromptPrefix(R"({"text":"hello world"})", 5), "hello");
  EXPECT_EQ(PromptPrefix(R"({"input_ids":[1,2,3]})", 4), "[1,2");
  EXPECT_EQ(PromptPrefix(R"({"prompt":"hi"})", 10), "hi");
  EXPECT_EQ(PromptPrefix(R"({"messages":[{"role":"user","content":"a"}]})", 9), R"([{"role":)");
  EXPECT_EQ(PromptPrefix(R"({"x":1})", 5), "");
  EXPECT_EQ(PromptPrefix("not json", 5), "");
}

TEST(WithConstraintTest, SetsWeightVersionAndKeepsTheRest) {
  auto body = WithConstraint(R"({"text":"hi"})", VersionConstraint::Fresh(1));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, R"({"text":"hi","weight_version":{"max_staleness":1}})");
  EXPECT_FALSE(WithConstraint("[1]", VersionConstraint::Fresh(1)).ok());
}

TEST(TaggingTest, GenerateGetsAnExtraKeyPrefixedWithTheServingVersion) {
  json::object body = ParseObject(R"({"text":"hi","extra_key":"user-7"})");
  TagRequest(ApiRoute::kGenerate, body, VersionRef{"r1", 7});
  EXPECT_EQ(body.at("extra_key").as_string(), CacheIsolationPrefix({"r1", 7}) + "user-7");
  EXPECT_FALSE(body.contains("cache_salt"));

  json::object bare = ParseObject(R"({"text":"hi"})");
  TagRequest(ApiRoute::kGenerate, bare, VersionRef{"r1", 12});
  EXPECT_EQ(bare.at("extra_key").as_string(), CacheIsolationPrefix({"r1", 12}));
}

// A batch's keys are a list, one per prompt: each is prefixed, none is
// lost to a single string.
TEST(TaggingTest, EachKeyOfABatchIsPrefixed) {
  json::object body = ParseObject(R"({"text":["a","b","c"],"extra_key":["x","y",7]})");
  TagRequest(ApiRoute::kGenerate, body, VersionRef{"r1", 2});
  const json::array& keys = body.at("extra_key").as_array();
  ASSERT_EQ(keys.size(), 3u);
  const std::string prefix = CacheIsolationPrefix({"r1", 2});
  EXPECT_EQ(keys[0].as_string(), prefix + "x");
  EXPECT_EQ(keys[1].as_string(), prefix + "y");
  EXPECT_EQ(keys[2].as_string(), prefix);  // not a string: replaced, never untagged
}

TEST(TaggingTest, OpenAiRoutesGetACacheSalt) {
  for (ApiRoute route : {ApiRoute::kCompletions, ApiRoute::kChatCompletions}) {
    json::object body = ParseObject(R"({"prompt":"hi","cache_salt":"s"})");
    TagRequest(route, body, VersionRef{"run-b", 3});
    EXPECT_EQ(body.at("cache_salt").as_string(), CacheIsolationPrefix({"run-b", 3}) + "s");
    EXPECT_FALSE(body.contains("extra_key"));
  }
}

// vLLM refuses a salt over 128 characters or holding '@', '/', '\\' or NUL
// (with a 400 for every request): what the sidecar adds never does, even
// for the longest run id with an '@', and the caller's own salt is kept
// (as its hash when the whole would be too long).
bool VllmAcceptsSalt(std::string_view salt) {
  return salt.size() <= 128 &&
         salt.find_first_of(std::string_view("@/\\\0", 4)) == std::string_view::npos;
}

TEST(TaggingTest, SaltsFollowVllmsRulesAndStillIsolateVersionsRunsAndCallers) {
  const std::string long_run = std::string(126, 'r') + "@x";
  for (const VersionRef& serving : {VersionRef{"r1", 0}, VersionRef{long_run, 999999999999}}) {
    EXPECT_TRUE(VllmAcceptsSalt(IsolationKey(serving, ""))) << IsolationKey(serving, "");
    EXPECT_TRUE(VllmAcceptsSalt(IsolationKey(serving, "tenant-a")));
    EXPECT_TRUE(VllmAcceptsSalt(IsolationKey(serving, std::string(128, 's'))));
  }
  EXPECT_EQ(IsolationKey({"r1", 3}, "tenant-a"), CacheIsolationPrefix({"r1", 3}) + "tenant-a");
  EXPECT_NE(IsolationKey({"r1", 3}, "a"), IsolationKey({"r1", 4}, "a"));
  EXPECT_NE(IsolationKey({"r1", 3}, "a"), IsolationKey({"r2", 3}, "a"));
  EXPECT_NE(IsolationKey({"r1", 3}, "a"), IsolationKey({"r1", 3}, "b"));
  EXPECT_NE(IsolationKey({"r1", 3}, std::string(120, 'a')),
            IsolationKey({"r1", 3}, std::string(121, 'a')));
  // A run id holding the separator cannot alias another run's caller value.
  EXPECT_NE(IsolationKey({"a:b", 3}, ""), IsolationKey({"a", 3}, "b:"));
}

TEST(TaggingTest, DifferentVersionsNeverShareACacheKey) {
  json::object a = ParseObject(R"({"extra_key":"k"})");
  json::object b = ParseObject(R"({"extra_key":"k"})");
  json::object c = ParseObject(R"({"extra_key":"k"})");
  TagRequest(ApiRoute::kGenerate, a, VersionRef{"r1", 1});
  TagRequest(ApiRoute::kGenerate, b, VersionRef{"r1", 11});
  TagRequest(ApiRoute::kGenerate, c, VersionRef{"r2", 1});
  EXPECT_NE(a.at("extra_key"), b.at("extra_key"));
  EXPECT_NE(a.at("extra_key"), c.at("extra_key"));
}

// Versioned bodies ----------------------------------------------------------------

TEST(VersionedBodyTest, TheConstraintAndStreamAreRead) {
  json::value doc;
  auto ask =
      ParseVersionedBody(R"({"text":"x","weight_version":{"min_version":3},"stream":true})", doc);
  ASSERT_TRUE(ask.ok()) << ask.status();
  EXPECT_EQ(ask->constraint.min_version, 3);
  EXPECT_TRUE(ask->stream);
  ASSERT_TRUE(doc.is_object());
  StripConstraint(doc.get_object());
  EXPECT_FALSE(doc.get_object().contains("weight_version"));
  EXPECT_TRUE(doc.get_object().contains("text"));

  auto plain = ReadVersionedAsk(R"({"text":"x","stream":"yes"})");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->constraint.empty());
  EXPECT_FALSE(plain->stream);
}

TEST(VersionedBodyTest, BadBodiesAreRefusedWithTheMessageOfThe400) {
  EXPECT_THAT(ReadVersionedAsk("not json").status().message(), HasSubstr("JSON object"));
  EXPECT_THAT(ReadVersionedAsk("[1]").status().message(), HasSubstr("JSON object"));
  EXPECT_THAT(ReadVersionedAsk(R"({"weight_version":{"exact_version":"x"}})").status().message(),
              HasSubstr("weight_version"));
  EXPECT_THAT(ReadVersionedAsk(R"({"weight_version":{"exact_version":1,"min_version":2}})")
                  .status()
                  .message(),
              HasSubstr("no version is both"));
  EXPECT_THAT(ReadVersionedAsk(R"({"weight_version":{},"weight_version":{}})").status().message(),
              HasSubstr("twice"));
}

// Request ids ---------------------------------------------------------------------

TEST(EngineRidsTest, OnePromptGetsTheBaseAndTheClientsRidAfterIt) {
  json::object body = ParseObject(R"({"text":"x","rid":"mine"})");
  auto rids = AssignEngineRids(ApiRoute::kGenerate, body, "stitch-0000000a-0000000000000001");
  ASSERT_TRUE(rids.ok()) << rids.status();
  EXPECT_THAT(rids->engine, ElementsAre("stitch-0000000a-0000000000000001-mine"));
  EXPECT_THAT(rids->client, ElementsAre("mine"));
  EXPECT_EQ(body.at("rid").as_string(), "stitch-0000000a-0000000000000001-mine");

  json::object none = ParseObject(R"({"prompt":"x","rid":null})");
  rids = AssignEngineRids(ApiRoute::kCompletions, none, "base");
  ASSERT_TRUE(rids.ok());
  EXPECT_THAT(rids->engine, ElementsAre("base"));
  EXPECT_THAT(rids->client, ElementsAre(""));
}

// vLLM carries the id in `request_id`; `rid` is left alone.
TEST(EngineRidsTest, VllmGetsItsIdInRequestId) {
  json::object body = ParseObject(R"({"prompt":"x","request_id":"job-7","rid":"other"})");
  auto rids = AssignEngineRids(ApiRoute::kCompletions, body, "base", EngineRidField::kRequestId);
  ASSERT_TRUE(rids.ok()) << rids.status();
  EXPECT_THAT(rids->engine, ElementsAre("base-job-7"));
  EXPECT_THAT(rids->client, ElementsAre("job-7"));
  EXPECT_EQ(body.at("request_id").as_string(), "base-job-7");
  EXPECT_EQ(body.at("rid").as_string(), "other");

  json::object number = ParseObject(R"({"prompt":"x","request_id":7})");
  EXPECT_EQ(AssignEngineRids(ApiRoute::kCompletions, number, "b", EngineRidField::kRequestId)
                .status()
                .message(),
            "request_id must be a string");
}

TEST(EngineRidsTest, ABatchGetsZeroPaddedIndicesOfOneWidth) {
  json::object body = ParseObject(
      R"({"text":["a","b","c","d","e","f","g","h","i","j","k"],
          "rid":["r0","","r2","r3","r4","r5","r6","r7","r8","r9","r10"]})");
  auto rids = AssignEngineRids(ApiRoute::kGenerate, body, "b");
  ASSERT_TRUE(rids.ok()) << rids.status();
  ASSERT_EQ(rids->engine.size(), 11u);
  EXPECT_EQ(rids->engine[0], "b-00-r0");
  EXPECT_EQ(rids->engine[1], "b-01");
  EXPECT_EQ(rids->engine[10], "b-10-r10");
  EXPECT_EQ(body.at("rid").as_array().size(), 11u);

  json::object ids = ParseObject(R"({"input_ids":[[1],[2]]})");
  rids = AssignEngineRids(ApiRoute::kGenerate, ids, "b");
  ASSERT_TRUE(rids.ok());
  EXPECT_THAT(rids->engine, ElementsAre("b-0", "b-1"));
}

TEST(EngineRidsTest, RidsOfTheWrongShapeAreRefused) {
  json::object number = ParseObject(R"({"text":"x","rid":7})");
  EXPECT_EQ(AssignEngineRids(ApiRoute::kGenerate, number, "b").status().message(),
            "rid must be a string");
  json::object short_list = ParseObject(R"({"text":["a","b"],"rid":["x"]})");
  EXPECT_THAT(AssignEngineRids(ApiRoute::kGenerate, short_list, "b").status().message(),
              HasSubstr("a list of 2 strings"));
  json::object mixed = ParseObject(R"({"text":["a","b"],"rid":["x",1]})");
  EXPECT_THAT(AssignEngineRids(ApiRoute::kGenerate, mixed, "b").status().message(),
              HasSubstr("list of strings"));
}

}  // namespace
}  // namespace stitch
