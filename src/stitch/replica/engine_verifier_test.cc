// The engine verifier on its own: what a report must say to be vouched for,
// what a load must leave, and what counts as the engine changing behind the
// sidecar's back. Against an in-memory store of real versions and a scripted
// engine; the reconciler's use of it is reconciler_test.cc's.
#include "stitch/replica/engine_verifier.h"

#include <atomic>
#include <memory>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/net/event_loop.h"
#include "stitch/replica/replica_test_util.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using ::testing::HasSubstr;
using testing::ScriptedEngine;

VersionRef Ref(std::string run, int64_t v) { return VersionRef{std::move(run), v}; }

EngineReport ReportOf(const VersionRef& held, std::optional<Checksum128> fingerprint = {},
                      std::string instance = "i-1") {
  EngineReport r;
  r.label = held.ToString();
  r.held = held;
  r.instance = std::move(instance);
  r.fingerprint = fingerprint;
  return r;
}

class EngineVerifierTest : public ::testing::Test {
 protected:
  EngineVerifierTest() {
    pool_ = std::make_unique<WorkerPool>(2);
    loop_ = std::make_unique<EventLoop>();
    static std::atomic<int> counter{0};
    auto mem = MemStore::Open(absl::StrCat("verifier-", ++counter), "r1", tmp_ / "cache");
    EXPECT_TRUE(mem.ok()) << mem.status();
    store_ = *std::move(mem);
    engine_ = std::make_unique<ScriptedEngine>(loop_->executor());
    testing::TestVersionOptions boot;
    boot.seed = 100;
    boot.record_version = false;
    EXPECT_TRUE(testing::WriteTestVersionAt(tmp_ / "base", 0, boot).ok());
    for (int64_t v : {1, 2}) {
      testing::TestVersionOptions o;
      o.seed = static_cast<int>(v) + 1;
      auto dir = testing::WriteTestVersion(tmp_ / absl::StrCat("v", v), v, o);
      EXPECT_TRUE(dir.ok()) << dir.status();
      EXPECT_TRUE(store_->PublishFiles(v, *dir).ok());
    }
    verifier_ = std::make_unique<EngineVerifier>(
        EngineVerifierOptions{0, tmp_ / "base", std::chrono::seconds(5)}, *store_, *engine_,
        *pool_);
  }
  ~EngineVerifierTest() override {
    verifier_.reset();
    engine_.reset();
    pool_.reset();
    loop_.reset();
  }
  Checksum128 FingerprintOf(const std::filesystem::path& dir) {
    auto checksums = HashCheckpointTensors(dir);
    EXPECT_TRUE(checksums.ok()) << checksums.status();
    return checksums.ok() ? WeightsFingerprint(*checksums) : Checksum128{};
  }
  EngineVerdict Verify(const EngineReport& report, std::optional<VersionRef> head,
                       const std::string& run = "r1") {
    return loop_->BlockOn(verifier_->Verify(report, head, run));
  }
  absl::Status CheckLoaded(const VersionRef& label) {
    return loop_->BlockOn(verifier_->CheckLoaded(label, "r1"));
  }

  testing::TempDir tmp_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<MemStore> store_;
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<EngineVerifier> verifier_;
};

TEST_F(EngineVerifierTest, APublishedVersionAtOrBelowThePointerIsVouchedForByItsLabel) {
  EngineVerdict v = Verify(ReportOf(Ref("r1", 1)), Ref("r1", 2));
  EXPECT_TRUE(v.ok()) << v.unverified;
  EXPECT_EQ(v.verified, Ref("r1", 1));
  // A bare number is a version of the run followed.
  EngineReport bare;
  bare.label = "2";
  bare.held = Ref("", 2);
  v = Verify(bare, Ref("r1", 2));
  EXPECT_TRUE(v.ok()) << v.unverified;
  EXPECT_EQ(v.verified, Ref("r1", 2));
  // The boot version needs no store.
  v = Verify(ReportOf(Ref("r1", 0)), std::nullopt);
  EXPECT_TRUE(v.ok()) << v.unverified;
}

TEST_F(EngineVerifierTest, LabelsThatCannotBeVouchedForSayWhy) {
  EngineReport none;
  EXPECT_EQ(Verify(none, Ref("r1", 2)).unverified, "the engine reports no weight label");
  EngineReport other;
  other.label = "default";
  EXPECT_THAT(Verify(other, Ref("r1", 2)).unverified, HasSubstr("\"default\" names no version"));
  EXPECT_THAT(Verify(ReportOf(Ref("r9", 1)), Ref("r1", 2)).unverified,
              HasSubstr("a version of run r9, which this replica does not follow"));
  EXPECT_THAT(Verify(ReportOf(Ref("r1", 3)), Ref("r1", 2)).unverified,
              HasSubstr("ahead of the store's pointer r1/weight_v000002"));
  EXPECT_THAT(Verify(ReportOf(Ref("r1", 1)), std::nullopt).unverified,
              HasSubstr("the store's pointer names no version of that run"));
}

