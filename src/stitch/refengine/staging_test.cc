#include "stitch/refengine/staging.h"

#include <filesystem>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/core/errors.h"
#include "stitch/refengine/engine_test_util.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::EngineTestConfig;
using ::stitch::testing::EngineTestTensors;
using ::stitch::testing::PerturbTensors;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

// Weights are equal when every array is bit-for-bit equal.
bool SameWeights(const ModelWeights& a, const ModelWeights& b) {
  if (!(a.config() == b.config())) return false;
  auto eq = [](auto x, auto y) { return std::equal(x.begin(), x.end(), y.begin(), y.end()); };
  if (!eq(a.embedding(), b.embedding()) || !eq(a.final_norm(), b.final_norm()) ||
      !eq(a.lm_head(), b.lm_head())) {
    return false;
  }
  for (size_t i = 0; i < a.layers().size(); ++i) {
    const auto& x = a.layers()[i];
    const auto& y = b.layers()[i];
    if (x.input_norm != y.input_norm || x.qkv != y.qkv || x.o != y.o ||
        x.post_norm != y.post_norm || x.gate_up != y.gate_up || x.down != y.down) {
      return false;
    }
  }
  return true;
}

// A boot checkpoint (version 0 of run-a) and a store's updates/ directory:
//   v1 DELTA, v2 DELTA, v3 FULL, v4 DELTA
class StagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = EngineTestConfig();
    versions_.push_back(EngineTestTensors(config_, 1));
    for (int v = 1; v <= 4; ++v) versions_.push_back(PerturbTensors(versions_.back(), 0.01 * v));
    ASSERT_TRUE(testing::WriteModel(boot_, config_, versions_[0]).ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 1, versions_[0], versions_[1], "run-a").ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 2, versions_[1], versions_[2], "run-a").ok());
    ASSERT_TRUE(testing::PublishFull(updates_, 3, versions_[3], "run-a").ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 4, versions_[3], versions_[4], "run-a").ok());
  }

  StageRequest Request(int64_t target, UpdateDestination destination) const {
    StageRequest r;
    r.base_checkpoint_dir = boot_;
    r.base_version = 0;
    r.target_version = target;
    r.run_id = "run-a";
    r.destination = destination;
    r.checkpoint_source_dir = updates_;
    if (destination == UpdateDestination::kDisk) r.local_checkpoint_dir = tmp_ / "local";
    return r;
  }

  std::shared_ptr<const ModelWeights> Expected(int v) const {
    return testing::BuildWeights(config_, versions_[static_cast<size_t>(v)]);
  }

  TempDir tmp_;
  fs::path boot_ = tmp_ / "boot";
  fs::path updates_ = tmp_ / "store" / "updates";
  ModelConfig config_;
  std::vector<std::vector<HostTensor>> versions_;
};

TEST_F(StagingTest, PlansFromTheNewestAnchorAtOrBelowTheTarget) {
  absl::StatusOr<WeightStagePlan> two =
      PlanStage(Request(2, UpdateDestination::kCpu), std::nullopt);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->anchor_dir, boot_);
  EXPECT_EQ(two->anchor_version, 0);
  EXPECT_EQ(two->deltas.size(), 2u);
  absl::StatusOr<WeightStagePlan> four =
      PlanStage(Request(4, UpdateDestination::kCpu), std::nullopt);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(four->anchor_dir, updates_ / "weight_v000003");
  ASSERT_EQ(four->deltas.size(), 1u);
  EXPECT_EQ(four->deltas[0], updates_ / "weight_v000004");
  absl::StatusOr<WeightStagePlan> held = PlanStage(Request(2, UpdateDestination::kCpu), 1);
  ASSERT_TRUE(held.ok());
  EXPECT_TRUE(held->anchor_is_held);
  EXPECT_EQ(held->deltas.size(), 1u);
}

TEST_F(StagingTest, AnAnchorWrittenAfterTheFactEndsTheWalkAndMustBeFull) {
  // A FULL copy of v2, outside updates/: the walk from v2 stops there.
  const fs::path anchors = tmp_ / "store" / "anchors" / "updates";
  ASSERT_TRUE(testing::PublishFull(anchors, 2, versions_[2], "run-a").ok());
  StageRequest r = Request(2, UpdateDestination::kCpu);
  r.anchor_dir = anchors / "weight_v000002";
  r.anchor_version = 2;
  absl::StatusOr<WeightStagePlan> plan = PlanStage(r, std::nullopt);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->anchor_dir, anchors / "weight_v000002");
  EXPECT_EQ(plan->anchor_version, 2);
  EXPECT_TRUE(plan->deltas.empty());
  WeightStager stager(config_, 1);
  absl::StatusOr<StageResult> staged = stager.Stage(r);
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ(staged->anchor_version, 2);
  absl::StatusOr<PreparedWeights> p = stager.TakePrepared(2, "run-a");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(SameWeights(*p->weights, *Expected(2)));
  // A DELTA named as the anchor is refused.
  r.anchor_dir = updates_ / "weight_v000002";
  EXPECT_THAT(PlanStage(r, std::nullopt).status().message(), HasSubstr("not a FULL version"));
}

