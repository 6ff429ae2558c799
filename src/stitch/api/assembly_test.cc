#include "stitch/api/assembly.h"

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

TEST(SingleGenerationTest, OnePromptSampledOnceIsASingleGeneration) {
  EXPECT_TRUE(IsSingleGeneration(ParseObject(R"({"text":"hi"})")));
  EXPECT_TRUE(IsSingleGeneration(ParseObject(R"({"input_ids":[1,2,3],"text":null})")));
  EXPECT_TRUE(IsSingleGeneration(ParseObject(R"({"text":"hi","sampling_params":{"n":1}})")));
  EXPECT_TRUE(
      IsSingleGeneration(ParseObject(R"({"text":"hi","sampling_params":{"temperature":0}})")));
}

TEST(SingleGenerationTest, BatchesParallelSamplingAndOddPromptsAreNot) {
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"text":["a","b"]})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"text":["a"]})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"input_ids":[[1,2],[3]]})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"input_ids":[]})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"text":"hi","input_ids":[1]})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"text":"hi","sampling_params":{"n":4}})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"text":"hi","sampling_params":[{}]})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"input_embeds":[[0.5]]})")));
  EXPECT_FALSE(IsSingleGeneration(ParseObject(R"({"sampling_params":{}})")));
}

// SGLang's default: every event is the whole answer so far; the last one is
// the answer, whatever it carries.
TEST(GenerateAssemblerTest, CumulativeEventsGiveTheLastOne) {
  GenerateAssembler a;
  ASSERT_TRUE(a.Add(ParseObject(R"({"text":"a","output_ids":[7],)"
                                R"("meta_info":{"completion_tokens":1,"weight_version":"3"}})"))
                  .ok());
  ASSERT_TRUE(a.Add(ParseObject(R"({"text":"ab","output_ids":[7,8],)"
                                R"("meta_info":{"completion_tokens":2,"weight_version":"4"}})"))
                  .ok());
  ASSERT_TRUE(
      a.Add(ParseObject(R"({"text":"abc","output_ids":[7,8,9],"meta_info":{"completion_tokens":3,)"
                        R"("weight_version":"4","finish_reason":{"type":"length"},)"
                        R"("output_token_logprobs":[[-1,7],[-2,8],[-3,9]]}})"))
          .ok());
  EXPECT_EQ(a.events(), 3);
  auto answer = std::move(a).Finish();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(json::serialize(*answer),
            R"({"text":"abc","output_ids":[7,8,9],"meta_info":{"completion_tokens":3,)"
            R"("weight_version":"4","finish_reason":{"type":"length"},)"
            R"("output_token_logprobs":[[-1,7],[-2,8],[-3,9]]}})");
}

// --incremental-streaming-output: text, ids and the per-token meta_info
// lists are joined; everything else is the last event's.
TEST(GenerateAssemblerTest, IncrementalEventsAreJoined) {
  GenerateAssembler a;
  ASSERT_TRUE(
      a.Add(ParseObject(R"({"text":"ab","output_ids":[7,8],"meta_info":{"completion_tokens":2,)"
                        R"("weight_version":"3","output_token_logprobs":[[-1,7],[-2,8]]}})"))
          .ok());
  ASSERT_TRUE(
      a.Add(ParseObject(R"({"text":"c","output_ids":[9],"meta_info":{"completion_tokens":3,)"
                        R"("weight_version":"4","output_token_logprobs":[[-3,9]]}})"))
          .ok());
  ASSERT_TRUE(a.Add(ParseObject(R"({"text":"","output_ids":[],"meta_info":{"completion_tokens":3,)"
                                R"("weight_version":"4","finish_reason":{"type":"stop"},)"
                                R"("output_token_logprobs":[]}})"))
                  .ok());
  auto answer = std::move(a).Finish();
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->at("text").as_string(), "abc");
  EXPECT_EQ(json::serialize(answer->at("output_ids")), "[7,8,9]");
  const json::object& meta = answer->at("meta_info").as_object();
  EXPECT_EQ(json::serialize(meta.at("output_token_logprobs")), "[[-1,7],[-2,8],[-3,9]]");
  EXPECT_EQ(meta.at("completion_tokens").as_int64(), 3);
  EXPECT_EQ(meta.at("weight_version").as_string(), "4");
  EXPECT_EQ(meta.at("finish_reason").at("type").as_string(), "stop");
}

// Events that fit neither form, switch forms, or lack what places them are
// refused, and nothing is assembled after that.
TEST(GenerateAssemblerTest, EventsThatCannotBePlacedAreRefused) {
  {
    GenerateAssembler a;
    ASSERT_TRUE(
        a.Add(ParseObject(R"({"output_ids":[1,2],"meta_info":{"completion_tokens":2}})")).ok());
    absl::Status s =
        a.Add(ParseObject(R"({"output_ids":[3,4],"meta_info":{"completion_tokens":5}})"));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("event 2"), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("neither the whole answer so far nor what is new"),
              std::string_view::npos)
        << s;
    EXPECT_FALSE(std::move(a).Finish().ok());
  }
  {
    // Cumulative, then something that only fits the incremental form.
    GenerateAssembler a;
    ASSERT_TRUE(
        a.Add(ParseObject(R"({"output_ids":[1],"meta_info":{"completion_tokens":1}})")).ok());
    ASSERT_TRUE(
        a.Add(ParseObject(R"({"output_ids":[1,2],"meta_info":{"completion_tokens":2}})")).ok());
    EXPECT_FALSE(
        a.Add(ParseObject(R"({"output_ids":[3],"meta_info":{"completion_tokens":3}})")).ok());
  }
  {
    GenerateAssembler a;
    absl::Status s = a.Add(ParseObject(R"({"text":"x","meta_info":{"completion_tokens":1}})"));
    EXPECT_NE(s.message().find("no output_ids"), std::string_view::npos) << s;
  }
  {
    GenerateAssembler a;
    absl::Status s = a.Add(ParseObject(R"({"text":"x","output_ids":[1],"meta_info":{}})"));
    EXPECT_NE(s.message().find("completion_tokens"), std::string_view::npos) << s;
  }
  {
    GenerateAssembler a;
    EXPECT_TRUE(absl::IsFailedPrecondition(std::move(a).Finish().status()));
  }
}

}  // namespace
}  // namespace stitch
