#include "stitch/replica/reconciler.h"

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/core/errors.h"
#include "stitch/delta/weights_checksums.h"
#include "stitch/net/event_loop.h"
#include "stitch/replica/replica_test_util.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using testing::FlakyStore;
using ::testing::HasSubstr;
using testing::LoopLatch;
using testing::PublishDelta;
using testing::PublishFull;
using testing::RollingRequest;
using testing::ScriptedEngine;
using testing::Settle;
using testing::SpawnRoll;
using testing::Until;

// gtest's ASSERT_* return from the function, which a coroutine cannot do.
#define CO_ASSERT(cond)                            \
  do {                                             \
    if (!(cond)) {                                 \
      ADD_FAILURE() << "assertion failed: " #cond; \
      co_return;                                   \
    }                                              \
  } while (0)

VersionRef Ref(std::string run, int64_t v) { return VersionRef{std::move(run), v}; }

class ReconcilerTest : public ::testing::Test {
 protected:
  ReconcilerTest() {
    pool_ = std::make_unique<WorkerPool>(2);
    loop_ = std::make_unique<EventLoop>();
    clock_ = std::make_unique<ManualClock>(loop_->executor());
    static std::atomic<int> counter{0};
    std::string name = absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                    "-", ++counter);
    auto mem = MemStore::Open(name, "r1", tmp_ / "cache");
    EXPECT_TRUE(mem.ok()) << mem.status();
    mem_ = *std::move(mem);
    store_ = std::make_unique<FlakyStore>(*mem_);
    engine_ = std::make_unique<ScriptedEngine>(loop_->executor());
  }

  // I/O objects (timers) go before their loop, once nothing uses them.
  ~ReconcilerTest() override {
    if (reconciler_) loop_->BlockOn(reconciler_->Stop());
    reconciler_.reset();
    gate_.reset();
    engine_.reset();
    latches_.clear();
    pool_.reset();
    loop_.reset();
  }

  // Builds the gate and the reconciler (the backstop off unless asked).
  void Build(ReconcilerOptions options = {}) {
    if (options.run_id.empty()) options.run_id = "r1";
    options.base_checkpoint_dir = tmp_ / "base";
    gate_ = std::make_unique<AdmissionGate>(loop_->executor(),
                                            Ref(options.run_id, options.boot_version));
    reconciler_ = std::make_unique<Reconciler>(loop_->executor(), options, *store_, *engine_,
                                               *gate_, *pool_, *clock_);
    reconciler_->SetTerminalListener(
        [this](const absl::Status& s) { terminal_reports_.push_back(s); });
  }
  static ReconcilerOptions NoBackstop(CommitMode mode = CommitMode::kInPlace) {
    ReconcilerOptions o;
    o.reconcile_interval = Clock::Duration::zero();
    o.commit_mode = mode;
    return o;
  }

  // Runs the test body on the loop. Callbacks it gave the engine may
  // reference its locals: they are dropped when it returns.
  template <typename F>
  void Run(F body) {
    loop_->BlockOn([&]() -> awaitable<void> {
      co_await body();
      engine_->ClearCallbacks();
    }());
  }

  // Latches and requests that coroutines spawned by a test reference; they
  // live as long as the fixture, so a test that fails early leaves nothing
  // dangling.
  LoopLatch& NewLatch() { return latches_.emplace_back(loop_->executor()); }
  RollingRequest& NewRequest() { return requests_.emplace_back(); }

  void SetPointer(const VersionRef& ref) { mem_->SetPointerTextForTesting(ref.ToString()); }
  void Full(int64_t v) { PublishFull(*mem_, tmp_.path(), v); }
  void Delta(int64_t v, int files) { PublishDelta(*mem_, tmp_.path(), v, files); }

  // Lets the 5 s backstop run one pass, which must be the `n`th to fail.
  awaitable<bool> BackstopPassFails(int n) {
    const bool asleep = co_await Until([&] { return clock_->sleepers() == 1; });
    if (!asleep) co_return false;
    clock_->Advance(std::chrono::seconds(5));
    co_return co_await Until([&] { return reconciler_->counters().errors == uint64_t(n); });
  }

  // The replica is idle at `v` of run r1 (or `run`).
  bool SettledAt(int64_t v, const std::string& run = "r1") const {
    return reconciler_->applied() == Ref(run, v) && reconciler_->sync_state() == SyncState::kIdle &&
           reconciler_->ready();
  }

  stitch::testing::TempDir tmp_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<ManualClock> clock_;
  std::unique_ptr<MemStore> mem_;
  std::unique_ptr<FlakyStore> store_;
  std::unique_ptr<ScriptedEngine> engine_;
  std::unique_ptr<AdmissionGate> gate_;
  std::unique_ptr<Reconciler> reconciler_;
  std::vector<absl::Status> terminal_reports_;
  std::deque<LoopLatch> latches_;
  std::deque<RollingRequest> requests_;
};

TEST_F(ReconcilerTest, FreshReconcileStagesAndCommitsThePointer) {
  Full(3);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop(CommitMode::kQuiesce));
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    EXPECT_EQ(engine_->calls, (std::vector<std::string>{"init:r1/weight_v000000", "stage:3",
                                                        "pause", "commit:3", "resume"}));
    // Flushing rides on commit options; it is never a separate call.
    EXPECT_EQ(engine_->Count("flush"), 0u);
    EXPECT_EQ(engine_->flushed_on_commit, std::vector<bool>{false});
    const StagePlan& plan = engine_->plans.at(0);
    EXPECT_EQ(plan.target, Ref("r1", 3));
    EXPECT_EQ(plan.base_version, 0);
    CO_ASSERT(plan.chain.size() == 1u);
    EXPECT_EQ(plan.chain[0].manifest.kind, VersionKind::kFull);
    EXPECT_EQ(plan.source_dir, plan.chain[0].dir.parent_path());
    ReplicaState state = reconciler_->State();
    EXPECT_TRUE(state.ready);
    EXPECT_EQ(state.applied, Ref("r1", 3));
    EXPECT_EQ(state.pointer, Ref("r1", 3));
    EXPECT_EQ(gate_->pointer(), Ref("r1", 3));
    EXPECT_TRUE(state.update_destination_ready);
    EXPECT_EQ(state.commit_mode, CommitMode::kQuiesce);
    EXPECT_EQ(state.metrics.at("target_version"), 3);
    EXPECT_EQ(state.metrics.at("versions"), 3);
    EXPECT_GE(state.metrics.at("stage_s"), 0);
    EXPECT_GE(state.metrics.at("commit_s"), 0);
  });
}

TEST_F(ReconcilerTest, ReadyLatchesAfterTheFirstCatchUpAndSurvivesLaterErrors) {
  Full(2);
  SetPointer(Ref("r1", 2));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_EQ(reconciler_->reason(), "initializing: preparing the engine's update destination");
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    // A later store error is reported but does not take the replica out of
    // rotation.
    store_->FailRefreshes(1);
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_TRUE(reconciler_->ready());
    EXPECT_EQ(reconciler_->reason(), "");
    EXPECT_NE(reconciler_->State().reason.find("store flake"), std::string::npos)
        << reconciler_->State().reason;
  });
}

