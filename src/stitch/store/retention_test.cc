#include "stitch/store/retention.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_join.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

// A lineage described by its anchors: every version in `anchors` is FULL,
// every other one a DELTA on the one below.
struct Lineage {
  std::vector<int64_t> versions;
  std::set<int64_t> anchors;
  std::map<int64_t, int> reads;

  ManifestReader Reader() {
    return [this](int64_t v) -> absl::StatusOr<VersionManifest> {
      ++reads[v];
      if (std::find(versions.begin(), versions.end(), v) == versions.end()) {
        return absl::NotFoundError("not published");
      }
      VersionManifest m;
      m.version = v;
      if (!anchors.contains(v)) {
        m.kind = VersionKind::kDelta;
        m.base_version = v - 1;
      }
      return m;
    };
  }
};

Lineage Range(int64_t first, int64_t last, std::set<int64_t> anchors) {
  Lineage l;
  for (int64_t v = first; v <= last; ++v) l.versions.push_back(v);
  l.anchors = std::move(anchors);
  return l;
}

std::vector<int64_t> Kept(const RetentionPlan& plan) {
  std::vector<int64_t> out;
  for (const auto& k : plan.kept) out.push_back(k.version);
  return out;
}

std::string Reasons(const RetentionPlan& plan, int64_t v) {
  for (const auto& k : plan.kept) {
    if (k.version == v) return absl::StrJoin(k.reasons, "; ");
  }
  return "";
}

Hold HoldOn(std::string holder, int64_t version, absl::Duration ttl = absl::Hours(1)) {
  Hold h;
  h.holder = std::move(holder);
  h.version = version;
  h.expires = kNow + ttl;
  return h;
}

TEST(PlanRetention, KeepsTheLastKWithTheirChainBackToTheAnchor) {
  Lineage l = Range(0, 12, {0, 5, 10});
  auto plan = PlanRetention({"r", 12}, l.versions, {}, kNow, {.keep_last = 2}, l.Reader());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Kept(*plan), ElementsAre(10, 11, 12));
  EXPECT_THAT(plan->deleted, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));
  EXPECT_THAT(Reasons(*plan, 12), HasSubstr("pointer"));
  EXPECT_THAT(Reasons(*plan, 10), HasSubstr("chain of weight_v000012"));
  EXPECT_THAT(plan->warnings, IsEmpty());
  // Only the needed versions' indexes were read, each once.
  for (const auto& [v, n] : l.reads) {
    EXPECT_GE(v, 10);
    EXPECT_EQ(n, 1) << v;
  }
}

TEST(PlanRetention, AChainEndsAtAnAnchorWrittenAfterTheFact) {
  Lineage l = Range(0, 12, {0});
  auto plan = PlanRetention({"r", 12}, l.versions, {}, kNow, {.keep_last = 2}, l.Reader(),
                            /*anchors=*/{3, 7, 12});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 12's chain is 12 itself (anchored): 11's goes back to 7.
  EXPECT_THAT(Kept(*plan), ElementsAre(7, 8, 9, 10, 11, 12));
  EXPECT_THAT(Reasons(*plan, 7), HasSubstr("anchored"));
  EXPECT_THAT(plan->deleted, ElementsAre(0, 1, 2, 3, 4, 5, 6));
  EXPECT_THAT(plan->anchors_deleted, ElementsAre(3));
  EXPECT_FALSE(l.reads.contains(6));
}

TEST(PlanRetention, MilestonesAndHoldsKeepTheirOwnChains) {
  Lineage l = Range(0, 30, {0, 10, 20});
  std::vector<Hold> holds = {HoldOn("eval", 13), HoldOn("old", 3, -absl::Seconds(1))};
  auto plan = PlanRetention({"r", 30}, l.versions, holds, kNow, {.keep_last = 1, .keep_every = 25},
                            l.Reader());
  ASSERT_TRUE(plan.ok()) << plan.status();
  // 30 (pointer, a DELTA on 29... back to 20), 25 and 0 (milestones; 25
  // back to 20), 13 (held, back to 10). The expired hold on 3 keeps nothing.
  std::vector<int64_t> want = {0};
  for (int64_t v = 10; v <= 13; ++v) want.push_back(v);
  for (int64_t v = 20; v <= 30; ++v) want.push_back(v);
  EXPECT_EQ(Kept(*plan), want);
  EXPECT_THAT(Reasons(*plan, 13), HasSubstr("held by eval"));
  EXPECT_THAT(Reasons(*plan, 25), HasSubstr("milestone"));
  EXPECT_THAT(plan->deleted, ::testing::Contains(3));
}

