// The vLLM adapter (engine/vllm_engine.h) against the reference engine's
// vLLM dialect, in process: pause modes, abort by request id, commits that
// reload and label, and the refusals.
#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/engine/vllm_engine.h"
#include "stitch/format/index.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/worker_pool.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/server.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::stitch::testing::Eventually;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

constexpr auto kWait = std::chrono::seconds(30);

class VllmEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ModelConfig config = testing::EngineTestConfig();
    ASSERT_TRUE(
        testing::WriteModel(tmp_ / "base", config, testing::EngineTestTensors(config, 1)).ok());
    EngineOptions options;
    options.model_dir = tmp_ / "base";
    options.api = EngineApi::kVllm;
    auto server = EngineServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::unique_ptr<VllmEngine> Make(VllmPauseMode mode, bool patch = false) {
    VllmEngineOptions options;
    options.url = server_->url();
    options.base_checkpoint_dir = tmp_ / "base";
    options.local_checkpoint_dir = tmp_ / "local";
    options.pause_mode = mode;
    options.patch = patch;
    auto engine = VllmEngine::Make(loop_.executor(), options, pool_);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  // A completion of `tokens` greedy tokens under vLLM request id `id`,
  // answered on another thread: its finish_reason, or the error.
  std::future<std::string> Complete(const std::string& id, int tokens) {
    const std::string url = server_->url() + "/v1/completions";
    const std::string body =
        absl::StrCat(R"({"prompt":"hello","max_tokens":)", tokens,
                     R"(,"temperature":0,"ignore_eos":true,"request_id":")", id, R"("})");
    return std::async(std::launch::async, [url, body]() -> std::string {
      FetchOptions options;
      options.timeout = std::chrono::seconds(60);
      auto r = HttpFetch("POST", url, body, options);
      if (!r.ok()) return std::string(r.status().message());
      if (r->status != 200) return absl::StrCat("HTTP ", r->status, ": ", r->body);
      boost::json::value doc = boost::json::parse(r->body);
      return std::string(doc.at("choices").at(0).at("finish_reason").as_string());
    });
  }

  TempDir tmp_;
  std::unique_ptr<EngineServer> server_;
  EventLoop loop_;
  WorkerPool pool_{1};
};

TEST_F(VllmEngineTest, AbortEndsOnlyTheRequestsWithTheGivenIds) {
  auto engine = Make(VllmPauseMode::kKeep);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(loop_.BlockOn(engine->Pause()).ok());
  // Held while paused: "a" and "ab" wait in the queue ("a" is a prefix of
  // "ab": vLLM aborts by exact id, so only "a" may end).
  auto a = Complete("a", 4);
  auto ab = Complete("ab", 4);
  ASSERT_TRUE(Eventually([&] { return server_->scheduler().stats().queued == 2; }, kWait));
  std::vector<std::string> ids = {"a"};
  loop_.BlockOn(engine->Abort(std::move(ids)));
  EXPECT_EQ(a.get(), "abort");
  EXPECT_EQ(server_->scheduler().stats().queued, 1);
  ASSERT_TRUE(loop_.BlockOn(engine->Resume()).ok());
  EXPECT_EQ(ab.get(), "length");
}

TEST_F(VllmEngineTest, AWaitPauseAnswersOnceTheRequestsInFlightFinished) {
  // A request held by a keep pause is in flight when the wait pause comes:
  // it runs to its end before the wait pause answers.
  auto keep = Make(VllmPauseMode::kKeep);
  auto engine = Make(VllmPauseMode::kWait);
  ASSERT_NE(keep, nullptr);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(loop_.BlockOn(keep->Pause()).ok());
  auto running = Complete("r", 24);
  ASSERT_TRUE(Eventually([&] { return server_->scheduler().stats().queued == 1; }, kWait));
  ASSERT_TRUE(loop_.BlockOn(engine->Pause()).ok());
  // The pause answered: the request had already run to its end in the
  // engine (its answer may still be on the way to the client).
  const SchedulerStats stats = server_->scheduler().stats();
  EXPECT_EQ(stats.requests_finished, 1u);
  EXPECT_EQ(stats.running, 0);
  EXPECT_EQ(stats.queued, 0);
  EXPECT_TRUE(stats.paused);
  EXPECT_EQ(running.get(), "length");
  ASSERT_TRUE(loop_.BlockOn(engine->Resume()).ok());
}