// A store writer moves the pointer back within the run: the replica keeps
// the version it serves (versions only move forward within a run) and says
// so, once per moved-back pointer, so that the operator hears of it.
TEST_F(ReconcilerTest, APointerMovedBackIsCountedOnceAndTheAppliedVersionKept) {
  Full(1);
  Full(2);
  SetPointer(Ref("r1", 2));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(reconciler_->counters().pointer_rewinds, 0u);
    SetPointer(Ref("r1", 1));
    uint64_t passes = reconciler_->counters().passes;
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return reconciler_->counters().passes > passes; }));
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(reconciler_->counters().pointer_rewinds, 1u);
    // /server_info (and the gateway's dashboard) say so while it lasts.
    EXPECT_THAT(reconciler_->State().pointer_notice,
                HasSubstr("the store's pointer moved back to r1/weight_v000001; this replica keeps "
                          "r1/weight_v000002"));
    passes = reconciler_->counters().passes;
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return reconciler_->counters().passes > passes; }));
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(reconciler_->counters().pointer_rewinds, 1u) << "once per moved-back pointer";
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{2});
    SetPointer(Ref("r1", 2));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return reconciler_->State().pointer_notice.empty(); }));
  });
}

TEST_F(ReconcilerTest, UnsetPointerMeansReadyAtTheBootVersion) {
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(0); }));
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:r1/weight_v000000"});
  });
}

TEST_F(ReconcilerTest, DestinationIsInitialisedBeforeAnythingElse) {
  Full(2);
  SetPointer(Ref("r1", 2));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    engine_->HoldNext(ScriptedEngine::kInit);
    reconciler_->Start();
    reconciler_->Wake();  // a wake while initializing must not start a pass
    CO_ASSERT(co_await Until([&] { return engine_->held(ScriptedEngine::kInit); }));
    co_await Settle();
    EXPECT_EQ(store_->refreshes(), 0);
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:r1/weight_v000000"});
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_FALSE(reconciler_->State().update_destination_ready);
    EXPECT_NE(reconciler_->reason().find("initializing"), std::string::npos);
    engine_->Release(ScriptedEngine::kInit);
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_LT(engine_->IndexOf("init:r1/weight_v000000"), engine_->IndexOf("stage:2"));
    EXPECT_TRUE(reconciler_->State().update_destination_ready);
  });
}

TEST_F(ReconcilerTest, DestinationInitialisationFailureIsTerminal) {
  Full(2);
  SetPointer(Ref("r1", 2));
  engine_->init_results.push_back(absl::InternalError("broken destination"));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return !reconciler_->terminal().ok(); }));
    co_await Settle();
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_EQ(engine_->Count("stage:2"), 0u);
    ReplicaState state = reconciler_->State();
    EXPECT_NE(state.terminal_error.find("weight update destination initialization failed"),
              std::string::npos)
        << state.terminal_error;
    EXPECT_NE(state.terminal_error.find("broken destination"), std::string::npos);
    EXPECT_EQ(state.update_destination_error, "broken destination");
    EXPECT_EQ(terminal_reports_.size(), 1u);
    // Requests are refused from now on.
    auto refused = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(refused.has_value());
    EXPECT_TRUE(absl::IsUnavailable(refused->status())) << refused->status();
  });
}

// A sidecar started before its engine waits for it (a real engine loads
// its model for minutes), saying so, then carries on; past the start
// timeout it gives up.
TEST_F(ReconcilerTest, AnEngineThatIsNotUpYetIsWaitedForUntilTheStartTimeout) {
  Full(2);
  SetPointer(Ref("r1", 2));
  for (int i = 0; i < 3; ++i) {
    engine_->init_results.push_back(absl::UnavailableError("connect failed: Connection refused"));
  }
  ReconcilerOptions options = NoBackstop();
  options.engine_start_timeout = std::chrono::seconds(60);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    for (size_t attempt = 1; attempt <= 3; ++attempt) {
      CO_ASSERT(co_await Until([&] {
        return engine_->Count("init:r1/weight_v000000") == attempt && clock_->sleepers() == 1;
      }));
      EXPECT_TRUE(reconciler_->terminal().ok());
      EXPECT_THAT(reconciler_->reason(), HasSubstr("waiting for the engine to start"));
      EXPECT_THAT(reconciler_->reason(), HasSubstr("Connection refused"));
      clock_->Advance(std::chrono::seconds(1));
    }
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(engine_->Count("init:r1/weight_v000000"), 4u);
  });
}

TEST_F(ReconcilerTest, AnEngineThatDoesNotStartWithinTheTimeoutIsTerminal) {
  for (int i = 0; i < 100; ++i) engine_->init_results.push_back(absl::UnavailableError("refused"));
  ReconcilerOptions options = NoBackstop();
  options.engine_start_timeout = std::chrono::seconds(3);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    for (size_t attempt = 1; attempt <= 3; ++attempt) {
      CO_ASSERT(co_await Until([&] {
        return engine_->Count("init:r1/weight_v000000") == attempt && clock_->sleepers() == 1;
      }));
      clock_->Advance(std::chrono::seconds(1));
    }
    CO_ASSERT(co_await Until([&] { return !reconciler_->terminal().ok(); }));
    EXPECT_EQ(engine_->Count("init:r1/weight_v000000"), 4u);
    EXPECT_THAT(reconciler_->State().terminal_error, HasSubstr("refused"));
  });
}

TEST_F(ReconcilerTest, CatchUpAppliesOneChainWithOneCommit) {
  Full(3);
  Delta(4, 1);
  Delta(5, 2);
  SetPointer(Ref("r1", 5));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
    EXPECT_EQ(engine_->staged, std::vector<int64_t>{5});
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{5});
    const StagePlan& plan = engine_->plans.at(0);
    CO_ASSERT(plan.chain.size() == 3u);
    EXPECT_EQ(plan.chain[0].version, 3);
    EXPECT_EQ(plan.chain[0].manifest.kind, VersionKind::kFull);
    EXPECT_EQ(plan.chain[2].version, 5);
  });
}

// Held for evaluation on an older version, a replica loads it from its
// chain, reports the hold, stays ready on it while the pointer moves on,
// and, released, leaves rotation until it has caught up again.
TEST_F(ReconcilerTest, AHeldReplicaServesTheHeldVersionAndCatchesUpWhenReleased) {
  Full(3);
  Delta(4, 1);
  Delta(5, 1);
  SetPointer(Ref("r1", 5));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
    EXPECT_TRUE(reconciler_->HoldForEvaluation(Ref("r1", 4), "eval").ok());
    CO_ASSERT(co_await Until([&] { return SettledAt(4); }));
    // Back to 4: staged from its anchor, not undone from 5.
    const StagePlan& plan = engine_->plans.back();
    CO_ASSERT(plan.chain.size() == 2u);
    EXPECT_EQ(plan.chain[0].version, 3);
    EXPECT_EQ(plan.chain[1].version, 4);
    ReplicaState state = reconciler_->State();
    CO_ASSERT(state.held.has_value());
    EXPECT_EQ(state.held->version, Ref("r1", 4));
    EXPECT_EQ(state.held->holder, "eval");
    EXPECT_EQ(state.pointer, Ref("r1", 5));

    // The trainer moves on; the held replica does not.
    Delta(6, 1);
    SetPointer(Ref("r1", 6));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return gate_->pointer() == Ref("r1", 6); }));
    CO_ASSERT(co_await Until([&] { return SettledAt(4); }));
    EXPECT_EQ(engine_->committed, (std::vector<int64_t>{5, 4}));

    // Another holder cannot take it; a hold above the pointer is refused.
    EXPECT_TRUE(absl::IsFailedPrecondition(reconciler_->HoldForEvaluation(Ref("r1", 3), "b")));
    EXPECT_TRUE(absl::IsFailedPrecondition(reconciler_->HoldForEvaluation(Ref("r1", 9), "eval")));
    EXPECT_TRUE(absl::IsFailedPrecondition(reconciler_->HoldForEvaluation(Ref("r2", 4), "eval")));
    EXPECT_TRUE(absl::IsNotFound(reconciler_->ReleaseEvaluationHold("b")));

    EXPECT_TRUE(reconciler_->ReleaseEvaluationHold("eval").ok());
    EXPECT_FALSE(reconciler_->ready());  // out of rotation until caught up
    EXPECT_FALSE(reconciler_->State().held.has_value());
    CO_ASSERT(co_await Until([&] { return SettledAt(6); }));
    EXPECT_EQ(engine_->committed, (std::vector<int64_t>{5, 4, 6}));
  });
}