TEST_F(StagingTest, CpuStagesADeltaChainThenContinuesFromTheHeldImage) {
  WeightStager stager(config_, 1);
  absl::StatusOr<StageResult> two = stager.Stage(Request(2, UpdateDestination::kCpu));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->version, (VersionRef{"run-a", 2}));
  EXPECT_TRUE(two->reseeded);
  EXPECT_EQ(two->deltas_applied, 2u);
  absl::StatusOr<PreparedWeights> p2 = stager.TakePrepared(2, "run-a");
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_TRUE(SameWeights(*p2->weights, *Expected(2)));
  EXPECT_FALSE(SameWeights(*p2->weights, *Expected(1)));
  // Taken: a second commit of the same version is refused.
  EXPECT_TRUE(absl::IsInvalidArgument(stager.TakePrepared(2, "run-a").status()));

  // v4 sits behind the FULL v3: the image reseeds from it.
  absl::StatusOr<StageResult> four = stager.Stage(Request(4, UpdateDestination::kCpu));
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_TRUE(four->reseeded);
  EXPECT_EQ(four->anchor_version, 3);
  absl::StatusOr<PreparedWeights> p4 = stager.TakePrepared(4, "");
  ASSERT_TRUE(p4.ok()) << p4.status();
  EXPECT_TRUE(SameWeights(*p4->weights, *Expected(4)));
}

TEST_F(StagingTest, CpuStagingFromTheHeldImageAppliesOnlyNewDeltas) {
  WeightStager stager(config_, 1);
  ASSERT_TRUE(stager.Stage(Request(1, UpdateDestination::kCpu)).ok());
  absl::StatusOr<StageResult> two = stager.Stage(Request(2, UpdateDestination::kCpu));
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_FALSE(two->reseeded);
  EXPECT_EQ(two->deltas_applied, 1u);
  absl::StatusOr<PreparedWeights> p = stager.TakePrepared(2, "run-a");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(SameWeights(*p->weights, *Expected(2)));
}

TEST_F(StagingTest, InitializesAtTheBaseVersionWithoutASource) {
  WeightStager stager(config_, 1);
  StageRequest r = Request(0, UpdateDestination::kCpu);
  r.checkpoint_source_dir.reset();
  absl::StatusOr<StageResult> boot = stager.Stage(r);
  ASSERT_TRUE(boot.ok()) << boot.status();
  EXPECT_EQ(boot->version.version, 0);
  r.target_version = 1;
  absl::StatusOr<StageResult> beyond = stager.Stage(r);
  EXPECT_TRUE(absl::IsInvalidArgument(beyond.status()));
  EXPECT_THAT(beyond.status().message(), HasSubstr("checkpoint_source_dir"));
}

TEST_F(StagingTest, DiskMaterializesALoadableCheckpointOfTheTarget) {
  WeightStager stager(config_, 1);
  for (int v : {2, 3, 4}) {
    absl::StatusOr<StageResult> r = stager.Stage(Request(v, UpdateDestination::kDisk));
    ASSERT_TRUE(r.ok()) << "v" << v << ": " << r.status();
    EXPECT_EQ(r->version.version, v);
    absl::StatusOr<std::shared_ptr<const ModelWeights>> loaded = LoadCheckpoint(tmp_ / "local");
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_TRUE(SameWeights(**loaded, *Expected(v))) << "v" << v;
  }
  EXPECT_EQ(stager.info().disk_staged, (VersionRef{"run-a", 4}));
}

TEST_F(StagingTest, ACorruptDeltaIsRejectedAndTheStagedStateStays) {
  WeightStager stager(config_, 1);
  ASSERT_TRUE(stager.Stage(Request(1, UpdateDestination::kCpu)).ok());
  ASSERT_TRUE(stager.Stage(Request(1, UpdateDestination::kDisk)).ok());
  ASSERT_TRUE(testing::CorruptVersion(updates_ / "weight_v000002").ok());
  for (UpdateDestination d : {UpdateDestination::kCpu, UpdateDestination::kDisk}) {
    absl::StatusOr<StageResult> r = stager.Stage(Request(2, d));
    ASSERT_FALSE(r.ok()) << UpdateDestinationName(d);
    EXPECT_TRUE(absl::IsDataLoss(r.status()) || absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("weight_v000002"));
  }
  EXPECT_FALSE(stager.info().last_error.empty());
  absl::StatusOr<PreparedWeights> p = stager.TakePrepared(1, "run-a");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(SameWeights(*p->weights, *Expected(1)));
  absl::StatusOr<std::shared_ptr<const ModelWeights>> disk = LoadCheckpoint(tmp_ / "local");
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(SameWeights(**disk, *Expected(1)));
}

