#include "stitch/engine/sglang_engine.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/engine/fake_sglang_server.h"
#include "stitch/io/fileio.h"
#include "stitch/net/event_loop.h"
#include "tests/support/json_object.h"
#include "tests/support/loopback_http.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace json = boost::json;
using testing::FakeSglangServer;

using testing::ParseObject;

// What engines say they hold -------------------------------------------------

TEST(EngineReportTest, LabelsAreVersionsOnlyWhenTheyNameOne) {
  EXPECT_EQ(ParseEngineLabel("r1/weight_v000007"), (VersionRef{"r1", 7}));
  EXPECT_EQ(ParseEngineLabel("weight_v000007"), (VersionRef{"", 7}));
  EXPECT_EQ(ParseEngineLabel("7"), (VersionRef{"", 7}));
  for (std::string_view none : {"", "default", "v7", "r1/7", "-1"}) {
    EXPECT_EQ(ParseEngineLabel(none), std::nullopt) << none;
  }
}

TEST(EngineReportTest, ModelInfoIsReadWithTheIdentityFirst) {
  auto sglang = ParseEngineReport(R"({"model_path": "m", "weight_version": "r1/weight_v000003"})");
  ASSERT_TRUE(sglang.ok()) << sglang.status();
  EXPECT_EQ(sglang->held, (VersionRef{"r1", 3}));
  EXPECT_EQ(sglang->instance, "");
  EXPECT_EQ(sglang->fingerprint, std::nullopt);

  const std::string fp(32, 'a');
  auto ours = ParseEngineReport(absl::StrCat(
      R"({"weight_version": "3", "weight_version_id": "r1/weight_v000003", "instance_id": "i1",)",
      R"( "weights_fingerprint": ")", fp, R"("})"));
  ASSERT_TRUE(ours.ok()) << ours.status();
  EXPECT_EQ(ours->label, "r1/weight_v000003");
  EXPECT_EQ(ours->held, (VersionRef{"r1", 3}));
  EXPECT_EQ(ours->instance, "i1");
  ASSERT_TRUE(ours->fingerprint.has_value());
  EXPECT_EQ(ours->fingerprint->ToHex(), fp);

  auto unlabelled = ParseEngineReport(R"({"weight_version": "default"})");
  ASSERT_TRUE(unlabelled.ok());
  EXPECT_EQ(unlabelled->label, "default");
  EXPECT_EQ(unlabelled->held, std::nullopt);
  auto numeric = ParseEngineReport(R"({"weight_version": 4})");
  ASSERT_TRUE(numeric.ok());
  EXPECT_EQ(numeric->held, (VersionRef{"", 4}));

  EXPECT_FALSE(ParseEngineReport("[]").ok());
  EXPECT_FALSE(ParseEngineReport(R"({"weight_version": [1]})").ok());
  EXPECT_FALSE(ParseEngineReport(R"({"weights_fingerprint": "xyz"})").ok());
}

// The SGLang adapters ---------------------------------------------------------

class SglangEngineTest : public ::testing::Test {
 protected:
  SglangEngineOptions Options(UpdateDestination destination) {
    SglangEngineOptions o;
    o.url = fake_.url();
    o.base_checkpoint_dir = tmp_ / "base";
    o.local_checkpoint_dir = destination == UpdateDestination::kDisk ? tmp_ / "local" : "";
    o.destination = destination;
    o.control_timeout = std::chrono::seconds(10);
    return o;
  }
  template <typename T>
  T Await(boost::asio::awaitable<T> task) {
    return loop_.BlockOn(std::move(task));
  }
  static StagePlan Plan(const std::filesystem::path& source) {
    StagePlan plan;
    plan.target = VersionRef{"r1", 3};
    plan.base_version = 0;
    plan.source_dir = source;
    return plan;
  }

  stitch::testing::TempDir tmp_;
  FakeSglangServer fake_;
  EventLoop loop_;
};