// Held on a version ahead of what it serves, a replica advances to it and
// stops there, even when the pointer is further on.
TEST_F(ReconcilerTest, AHoldAheadOfTheServedVersionAdvancesToItAndNoFurther) {
  Full(1);
  SetPointer(Ref("r1", 1));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    Delta(2, 1);
    Delta(3, 1);
    SetPointer(Ref("r1", 3));
    // The hold is taken before the replica heard of 3 (no wake was sent).
    gate_->SetPointer(Ref("r1", 3));
    EXPECT_TRUE(reconciler_->HoldForEvaluation(Ref("r1", 2), "eval").ok());
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(engine_->committed, (std::vector<int64_t>{1, 2}));
    // Coalescing did not carry it past the hold.
    EXPECT_EQ(engine_->staged.back(), 2);
  });
}

// A claim that moves the pointer to another run ends the hold: the run it
// held is gone from the store's point of view.
TEST_F(ReconcilerTest, ARunSwitchEndsAHold) {
  Full(1);
  Full(2);
  SetPointer(Ref("r1", 2));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_TRUE(reconciler_->HoldForEvaluation(Ref("r1", 1), "eval").ok());
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    SetPointer(Ref("r2", 0));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return SettledAt(0, "r2"); }));
    EXPECT_FALSE(reconciler_->State().held.has_value());
  });
}

TEST_F(ReconcilerTest, NewerHeadDuringStagingIsCoalescedBeforeCommit) {
  ReconcilerOptions options = NoBackstop();
  options.boot_version = 6;
  for (int v = 7; v <= 10; ++v) Delta(v, 1);
  SetPointer(Ref("r1", 7));
  Build(options);
  Run([&]() -> awaitable<void> {
    engine_->HoldNext(ScriptedEngine::kStage, 7);
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return engine_->held(ScriptedEngine::kStage); }));
    SetPointer(Ref("r1", 10));
    engine_->Release(ScriptedEngine::kStage);
    CO_ASSERT(co_await Until([&] { return SettledAt(10); }));
    EXPECT_EQ(engine_->staged, (std::vector<int64_t>{7, 10}));
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{10});
    const auto& m = reconciler_->last_pass();
    EXPECT_EQ(m.at("initial_target_version"), 7);
    EXPECT_EQ(m.at("target_version"), 10);
    EXPECT_EQ(m.at("coalesced_versions"), 3);
    EXPECT_EQ(m.at("versions"), 4);
  });
}

TEST_F(ReconcilerTest, ContinuousPublishingCannotStarveCommit) {
  for (int v = 1; v <= 6; ++v) Delta(v, 1);
  SetPointer(Ref("r1", 1));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    // Every staging publishes the next version, up to 6: a replica that
    // chased the head before committing would never commit.
    engine_->on_stage = [this](const StagePlan& plan) {
      if (plan.target.version < 6) SetPointer(Ref("r1", plan.target.version + 1));
    };
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return !engine_->committed.empty(); }));
    EXPECT_EQ(engine_->committed.front(), 2);
    CO_ASSERT(engine_->calls.size() >= 6u);
    EXPECT_EQ((std::vector<std::string>(engine_->calls.begin(), engine_->calls.begin() + 6)),
              (std::vector<std::string>{"init:r1/weight_v000000", "stage:1", "stage:2", "pause",
                                        "commit:2", "resume"}));
    // And the next passes keep converging to the final head.
    CO_ASSERT(co_await Until([&] { return SettledAt(6); }));
    for (size_t i = 1; i < engine_->committed.size(); ++i) {
      EXPECT_GT(engine_->committed[i], engine_->committed[i - 1]);
    }
  });
}

TEST_F(ReconcilerTest, CoalescingNeverCrossesRuns) {
  Delta(1, 1);
  Full(2);  // run r2's version (the pointer names r2/weight_v000002 later)
  SetPointer(Ref("r1", 1));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    auto switched = std::make_shared<bool>(false);
    engine_->on_stage = [this, switched](const StagePlan& plan) {
      if (!*switched) {
        *switched = true;
        EXPECT_EQ(plan.target, Ref("r1", 1));
        SetPointer(Ref("r2", 2));
      }
    };
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return !engine_->committed.empty(); }));
    // The staged r1 target is committed, never swapped for the other run.
    EXPECT_EQ(engine_->committed.front(), 1);
    CO_ASSERT(engine_->calls.size() >= 5u);
    EXPECT_EQ((std::vector<std::string>(engine_->calls.begin(), engine_->calls.begin() + 5)),
              (std::vector<std::string>{"init:r1/weight_v000000", "stage:1", "pause", "commit:1",
                                        "resume"}));
    // The run change is followed by the next pass, through a reset.
    CO_ASSERT(co_await Until([&] { return SettledAt(2, "r2"); }));
    EXPECT_GE(engine_->IndexOf("reset:r2/weight_v000000"), 0);
  });
}

TEST_F(ReconcilerTest, FailedReReadOfTheHeadStillCommitsTheStagedTarget) {
  Delta(1, 1);
  SetPointer(Ref("r1", 1));
  store_->FailRefreshNumber(3);  // the re-read after staging (1: verifying, 2: the pass)
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    EXPECT_EQ(engine_->staged, std::vector<int64_t>{1});
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{1});
    EXPECT_EQ(reconciler_->last_pass().at("coalesce_failed"), 1);
  });
}

TEST_F(ReconcilerTest, RunSwitchResetsAndDrainsRollingRequests) {
  Full(3);
  Full(5);  // r2's FULL version
  SetPointer(Ref("r1", 3));
  Build(NoBackstop());  // in_place: a run change drains anyway
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    LoopLatch& release = NewLatch();
    RollingRequest& rolling = NewRequest();
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint{}, &release, &rolling);
    CO_ASSERT(co_await Until([&] { return rolling.admitted; }));

    SetPointer(Ref("r2", 5));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return !gate_->is_open(); }));
    RollingRequest& late = NewRequest();
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint{}, nullptr, &late);
    co_await Settle();
    // The reset waits for the rolling request, and nothing new is admitted.
    EXPECT_EQ(engine_->IndexOf("reset:r2/weight_v000000"), -1);
    EXPECT_FALSE(late.admitted);
    EXPECT_EQ(reconciler_->sync_state(), SyncState::kCommitting);
    EXPECT_TRUE(reconciler_->may_probe());  // the engine still serves while requests drain

    release.Open();
    CO_ASSERT(co_await Until([&] { return SettledAt(5, "r2"); }));
    CO_ASSERT(co_await Until([&] { return late.done; }));
    EXPECT_EQ(rolling.stamp->start, 3);
    EXPECT_EQ(rolling.stamp->end, 3);  // it never crossed the run change
    EXPECT_EQ(late.start->run_id, "r2");
    const int reset = engine_->IndexOf("reset:r2/weight_v000000");
    CO_ASSERT(reset > 0);
    EXPECT_EQ(engine_->calls[reset - 1], "pause");
    EXPECT_EQ(engine_->calls[reset + 1], "resume");
    EXPECT_EQ(engine_->committed.back(), 5);
    EXPECT_EQ(engine_->Count("flush"), 0u);
  });
}