TEST_F(VllmEngineTest, ACommitReloadsTheStagedCheckpointAndLabelsIt) {
  auto engine = Make(VllmPauseMode::kKeep);
  ASSERT_NE(engine, nullptr);
  const VersionRef boot{"r1", 0};
  // vLLM starts unlabelled.
  auto before = loop_.BlockOn(engine->Report(std::chrono::seconds(5)));
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->held.has_value());

  ASSERT_TRUE(loop_.BlockOn(engine->InitializeDestination(boot)).ok());
  ASSERT_TRUE(loop_.BlockOn(engine->Pause()).ok());
  absl::Status committed = loop_.BlockOn(engine->Commit(boot, Engine::CommitOptions{true}));
  ASSERT_TRUE(committed.ok()) << committed;
  ASSERT_TRUE(loop_.BlockOn(engine->Resume()).ok());
  auto after = loop_.BlockOn(engine->Report(std::chrono::seconds(5)));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->label, "r1/weight_v000000");
  ASSERT_TRUE(after->held.has_value());
  EXPECT_EQ(*after->held, boot);
  EXPECT_EQ(server_->scheduler().stats().weight_swaps, 1u);
}

TEST_F(VllmEngineTest, ACommitOfAVersionNotStagedIsRefusedBeforeVllmIsAsked) {
  auto engine = Make(VllmPauseMode::kKeep);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(loop_.BlockOn(engine->InitializeDestination(VersionRef{"r1", 0})).ok());
  absl::Status s = loop_.BlockOn(engine->Commit(VersionRef{"r1", 5}, Engine::CommitOptions{}));
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("not the staged target"));
  EXPECT_EQ(server_->scheduler().stats().weight_swaps, 0u);
}