TEST_F(StagingTest, AFlippedByteInAFullVersionIsRejectedAndTheStagedStateStays) {
  WeightStager stager(config_, 1);
  ASSERT_TRUE(stager.Stage(Request(1, UpdateDestination::kCpu)).ok());
  ASSERT_TRUE(stager.Stage(Request(1, UpdateDestination::kDisk)).ok());
  // v3 is a FULL version: its recorded checksums are all that can tell.
  ASSERT_TRUE(testing::CorruptVersion(updates_ / "weight_v000003").ok());
  for (UpdateDestination d : {UpdateDestination::kCpu, UpdateDestination::kDisk}) {
    for (int64_t target : {3, 4}) {
      absl::StatusOr<StageResult> r = stager.Stage(Request(target, d));
      ASSERT_FALSE(r.ok()) << UpdateDestinationName(d) << " v" << target;
      EXPECT_EQ(GetErrorKind(r.status()), ErrorKind::kChecksumMismatch) << r.status();
      // v3 names the anchor's file; v4 may name the delta whose target
      // checksum no longer matches.
      if (target == 3) {
        EXPECT_THAT(r.status().message(), HasSubstr("weight_v000003"));
      }
    }
  }
  absl::StatusOr<PreparedWeights> p = stager.TakePrepared(1, "run-a");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(SameWeights(*p->weights, *Expected(1)));
  absl::StatusOr<std::shared_ptr<const ModelWeights>> disk = LoadCheckpoint(tmp_ / "local");
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(SameWeights(**disk, *Expected(1)));
}

TEST_F(StagingTest, RefusesMissingDirectoriesGapsAndOtherRuns) {
  WeightStager stager(config_, 1);
  StageRequest no_base = Request(1, UpdateDestination::kCpu);
  no_base.base_checkpoint_dir = tmp_ / "nope";
  EXPECT_TRUE(absl::IsNotFound(stager.Stage(no_base).status()));

  StageRequest no_source = Request(1, UpdateDestination::kCpu);
  no_source.checkpoint_source_dir = tmp_ / "missing" / "updates";
  absl::StatusOr<StageResult> r = stager.Stage(no_source);
  EXPECT_TRUE(absl::IsNotFound(r.status()));
  EXPECT_THAT(r.status().message(), HasSubstr("checkpoint_source_dir"));

  absl::StatusOr<StageResult> missing = stager.Stage(Request(7, UpdateDestination::kCpu));
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("weight_v000007"));

  fs::remove_all(updates_ / "weight_v000001");
  absl::StatusOr<StageResult> gap = stager.Stage(Request(2, UpdateDestination::kCpu));
  EXPECT_TRUE(absl::IsNotFound(gap.status()));
  EXPECT_THAT(gap.status().message(), HasSubstr("weight_v000001"));

  StageRequest other_run = Request(4, UpdateDestination::kCpu);
  other_run.run_id = "run-b";
  absl::StatusOr<StageResult> other = stager.Stage(other_run);
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(other.status())) << other.status();

  StageRequest below = Request(0, UpdateDestination::kCpu);
  below.base_version = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(stager.Stage(below).status()));

  StageRequest no_local = Request(3, UpdateDestination::kDisk);
  no_local.local_checkpoint_dir.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(stager.Stage(no_local).status()));
}

TEST_F(StagingTest, RefusesACheckpointOfAnotherModel) {
  ModelConfig other = config_;
  other.num_hidden_layers = 3;
  WeightStager stager(other, 1);
  absl::StatusOr<StageResult> r = stager.Stage(Request(1, UpdateDestination::kCpu));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_THAT(r.status().message(), HasSubstr("another model"));
}

TEST_F(StagingTest, CommittingAVersionNeverStagedIsRefused) {
  WeightStager stager(config_, 1);
  absl::StatusOr<PreparedWeights> p = stager.TakePrepared(3, "run-a");
  EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
  EXPECT_THAT(p.status().message(), HasSubstr("never staged"));
  ASSERT_TRUE(stager.Stage(Request(1, UpdateDestination::kCpu)).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(stager.TakePrepared(1, "run-b").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(stager.TakePrepared(2, "run-a").status()));
}

}  // namespace
}  // namespace stitch