TEST(PlanRetention, VersionsAboveThePointerAreNeverDeleted) {
  Lineage l = Range(0, 8, {0});
  auto plan = PlanRetention({"r", 5}, l.versions, {}, kNow, {.keep_last = 1}, l.Reader());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Kept(*plan), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8));
  EXPECT_THAT(Reasons(*plan, 7), HasSubstr("being published"));
  EXPECT_THAT(plan->deleted, IsEmpty());
}

TEST(PlanRetention, AnIncompleteVersionIsDeletedUnlessNeededAndABrokenChainIsSaid) {
  Lineage l = Range(0, 6, {0, 4});
  // Version 2 has files but no index (a publisher died).
  l.versions.erase(std::find(l.versions.begin(), l.versions.end(), 2));
  std::vector<int64_t> listed = {0, 1, 2, 3, 4, 5, 6};
  auto plan = PlanRetention({"r", 6}, listed, {HoldOn("h", 3)}, kNow, {.keep_last = 1}, l.Reader());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Kept(*plan), ElementsAre(3, 4, 5, 6));
  EXPECT_THAT(plan->deleted, ElementsAre(0, 1, 2));
  ASSERT_EQ(plan->warnings.size(), 1u);
  EXPECT_THAT(plan->warnings[0], HasSubstr("broken chain"));
}

// A run whose first versions are DELTAs on its boot checkpoint (which the
// store never holds): the chain ends there, and that is no broken chain.
TEST(PlanRetention, AChainThatStartsAtTheBootCheckpointIsWhole) {
  Lineage l = Range(1, 6, {4});
  auto plan =
      PlanRetention({"r", 6}, l.versions, {HoldOn("h", 2)}, kNow, {.keep_last = 1}, l.Reader());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Kept(*plan), ElementsAre(1, 2, 4, 5, 6));
  EXPECT_THAT(plan->deleted, ElementsAre(3));
  EXPECT_THAT(plan->warnings, IsEmpty());
}

TEST(PlanRetention, AnErrorReadingANeededVersionStopsThePlan) {
  Lineage l = Range(0, 4, {0});
  ManifestReader reader = [&](int64_t v) -> absl::StatusOr<VersionManifest> {
    if (v == 2) return absl::UnavailableError("connection reset");
    return l.Reader()(v);
  };
  auto plan = PlanRetention({"r", 4}, l.versions, {}, kNow, {.keep_last = 1}, reader);
  EXPECT_TRUE(absl::IsUnavailable(plan.status())) << plan.status();
}

TEST(PlanRetention, RefusesAMeaninglessRule) {
  Lineage l = Range(0, 1, {0});
  EXPECT_TRUE(absl::IsInvalidArgument(
      PlanRetention({"r", 1}, l.versions, {}, kNow, {.keep_last = 0}, l.Reader()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      PlanRetention({"r", 1}, l.versions, {}, kNow, {.keep_last = 1, .keep_every = -2}, l.Reader())
          .status()));
}

TEST(HoldRecords, RoundTripAndRefuseMalformedText) {
  Hold h = HoldOn("eval-1", 42);
  auto back = HoldFromJson("eval-1", HoldToJson(h));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, 42);
  EXPECT_EQ(back->expires, h.expires);
  for (const char* bad : {"", "[]", R"({"version":1})", R"({"version":"1","expires_unix":5})",
                          R"({"version":-1,"expires_unix":5})"}) {
    auto parsed = HoldFromJson("x", bad);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("hold 'x'")) << bad;
  }
}

int NextStoreNumber() {
  static std::atomic<int> next{0};
  return next++;
}

