#include "stitch/core/constraint.h"

#include <gtest/gtest.h>

#include <boost/json/parse.hpp>

#include "stitch/core/json.h"
#include "stitch/core/version.h"

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

// Both versions: an exact version below the minimum satisfies neither and is
// refused; one at or above it satisfies both, so nothing is dropped by
// serving exactly it (the original Python Stitch sends both keys).
TEST(VersionConstraint, ContradictoryVersionsAreRefusedCompatibleOnesKept) {
  auto c = VersionConstraint::FromJson(R"({"min_version": 9, "exact_version": 3})");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c.status()));
  EXPECT_NE(c.status().message().find("no version is both"), std::string::npos) << c.status();
  c = VersionConstraint::FromJson(R"({"min_version": 3, "exact_version": 3})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->is_exact());
  EXPECT_TRUE(c->SatisfiedBy(3));
  EXPECT_FALSE(c->SatisfiedBy(4));
  // A null field is an absent one.
  c = VersionConstraint::FromJson(R"({"min_version": null, "exact_version": 3})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, VersionConstraint::Exact(3));
}

// The forms the original Python Stitch accepts (it calls int() on them):
// strings as int() reads them too (whitespace, '+', '_' between digits), and
// nothing int() would truncate or that names no version (docs/migrating.md).
TEST(VersionConstraint, VersionsAreWhatPythonsIntReadsAsANonNegativeInteger) {
  for (const char* text :
       {R"({"min_version": 7})", R"({"min_version": "7"})", R"({"min_version": 7.0})",
        R"({"min_version": "007"})", R"({"min_version": " 7 "})", R"({"min_version": "+7"})",
        R"({"min_version": "\t+0_0_7\n"})"}) {
    auto c = VersionConstraint::FromJson(text);
    ASSERT_TRUE(c.ok()) << text << ": " << c.status();
    EXPECT_EQ(*c, VersionConstraint::AtLeast(7)) << text;
  }
  auto thousand = VersionConstraint::FromJson(R"({"exact_version": "1_000"})");
  ASSERT_TRUE(thousand.ok()) << thousand.status();
  EXPECT_EQ(*thousand, VersionConstraint::Exact(1000));
  for (const char* text :
       {R"({"exact_version": 7.5})", R"({"exact_version": "seven"})", R"({"exact_version": "7 7"})",
        R"({"exact_version": true})", R"({"exact_version": -1})", R"({"exact_version": "-1"})",
        R"({"exact_version": "1__0"})", R"({"exact_version": "_1"})", R"({"exact_version": "7.0"})",
        R"({"exact_version": "1000000000000"})", R"({"exact_version": 1e300})",
        R"({"exact_version": ""})", R"({"exact_version": [7]})"}) {
    auto c = VersionConstraint::FromJson(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find("exact_version"), std::string::npos) << c.status();
  }
}

TEST(VersionConstraint, AFieldGivenTwiceIsRefused) {
  for (const char* text :
       {R"({"min_version": 3, "min_version": 5})", R"({"exact_version": 3, "exact_version": 3})",
        R"({"min_version": 3, "min_\u0076ersion": 5})"}) {
    auto c = VersionConstraint::FromJson(text);
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find("twice"), std::string::npos) << c.status();
  }
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
           Case{R"({"min_version": "7x"})", "integer"},
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

// A versioned request body, parsed once: the keys that decide the version
// must not repeat; everything else parses as boost::json::parse would.
absl::StatusOr<boost::json::value> ParseBody(std::string_view text) {
  return ParseVersionedBodyJson(text, {});
}

TEST(VersionedBodyJson, ParsesWhatBoostJsonParses) {
  for (const char* text : {
           R"({"text":"hi","weight_version":{"min_version":3},"sampling_params":{"n":1}})",
           R"({"text":"hi"})",
           R"([{"weight_version":1},{"weight_version":2}])",
           R"("just a string")",
           R"({"a":[{"weight_version":{"min_version":1,"min_version":2}}]})",
           R"({"sampling_params":{"n":1,"n":2},"text":"a","text":"b"})",
           R"({"meta":{"weight_version":1,"weight_version":2}})",
           // Values the constraint may refuse later, but the parse does not.
           R"({"weight_version":{"exact_version":"7"}})",
           R"({"weight_version":{"exact_version":7.0}})",
           R"({"weight_version":null})",
       }) {
    absl::StatusOr<boost::json::value> v = ParseBody(text);
    ASSERT_TRUE(v.ok()) << text << ": " << v.status();
    EXPECT_EQ(*v, boost::json::parse(text)) << text;
  }
}

TEST(VersionedBodyJson, WeightVersionAndItsFieldsMustNotRepeat) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& k : {
           Case{R"({"weight_version":{"min_version":1},"weight_version":{"min_version":9}})",
                "gives weight_version twice"},
           Case{R"({"weight_version":{"exact_version":1},"text":"x","weight_version":null})",
                "gives weight_version twice"},
           Case{R"({"weight_version":1,"weight_\u0076ersion":2})", "gives weight_version twice"},
           Case{R"({"weight_version":{"min_version":1,"min_version":9}})",
                R"(gives "min_version" twice)"},
           Case{R"({"text":"x","weight_version":{"exact_version":1,"min_version":null,)"
                R"("exact_version":2}})",
                R"(gives "exact_version" twice)"},
           Case{R"({"weight_version":{"a":{"b":1,"b":2},"a":1}})", R"(gives "a" twice)"},
           Case{R"({"weight_version":)", "must be a JSON object (incomplete JSON)"},
       }) {
    absl::StatusOr<boost::json::value> v = ParseBody(k.text);
    ASSERT_FALSE(v.ok()) << k.text;
    EXPECT_TRUE(absl::IsInvalidArgument(v.status()));
    EXPECT_NE(v.status().message().find(k.says), std::string::npos)
        << k.text << " -> " << v.status();
  }
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

