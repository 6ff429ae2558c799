#include "stitch/core/pointer.h"

#include <gtest/gtest.h>

#include "stitch/core/errors.h"

namespace stitch {
namespace {

VersionRef V(const char* run, int64_t v) { return VersionRef{run, v}; }

TEST(CheckPointerMove, UnsetPointerIsAnInitialMove) {
  auto m = CheckPointerMove("s", std::nullopt, V("a", 0));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, PointerMove::kInitial);
}

TEST(CheckPointerMove, ForwardWithinARun) {
  auto m = CheckPointerMove("s", V("a", 3), V("a", 4));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, PointerMove::kForward);
  m = CheckPointerMove("s", V("a", 3), V("a", 30));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, PointerMove::kForward);
}

TEST(CheckPointerMove, LowerOrEqualVersionIsARewind) {
  for (int64_t v : {0, 2, 3}) {
    auto m = CheckPointerMove("file:///s", V("a", 3), V("a", v));
    ASSERT_FALSE(m.ok()) << v;
    EXPECT_EQ(GetErrorKind(m.status()), ErrorKind::kPointerRewind);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(m.status().message().find("file:///s"), std::string::npos);
    EXPECT_NE(m.status().message().find("a/weight_v000003"), std::string::npos);
  }
}

TEST(CheckPointerMove, AnotherRunIsAReset) {
  auto m = CheckPointerMove("s", V("a", 30), V("b", 0));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, PointerMove::kRunReset);
}

TEST(PointerConflict, CarriesExpectedActualAndProposed) {
  absl::Status s = PointerConflict("file:///s", V("a", 3), V("a", 4), V("a", 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kPointerConflict);
  auto d = GetConflictDetails(s);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->expected, "a/weight_v000003");
  EXPECT_EQ(d->actual, "a/weight_v000004");
  EXPECT_EQ(d->proposed, "a/weight_v000004");
}

TEST(PointerConflict, UnsetValuesAreEmpty) {
  absl::Status s = PointerConflict("s", std::nullopt, V("a", 0), V("a", 0));
  auto d = GetConflictDetails(s);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->expected, "");
  EXPECT_NE(s.message().find("<unset>"), std::string::npos);
}

TEST(PlanFollow, Rules) {
  EXPECT_EQ(PlanFollow(std::nullopt, V("a", 0)), FollowAction::kRunReset);
  EXPECT_EQ(PlanFollow(V("a", 2), V("a", 5)), FollowAction::kAdvance);
  EXPECT_EQ(PlanFollow(V("a", 5), V("a", 5)), FollowAction::kNothing);
  EXPECT_EQ(PlanFollow(V("a", 5), V("b", 1)), FollowAction::kRunReset);
}

TEST(Errors, KindsSurviveAnnotation) {
  absl::Status s = WithKind(absl::DataLossError("bad"), ErrorKind::kChecksumMismatch);
  absl::Status a = Annotate(s, "tensor w");
  EXPECT_EQ(a.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(a.message(), "tensor w: bad");
  EXPECT_EQ(GetErrorKind(a), ErrorKind::kChecksumMismatch);
  EXPECT_EQ(GetErrorKind(absl::OkStatus()), ErrorKind::kOther);
  EXPECT_EQ(GetErrorKind(absl::InternalError("x")), ErrorKind::kOther);
  EXPECT_FALSE(GetConflictDetails(s).has_value());
}

}  // namespace
}  // namespace stitch