TEST_F(SglangEngineTest, AChainFromAnAnchorWrittenAfterTheFactNamesIt) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk));
  ASSERT_TRUE(engine.ok()) << engine.status();
  StagePlan plan = Plan(tmp_ / "store/updates");
  StagedVersion anchor;
  anchor.version = 2;
  anchor.manifest.version = 2;
  anchor.manifest.kind = VersionKind::kFull;
  anchor.dir = tmp_ / "store/anchors/updates" / VersionDirName(2);
  StagedVersion delta;
  delta.version = 3;
  delta.manifest.version = 3;
  delta.manifest.kind = VersionKind::kDelta;
  delta.manifest.base_version = 2;
  delta.dir = tmp_ / "store/updates" / VersionDirName(3);
  plan.chain = {anchor, delta};
  EXPECT_TRUE(Await((*engine)->Stage(plan)).ok());
  auto stages = fake_.RequestsTo("/stage_weight_update");
  ASSERT_EQ(stages.size(), 1u);
  json::object stage = ParseObject(stages[0].body);
  EXPECT_EQ(stage.at("base_checkpoint_dir").as_string(), (tmp_ / "base").string());
  EXPECT_EQ(stage.at("base_version").as_int64(), 0);
  EXPECT_EQ(stage.at("anchor_dir").as_string(), anchor.dir.string());
  EXPECT_EQ(stage.at("anchor_version").as_int64(), 2);
  EXPECT_EQ(stage.at("target_version").as_int64(), 3);
  EXPECT_EQ(stage.at("checkpoint_source_dir").as_string(), (tmp_ / "store/updates").string());
}

TEST_F(SglangEngineTest, DiskDestinationStagesAndCommitsThroughTheEngine) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE(Await((*engine)->InitializeDestination(VersionRef{"r1", 0})).ok());
  EXPECT_TRUE(Await((*engine)->Stage(Plan(tmp_ / "store/updates"))).ok());
  EXPECT_TRUE(Await((*engine)->Pause()).ok());
  EXPECT_TRUE(Await((*engine)->Commit(VersionRef{"r1", 3}, Engine::CommitOptions{true})).ok());
  EXPECT_TRUE(Await((*engine)->Resume()).ok());

  auto stages = fake_.RequestsTo("/stage_weight_update");
  ASSERT_EQ(stages.size(), 2u);
  json::object init = ParseObject(stages[0].body);
  EXPECT_EQ(init.at("base_checkpoint_dir").as_string(), (tmp_ / "base").string());
  EXPECT_EQ(init.at("base_version").as_int64(), 0);
  EXPECT_EQ(init.at("target_version").as_int64(), 0);
  EXPECT_EQ(init.at("destination").as_string(), "disk");
  EXPECT_EQ(init.at("local_checkpoint_dir").as_string(), (tmp_ / "local").string());
  EXPECT_FALSE(init.contains("checkpoint_source_dir"));
  EXPECT_EQ(init.at("run_id").as_string(), "r1");
  json::object stage = ParseObject(stages[1].body);
  EXPECT_EQ(stage.at("target_version").as_int64(), 3);
  EXPECT_EQ(stage.at("checkpoint_source_dir").as_string(), (tmp_ / "store/updates").string());

  auto pauses = fake_.RequestsTo("/pause_generation");
  ASSERT_EQ(pauses.size(), 1u);
  EXPECT_EQ(ParseObject(pauses[0].body).at("mode").as_string(), "in_place");
  auto loads = fake_.RequestsTo("/update_weights_from_disk");
  ASSERT_EQ(loads.size(), 1u);
  json::object load = ParseObject(loads[0].body);
  EXPECT_EQ(load.at("model_path").as_string(), (tmp_ / "local").string());
  EXPECT_EQ(load.at("weight_version").as_string(), "r1/weight_v000003");
  EXPECT_EQ(load.at("load_format").as_string(), "auto");
  EXPECT_EQ(load.at("flush_cache").as_bool(), true);
  EXPECT_EQ(fake_.RequestsTo("/continue_generation").size(), 1u);
}

