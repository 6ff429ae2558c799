// In-place weight patches in the reference engine: ModelWeights::ApplyPatch
// (exact, transactional) and what a cpu staging prepares (a patch, or whole
// weights and why).

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/staging.h"
#include "stitch/refengine/test_models.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

// Every float of the two weights, bit for bit.
bool SameBits(const ModelWeights& a, const ModelWeights& b) {
  auto eq = [](auto x, auto y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size_bytes()) == 0;
  };
  if (!eq(a.embedding(), b.embedding()) || !eq(a.final_norm(), b.final_norm()) ||
      !eq(a.lm_head(), b.lm_head()) || a.layers().size() != b.layers().size()) {
    return false;
  }
  for (size_t i = 0; i < a.layers().size(); ++i) {
    const auto& x = a.layers()[i];
    const auto& y = b.layers()[i];
    auto same = [&](const std::vector<float>& p, const std::vector<float>& q) {
      return eq(std::span<const float>(p), std::span<const float>(q));
    };
    if (!same(x.input_norm, y.input_norm) || !same(x.qkv, y.qkv) || !same(x.o, y.o) ||
        !same(x.post_norm, y.post_norm) || !same(x.gate_up, y.gate_up) || !same(x.down, y.down)) {
      return false;
    }
  }
  return a.fingerprint() == b.fingerprint() && a.tensor_checksums() == b.tensor_checksums();
}

// Weights only the test holds, to patch.
ModelWeights& Mutable(const std::shared_ptr<const ModelWeights>& w) {
  return const_cast<ModelWeights&>(*w);
}

class ApplyPatchTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    config_ = testing::GqaConfig();
    config_.weight_dtype = GetParam();
    v0_ = testing::RandomTensors(config_, 3, 0.3f);
    v1_ = testing::SparselyPerturbTensors(v0_, 7, 0.05);
    v2_ = testing::SparselyPerturbTensors(v1_, 5, -0.04, 2);
  }
  std::shared_ptr<const ModelWeights> Build(const std::vector<HostTensor>& t) const {
    return testing::BuildWeights(config_, t);
  }
  WeightPatch Patch(const std::vector<HostTensor>& from, const std::vector<HostTensor>& to, int a,
                    int b) const {
    return testing::DiffWeightPatch(from, to, {"run-a", a}, {"run-a", b});
  }

  ModelConfig config_;
  std::vector<HostTensor> v0_, v1_, v2_;
};

TEST_P(ApplyPatchTest, BringsTheWeightsToTheTargetBitForBit) {
  const WeightPatch patch = Patch(v0_, v1_, 0, 1);
  // Every tensor changes (q, k and v rows inside the fused qkv among them),
  // a seventh of its values.
  ASSERT_EQ(patch.tensors.size(), ExpectedTensors(config_).size());
  EXPECT_NEAR(patch.stats.density(), 1.0 / 7, 0.01);
  auto w = Build(v0_);
  ASSERT_FALSE(SameBits(*w, *Build(v1_)));
  ASSERT_TRUE(Mutable(w).ApplyPatch(patch).ok());
  EXPECT_TRUE(SameBits(*w, *Build(v1_)));
  ASSERT_TRUE(Mutable(w).ApplyPatch(Patch(v1_, v2_, 1, 2)).ok());
  EXPECT_TRUE(SameBits(*w, *Build(v2_)));
}

TEST_P(ApplyPatchTest, AFailurePartWayIsUndoneBitForBit) {
  const WeightPatch patch = Patch(v0_, v1_, 0, 1);
  for (int64_t after : {int64_t{0}, int64_t{1}, static_cast<int64_t>(patch.tensors.size() - 1)}) {
    auto w = Build(v0_);
    const absl::Status s = Mutable(w).ApplyPatch(patch, after);
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("undone"));
    EXPECT_THAT(s.message(), HasSubstr("injected fault"));
    EXPECT_TRUE(SameBits(*w, *Build(v0_))) << "failing after " << after << " tensors";
    // The same weights take the patch afterwards.
    ASSERT_TRUE(Mutable(w).ApplyPatch(patch).ok());
    EXPECT_TRUE(SameBits(*w, *Build(v1_)));
  }
}

TEST_P(ApplyPatchTest, AChecksumThatDoesNotHoldIsUndone) {
  WeightPatch patch = Patch(v0_, v1_, 0, 1);
  patch.tensors.back().checksum = Xxh3Checksum(std::as_bytes(std::span<const char>("other", 5)));
  auto w = Build(v0_);
  const absl::Status s = Mutable(w).ApplyPatch(patch);
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(patch.tensors.back().name));
  EXPECT_TRUE(SameBits(*w, *Build(v0_)));
}

TEST_P(ApplyPatchTest, WeightsOfAnotherVersionAreRefusedUntouched) {
  // v1 -> v2 applied to v0: the old values are not where the patch expects
  // them; the first tensor that differs stops it, the ones before are undone.
  auto w = Build(v0_);
  const absl::Status s = Mutable(w).ApplyPatch(Patch(v1_, v2_, 1, 2));
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("holds another value"));
  EXPECT_TRUE(SameBits(*w, *Build(v0_)));
}

