#include "stitch/core/constraint.h"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>

#include "stitch/core/json.h"

namespace stitch {
namespace {

TEST(VersionConstraint, EmptyIsSatisfiedByAnything) {
  VersionConstraint c;
  EXPECT_TRUE(c.empty());
  EXPECT_TRUE(c.SatisfiedBy(std::nullopt));
  EXPECT_TRUE(c.SatisfiedBy(0));
  EXPECT_TRUE(c.SatisfiedBy(99));
}

TEST(VersionConstraint, ReplicaWithoutAppliedVersionSatisfiesOnlyEmpty) {
  EXPECT_FALSE(VersionConstraint::AtLeast(0).SatisfiedBy(std::nullopt));
  EXPECT_FALSE(VersionConstraint::Exact(0).SatisfiedBy(std::nullopt));
}

TEST(VersionConstraint, MinAndExactSemantics) {
  auto min = VersionConstraint::AtLeast(5);
  EXPECT_FALSE(min.SatisfiedBy(4));
  EXPECT_TRUE(min.SatisfiedBy(5));
  EXPECT_TRUE(min.SatisfiedBy(6));
  auto exact = VersionConstraint::Exact(5);
  EXPECT_FALSE(exact.SatisfiedBy(4));
  EXPECT_TRUE(exact.SatisfiedBy(5));
  EXPECT_FALSE(exact.SatisfiedBy(6));
}

TEST(VersionConstraint, ExactBeatsMin) {
  auto c = VersionConstraint::FromJson(R"({"min_version": 9, "exact_version": 3})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->exact_version, 3);
  EXPECT_TRUE(c->SatisfiedBy(3));
  EXPECT_FALSE(c->SatisfiedBy(9));
  EXPECT_EQ(c->ToJson(), R"({"exact_version":3})");
}

TEST(VersionConstraint, JsonRoundTrip) {
  for (VersionConstraint c : {VersionConstraint{}, VersionConstraint::AtLeast(12),
                              VersionConstraint::Exact(0), VersionConstraint::Exact(kMaxVersion)}) {
    auto back = VersionConstraint::FromJson(c.ToJson());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c) << c.ToJson();
  }
}

TEST(VersionConstraint, NullAndNullFieldsMeanNoConstraint) {
  auto c = VersionConstraint::FromJson("null");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
  c = VersionConstraint::FromJson(R"({"min_version": null})");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
}

TEST(VersionConstraint, BadValuesAreClearErrors) {
  struct Case {
    const char* json;
    const char* says;
  };
  for (const Case& k : {
           Case{R"({"min_version": "7"})", "integer"},
           Case{R"({"min_version": 7.5})", "integer"},
           Case{R"({"exact_version": -1})", "negative"},
           Case{R"({"exact_version": true})", "integer"},
           Case{R"({"min_version": 18446744073709551615})", "maximum"},
           Case{R"({"min_version": 9007199254740992})", "maximum"},
           Case{R"({"min_versoin": 3})", "unknown field"},
           Case{R"([3])", "object"},
           Case{R"({"min_version": )", "JSON"},
       }) {
    auto c = VersionConstraint::FromJson(k.json);
    ASSERT_FALSE(c.ok()) << k.json;
    EXPECT_NE(c.status().message().find(k.says), std::string::npos)
        << k.json << " -> " << c.status();
  }
}

TEST(VersionConstraint, JsonValueForm) {
  auto c = ConstraintFromJsonValue(boost::json::parse(R"({"min_version": 4})"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, VersionConstraint::AtLeast(4));
  EXPECT_EQ(boost::json::parse(c->ToJson()), ConstraintToJsonValue(*c));
}

TEST(MakeRequestConstraint, ExactWins) {
  auto c = MakeRequestConstraint(10, 2, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, VersionConstraint::Exact(4));
}

TEST(MakeRequestConstraint, LatestMinusLagNeverBelowZero) {
  auto c = MakeRequestConstraint(10, 2, std::nullopt);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, VersionConstraint::AtLeast(8));
  c = MakeRequestConstraint(1, 5, std::nullopt);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, VersionConstraint::AtLeast(0));
}

TEST(MakeRequestConstraint, UnknownLatestMeansNoConstraint) {
  auto c = MakeRequestConstraint(std::nullopt, 1, std::nullopt);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->empty());
}

TEST(MakeRequestConstraint, NegativeInputsAreErrors) {
  EXPECT_FALSE(MakeRequestConstraint(5, -1, std::nullopt).ok());
  EXPECT_FALSE(MakeRequestConstraint(5, 0, -2).ok());
  EXPECT_FALSE(MakeRequestConstraint(-5, 0, std::nullopt).ok());
}

}  // namespace
}  // namespace stitch