TEST_F(ReconcilerTest, RunSwitchFromBootWeightsSkipsTheReset) {
  Full(4);
  SetPointer(Ref("r2", 4));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(4, "r2"); }));
    for (const std::string& call : engine_->calls)
      EXPECT_EQ(call.rfind("reset", 0), std::string::npos);
    EXPECT_EQ(reconciler_->counters().run_switches, 1u);
    EXPECT_THAT(reconciler_->State().pointer_notice,
                HasSubstr("the store's pointer moved from run r1 to run r2"));
    // Told for ten minutes.
    clock_->Advance(std::chrono::minutes(9));
    EXPECT_NE(reconciler_->State().pointer_notice, "");
    clock_->Advance(std::chrono::minutes(1));
    EXPECT_EQ(reconciler_->State().pointer_notice, "");
  });
}

TEST_F(ReconcilerTest, RollingRequestsCrossAnInPlaceCommit) {
  Full(3);
  Full(4);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop(CommitMode::kInPlace));
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    LoopLatch& release = NewLatch();
    RollingRequest& rolling = NewRequest();
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint::AtLeast(2), &release, &rolling);
    CO_ASSERT(co_await Until([&] { return rolling.admitted; }));
    SetPointer(Ref("r1", 4));
    reconciler_->Wake();
    // The commit completes while the request is still in flight.
    CO_ASSERT(co_await Until([&] { return SettledAt(4); }));
    EXPECT_FALSE(rolling.done);
    release.Open();
    CO_ASSERT(co_await Until([&] { return rolling.done; }));
    EXPECT_EQ(rolling.stamp->start, 3);
    EXPECT_EQ(rolling.stamp->end, 4);
  });
}

TEST_F(ReconcilerTest, ExactPinsDrainBeforeAnInPlaceCommit) {
  Full(3);
  Full(4);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop(CommitMode::kInPlace));
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    LoopLatch& release = NewLatch();
    RollingRequest& pinned = NewRequest();
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint::Exact(3), &release, &pinned);
    CO_ASSERT(co_await Until([&] { return pinned.admitted; }));
    SetPointer(Ref("r1", 4));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return !gate_->is_open(); }));
    co_await Settle();
    EXPECT_EQ(engine_->Count("commit:4"), 0u);
    release.Open();
    CO_ASSERT(co_await Until([&] { return SettledAt(4); }));
    EXPECT_EQ(pinned.stamp->start, 3);
    EXPECT_EQ(pinned.stamp->end, 3);
  });
}

TEST_F(ReconcilerTest, QuiesceCommitDrainsEveryRequest) {
  Full(3);
  Full(4);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop(CommitMode::kQuiesce));
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    LoopLatch& release = NewLatch();
    RollingRequest& rolling = NewRequest();
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint{}, &release, &rolling);
    CO_ASSERT(co_await Until([&] { return rolling.admitted; }));
    SetPointer(Ref("r1", 4));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return !gate_->is_open(); }));
    co_await Settle();
    EXPECT_EQ(engine_->Count("pause"), 1u);  // only the first commit's
    release.Open();
    CO_ASSERT(co_await Until([&] { return SettledAt(4); }));
    EXPECT_EQ(rolling.stamp->end, 3);
  });
}

TEST_F(ReconcilerTest, NewRequestWaitsForAnInPlaceCommit) {
  Full(3);
  Full(4);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop(CommitMode::kInPlace));
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    LoopLatch& release_rolling = NewLatch();
    RollingRequest& rolling = NewRequest();
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint{}, &release_rolling, &rolling);
    CO_ASSERT(co_await Until([&] { return rolling.admitted; }));

    engine_->HoldNext(ScriptedEngine::kCommit);
    SetPointer(Ref("r1", 4));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return engine_->held(ScriptedEngine::kCommit); }));
    RollingRequest& late = NewRequest();
    SpawnRoll(loop_->executor(), *gate_, VersionConstraint{}, nullptr, &late);
    co_await Settle();
    EXPECT_FALSE(late.admitted);
    engine_->Release(ScriptedEngine::kCommit);
    CO_ASSERT(co_await Until([&] { return late.done; }));
    EXPECT_EQ(late.start, Ref("r1", 4));
    EXPECT_FALSE(rolling.done);
    release_rolling.Open();
    CO_ASSERT(co_await Until([&] { return rolling.done; }));
    EXPECT_EQ(rolling.stamp->start, 3);
    EXPECT_EQ(rolling.stamp->end, 4);
  });
}

TEST_F(ReconcilerTest, EmptyDeltasSkipTheEngine) {
  ReconcilerOptions options = NoBackstop();
  options.boot_version = 3;
  Delta(4, 0);
  Delta(5, 0);
  SetPointer(Ref("r1", 5));
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:r1/weight_v000003"});
    EXPECT_EQ(reconciler_->last_pass().at("skipped_weight_update"), 1);
    EXPECT_EQ(reconciler_->counters().skipped, 1u);
  });
}

TEST_F(ReconcilerTest, NonEmptyDeltaAnywhereInTheRangeCommits) {
  ReconcilerOptions options = NoBackstop();
  options.boot_version = 3;
  Delta(4, 1);
  Delta(5, 0);
  SetPointer(Ref("r1", 5));
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{5});
    EXPECT_EQ(reconciler_->last_pass().at("skipped_weight_update"), 0);
    const StagePlan& plan = engine_->plans.at(0);
    CO_ASSERT(plan.chain.size() == 2u);
    EXPECT_EQ(plan.chain[0].version, 4);
    EXPECT_EQ(plan.base_version, 3);
  });
}

TEST_F(ReconcilerTest, PeriodicReconcileRecoversAMissedWake) {
  Full(3);
  Full(5);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    // Published, but its wake never arrives.
    SetPointer(Ref("r1", 5));
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(4));
    co_await Settle();
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 3));
    clock_->Advance(std::chrono::seconds(1));
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
  });
}

// Idle replicas read the pointer less and less often (doubling, with
// jitter, up to reconcile_max_interval); a publish whose wake is lost is still
// caught within that bound, and a failed read brings the period back.
TEST_F(ReconcilerTest, AnIdleReplicaBacksOffItsPointerReadsAndAFailureEndsTheBackoff) {
  Full(3);
  Full(5);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  options.reconcile_max_interval = std::chrono::seconds(40);
  Build(options);
  // Each second, whatever pass it started ends before the next.
  auto run_for = [&](int seconds) -> awaitable<bool> {
    for (int s = 0; s < seconds; ++s) {
      clock_->Advance(std::chrono::seconds(1));
      co_await Settle();
      const bool ended = co_await Until([&] {
        return reconciler_->sync_state() == SyncState::kIdle ||
               reconciler_->sync_state() == SyncState::kError;
      });
      if (!ended) co_return false;
    }
    co_return true;
  };
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    int reads = store_->refreshes();
    CO_ASSERT(co_await run_for(600));
    const int idle_reads = store_->refreshes() - reads;
    // Without the backoff, one read every 5 s: 120. With it: 5, 10 and 20 s
    // (x0.8 to x1.2), then never more than 40 s apart and never less than 32.
    EXPECT_GE(idle_reads, 600 / 40);
    EXPECT_LE(idle_reads, 600 / 32 + 4);
    // A publish whose wake is lost is caught within the longest period.
    SetPointer(Ref("r1", 5));
    int waited = 0;
    reads = store_->refreshes();
    while (store_->refreshes() == reads && waited < 41) {
      CO_ASSERT(co_await run_for(1));
      ++waited;
    }
    EXPECT_LE(waited, 40);
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
    // Failed reads end the backoff: the next read comes one base period
    // later, and so does the one after.
    CO_ASSERT(co_await run_for(200));
    store_->FailRefreshes(1000);
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return reconciler_->counters().errors == 1; }));
    reads = store_->refreshes();
    CO_ASSERT(co_await run_for(20));
    EXPECT_GE(store_->refreshes() - reads, 3);
    store_->FailRefreshes(0);
  });
}

