#include "stitch/publish/request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stitch {
namespace {

using ::testing::HasSubstr;

std::string Constrain(std::string_view body, const VersionConstraint& c) {
  auto out = ConstrainRequestBody(body, c);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "";
}

TEST(RequestTest, SetsTheConstraintAndKeepsOtherFields) {
  EXPECT_EQ(
      Constrain(R"({"text":"hi","sampling_params":{"max_new_tokens":4}})",
                VersionConstraint::Exact(7)),
      R"({"text":"hi","sampling_params":{"max_new_tokens":4},"weight_version":{"exact_version":7}})");
}

TEST(RequestTest, ReplacesAPreviousConstraint) {
  EXPECT_EQ(Constrain(R"({"weight_version":{"exact_version":1},"text":"x"})",
                      VersionConstraint::AtLeast(3)),
            R"({"weight_version":{"min_version":3},"text":"x"})");
}

TEST(RequestTest, AnEmptyConstraintRemovesTheField) {
  EXPECT_EQ(Constrain(R"({"weight_version":{"min_version":1},"text":"x"})", VersionConstraint{}),
            R"({"text":"x"})");
}

TEST(RequestTest, TheBodyMustBeAJsonObject) {
  for (std::string_view body : {"[1,2]", "\"text\"", "{", ""}) {
    auto out = ConstrainRequestBody(body, VersionConstraint::Exact(1));
    EXPECT_TRUE(absl::IsInvalidArgument(out.status())) << body;
  }
  EXPECT_THAT(std::string(ConstrainRequestBody("[1]", VersionConstraint{}).status().message()),
              HasSubstr("JSON object"));
}

TEST(RequestTest, ExactBeatsLagAndLagCountsBackFromLatest) {
  auto exact = ConstrainRequestBodyToLatest("{}", 10, 2, 4);
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(*exact, R"({"weight_version":{"exact_version":4}})");
  auto lagged = ConstrainRequestBodyToLatest("{}", 10, 2, std::nullopt);
  ASSERT_TRUE(lagged.ok());
  EXPECT_EQ(*lagged, R"({"weight_version":{"min_version":8}})");
  auto clamped = ConstrainRequestBodyToLatest("{}", 1, 5, std::nullopt);
  ASSERT_TRUE(clamped.ok());
  EXPECT_EQ(*clamped, R"({"weight_version":{"min_version":0}})");
  auto unknown = ConstrainRequestBodyToLatest(R"({"weight_version":{"min_version":3}})",
                                              std::nullopt, 2, std::nullopt);
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(*unknown, "{}");
}

TEST(RequestTest, NegativeLagAndBadVersionsAreRefused) {
  EXPECT_TRUE(
      absl::IsInvalidArgument(ConstrainRequestBodyToLatest("{}", 3, -1, std::nullopt).status()));
  EXPECT_FALSE(ConstrainRequestBodyToLatest("{}", std::nullopt, 0, -4).ok());
}

}  // namespace
}  // namespace stitch