TEST_F(SglangEngineTest, EveryCallPresentsTheEnginesApiKeyWhenGivenOne) {
  SglangEngineOptions options = Options(UpdateDestination::kCpu);
  options.api_key = "engine-key";
  auto engine = SglangEngine::Make(loop_.executor(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE(Await((*engine)->Pause()).ok());
  EXPECT_TRUE(Await((*engine)->Health(std::chrono::seconds(5))).ok());
  (void)Await((*engine)->Report(std::chrono::seconds(5)));
  Await((*engine)->Abort({"stitch-x"}));
  ASSERT_GE(fake_.requests().size(), 4u);
  for (const HttpRequest& r : fake_.requests()) {
    EXPECT_EQ(r.headers.Get("authorization"), "Bearer engine-key") << r.method << " " << r.target;
  }
}

TEST_F(SglangEngineTest, CpuDestinationCommitsFromMemory) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kCpu));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE(Await((*engine)->Stage(Plan(tmp_ / "updates"))).ok());
  EXPECT_TRUE(Await((*engine)->Commit(VersionRef{"r1", 3}, Engine::CommitOptions{false})).ok());
  json::object stage = ParseObject(fake_.RequestsTo("/stage_weight_update").at(0).body);
  EXPECT_EQ(stage.at("destination").as_string(), "cpu");
  EXPECT_FALSE(stage.contains("local_checkpoint_dir"));
  auto commits = fake_.RequestsTo("/update_weights_from_cpu");
  ASSERT_EQ(commits.size(), 1u);
  json::object commit = ParseObject(commits[0].body);
  EXPECT_EQ(commit.at("target_version").as_int64(), 3);
  EXPECT_EQ(commit.at("flush_cache").as_bool(), false);
  EXPECT_TRUE(fake_.RequestsTo("/update_weights_from_disk").empty());
}

TEST_F(SglangEngineTest, ResetLoadsTheBaseCheckpointThenReinitialisesTheDestination) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk));
  ASSERT_TRUE(engine.ok());
  EXPECT_TRUE(Await((*engine)->ResetToBoot(VersionRef{"r2", 4})).ok());
  auto requests = fake_.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].target, "/update_weights_from_disk");
  EXPECT_EQ(ParseObject(requests[0].body).at("model_path").as_string(), (tmp_ / "base").string());
  EXPECT_EQ(ParseObject(requests[0].body).at("weight_version").as_string(), "r2/weight_v000004");
  EXPECT_EQ(requests[1].target, "/stage_weight_update");
  EXPECT_EQ(ParseObject(requests[1].body).at("target_version").as_int64(), 4);
}

// The configured load format goes with every load from disk: a commit's and
// the reset's.
TEST_F(SglangEngineTest, TheDiskLoadFormatGoesWithEveryLoadFromDisk) {
  SglangEngineOptions options = Options(UpdateDestination::kDisk);
  options.load_format = "fastsafetensors";
  auto engine = SglangEngine::Make(loop_.executor(), options);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_TRUE(Await((*engine)->ResetToBoot(VersionRef{"r1", 0})).ok());
  EXPECT_TRUE(Await((*engine)->Stage(Plan(tmp_ / "store/updates"))).ok());
  EXPECT_TRUE(Await((*engine)->Commit(VersionRef{"r1", 3}, Engine::CommitOptions{false})).ok());
  auto loads = fake_.RequestsTo("/update_weights_from_disk");
  ASSERT_EQ(loads.size(), 2u);
  for (const auto& load : loads) {
    EXPECT_EQ(ParseObject(load.body).at("load_format").as_string(), "fastsafetensors") << load.body;
  }
}

TEST_F(SglangEngineTest, RefusalCarriesTheEnginesMessage) {
  fake_.SetAnswer("/update_weights_from_disk",
                  JsonResponse(200, R"({"success":false,"message":"shape mismatch in q_proj"})"));
  fake_.SetAnswer("/stage_weight_update",
                  JsonResponse(400, R"({"error":{"message":"missing delta file"}})"));
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk));
  ASSERT_TRUE(engine.ok());
  absl::Status commit = Await((*engine)->Commit(VersionRef{"r1", 3}, Engine::CommitOptions{}));
  EXPECT_TRUE(absl::IsInternal(commit)) << commit;
  EXPECT_NE(commit.message().find("shape mismatch in q_proj"), std::string::npos) << commit;
  EXPECT_NE(commit.message().find("/update_weights_from_disk"), std::string::npos) << commit;
  absl::Status stage = Await((*engine)->Stage(Plan(tmp_ / "updates")));
  EXPECT_NE(stage.message().find("missing delta file"), std::string::npos) << stage;
  EXPECT_NE(stage.message().find("HTTP 400"), std::string::npos) << stage;
}