TEST_F(ReconcilerTest, IntervalZeroDisablesTheBackstop) {
  Full(3);
  Full(5);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    SetPointer(Ref("r1", 5));
    EXPECT_EQ(clock_->sleepers(), 0u);
    clock_->Advance(std::chrono::hours(1));
    co_await Settle();
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 3));
    const uint64_t passes = reconciler_->counters().passes;
    co_await Settle();
    EXPECT_EQ(reconciler_->counters().passes, passes);
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
  });
}

TEST_F(ReconcilerTest, WakeDuringReconcileIsKept) {
  Full(1);
  Full(2);
  SetPointer(Ref("r1", 1));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    engine_->HoldNext(ScriptedEngine::kStage);
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return engine_->held(ScriptedEngine::kStage); }));
    // Published and woken while the pass stages v1.
    SetPointer(Ref("r1", 2));
    reconciler_->Wake();
    engine_->Release(ScriptedEngine::kStage);
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
  });
}

TEST_F(ReconcilerTest, WakeDuringAPassThatAlreadyReadTheHeadAsksForAnotherPass) {
  Full(1);
  Full(2);
  SetPointer(Ref("r1", 1));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    // A pass snapshots the pointer at v1 and is held there; v2 is published
    // and its wake delivered meanwhile. That pass finds nothing to do, so
    // only the kept wake brings the replica to v2 (no backstop here).
    store_->HoldNextRefresh();
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return store_->refresh_held(); }));
    SetPointer(Ref("r1", 2));
    reconciler_->Wake();
    store_->ReleaseRefresh();
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
  });
}

TEST_F(ReconcilerTest, RejectionTriggersCatchUpWithoutTheBackstop) {
  Full(1);
  SetPointer(Ref("r1", 1));
  store_->FailManifests(1);
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_NE(reconciler_->reason().find("sync error"), std::string::npos);
    // Unconstrained traffic is admitted and wakes nothing...
    auto any = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(any.has_value() && any->ok());
    co_await Settle();
    EXPECT_EQ(reconciler_->sync_state(), SyncState::kError);
    // ...but a 409 does.
    auto refused = gate_->TryAdmit(VersionConstraint::AtLeast(1));
    CO_ASSERT(refused.has_value());
    EXPECT_EQ(GetErrorKind(refused->status()), ErrorKind::kVersionNotReady);
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
  });
}

TEST_F(ReconcilerTest, TransientErrorsRecoverOnTheBackstop) {
  Full(1);
  SetPointer(Ref("r1", 1));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  Build(options);
  engine_->stage_results.push_back(absl::UnavailableError("engine busy"));
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_NE(reconciler_->State().reason.find("engine busy"), std::string::npos);
    EXPECT_EQ(engine_->committed.size(), 0u);
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    EXPECT_EQ(engine_->staged, (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(reconciler_->counters().errors, 1u);
  });
}

TEST_F(ReconcilerTest, UnreadablePointerIsAnErrorNeverTheBootWeights) {
  mem_->SetPointerTextForTesting("weight_vx");
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_NE(reconciler_->State().reason.find("weight_vx"), std::string::npos);
  });
}

// A malformed pointer is not a store outage: the replica keeps serving
// its version (labelled truly) past the outage limit, says why it is not
// following, and converges once the pointer is fixed.
TEST_F(ReconcilerTest, AMalformedPointerKeepsTheReplicaServingItsVersion) {
  Full(3);
  Full(5);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  options.store_outage_limit = std::chrono::seconds(12);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    mem_->SetPointerTextForTesting("r1/weight_v00005X");
    for (int pass = 1; pass <= 4; ++pass) {  // 20 s: past the 12 s limit
      CO_ASSERT(co_await BackstopPassFails(pass));
      EXPECT_TRUE(reconciler_->ready()) << pass;
    }
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 3));
    EXPECT_THAT(reconciler_->State().sync_error, HasSubstr("weight_v00005X"));
    EXPECT_EQ(reconciler_->State().pointer, std::optional<VersionRef>(Ref("r1", 3)));
    SetPointer(Ref("r1", 5));
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
    EXPECT_EQ(reconciler_->State().sync_error, "");
  });
}

// A version whose files are refused (a hostile header, a malformed index)
// is not read again on every pass: the replica says which version cannot
// be applied and how to move on, keeps serving, and follows the next one.
TEST_F(ReconcilerTest, ARefusedVersionIsRememberedNotReadAgainEveryPass) {
  Full(3);
  Full(5);
  Full(6);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    store_->BreakVersion(5);
    SetPointer(Ref("r1", 5));
    for (int pass = 1; pass <= 3; ++pass) {
      CO_ASSERT(co_await BackstopPassFails(pass));
    }
    EXPECT_EQ(store_->manifest_reads(5), 1);
    EXPECT_TRUE(reconciler_->ready());
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 3));
    const std::string error = reconciler_->State().sync_error;
    EXPECT_THAT(error, HasSubstr("r1/weight_v000005 cannot be applied"));
    EXPECT_THAT(error, HasSubstr("publishing a FULL next version moves it on"));
    SetPointer(Ref("r1", 6));
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return SettledAt(6); }));
  });
}

// SGLang answers 400 to a load that changed the weights and the version
// but could not flush its cache: what the engine holds decides.
TEST_F(ReconcilerTest, AFailedCommitAnswerIsCheckedAgainstWhatTheEngineHolds) {
  Delta(1, 1);
  SetPointer(Ref("r1", 1));
  engine_->commit_results.push_back(
      absl::InvalidArgumentError("weights were updated, but the cache was not flushed"));
  engine_->loads_despite_error = true;
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    EXPECT_TRUE(reconciler_->terminal().ok());
    EXPECT_EQ(engine_->Count("resume"), 1u);
  });
}

// A DELTA encoded against another base stages to the wrong checksums: the
// replica says it cannot be applied and how to move on, keeps serving, does
// not stage it again on every pass, and follows a FULL next version.
TEST_F(ReconcilerTest, AVersionWhoseBytesFailTheirChecksumsIsRefusedUntilTheNext) {
  Full(3);
  Delta(4, 1);
  Full(5);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    engine_->stage_results.push_back(
        WithKind(absl::DataLossError("tensor w: checksum mismatch"), ErrorKind::kChecksumMismatch));
    SetPointer(Ref("r1", 4));
    for (int pass = 1; pass <= 3; ++pass) {
      CO_ASSERT(co_await BackstopPassFails(pass));
    }
    EXPECT_EQ(engine_->Count("stage:4"), 1u);
    EXPECT_TRUE(reconciler_->ready());
    EXPECT_THAT(reconciler_->State().sync_error,
                HasSubstr("r1/weight_v000004 cannot be applied (staging r1/weight_v000004: "
                          "tensor w: checksum mismatch); this replica keeps serving "
                          "r1/weight_v000003; publishing a FULL next version moves it on"));
    SetPointer(Ref("r1", 5));
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
  });
}