// collective_rpc reaches the workers' methods; the reference engine's
// workers have one, and any other is a client's mistake named in a 400.
TEST_F(VllmEngineTest, AWorkerMethodOtherThanReloadWeightsIsRefusedByName) {
  auto r = HttpFetch("POST", server_->url() + "/collective_rpc",
                     R"({"method":"init_weight_transfer","kwargs":{}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_THAT(r->body, HasSubstr("have no method"));
  EXPECT_THAT(r->body, HasSubstr("init_weight_transfer"));
  EXPECT_THAT(r->body, HasSubstr("reload_weights"));
}

// The plan to stage DELTA `version`, encoded from `base` to the model in
// `target` under updates/.
StagePlan DeltaPlan(const std::filesystem::path& root, const std::filesystem::path& base,
                    const std::filesystem::path& target, int64_t version) {
  const std::filesystem::path dir = root / "updates" / VersionDirName(version);
  EncodeOptions encode;
  encode.version = version;
  encode.base_version = version - 1;
  encode.run_id = "r1";
  std::filesystem::create_directories(dir.parent_path());
  absl::StatusOr<EncodeResult> encoded = EncodeDelta(base, target, dir, encode);
  EXPECT_TRUE(encoded.ok()) << encoded.status();
  StagePlan plan;
  plan.target = VersionRef{"r1", version};
  plan.base_checkpoint_dir = root / "base";
  plan.base_version = 0;
  plan.source_dir = root / "updates";
  for (int64_t v = 1; v <= version; ++v) {
    StagedVersion staged;
    staged.version = v;
    staged.manifest.version = v;
    staged.manifest.kind = VersionKind::kDelta;
    staged.manifest.base_version = v - 1;
    staged.dir = root / "updates" / VersionDirName(v);
    plan.chain.push_back(staged);
  }
  return plan;
}

// With patches on, an engine without Stitch's worker extension (the
// reference engine's workers have no stitch_patch_stage) refuses the patch
// while it serves, and the commit reloads the whole checkpoint instead; a
// DELTA that changes most values is not even offered as a patch, nor is an
// engine patched whose label is not the version the patch starts from. Each
// reload is counted with its reason.
TEST_F(VllmEngineTest, WithPatchesOnAnEngineThatCannotPatchReloadsAndSaysWhy) {
  auto made = Make(VllmPauseMode::kKeep, /*patch=*/true);
  ASSERT_NE(made, nullptr);
  VllmEngine& engine = *made;
  const VersionRef boot{"r1", 0};
  ASSERT_TRUE(loop_.BlockOn(engine.InitializeDestination(boot)).ok());
  // vLLM starts unlabelled: a patch needs the engine to report the version
  // it starts from, so label the boot weights first.
  ASSERT_TRUE(loop_.BlockOn(engine.Pause()).ok());
  ASSERT_TRUE(loop_.BlockOn(engine.Commit(boot, Engine::CommitOptions{})).ok());
  ASSERT_TRUE(loop_.BlockOn(engine.Resume()).ok());

  const ModelConfig config = testing::EngineTestConfig();
  std::vector<HostTensor> sparse = testing::EngineTestTensors(config, 1);
  sparse[0].data[0] ^= std::byte{1};  // one value of one tensor
  ASSERT_TRUE(testing::WriteModel(tmp_ / "v1", config, sparse).ok());
  ASSERT_TRUE(testing::WriteModel(tmp_ / "v2", config, testing::EngineTestTensors(config, 2)).ok());

  const auto commit = [&](const StagePlan& plan) {
    ASSERT_TRUE(loop_.BlockOn(engine.Stage(plan)).ok());
    ASSERT_TRUE(loop_.BlockOn(engine.Pause()).ok());
    absl::Status committed = loop_.BlockOn(engine.Commit(plan.target, Engine::CommitOptions{}));
    ASSERT_TRUE(committed.ok()) << committed;
    ASSERT_TRUE(loop_.BlockOn(engine.Resume()).ok());
    auto report = loop_.BlockOn(engine.Report(std::chrono::seconds(5)));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->held, plan.target);
  };
  ASSERT_NO_FATAL_FAILURE(commit(DeltaPlan(tmp_.path(), tmp_ / "base", tmp_ / "v1", 1)));
  ASSERT_NO_FATAL_FAILURE(commit(DeltaPlan(tmp_.path(), tmp_ / "v1", tmp_ / "v2", 2)));
  EXPECT_EQ(server_->scheduler().stats().weight_swaps, 3u);
  std::vector<std::string> paths;
  for (const Engine::CommitPath& c : engine.CommitPaths()) {
    paths.push_back(absl::StrCat(c.path, "/", c.reason, "=", c.count));
  }
  EXPECT_THAT(paths, ::testing::UnorderedElementsAre("reload/no-patch-staged=1",
                                                     "reload/engine-refused=1", "reload/dense=1"));

  // An engine that no longer reports the weights a patch would start from
  // (relabelled behind the adapter's back, as a restarted vLLM would be) is
  // not patched: it reloads.
  auto relabel = HttpFetch("POST", server_->url() + "/update_weight_version",
                           R"({"new_version":"r1/weight_v000009"})");
  ASSERT_TRUE(relabel.ok() && relabel->status == 200);
  std::vector<HostTensor> third = testing::EngineTestTensors(config, 2);
  third[0].data[0] ^= std::byte{1};
  ASSERT_TRUE(testing::WriteModel(tmp_ / "v3", config, third).ok());
  ASSERT_NO_FATAL_FAILURE(commit(DeltaPlan(tmp_.path(), tmp_ / "v2", tmp_ / "v3", 3)));
  bool label_reload = false;
  for (const Engine::CommitPath& c : engine.CommitPaths()) {
    label_reload |= c.path == "reload" && c.reason == "engine-label" && c.count == 1;
  }
  EXPECT_TRUE(label_reload);
}

TEST_F(VllmEngineTest, AnEngineThatRefusesOrIsGoneGivesErrorsNamingTheRoute) {
  VllmEngineOptions options;
  options.url = server_->url();
  options.base_checkpoint_dir = tmp_ / "base";
  auto no_local = VllmEngine::Make(loop_.executor(), options, pool_);
  EXPECT_TRUE(absl::IsInvalidArgument(no_local.status()));
  EXPECT_THAT(no_local.status().message(), HasSubstr("--local-checkpoint"));

  auto engine = Make(VllmPauseMode::kKeep);
  ASSERT_NE(engine, nullptr);
  server_->Shutdown();
  absl::Status paused = loop_.BlockOn(engine->Pause());
  EXPECT_TRUE(absl::IsUnavailable(paused)) << paused;
  EXPECT_THAT(paused.message(), HasSubstr("POST /pause?mode=keep"));
}

}  // namespace
}  // namespace stitch