TEST_F(SglangEngineTest, UnreachableEngineIsUnavailable) {
  SglangEngineOptions options = Options(UpdateDestination::kDisk);
  options.url = stitch::testing::UnreachableUrl();
  auto engine = SglangEngine::Make(loop_.executor(), options);
  ASSERT_TRUE(engine.ok());
  absl::Status health = Await((*engine)->Health(std::chrono::seconds(2)));
  EXPECT_TRUE(absl::IsUnavailable(health)) << health;
  absl::Status pause = Await((*engine)->Pause());
  EXPECT_TRUE(absl::IsUnavailable(pause)) << pause;
  EXPECT_NE(pause.message().find("/pause_generation"), std::string::npos) << pause;
}

TEST_F(SglangEngineTest, HealthFollowsTheEnginesStatus) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kCpu));
  ASSERT_TRUE(engine.ok());
  EXPECT_TRUE(Await((*engine)->Health(std::chrono::seconds(2))).ok());
  fake_.SetAnswer("/health", JsonResponse(503, R"({"message":"scheduler stalled"})"));
  absl::Status health = Await((*engine)->Health(std::chrono::seconds(2)));
  EXPECT_TRUE(absl::IsUnavailable(health));
  EXPECT_NE(health.message().find("scheduler stalled"), std::string::npos) << health;
}

TEST_F(SglangEngineTest, ReportReadsTheLabelALoadSet) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk));
  ASSERT_TRUE(engine.ok());
  auto before = Await((*engine)->Report(std::chrono::seconds(2)));
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->label, "default");
  EXPECT_EQ(before->held, std::nullopt);
  ASSERT_TRUE(Await((*engine)->Commit(VersionRef{"r1", 3}, {})).ok());
  auto after = Await((*engine)->Report(std::chrono::seconds(2)));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->held, (VersionRef{"r1", 3}));
  EXPECT_EQ(fake_.RequestsTo("/model_info").size(), 2u);
}

// A disk load renames SGLang's served model after the load's directory: the
// forwarded /v1/models and /model_info name it as the engine was started.
TEST_F(SglangEngineTest, TheServedModelKeepsTheNameTheEngineWasStartedWith) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk));
  ASSERT_TRUE(engine.ok());
  const std::string local = (tmp_ / "local").string();
  const std::string models = absl::StrCat(R"({"object":"list","data":[{"id":")", local,
                                          R"(","root":")", local, R"(","owned_by":"sglang"}]})");
  std::string body = models;
  (*engine)->RestoreForwarded("/v1/models", body);
  EXPECT_EQ(body, models) << "nothing is restored before the engine's name is known";
  fake_.SetAnswer("/model_info", JsonResponse(200, R"({"weight_version":"default",)"
                                                   R"("served_model_name":"policy"})"));
  ASSERT_TRUE(Await((*engine)->Report(std::chrono::seconds(2))).ok());
  // After a load, the engine reports the path: that name is not learned.
  fake_.SetAnswer("/model_info",
                  JsonResponse(200, absl::StrCat(R"({"weight_version":"r1/3",)",
                                                 R"("served_model_name":")", local, R"("})")));
  ASSERT_TRUE(Await((*engine)->Report(std::chrono::seconds(2))).ok());
  (*engine)->RestoreForwarded("/v1/models", body);
  EXPECT_EQ(ParseObject(body).at("data").at(0).at("id").as_string(), "policy") << body;
  EXPECT_EQ(ParseObject(body).at("data").at(0).at("root").as_string(), "policy") << body;
  body = absl::StrCat(R"({"served_model_name":")", (tmp_ / "base").string(), R"("})");
  (*engine)->RestoreForwarded("/model_info", body);
  EXPECT_EQ(ParseObject(body).at("served_model_name").as_string(), "policy") << body;
  // Names that are not the sidecar's load directories, and other routes, stay.
  for (const auto& [path, other] :
       {std::pair<std::string, std::string>{"/v1/models", R"({"data":[{"id":"other"}]})"},
        {"/model_info", absl::StrCat(R"({"served_model_name":")", local, R"(x"})")},
        {"/server_info", absl::StrCat(R"({"served_model_name":")", local, R"("})")}}) {
    std::string kept = other;
    (*engine)->RestoreForwarded(path, kept);
    EXPECT_EQ(kept, other) << path;
  }
}