TEST_F(ReconcilerTest, CommitFailureIsTerminal) {
  Delta(1, 1);
  SetPointer(Ref("r1", 1));
  engine_->commit_results.push_back(absl::InternalError("partial weight copy"));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return !reconciler_->terminal().ok(); }));
    co_await Settle();
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 0));
    // Paused and never resumed: requests held by the engine must not go on
    // with weights nobody can name.
    EXPECT_EQ(engine_->calls,
              (std::vector<std::string>{"init:r1/weight_v000000", "stage:1", "pause", "commit:1"}));
    CO_ASSERT(terminal_reports_.size() == 1u);
    EXPECT_NE(terminal_reports_[0].message().find(
                  "weight commit of r1/weight_v000001 failed; live engine state is uncertain"),
              std::string::npos)
        << terminal_reports_[0];
    EXPECT_NE(reconciler_->reason().find("terminal error"), std::string::npos);
    auto refused = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(refused.has_value());
    EXPECT_TRUE(absl::IsUnavailable(refused->status()));
  });
}

// Aborted from Commit: the engine undid the commit (an in-place patch that
// failed part-way) and serves the old version. The replica resumes it under
// the old label, counts the undone commit, and commits the target on the
// next pass.
TEST_F(ReconcilerTest, ACommitTheEngineUndidResumesTheOldVersionAndIsRetried) {
  Delta(1, 1);
  SetPointer(Ref("r1", 1));
  engine_->commit_results.push_back(absl::AbortedError("patch failed and was undone"));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return reconciler_->counters().errors == 1u; }));
    EXPECT_TRUE(reconciler_->terminal().ok());
    EXPECT_EQ(reconciler_->counters().commits_undone, 1u);
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 0));
    EXPECT_EQ(engine_->calls, (std::vector<std::string>{"init:r1/weight_v000000", "stage:1",
                                                        "pause", "commit:1", "resume"}));
    EXPECT_THAT(reconciler_->State().sync_error, HasSubstr("patch failed and was undone"));
    {
      // Requests go on at the old version, stamped with its label.
      auto admitted = gate_->TryAdmit(VersionConstraint{});
      CO_ASSERT(admitted.has_value() && admitted->ok());
      EXPECT_EQ((*admitted)->start(), Ref("r1", 0));
      EXPECT_TRUE(gate_->CheckEngineLabel(**admitted, "r1/weight_v000000").ok());
      EXPECT_FALSE(gate_->CheckEngineLabel(**admitted, "r1/weight_v000001").ok());
    }
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    EXPECT_EQ(engine_->Count("commit:1"), 2u);
  });
}

// An engine that says it undid a commit but then reports neither the old
// version nor the target is not believed: terminal, as for any failed
// commit. (One that reports the target after all keeps the commit, as for
// any error answer.)
TEST_F(ReconcilerTest, AnUndoneCommitWhoseOldLabelIsGoneIsTerminal) {
  Delta(1, 1);
  SetPointer(Ref("r1", 1));
  engine_->commit_results.push_back(absl::AbortedError("patch failed and was undone"));
  engine_->on_stage = [this](const StagePlan&) {
    EngineReport other;
    other.label = "r1/weight_v000009";
    other.held = Ref("r1", 9);
    engine_->report_results.push_back(other);  // asked whether it holds the target
    engine_->report_results.push_back(other);  // asked whether it holds the old version
  };
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return !reconciler_->terminal().ok(); }));
    EXPECT_EQ(reconciler_->counters().commits_undone, 0u);
    EXPECT_EQ(engine_->Count("resume"), 0u);
    CO_ASSERT(terminal_reports_.size() == 1u);
    EXPECT_THAT(terminal_reports_[0].message(), HasSubstr("live engine state is uncertain"));
  });
}

TEST_F(ReconcilerTest, ResumedReplicaServesItsBootCheckpointAtTheSavedVersion) {
  ReconcilerOptions options = NoBackstop();
  options.run_id = "resumed";
  options.boot_version = 119;
  SetPointer(Ref("resumed", 119));
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(119, "resumed"); }));
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:resumed/weight_v000119"});
    auto pinned = gate_->TryAdmit(VersionConstraint::Exact(119));
    CO_ASSERT(pinned.has_value() && pinned->ok());
    EXPECT_EQ((*pinned)->start(), Ref("resumed", 119));
  });
}

TEST_F(ReconcilerTest, ResumedReplicaAppliesOnlyLaterVersions) {
  ReconcilerOptions options = NoBackstop();
  options.run_id = "resumed";
  options.boot_version = 119;
  Delta(120, 1);
  SetPointer(Ref("resumed", 120));
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(120, "resumed"); }));
    EXPECT_EQ(engine_->staged, std::vector<int64_t>{120});
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{120});
    const StagePlan& plan = engine_->plans.at(0);
    EXPECT_EQ(plan.base_version, 119);
    CO_ASSERT(plan.chain.size() == 1u);
    EXPECT_EQ(plan.chain[0].version, 120);
  });
}

TEST_F(ReconcilerTest, VersionFlipsBeforeTheEngineResumes) {
  Full(3);
  Full(4);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop(CommitMode::kInPlace));
  Run([&]() -> awaitable<void> {
    // The served version and whether admission is open, at each resume.
    auto at_resume = std::make_shared<std::vector<std::pair<VersionRef, bool>>>();
    engine_->on_resume = [this, at_resume] {
      at_resume->emplace_back(gate_->serving(), gate_->is_open());
    };
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    SetPointer(Ref("r1", 4));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return SettledAt(4); }));
    CO_ASSERT(at_resume->size() == 2u);
    EXPECT_EQ((*at_resume)[1].first, Ref("r1", 4));  // flipped under the gate first
    EXPECT_FALSE((*at_resume)[1].second);            // admission reopens after resume
  });
}

TEST_F(ReconcilerTest, FlushCacheOnCommitRidesOnTheCommit) {
  Full(2);
  SetPointer(Ref("r1", 2));
  ReconcilerOptions options = NoBackstop();
  options.flush_cache_on_commit = true;
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(engine_->flushed_on_commit, std::vector<bool>{true});
  });
}

TEST_F(ReconcilerTest, MissingPointerTargetNamesTheBootVersionFlags) {
  SetPointer(Ref("r1", 9));  // never published
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_NE(reconciler_->State().reason.find("--boot-version"), std::string::npos)
        << reconciler_->State().reason;
  });
}

// --- Trust in the engine's weights ---------------------------------------------

class ReconcilerTrustTest : public ReconcilerTest {
 protected:
  // A boot checkpoint with real tensors (the fingerprint of boot weights is
  // hashed from it) and FULL versions of distinct weights.
  void WriteBoot() {
    testing::TestVersionOptions o;
    o.seed = 100;
    o.record_version = false;
    ASSERT_TRUE(testing::WriteTestVersionAt(tmp_ / "base", 0, o).ok());
  }
  void DistinctFull(int64_t v) {
    testing::TestVersionOptions o;
    o.seed = static_cast<int>(v) + 1;
    auto dir = testing::WriteTestVersion(tmp_ / absl::StrCat("distinct-", v), v, o);
    ASSERT_TRUE(dir.ok()) << dir.status();
    ASSERT_TRUE(mem_->PublishFiles(v, *dir).ok());
  }
  Checksum128 FingerprintOf(const std::filesystem::path& dir) {
    auto checksums = HashCheckpointTensors(dir);
    EXPECT_TRUE(checksums.ok()) << checksums.status();
    return checksums.ok() ? WeightsFingerprint(*checksums) : Checksum128{};
  }
  Checksum128 FingerprintOfVersion(int64_t v) {
    auto dir = mem_->Materialize(v);
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? FingerprintOf(*dir) : Checksum128{};
  }
  // A ticket admitted now, kept by the test.
  std::optional<AdmissionGate::Ticket> Admit(VersionConstraint c = {}) {
    auto t = gate_->TryAdmit(c);
    if (!t.has_value() || !t->ok()) return std::nullopt;
    return **std::move(t);
  }
};

