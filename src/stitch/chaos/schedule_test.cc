#include "stitch/chaos/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

namespace stitch {
namespace {

ScheduleOptions Options(double duration_s) {
  ScheduleOptions o;
  o.duration_s = duration_s;
  o.replicas = 3;
  o.kinds = {FaultKind::kEngineKill,  FaultKind::kEngineStop,      FaultKind::kSidecarKill,
             FaultKind::kGatewayKill, FaultKind::kPublisherKill,   FaultKind::kStoreUnreadable,
             FaultKind::kStoreFull,   FaultKind::kClientDisconnect};
  return o;
}

TEST(ScheduleTest, TheSameSeedGivesTheSameSchedule) {
  EXPECT_EQ(MakeSchedule(42, Options(600)), MakeSchedule(42, Options(600)));
  EXPECT_EQ(FormatSchedule(MakeSchedule(7, Options(120))),
            FormatSchedule(MakeSchedule(7, Options(120))));
}

TEST(ScheduleTest, AnotherSeedGivesAnotherSchedule) {
  EXPECT_NE(MakeSchedule(1, Options(600)), MakeSchedule(2, Options(600)));
}

TEST(ScheduleTest, TheDurationIsPartOfTheSchedule) {
  EXPECT_NE(MakeSchedule(1, Options(600)), MakeSchedule(1, Options(300)));
}

TEST(ScheduleTest, EveryKindAppearsInAShortRun) {
  const ScheduleOptions o = Options(60);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    std::set<FaultKind> seen;
    for (const Fault& f : MakeSchedule(seed, o)) seen.insert(f.kind);
    EXPECT_EQ(seen.size(), o.kinds.size()) << "seed " << seed;
  }
}

TEST(ScheduleTest, FaultsStayInsideTheWindowAndAreOrdered) {
  const ScheduleOptions o = Options(300);
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<Fault> s = MakeSchedule(seed, o);
    ASSERT_FALSE(s.empty());
    for (size_t i = 0; i < s.size(); ++i) {
      EXPECT_EQ(s[i].id, static_cast<int>(i + 1));
      EXPECT_GE(s[i].start_s, o.warmup_s);
      EXPECT_LE(s[i].end_s(), o.duration_s - o.cooldown_s + 1e-9);
      EXPECT_GE(s[i].duration_s, o.min_duration_s);
      EXPECT_LE(s[i].duration_s, o.max_duration_s);
      EXPECT_GE(s[i].param, 0);
      EXPECT_LT(s[i].param, 1);
      if (i > 0) {
        EXPECT_LE(s[i - 1].start_s, s[i].start_s);
      }
      if (TargetsReplica(s[i].kind)) {
        EXPECT_GE(s[i].replica, 0);
        EXPECT_LT(s[i].replica, o.replicas);
      } else {
        EXPECT_EQ(s[i].replica, -1);
      }
    }
  }
}

TEST(ScheduleTest, FaultsOnOneResourceNeverOverlapButOthersDo) {
  bool overlapped = false;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const std::vector<Fault> s = MakeSchedule(seed, Options(600));
    for (size_t i = 0; i < s.size(); ++i) {
      for (size_t j = i + 1; j < s.size(); ++j) {
        const bool overlap = s[j].start_s < s[i].end_s() && s[i].start_s < s[j].end_s();
        const bool same_engine =
            TargetsReplica(s[i].kind) && TargetsReplica(s[j].kind) &&
            s[i].replica == s[j].replica &&
            (s[i].kind == FaultKind::kSidecarKill) == (s[j].kind == FaultKind::kSidecarKill);
        if (s[i].kind == s[j].kind && !TargetsReplica(s[i].kind)) {
          EXPECT_FALSE(overlap) << FormatSchedule(s);
        }
        if (same_engine) {
          EXPECT_FALSE(overlap) << FormatSchedule(s);
        }
        overlapped |= overlap;
      }
    }
  }
  EXPECT_TRUE(overlapped) << "several faults may overlap";
}

TEST(ScheduleTest, LongRunsHaveMoreFaults) {
  EXPECT_GT(MakeSchedule(3, Options(1800)).size(), 3 * MakeSchedule(3, Options(120)).size());
}

TEST(ScheduleTest, NoRoomOrNoKindsMeansNoFaults) {
  EXPECT_TRUE(MakeSchedule(1, Options(10)).empty());
  ScheduleOptions none = Options(600);
  none.kinds.clear();
  EXPECT_TRUE(MakeSchedule(1, none).empty());
}

TEST(ScheduleTest, KindNamesRoundTrip) {
  for (FaultKind kind : kAllFaultKinds) {
    EXPECT_EQ(ParseFaultKind(FaultKindName(kind)), kind);
  }
  EXPECT_EQ(ParseFaultKind("meteor"), std::nullopt);
  Fault f;
  f.kind = FaultKind::kSidecarKill;
  f.replica = 2;
  EXPECT_EQ(f.Target(), "sidecar_kill r2");
}

}  // namespace
}  // namespace stitch