// SGLang's spans place a commit exactly only with its overlap scheduler
// off, which /server_info reports; not knowing is "on".
TEST_F(SglangEngineTest, CommitsArePlacedExactlyOnlyWithTheOverlapSchedulerOff) {
  WorkerPool pool(1);
  auto engine = StockSglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk), pool);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_FALSE((*engine)->PlacesCommitsExactly()) << "before any report";
  ASSERT_TRUE(Await((*engine)->Report(std::chrono::seconds(2))).ok());
  EXPECT_TRUE((*engine)->PlacesCommitsExactly());
  fake_.SetOverlapSchedule(true);
  ASSERT_TRUE(Await((*engine)->Report(std::chrono::seconds(2))).ok());
  EXPECT_FALSE((*engine)->PlacesCommitsExactly());
  fake_.SetOverlapSchedule(false);
  fake_.SetAnswer("/server_info", JsonResponse(404, R"({"detail":"Not Found"})"));
  ASSERT_TRUE(Await((*engine)->Report(std::chrono::seconds(2))).ok());
  EXPECT_FALSE((*engine)->PlacesCommitsExactly());
}

TEST_F(SglangEngineTest, ReportFallsBackToGetModelInfoOnOlderEngines) {
  fake_.SetAnswer("/model_info", JsonResponse(404, R"({"detail":"Not Found"})"));
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kCpu));
  ASSERT_TRUE(engine.ok());
  for (int i = 0; i < 2; ++i) {
    auto report = Await((*engine)->Report(std::chrono::seconds(2)));
    ASSERT_TRUE(report.ok()) << report.status();
    EXPECT_EQ(report->label, "default");
  }
  EXPECT_EQ(fake_.RequestsTo("/model_info").size(), 1u);
  EXPECT_EQ(fake_.RequestsTo("/get_model_info").size(), 2u);
}

TEST_F(SglangEngineTest, ASilentEnginesReportIsUnavailable) {
  fake_.Hang("/model_info");
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kCpu));
  ASSERT_TRUE(engine.ok());
  auto report = Await((*engine)->Report(std::chrono::milliseconds(200)));
  EXPECT_TRUE(absl::IsUnavailable(report.status())) << report.status();
}

TEST_F(SglangEngineTest, HangingHealthTimesOut) {
  fake_.Hang("/health");
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kCpu));
  ASSERT_TRUE(engine.ok());
  absl::Status health = Await((*engine)->Health(std::chrono::milliseconds(200)));
  EXPECT_TRUE(absl::IsUnavailable(health)) << health;
}

TEST_F(SglangEngineTest, AbortSendsEachRid) {
  auto engine = SglangEngine::Make(loop_.executor(), Options(UpdateDestination::kCpu));
  ASSERT_TRUE(engine.ok());
  Await((*engine)->Abort({"a", "b"}));
  auto aborts = fake_.RequestsTo("/abort_request");
  ASSERT_EQ(aborts.size(), 2u);
  EXPECT_EQ(ParseObject(aborts[1].body).at("rid").as_string(), "b");
}

TEST_F(SglangEngineTest, InconsistentOptionsAreRefused) {
  SglangEngineOptions no_local = Options(UpdateDestination::kDisk);
  no_local.local_checkpoint_dir.clear();
  auto disk = SglangEngine::Make(loop_.executor(), no_local);
  EXPECT_NE(disk.status().message().find("--local-checkpoint"), std::string::npos);
  WorkerPool pool(1);
  auto stock_cpu =
      StockSglangEngine::Make(loop_.executor(), Options(UpdateDestination::kCpu), pool);
  EXPECT_NE(stock_cpu.status().message().find("--update-mode disk"), std::string::npos);
  SglangEngineOptions bad_url = Options(UpdateDestination::kDisk);
  bad_url.url = "ftp://x";
  EXPECT_FALSE(SglangEngine::Make(loop_.executor(), bad_url).ok());
}