// A sidecar restarted beside a live engine at v3 picks it up: the label and
// the fingerprint match what the store says v3 is, so nothing is reloaded.
TEST_F(ReconcilerTrustTest, SidecarRestartedBesideALiveEngineVerifiesWhatItHolds) {
  WriteBoot();
  DistinctFull(3);
  SetPointer(Ref("r1", 3));
  engine_->Holds(Ref("r1", 3));
  engine_->fingerprint_of[3] = FingerprintOfVersion(3);
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:r1/weight_v000000"});
    EXPECT_EQ(reconciler_->counters().verified, 1u);
    EXPECT_EQ(reconciler_->counters().established, 0u);
  });
}

// A pointer never goes back to unset. Read unset beside an engine that
// holds a later version (the store's root renamed away or its volume gone),
// it means the store is missing, not that there is nothing to follow: the
// engine is not reset to its boot weights and the replica does not enter
// rotation at the boot version; it waits for the pointer.
TEST_F(ReconcilerTrustTest, AnUnsetPointerNeverRollsTheEngineBackToItsBootWeights) {
  WriteBoot();
  DistinctFull(3);
  engine_->Holds(Ref("r1", 3));
  engine_->fingerprint_of[3] = FingerprintOfVersion(3);
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_FALSE(reconciler_->State().applied.has_value());
    EXPECT_NE(reconciler_->State().sync_error.find("the pointer reads unset, yet the engine holds "
                                                   "r1/weight_v000003"),
              std::string::npos)
        << reconciler_->State().sync_error;
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:r1/weight_v000000"});
    // The store is back: what the engine holds is verified, nothing loaded.
    SetPointer(Ref("r1", 3));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:r1/weight_v000000"});
    // It vanishes again under a replica in rotation: it keeps serving v3.
    mem_->SetPointerTextForTesting(std::nullopt);
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_TRUE(reconciler_->ready());
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 3));
    EXPECT_EQ(engine_->calls, std::vector<std::string>{"init:r1/weight_v000000"});
  });
}

// Until the engine answers, nothing versioned is admitted and the replica
// says it serves nothing: a sidecar must never stamp its boot version on
// weights it has not seen.
TEST_F(ReconcilerTrustTest, NothingIsAdmittedBeforeTheEngineIsVerified) {
  Full(3);
  SetPointer(Ref("r1", 3));
  engine_->Holds(Ref("r1", 3));
  engine_->report_results.push_back(absl::UnavailableError("engine: connection refused"));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return reconciler_->sync_state() == SyncState::kError; }));
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_FALSE(reconciler_->State().applied.has_value());
    auto constrained = gate_->TryAdmit(VersionConstraint::AtLeast(0));
    CO_ASSERT(constrained.has_value() && !constrained->ok());
    EXPECT_EQ(GetErrorKind(constrained->status()), ErrorKind::kVersionNotReady);
    auto any = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(any.has_value() && !any->ok());
    EXPECT_TRUE(absl::IsUnavailable(any->status())) << any->status();
    EXPECT_NE(any->status().message().find("connection refused"), std::string::npos)
        << any->status();
    // The engine answers again: it is verified at what it holds.
    co_await reconciler_->CheckEngine(std::chrono::seconds(1));
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{});
  });
}

// A label the store cannot vouch for (ahead of the pointer, another run,
// none at all, a fingerprint that disagrees) is never adopted: the sidecar
// loads a complete version itself.
TEST_F(ReconcilerTrustTest, AClaimTheStoreCannotVouchForIsReplacedByLoadingAVersion) {
  WriteBoot();
  DistinctFull(2);
  DistinctFull(3);
  SetPointer(Ref("r1", 3));
  // Labelled v3, but holding v2's weights (someone loaded v2 and named it).
  engine_->Holds(Ref("r1", 3));
  engine_->report_results.push_back([&] {
    EngineReport r;
    r.label = "r1/weight_v000003";
    r.held = Ref("r1", 3);
    r.instance = "scripted-1";
    r.fingerprint = FingerprintOfVersion(2);
    return r;
  }());
  engine_->fingerprint_of[3] = FingerprintOfVersion(3);
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    EXPECT_EQ(engine_->staged, std::vector<int64_t>{3});
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{3});
    EXPECT_EQ(reconciler_->counters().established, 1u);
  });
}

TEST_F(ReconcilerTrustTest, AnEngineWithoutAVersionLabelIsResetToItsBootCheckpoint) {
  engine_->Holds(std::nullopt);  // "default": SGLang started without --weight-version
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(0); }));
    EXPECT_EQ(engine_->Count("reset:r1/weight_v000000"), 1u);
  });
}

TEST_F(ReconcilerTrustTest, AnEngineAheadOfThePointerIsNotBelieved) {
  Full(2);
  Full(5);
  SetPointer(Ref("r1", 2));
  engine_->Holds(Ref("r1", 5));  // published, but the pointer never named it
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(engine_->committed, std::vector<int64_t>{2});
  });
}

// The engine restarts on its boot checkpoint under a live sidecar at v3:
// the next probe sees a new instance (and the boot label), trust is
// withdrawn at once (requests in flight are no longer vouched for and are
// aborted, new ones refused), and the replica converges again.
TEST_F(ReconcilerTrustTest, AnEngineRestartIsNoticedByTheNextProbeAndConvergesAgain) {
  Full(3);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop());
  int distrusts = 0;
  reconciler_->SetDistrustListener([&] { ++distrusts; });
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    std::optional<AdmissionGate::Ticket> in_flight = Admit(VersionConstraint::Exact(3));
    CO_ASSERT(in_flight.has_value() && in_flight->trusted());

    engine_->holds = Ref("r1", 0);
    engine_->instance = "scripted-2";
    engine_->HoldNext(ScriptedEngine::kStage);  // the catch-up waits, for the checks below
    const absl::Status probe = co_await reconciler_->CheckEngine(std::chrono::seconds(1));
    EXPECT_TRUE(probe.ok()) << probe;
    EXPECT_EQ(distrusts, 1);
    EXPECT_FALSE(in_flight->trusted());
    EXPECT_FALSE(reconciler_->ready());
    auto refused = gate_->TryAdmit(VersionConstraint::Exact(3));
    CO_ASSERT(refused.has_value() && !refused->ok());
    EXPECT_NE(refused->status().message().find("restarted"), std::string::npos)
        << refused->status();
    CO_ASSERT(co_await Until([&] { return engine_->held(ScriptedEngine::kStage); }));
    // Verified at the boot version it restarted on, now catching up.
    EXPECT_EQ(gate_->known_serving(), Ref("r1", 0));
    engine_->Release(ScriptedEngine::kStage);
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    EXPECT_EQ(engine_->committed, (std::vector<int64_t>{3, 3}));
    EXPECT_FALSE(in_flight->trusted());  // it stays unvouched
    EXPECT_EQ(reconciler_->counters().distrusted, 1u);
  });
}

TEST_F(ReconcilerTrustTest, WeightsChangedThroughTheEnginesOwnRouteAreNoticed) {
  Full(1);
  Full(3);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    engine_->holds = Ref("r1", 1);  // someone called /update_weights_from_disk
    co_await reconciler_->CheckEngine(std::chrono::seconds(1));
    EXPECT_FALSE(gate_->trusted());
    EXPECT_NE(gate_->distrust_reason().find("r1/weight_v000001"), std::string::npos)
        << gate_->distrust_reason();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
  });
}

