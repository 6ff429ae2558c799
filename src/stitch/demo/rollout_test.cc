#include "stitch/demo/rollout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stitch {
namespace {

using ::testing::HasSubstr;

TEST(Rollout, RequestAsksForLogProbsAndTheVersionConstraint) {
  RolloutRequest request;
  request.prompt = {256, 'h', 'i'};
  request.max_new_tokens = 4;
  request.min_version = 3;
  std::string body = GenerateRequestBody(request);
  EXPECT_THAT(body, HasSubstr("\"input_ids\":[256,104,105]"));
  EXPECT_THAT(body, HasSubstr("\"return_logprob\":true"));
  EXPECT_THAT(body, HasSubstr("\"weight_version\":{\"min_version\":3}"));
  request.min_version.reset();
  EXPECT_THAT(GenerateRequestBody(request), ::testing::Not(HasSubstr("weight_version")));
}

TEST(Rollout, ParsesTheSidecarsStampedResponse) {
  auto r = ParseGenerateResponse(
      R"({"text":"ab","output_ids":[97,98],"meta_info":{"weight_version":"4",)"
      R"("weight_version_start":3,"weight_version_end":4,)"
      R"("output_token_logprobs":[[-0.5,97,null],[-1,98,null]]}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->output_ids, (std::vector<int32_t>{97, 98}));
  EXPECT_EQ(r->logprobs, (std::vector<double>{-0.5, -1.0}));
  EXPECT_EQ(r->version_start, 3);
  EXPECT_EQ(r->version_end, 4);
}

TEST(Rollout, RefusesUnstampedOrInconsistentResponses) {
  auto unstamped = ParseGenerateResponse(
      R"({"output_ids":[97],"meta_info":{"output_token_logprobs":[[-0.5,97,null]]}})");
  EXPECT_THAT(unstamped.status().message(), HasSubstr("weight_version_start"));
  auto short_logprobs = ParseGenerateResponse(
      R"({"output_ids":[97,98],"meta_info":{"weight_version_start":1,"weight_version_end":1,)"
      R"("output_token_logprobs":[[-0.5,97,null]]}})");
  EXPECT_FALSE(short_logprobs.ok());
  EXPECT_FALSE(ParseGenerateResponse("not json").ok());
}

}  // namespace
}  // namespace stitch