// Retention over real stores. Versions written by WriteTestVersion are FULL:
// every version is its own anchor.
class ApplyRetentionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    store_ = OpenStore();
    ASSERT_TRUE(store_->AdvancePointer(std::nullopt, {"run-a", 0}).ok());
  }
  std::unique_ptr<Store> OpenStore() {
    if (GetParam() == "fs") return *FsStore::Open(tmp_ / "store", "run-a");
    return *MemStore::Open(name_, "run-a", tmp_ / "cache");
  }
  void PublishTo(int64_t last) {
    for (int64_t v = published_ + 1; v <= last; ++v) {
      auto dir = testing::WriteTestVersion(tmp_ / "src" / std::to_string(v), v, {.seed = int(v)});
      ASSERT_TRUE(dir.ok());
      ASSERT_TRUE(store_->PublishFiles(v, *dir).ok());
      ASSERT_TRUE(store_->AdvancePointer(VersionRef{"run-a", v - 1}, {"run-a", v}).ok());
    }
    published_ = last;
  }

  TempDir tmp_;
  const std::string name_ = "retention-" + std::to_string(NextStoreNumber());
  std::unique_ptr<Store> store_;
  int64_t published_ = 0;
};

TEST_P(ApplyRetentionTest, DeletesWhatNothingNeedsAndSaysWhy) {
  PublishTo(9);
  auto report = ApplyRetention(*store_, {.keep_last = 3, .keep_every = 4}, kNow);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->deleted, ElementsAre(1, 2, 3, 5, 6));
  EXPECT_THAT(report->failures, IsEmpty());
  EXPECT_THAT(*store_->ListVersions(), ElementsAre(4, 7, 8, 9));
  const std::string text = DescribeRetention(*report, false);
  EXPECT_THAT(text, HasSubstr("deleted weight_v000005"));
  EXPECT_THAT(text, HasSubstr("kept    weight_v000004: milestone (every 4)"));
  EXPECT_THAT(text, HasSubstr("kept    weight_v000009: last 3, pointer"));
  EXPECT_TRUE(store_->ListRecords(kGcRecordKind)->empty());  // its record is gone
  // A dry run deletes nothing.
  PublishTo(12);
  auto dry = ApplyRetention(*store_, {.keep_last = 1}, kNow, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok());
  EXPECT_THAT(dry->plan.deleted, ElementsAre(4, 7, 8, 9, 10, 11));
  EXPECT_THAT(dry->deleted, IsEmpty());
  EXPECT_THAT(*store_->ListVersions(), ElementsAre(4, 7, 8, 9, 10, 11, 12));
}

TEST_P(ApplyRetentionTest, AnAnchorGoesWithItsVersionAndStaysWithIt) {
  PublishTo(6);
  Store* anchors = store_->anchors();
  ASSERT_NE(anchors, nullptr);
  for (int64_t v : {3, 5}) {
    auto dir = testing::WriteTestVersion(tmp_ / "anchor" / std::to_string(v), v, {.seed = int(v)});
    ASSERT_TRUE(dir.ok());
    ASSERT_TRUE(anchors->PublishFiles(v, *dir).ok());
  }
  ASSERT_TRUE(PutHold(*store_, HoldOn("eval", 5), kNow).ok());
  auto report = ApplyRetention(*store_, {.keep_last = 1}, kNow);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->deleted, ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(report->anchors_deleted, ElementsAre(3));
  EXPECT_THAT(*anchors->ListVersions(), ElementsAre(5));
  EXPECT_THAT(DescribeRetention(*report, false), HasSubstr("deleted the anchor of weight_v000003"));
  // The anchor of the pointer's version is never deleted.
  auto dir = testing::WriteTestVersion(tmp_ / "anchor" / "6", 6, {.seed = 6});
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(anchors->PublishFiles(6, *dir).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(anchors->DeleteVersion(6)));
}

TEST_P(ApplyRetentionTest, AHeldVersionStaysUntilItsHoldIsReleasedOrExpires) {
  PublishTo(6);
  ASSERT_TRUE(PutHold(*store_, HoldOn("eval", 2, absl::Minutes(5)), kNow).ok());
  ASSERT_TRUE(ApplyRetention(*store_, {.keep_last = 1}, kNow).ok());
  EXPECT_THAT(*store_->ListVersions(), ElementsAre(2, 6));
  auto holds = ListHolds(*store_);
  ASSERT_TRUE(holds.ok());
  ASSERT_EQ(holds->size(), 1u);
  EXPECT_EQ((*holds)[0].version, 2);
  // Past its TTL the hold keeps nothing.
  ASSERT_TRUE(ApplyRetention(*store_, {.keep_last = 1}, kNow + absl::Minutes(6)).ok());
  EXPECT_THAT(*store_->ListVersions(), ElementsAre(6));
  // Released: gone from the list; releasing again says there is none.
  ASSERT_TRUE(ReleaseHold(*store_, "eval").ok());
  EXPECT_TRUE(ListHolds(*store_)->empty());
  EXPECT_TRUE(absl::IsNotFound(ReleaseHold(*store_, "eval").status()));
}