TEST_F(ReconcilerTrustTest, AChangedFingerprintIsNoticedEvenUnderTheSameLabel) {
  WriteBoot();
  DistinctFull(3);
  SetPointer(Ref("r1", 3));
  engine_->fingerprint_of[0] = FingerprintOf(tmp_ / "base");
  engine_->fingerprint_of[3] = FingerprintOfVersion(3);
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    engine_->fingerprint_of[3] = Checksum128{7, 7};
    co_await reconciler_->CheckEngine(std::chrono::seconds(1));
    EXPECT_FALSE(gate_->trusted());
    EXPECT_NE(gate_->distrust_reason().find("fingerprint"), std::string::npos)
        << gate_->distrust_reason();
  });
}

// A silent engine holds new requests (and /health) at once, without
// withdrawing trust from what is in flight; it answering as expected ends
// the hold.
TEST_F(ReconcilerTrustTest, ASilentEngineHoldsNewRequestsUntilItAnswersAsExpected) {
  Full(3);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    std::optional<AdmissionGate::Ticket> in_flight = Admit();
    CO_ASSERT(in_flight.has_value());
    engine_->health_results.push_back(absl::UnavailableError("engine: timed out"));
    const absl::Status probe = co_await reconciler_->CheckEngine(std::chrono::seconds(1));
    EXPECT_TRUE(absl::IsUnavailable(probe)) << probe;
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_NE(reconciler_->reason().find("did not answer"), std::string::npos);
    EXPECT_TRUE(in_flight->trusted());
    auto refused = gate_->TryAdmit(VersionConstraint{});
    CO_ASSERT(refused.has_value() && !refused->ok());
    EXPECT_NE(refused->status().message().find("timed out"), std::string::npos);
    co_await reconciler_->CheckEngine(std::chrono::seconds(1));
    EXPECT_TRUE(reconciler_->ready());
    EXPECT_TRUE(in_flight->trusted());
    EXPECT_EQ(reconciler_->counters().unreachable, 1u);
  });
}

TEST_F(ReconcilerTrustTest, EmptyDeltasMoveTheServedVersionButNotTheEnginesLabel) {
  Full(1);
  SetPointer(Ref("r1", 1));
  Build(NoBackstop());
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(1); }));
    Delta(2, 0);
    SetPointer(Ref("r1", 2));
    reconciler_->Wake();
    CO_ASSERT(co_await Until([&] { return SettledAt(2); }));
    EXPECT_EQ(reconciler_->counters().skipped, 1u);
    EXPECT_EQ(engine_->holds, Ref("r1", 1));
    co_await reconciler_->CheckEngine(std::chrono::seconds(1));
    EXPECT_TRUE(gate_->trusted());
    std::optional<AdmissionGate::Ticket> t = Admit();
    CO_ASSERT(t.has_value());
    EXPECT_TRUE(gate_->CheckEngineLabel(*t, "1").ok());
    EXPECT_FALSE(gate_->CheckEngineLabel(*t, "2").ok());
  });
}

// An engine that reports other weights than the ones it just loaded leaves
// its state unknown: terminal.
TEST_F(ReconcilerTrustTest, AnEngineReportingOtherWeightsAfterACommitIsTerminal) {
  Full(3);
  SetPointer(Ref("r1", 3));
  Build(NoBackstop());
  engine_->on_stage = [&](const StagePlan&) {
    EngineReport r;
    r.label = "r1/weight_v000002";
    r.held = Ref("r1", 2);
    engine_->report_results.push_back(r);
  };
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return !reconciler_->terminal().ok(); }));
    EXPECT_NE(reconciler_->terminal().message().find("after loading r1/weight_v000003"),
              std::string::npos)
        << reconciler_->terminal();
    EXPECT_EQ(terminal_reports_.size(), 1u);
    EXPECT_EQ(engine_->Count("resume"), 0u);  // its requests must not continue
  });
}

// A replica whose store stays unreadable (its host cut off) cannot tell how
// far behind the pointer it is: it leaves rotation after the limit, and
// returns only once a pass has caught up with the pointer again.
TEST_F(ReconcilerTest, AReplicaThatLosesTheStoreLeavesRotationUntilCaughtUp) {
  Full(3);
  Full(5);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  options.store_outage_limit = std::chrono::seconds(12);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    store_->FailRefreshes(3);  // three backstop passes fail
    for (int pass = 1; pass <= 2; ++pass) {
      CO_ASSERT(co_await BackstopPassFails(pass));
      // A transient error (for 0 s, then 5 s): still in rotation.
      EXPECT_TRUE(reconciler_->ready()) << pass;
    }
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(7));  // 12 s since the first failed read
    CO_ASSERT(co_await Until([&] { return reconciler_->counters().errors == 3u; }));
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_THAT(reconciler_->reason(), HasSubstr("cannot read the store's pointer for 12 s"));
    // Published meanwhile; the store answers again while v5 is staged.
    SetPointer(Ref("r1", 5));
    engine_->HoldNext(ScriptedEngine::kStage);
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return engine_->held(ScriptedEngine::kStage); }));
    // Readable again but behind: still out of rotation.
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 3));
    engine_->Release(ScriptedEngine::kStage);
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
  });
}

TEST_F(ReconcilerTest, AReadThatHangsPastTheLimitTakesTheReplicaOutOfRotationAndIsReadAgain) {
  Full(3);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  options.store_outage_limit = std::chrono::seconds(12);
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    store_->HoldNextRefresh();
    CO_ASSERT(co_await Until([&] { return clock_->sleepers() == 1; }));
    clock_->Advance(std::chrono::seconds(5));
    CO_ASSERT(co_await Until([&] { return store_->refresh_held(); }));
    clock_->Advance(std::chrono::seconds(11));
    EXPECT_TRUE(reconciler_->ready());
    clock_->Advance(std::chrono::seconds(1));
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_THAT(reconciler_->reason(), HasSubstr("a read is still waiting"));
    // Published while the read hung; the answer it brings back is from
    // before (v3). The replica reads again and stays out of rotation until
    // it serves v5.
    Full(5);
    SetPointer(Ref("r1", 5));
    engine_->HoldNext(ScriptedEngine::kStage);
    store_->ReleaseRefresh();
    CO_ASSERT(co_await Until([&] { return engine_->held(ScriptedEngine::kStage); }));
    EXPECT_FALSE(reconciler_->ready());
    EXPECT_EQ(reconciler_->applied(), Ref("r1", 3));
    engine_->Release(ScriptedEngine::kStage);
    CO_ASSERT(co_await Until([&] { return SettledAt(5); }));
  });
}

TEST_F(ReconcilerTest, AStoreOutageLimitOfZeroKeepsTheReplicaInRotation) {
  Full(3);
  SetPointer(Ref("r1", 3));
  ReconcilerOptions options;
  options.reconcile_interval = std::chrono::seconds(5);
  options.store_outage_limit = Clock::Duration::zero();
  Build(options);
  Run([&]() -> awaitable<void> {
    reconciler_->Start();
    CO_ASSERT(co_await Until([&] { return SettledAt(3); }));
    store_->FailRefreshes(100);
    for (int pass = 1; pass <= 4; ++pass) {
      CO_ASSERT(co_await BackstopPassFails(pass));
    }
    EXPECT_TRUE(reconciler_->ready());
    store_->FailRefreshes(0);
  });
}

}  // namespace
}  // namespace stitch
