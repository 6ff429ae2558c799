#include "stitch/core/version.h"

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(VersionRef, CanonicalIdentityRoundTrips) {
  auto ref = VersionRef::Parse("run-a/weight_v000007");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->run_id, "run-a");
  EXPECT_EQ(ref->version, 7);
  EXPECT_EQ(ref->ToString(), "run-a/weight_v000007");
  EXPECT_EQ(ref->DirName(), "weight_v000007");
}

TEST(VersionRef, BareIdentityHasNoRun) {
  auto ref = VersionRef::Parse("weight_v000012");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->run_id, "");
  EXPECT_EQ(ref->version, 12);
  EXPECT_EQ(ref->ToString(), "weight_v000012");
}

TEST(VersionRef, LegacyBareDigitsAreAccepted) {
  auto ref = VersionRef::Parse("42\n");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->version, 42);
  EXPECT_EQ(ref->ToString(), "weight_v000042");
}

TEST(VersionRef, MoreThanSixDigitsWhenNeeded) {
  VersionRef ref{"r", 12345678};
  EXPECT_EQ(ref.ToString(), "r/weight_v12345678");
  auto back = VersionRef::Parse(ref.ToString());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, ref);
}

TEST(VersionRef, SurroundingWhitespaceIsIgnored) {
  auto ref = VersionRef::Parse("  r/weight_v000001 \n");
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->ToString(), "r/weight_v000001");
}

TEST(VersionRef, GarbageIsRejected) {
  for (const char* text :
       {"", "   ", "weight_v", "weight_vx", "weight_v12a", "v7", "-3", "7.5", "run/", "run/7",
        "/weight_v000001", "a b/weight_v000001", "run/weight_v000001/extra", "../weight_v000001",
        "weight_v99999999999999999999", "run/weight_v-1", "0x10"}) {
    auto ref = VersionRef::Parse(text);
    EXPECT_FALSE(ref.ok()) << "accepted \"" << text << "\" as " << ref->ToString();
  }
}

TEST(VersionRef, RejectionSaysWhatIsWrong) {
  auto ref = VersionRef::Parse("weight_vx");
  ASSERT_FALSE(ref.ok());
  EXPECT_NE(ref.status().message().find("not a version identity"), std::string::npos)
      << ref.status();
}

TEST(VersionRef, VersionsAboveTheMaximumAreOutOfRange) {
  for (std::string_view text : {"weight_v1000000000000", "weight_v9007199254740991",
                                "run-a/weight_v9007199254740991", "9007199254740992"}) {
    auto ref = VersionRef::Parse(text);
    ASSERT_FALSE(ref.ok()) << text;
    EXPECT_EQ(ref.status().code(), absl::StatusCode::kOutOfRange) << text;
  }
  auto max = VersionRef::Parse("weight_v999999999999");
  ASSERT_TRUE(max.ok()) << max.status();
  EXPECT_EQ(max->version, kMaxVersion);
  EXPECT_EQ(kMaxVersion, 999'999'999'999);
}

// What Python's int() reads as a non-negative decimal is a version number.
TEST(ParseVersionText, ReadsWhatPythonsIntReads) {
  for (const auto& [text, want] :
       std::vector<std::pair<std::string, int64_t>>{{"7", 7},
                                                    {"007", 7},
                                                    {" 2 ", 2},
                                                    {"\t3\n", 3},
                                                    {"+4", 4},
                                                    {" +4 ", 4},
                                                    {"1_000", 1000},
                                                    {"1_2_3", 123},
                                                    {"0", 0},
                                                    {"999_999_999_999", kMaxVersion}}) {
    auto v = ParseVersionText(text);
    ASSERT_TRUE(v.ok()) << "\"" << text << "\": " << v.status();
    EXPECT_EQ(*v, want) << text;
  }
  for (const char* text : {"", " ", "+", "-1", "-0", "1__000", "_1", "1_", "+_1", "++1", "+ 1",
                           "1 2", "7.0", "0x7", "seven", "1e3"}) {
    auto v = ParseVersionText(text);
    EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << "\"" << text << "\": " << v.status();
  }
  EXPECT_TRUE(absl::IsOutOfRange(ParseVersionText("1_000_000_000_000").status()));
  EXPECT_TRUE(absl::IsOutOfRange(ParseVersionText("99999999999999999999999999").status()));
}

TEST(RunId, ValidationRules) {
  EXPECT_TRUE(ValidateRunId("run-2026.12_a:b+c=d@e").ok());
  EXPECT_FALSE(ValidateRunId("").ok());
  EXPECT_FALSE(ValidateRunId(".").ok());
  EXPECT_FALSE(ValidateRunId("..").ok());
  EXPECT_FALSE(ValidateRunId("a/b").ok());
  EXPECT_FALSE(ValidateRunId("a b").ok());
  EXPECT_FALSE(ValidateRunId(std::string(kMaxRunIdLength + 1, 'a')).ok());
  EXPECT_TRUE(ValidateRunId(std::string(kMaxRunIdLength, 'a')).ok());
}

TEST(VersionDirName, ParsesAndFormats) {
  EXPECT_EQ(VersionDirName(0), "weight_v000000");
  EXPECT_EQ(VersionDirName(1234567), "weight_v1234567");
  auto v = ParseVersionDirName("weight_v000031");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 31);
  EXPECT_FALSE(ParseVersionDirName("weights_v000031").ok());
  EXPECT_FALSE(ParseVersionDirName("weight_v").ok());
}

TEST(VersionNumber, RangeIsChecked) {
  EXPECT_TRUE(ValidateVersionNumber(0).ok());
  EXPECT_TRUE(ValidateVersionNumber(kMaxVersion).ok());
  EXPECT_FALSE(ValidateVersionNumber(-1).ok());
  EXPECT_FALSE(ValidateVersionNumber(kMaxVersion + 1).ok());
}

}  // namespace
}  // namespace stitch