TEST(VersionConstraint, MaxStalenessIsJudgedAgainstThePointer) {
  const VersionConstraint fresh = VersionConstraint::Fresh(1);
  EXPECT_FALSE(fresh.empty());
  EXPECT_TRUE(fresh.SatisfiedBy(9, 10));
  EXPECT_TRUE(fresh.SatisfiedBy(10, 10));
  EXPECT_EQ(fresh.Unmet(8, 10), VersionConstraint::Bound::kStaleness);
  // A replica with nothing applied serves nothing constrained.
  EXPECT_EQ(fresh.Unmet(std::nullopt, 10), VersionConstraint::Bound::kStaleness);
  // Without a pointer (the store has none) there is nothing to be behind.
  EXPECT_TRUE(fresh.SatisfiedBy(0, std::nullopt));
  // Zero: only the pointer's version itself.
  EXPECT_EQ(VersionConstraint::Fresh(0).Unmet(9, 10), VersionConstraint::Bound::kStaleness);
}

TEST(VersionConstraint, EveryBoundGivenMustHoldAndTheFirstFailingIsNamed) {
  VersionConstraint c = VersionConstraint::AtLeast(7);
  c.max_staleness = 2;
  EXPECT_TRUE(c.SatisfiedBy(8, 10));
  EXPECT_EQ(c.Unmet(6, 7), VersionConstraint::Bound::kMin);
  EXPECT_EQ(c.Unmet(7, 10), VersionConstraint::Bound::kStaleness);
  EXPECT_EQ(BoundName(*c.Unmet(7, 10)), "max_staleness");
  VersionConstraint pinned = VersionConstraint::Exact(5);
  pinned.max_staleness = 0;
  EXPECT_EQ(pinned.Unmet(5, 6), VersionConstraint::Bound::kStaleness);
  EXPECT_EQ(pinned.Unmet(6, 6), VersionConstraint::Bound::kExact);
  EXPECT_EQ(BoundName(VersionConstraint::Bound::kExact), "exact_version");
  EXPECT_EQ(BoundName(VersionConstraint::Bound::kMin), "min_version");
}

TEST(VersionConstraint, FloorIsTheLowestVersionMeetingMinAndStaleness) {
  VersionConstraint c = VersionConstraint::Fresh(2);
  EXPECT_EQ(c.Floor(10), 8);
  EXPECT_EQ(c.Floor(1), 0);
  EXPECT_EQ(c.Floor(std::nullopt), std::nullopt);
  c.min_version = 9;
  EXPECT_EQ(c.Floor(10), 9);
  EXPECT_EQ(c.Floor(std::nullopt), 9);
  EXPECT_EQ(VersionConstraint{}.Floor(10), std::nullopt);
}

TEST(VersionConstraint, MaxStalenessJsonForms) {
  auto c = VersionConstraint::FromJson(R"({"max_staleness": 1})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, VersionConstraint::Fresh(1));
  c = VersionConstraint::FromJson(R"({"min_version": 4, "max_staleness": 0})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->min_version, 4);
  EXPECT_EQ(c->max_staleness, 0);
  auto back = VersionConstraint::FromJson(c->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
  EXPECT_EQ(boost::json::parse(c->ToJson()), ConstraintToJsonValue(*c));
  EXPECT_EQ(c->ToString(), ">= v4 and <= 0 behind the pointer");
  EXPECT_EQ(VersionConstraint::Fresh(3).ToString(), "<= 3 behind the pointer");
  for (const char* bad :
       {R"({"max_staleness": -1})", R"({"max_staleness": 1, "max_staleness": 2})"}) {
    EXPECT_FALSE(VersionConstraint::FromJson(bad).ok()) << bad;
  }
}

TEST(ParseConstraintSpec, NamePairsOrJson) {
  auto c = ParseConstraintSpec("max_staleness:1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, VersionConstraint::Fresh(1));
  c = ParseConstraintSpec(" min_version:3, max_staleness:2 ");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->min_version, 3);
  EXPECT_EQ(c->max_staleness, 2);
  c = ParseConstraintSpec(R"({"exact_version": 5})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, VersionConstraint::Exact(5));
  for (const char* bad : {"max_staleness", "max_staleness:x", "staleness:1", "max_staleness:-1",
                          "min_version:3,exact_version:2", ""}) {
    auto refused = ParseConstraintSpec(bad);
    EXPECT_FALSE(refused.ok()) << bad;
  }
}

TEST(MakeRequestConstraint, MaxStalenessRidesAlong) {
  auto c = MakeRequestConstraint(10, 2, std::nullopt, 1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->min_version, 8);
  EXPECT_EQ(c->max_staleness, 1);
  c = MakeRequestConstraint(std::nullopt, 0, std::nullopt, 0);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, VersionConstraint::Fresh(0));
  EXPECT_FALSE(MakeRequestConstraint(std::nullopt, 0, std::nullopt, -1).ok());
}

}  // namespace
}  // namespace stitch