TEST_P(ApplyPatchTest, APatchThatDoesNotFitTheModelChangesNothing) {
  auto w = Build(v0_);
  WeightPatch unknown = Patch(v0_, v1_, 0, 1);
  unknown.tensors.back().name = "model.layers.9.mlp.up_proj.weight";
  WeightPatch out_of_range = Patch(v0_, v1_, 0, 1);
  out_of_range.tensors.back().idx.back() = 1 << 30;
  WeightPatch short_values = Patch(v0_, v1_, 0, 1);
  short_values.tensors.front().new_bits.pop_back();
  for (const WeightPatch* p : {&unknown, &out_of_range, &short_values}) {
    const absl::Status s = Mutable(w).ApplyPatch(*p);
    EXPECT_TRUE(absl::IsAborted(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("nothing was changed"));
    EXPECT_TRUE(SameBits(*w, *Build(v0_)));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ApplyPatchTest, ::testing::Values(DType::kF32, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

// A store of sparse versions: v1 DELTA, v2 DELTA, v3 FULL, v4 DELTA of run-a,
// each changing a tenth of the values, and one dense v5 DELTA.
class PatchStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = testing::EngineTestConfig();
    versions_.push_back(testing::EngineTestTensors(config_, 1));
    for (size_t v = 1; v <= 4; ++v) {
      versions_.push_back(testing::SparselyPerturbTensors(versions_.back(), 10, 0.02 * v, v));
    }
    versions_.push_back(testing::PerturbTensors(versions_.back(), 0.05, 1));
    ASSERT_TRUE(testing::WriteModel(boot_, config_, versions_[0]).ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 1, versions_[0], versions_[1], "run-a").ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 2, versions_[1], versions_[2], "run-a").ok());
    ASSERT_TRUE(testing::PublishFull(updates_, 3, versions_[3], "run-a").ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 4, versions_[3], versions_[4], "run-a").ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 5, versions_[4], versions_[5], "run-a").ok());
  }

  StageRequest Request(int64_t target, std::optional<int64_t> serving,
                       std::string serving_run = "run-a") const {
    StageRequest r;
    r.base_checkpoint_dir = boot_;
    r.target_version = target;
    r.run_id = "run-a";
    r.destination = UpdateDestination::kCpu;
    r.checkpoint_source_dir = updates_;
    if (serving.has_value()) r.serving = VersionRef{std::move(serving_run), *serving};
    return r;
  }
  std::shared_ptr<const ModelWeights> Expected(size_t v) const {
    return testing::BuildWeights(config_, versions_[v]);
  }
  // Stages `target` with `serving` given and returns what the commit gets.
  PreparedWeights StageAndTake(WeightStager& stager, const StageRequest& request,
                               std::string_view want_path) {
    absl::StatusOr<StageResult> staged = stager.Stage(request);
    EXPECT_TRUE(staged.ok()) << staged.status();
    if (!staged.ok()) return {};
    EXPECT_EQ(staged->commit_path, want_path);
    absl::StatusOr<PreparedWeights> p = stager.TakePrepared(request.target_version, "run-a");
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : PreparedWeights{};
  }

  TempDir tmp_;
  fs::path boot_ = tmp_ / "boot";
  fs::path updates_ = tmp_ / "store" / "updates";
  ModelConfig config_;
  std::vector<std::vector<HostTensor>> versions_;
};

TEST_F(PatchStagingTest, ADeltaChainFromTheServingVersionBecomesOnePatch) {
  WeightStager stager(config_, 1);
  PreparedWeights p = StageAndTake(stager, Request(2, 0), "patch");
  ASSERT_NE(p.patch, nullptr);
  EXPECT_EQ(p.weights, nullptr);
  EXPECT_EQ(p.patch->from, (VersionRef{"run-a", 0}));
  EXPECT_EQ(p.patch->to, (VersionRef{"run-a", 2}));
  // Two tenths: v1's and v2's.
  EXPECT_NEAR(p.patch->stats.density(), 0.2, 0.02);
  auto serving = Expected(0);
  ASSERT_TRUE(Mutable(serving).ApplyPatch(*p.patch).ok());
  EXPECT_TRUE(SameBits(*serving, *Expected(2)));
}

TEST_F(PatchStagingTest, WholeWeightsAndWhyWhenAPatchCannotBe) {
  struct Case {
    StageRequest request;
    std::string reason;
  };
  WeightStager off(config_, 1, 0.0);
  PreparedWeights p = StageAndTake(off, Request(1, 0), "swap");
  EXPECT_EQ(p.reason, "off");
  ASSERT_NE(p.weights, nullptr);
  EXPECT_TRUE(SameBits(*p.weights, *Expected(1)));

  const std::vector<Case> cases = {
      {Request(1, std::nullopt), "unknown-base"},
      {Request(2, 0, "run-b"), "other-run"},
      {Request(2, 2), "not-after"},
      {Request(4, 2), "full-version"},  // v3 is FULL
      {Request(5, 4), "dense"},         // v5 changes every value
  };
  for (const Case& c : cases) {
    WeightStager stager(config_, 1);
    PreparedWeights w = StageAndTake(stager, c.request, "swap");
    EXPECT_EQ(w.reason, c.reason) << "target " << c.request.target_version;
    ASSERT_NE(w.weights, nullptr);
    EXPECT_TRUE(SameBits(*w.weights, *Expected(static_cast<size_t>(c.request.target_version))));
  }
}

TEST_F(PatchStagingTest, AfterAnUndonePatchTheSameTargetGetsWholeWeights) {
  WeightStager stager(config_, 1);
  PreparedWeights p = StageAndTake(stager, Request(1, 0), "patch");
  ASSERT_NE(p.patch, nullptr);
  stager.PatchFailed({"run-a", 1});
  PreparedWeights again = StageAndTake(stager, Request(1, 0), "swap");
  EXPECT_EQ(again.reason, "patch-failed");
  ASSERT_NE(again.weights, nullptr);
  EXPECT_TRUE(SameBits(*again.weights, *Expected(1)));
  // Another target patches again.
  PreparedWeights next = StageAndTake(stager, Request(2, 1), "patch");
  ASSERT_NE(next.patch, nullptr);
  EXPECT_EQ(next.patch->from, (VersionRef{"run-a", 1}));
}

}  // namespace
}  // namespace stitch