// The loader's request reaches SGLang as a pickle of [(name, ByteTensor)]
// that names nothing but torch.ByteTensor (protocol 2, built by hand).
TEST(SglangNamedBytesPayloadTest, IsAProtocolTwoPickleOfOneNamedByteTensor) {
  std::string pickle;
  ASSERT_TRUE(
      absl::Base64Unescape(SglangNamedBytesPayload("nm", std::string("a\0\xff", 3)), &pickle));
  const std::string want =
      absl::StrCat(std::string("\x80\x02](X\x02\x00\x00\x00nm", 11), "ctorch\nByteTensor\n](",
                   std::string("Ka"
                               "K\0"
                               "K\xff",
                               6),
                   "e\x85R\x86"
                   "e.");
  EXPECT_EQ(absl::BytesToHexString(pickle), absl::BytesToHexString(want));
  // Nothing to send: an empty list of bytes still makes a tensor.
  ASSERT_TRUE(absl::Base64Unescape(SglangNamedBytesPayload("n", ""), &pickle));
  EXPECT_TRUE(
      pickle.ends_with("](e\x85R\x86"
                       "e."));
}

// The stock adapter stages on the sidecar's side with the delta codec.
TEST_F(SglangEngineTest, StockEngineMaterializesDeltasIntoTheLocalCheckpoint) {
  namespace fs = std::filesystem;
  // Boot checkpoint (v0) and two later checkpoints; the store holds deltas.
  ASSERT_TRUE(stitch::testing::WriteTestVersionAt(tmp_ / "base", 0, {.seed = 1}).ok());
  ASSERT_TRUE(stitch::testing::WriteTestVersionAt(tmp_ / "ckpt1", 1, {.seed = 2}).ok());
  ASSERT_TRUE(stitch::testing::WriteTestVersionAt(tmp_ / "ckpt2", 2, {.seed = 3}).ok());
  fs::create_directories(tmp_ / "updates");
  EncodeOptions e1;
  e1.version = 1;
  e1.base_version = 0;
  auto d1 = EncodeDelta(tmp_ / "base", tmp_ / "ckpt1", tmp_ / "updates/weight_v000001", e1);
  ASSERT_TRUE(d1.ok()) << d1.status();
  EncodeOptions e2;
  e2.version = 2;
  e2.base_version = 1;
  auto d2 = EncodeDelta(tmp_ / "ckpt1", tmp_ / "ckpt2", tmp_ / "updates/weight_v000002", e2);
  ASSERT_TRUE(d2.ok()) << d2.status();

  {
    std::FILE* config = std::fopen((tmp_ / "base/config.json").c_str(), "w");
    std::fputs("{\"model_type\":\"llama\"}", config);
    std::fclose(config);
  }
  WorkerPool pool(2);
  auto engine = StockSglangEngine::Make(loop_.executor(), Options(UpdateDestination::kDisk), pool);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE(Await((*engine)->InitializeDestination(VersionRef{"r1", 0})).ok());
  auto held = ReadHeldVersion(tmp_ / "local");
  ASSERT_TRUE(held.ok() && held->has_value()) << held.status();
  EXPECT_EQ((*held)->version, 0);

  StagePlan plan;
  plan.target = VersionRef{"r1", 2};
  plan.base_checkpoint_dir = tmp_ / "base";
  plan.base_version = 0;
  plan.source_dir = tmp_ / "updates";
  for (int v = 1; v <= 2; ++v) {
    StagedVersion sv;
    sv.version = v;
    sv.manifest.version = v;
    sv.manifest.kind = VersionKind::kDelta;
    sv.dir = tmp_ / "updates" / VersionDirName(v);
    plan.chain.push_back(sv);
  }
  // Committing before staging names the mismatch and loads nothing.
  absl::Status early = Await((*engine)->Commit(VersionRef{"r1", 2}, Engine::CommitOptions{}));
  EXPECT_TRUE(absl::IsFailedPrecondition(early)) << early;
  EXPECT_TRUE(fake_.RequestsTo("/update_weights_from_disk").empty());

  absl::Status staged = Await((*engine)->Stage(plan));
  ASSERT_TRUE(staged.ok()) << staged;
  held = ReadHeldVersion(tmp_ / "local");
  ASSERT_TRUE(held.ok() && held->has_value());
  EXPECT_EQ((*held)->version, 2);
  // The staged tensors are the target's, byte for byte.
  EXPECT_TRUE(stitch::testing::VerifyVersionDir(tmp_ / "local").ok());
  for (const auto& entry : fs::directory_iterator(tmp_ / "ckpt2")) {
    if (entry.path().extension() != ".safetensors") continue;
    auto want = ReadFileToString(entry.path());
    auto got = ReadFileToString(tmp_ / "local" / entry.path().filename());
    ASSERT_TRUE(want.ok() && got.ok()) << entry.path();
    EXPECT_EQ(*want, *got) << entry.path().filename();
  }

  ASSERT_TRUE(Await((*engine)->Commit(VersionRef{"r1", 2}, Engine::CommitOptions{})).ok());
  // Unrelated checkpoints: no patch, a reload with its reason counted, and
  // no weight-update session opened in the engine.
  const std::vector<Engine::CommitPath> paths = (*engine)->CommitPaths();
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0].path, "reload");
  EXPECT_NE(paths[0].reason, "");
  EXPECT_NE(paths[0].reason, "off");
  EXPECT_TRUE(fake_.RequestsTo("/begin_weight_update").empty());
  EXPECT_TRUE(fake_.RequestsTo("/update_weights_from_tensor").empty());
  auto loads = fake_.RequestsTo("/update_weights_from_disk");
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(ParseObject(loads[0].body).at("model_path").as_string(), (tmp_ / "local").string());
  EXPECT_TRUE(fake_.RequestsTo("/stage_weight_update").empty());

  // A FULL version holds no config.json: the staged directory still gets
  // the base checkpoint's, so that the engine can load it.
  ASSERT_TRUE(
      stitch::testing::WriteTestVersionAt(tmp_ / "updates" / VersionDirName(3), 3, {.seed = 4})
          .ok());
  StagePlan full;
  full.target = VersionRef{"r1", 3};
  full.base_checkpoint_dir = tmp_ / "base";
  full.source_dir = tmp_ / "updates";
  StagedVersion v3;
  v3.version = 3;
  v3.manifest.version = 3;
  v3.manifest.kind = VersionKind::kFull;
  v3.dir = tmp_ / "updates" / VersionDirName(3);
  full.chain.push_back(v3);
  absl::Status staged_full = Await((*engine)->Stage(full));
  ASSERT_TRUE(staged_full.ok()) << staged_full;
  EXPECT_TRUE(fs::exists(tmp_ / "local/config.json"));
  held = ReadHeldVersion(tmp_ / "local");
  ASSERT_TRUE(held.ok() && held->has_value());
  EXPECT_EQ((*held)->version, 3);

  // A corrupt delta fails the staging and leaves the local checkpoint alone.
  fs::path broken = tmp_ / "updates" / VersionDirName(2);
  for (const auto& entry : fs::directory_iterator(broken)) {
    if (entry.path().extension() == ".safetensors") fs::resize_file(entry.path(), 40);
  }
  plan.target = VersionRef{"r1", 2};
  absl::Status initialized = Await((*engine)->InitializeDestination(VersionRef{"r1", 0}));
  ASSERT_TRUE(initialized.ok()) << initialized;
  absl::Status corrupt = Await((*engine)->Stage(plan));
  EXPECT_FALSE(corrupt.ok());
  held = ReadHeldVersion(tmp_ / "local");
  ASSERT_TRUE(held.ok() && held->has_value());
  EXPECT_EQ((*held)->version, 0);
}

}  // namespace
}  // namespace stitch