TEST_F(EngineVerifierTest, AVersionOfThePointersRunIsVouchedForWhileFollowingAnother) {
  EngineVerdict v = Verify(ReportOf(Ref("r1", 1)), Ref("r1", 2), "r0");
  EXPECT_TRUE(v.ok()) << v.unverified;
  EXPECT_EQ(v.verified.run_id, "r1");
}

TEST_F(EngineVerifierTest, AReportedFingerprintMustBeTheOneTheStoresChecksumsGive) {
  auto dir = store_->Materialize(2);
  ASSERT_TRUE(dir.ok()) << dir.status();
  const Checksum128 v2 = FingerprintOf(*dir);
  EXPECT_FALSE(verifier_->reports_fingerprints());
  EXPECT_TRUE(Verify(ReportOf(Ref("r1", 2), v2), Ref("r1", 2)).ok());
  EXPECT_TRUE(verifier_->reports_fingerprints());
  const Checksum128 boot = FingerprintOf(tmp_ / "base");
  EXPECT_TRUE(Verify(ReportOf(Ref("r1", 0), boot), Ref("r1", 2)).ok());
  // Version 2's label on the boot weights.
  EngineVerdict v = Verify(ReportOf(Ref("r1", 2), boot), Ref("r1", 2));
  EXPECT_THAT(v.unverified, HasSubstr("the engine labels its weights r1/weight_v000002, but their "
                                      "fingerprint is " +
                                      boot.ToHex() + ", not " + v2.ToHex()));
}

TEST_F(EngineVerifierTest, ALoadIsCheckedAgainstWhatTheEngineThenReports) {
  engine_->holds = Ref("r1", 1);
  EXPECT_TRUE(CheckLoaded(Ref("r1", 1)).ok());
  absl::Status s = CheckLoaded(Ref("r1", 2));
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("after loading r1/weight_v000002, the engine reports weights "
                        "r1/weight_v000001, not r1/weight_v000002"));
  // Once the engine reports fingerprints, every load is held to them.
  auto dir = store_->Materialize(2);
  ASSERT_TRUE(dir.ok());
  engine_->holds = Ref("r1", 2);
  engine_->fingerprint = FingerprintOf(*dir);
  EXPECT_TRUE(CheckLoaded(Ref("r1", 2)).ok());
  engine_->fingerprint = FingerprintOf(tmp_ / "base");
  s = CheckLoaded(Ref("r1", 2));
  EXPECT_THAT(std::string(s.message()), HasSubstr("the engine's weights fingerprint is"));
  engine_->report_results.push_back(absl::UnavailableError("connection refused"));
  s = CheckLoaded(Ref("r1", 2));
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("reading what the engine holds after loading"));
}

TEST_F(EngineVerifierTest, DriftIsARestartAnotherLabelOrAnotherFingerprint) {
  const Checksum128 a{1, 2}, b{3, 4};
  verifier_->Vouch(ReportOf(Ref("r1", 1), a, "i-1"));
  EXPECT_EQ(verifier_->Drift(ReportOf(Ref("r1", 1), a, "i-1"), Ref("r1", 1)), "");
  EXPECT_THAT(verifier_->Drift(ReportOf(Ref("r1", 1), a, "i-2"), Ref("r1", 1)),
              HasSubstr("the engine restarted (its instance id changed from i-1 to i-2)"));
  EXPECT_THAT(verifier_->Drift(ReportOf(Ref("r1", 2), a, "i-1"), Ref("r1", 1)),
              HasSubstr("the engine reports weights r1/weight_v000002, not r1/weight_v000001"));
  EXPECT_THAT(verifier_->Drift(ReportOf(Ref("r1", 1), b, "i-1"), Ref("r1", 1)),
              HasSubstr("the engine's weights fingerprint is " + b.ToHex()));
}

TEST_F(EngineVerifierTest, ABaselineFieldNotKnownYetIsLearntFromTheFirstAgreeingProbe) {
  EngineReport silent = ReportOf(Ref("r1", 1));
  silent.instance.clear();
  verifier_->Vouch(silent);
  EXPECT_EQ(verifier_->Drift(ReportOf(Ref("r1", 1), Checksum128{1, 2}, "i-7"), Ref("r1", 1)), "");
  // Learnt: a later change of either is drift.
  EXPECT_NE(verifier_->Drift(ReportOf(Ref("r1", 1), Checksum128{1, 2}, "i-8"), Ref("r1", 1)), "");
  EXPECT_NE(verifier_->Drift(ReportOf(Ref("r1", 1), Checksum128{5, 6}, "i-7"), Ref("r1", 1)), "");
}

}  // namespace
}  // namespace stitch