TEST_P(ApplyRetentionTest, AHoldRefusesAVersionThatIsGoneOrBeingDeleted) {
  PublishTo(5);
  ASSERT_TRUE(ApplyRetention(*store_, {.keep_last = 2}, kNow).ok());
  absl::Status gone = PutHold(*store_, HoldOn("late", 1), kNow);
  EXPECT_TRUE(absl::IsFailedPrecondition(gone)) << gone;
  EXPECT_THAT(std::string(gone.message()), HasSubstr("not published"));
  // A gc that is deleting version 4 (its record written, not yet done).
  ASSERT_TRUE(store_
                  ->WriteRecord(kGcRecordKind, "gc-running",
                                R"({"deleting":[4],"expires_unix":)" +
                                    std::to_string(absl::ToUnixSeconds(kNow) + 60) + "}")
                  .ok());
  absl::Status racing = PutHold(*store_, HoldOn("racing", 4), kNow);
  EXPECT_TRUE(absl::IsFailedPrecondition(racing)) << racing;
  EXPECT_THAT(std::string(racing.message()), HasSubstr("retention is deleting weight_v000004"));
  EXPECT_TRUE(ListHolds(*store_)->empty());  // the refused hold left no record
  // An expired gc record says nothing.
  EXPECT_TRUE(PutHold(*store_, HoldOn("later", 4), kNow + absl::Minutes(2)).ok());
}

// Between a gc's two looks at the holds: a hold taken then keeps its
// version (the second look sees it); a version a hold released then was
// never announced, so it waits for the next gc.
TEST_P(ApplyRetentionTest, WhatChangesBetweenTheTwoLooksIsNeverLostOrDeletedUnannounced) {
  PublishTo(6);
  ASSERT_TRUE(PutHold(*store_, HoldOn("leaving", 2), kNow).ok());
  auto report = ApplyRetention(*store_, {.keep_last = 1}, kNow, /*dry_run=*/false, [&] {
    // The record of what this gc deletes is written: a hold on 3 sees it
    // and is refused; the released 2 is not in it.
    auto records = store_->ListRecords(kGcRecordKind);
    ASSERT_TRUE(records.ok());
    EXPECT_EQ(records->size(), 1u);
    absl::Status racing = PutHold(*store_, HoldOn("racing", 3), kNow);
    EXPECT_TRUE(absl::IsFailedPrecondition(racing)) << racing;
    ASSERT_TRUE(ReleaseHold(*store_, "leaving").ok());
  });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_THAT(report->deleted, ElementsAre(1, 3, 4, 5));
  EXPECT_THAT(*store_->ListVersions(), ElementsAre(2, 6));
  // The next gc takes it.
  ASSERT_TRUE(ApplyRetention(*store_, {.keep_last = 1}, kNow).ok());
  EXPECT_THAT(*store_->ListVersions(), ElementsAre(6));
}

TEST_P(ApplyRetentionTest, TwoGcRunsAtOnceDeleteEachVersionOnceAndKeepTheRest) {
  PublishTo(20);
  auto other = OpenStore();
  absl::StatusOr<RetentionReport> a, b;
  std::thread t([&] { a = ApplyRetention(*other, {.keep_last = 4}, kNow); });
  b = ApplyRetention(*store_, {.keep_last = 4}, kNow);
  t.join();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT(a->failures, IsEmpty());
  EXPECT_THAT(b->failures, IsEmpty());
  EXPECT_THAT(*store_->ListVersions(), ElementsAre(17, 18, 19, 20));
  for (int64_t v = 17; v <= 20; ++v) {
    auto dir = store_->Materialize(v);
    ASSERT_TRUE(dir.ok()) << dir.status();
    EXPECT_TRUE(testing::VerifyVersionDir(*dir).ok()) << v;
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, ApplyRetentionTest, ::testing::Values("fs", "mem"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace stitch
