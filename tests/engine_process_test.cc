// `stitch engine` as a process: the real binary serving real HTTP. Generation
// against the reference forward pass, a staged commit with a request in
// flight, disk staging, bad input, the fault-injection flags, and clean
// shutdown.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/client.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/faults.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/tokenizer.h"
#include "stitch/refengine/weights.h"
#include "tests/sidecar_process.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::Ids;
using ::stitch::testing::JsonGet;
using ::stitch::testing::JsonInts;
using ::stitch::testing::JsonNumbers;
using ::stitch::testing::Logprobs;
using ::stitch::testing::ProcessResult;
using ::stitch::testing::ReferenceGenerate;
using ::stitch::testing::ReferenceOptions;
using ::stitch::testing::RunStitch;
using ::stitch::testing::ServerProcess;
using ::stitch::testing::SseClient;
using ::stitch::testing::TempDir;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr uint64_t kSeed = 5;

std::vector<int64_t> Wide(const std::vector<int32_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// Log-probabilities that went through JSON: the engine writes the shortest
// text that round-trips, but Boost.JSON 1.81 may parse it back one unit in
// the last place off, so compare within DoubleEq's 4 ULPs.
std::vector<::testing::Matcher<double>> SameDoubles(const std::vector<double>& values) {
  std::vector<::testing::Matcher<double>> out;
  for (double v : values) out.push_back(::testing::DoubleEq(v));
  return out;
}

ReferenceOptions Greedy(int max_new_tokens) {
  ReferenceOptions o;
  o.sampling.temperature = 0;
  o.max_new_tokens = max_new_tokens;
  o.ignore_eos = true;
  return o;
}

class EngineProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is unset"; }

  // `stitch engine init-model` with `size` flags.
  void InitModel(std::vector<std::string> size) {
    std::vector<std::string> args = {"engine", "init-model", model_.string(), "--seed",
                                     std::to_string(kSeed)};
    args.insert(args.end(), size.begin(), size.end());
    ProcessResult r = RunStitch(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    absl::StatusOr<ModelConfig> config = ReadModelConfig(model_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
  }
  void InitSmallModel() {
    InitModel({"--layers", "2", "--hidden", "64", "--heads", "4", "--max-positions", "512"});
  }

  void StartEngine(std::vector<std::string> flags = {}) {
    std::vector<std::string> argv = {
        testing::StitchBinary(), "engine", "--model",  model_.string(), "--port", "0",
        "--boot-version",        "3",      "--run-id", "run-a"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    engine_ = std::make_unique<ServerProcess>(argv);
    ASSERT_TRUE(engine_->started());
    std::optional<std::string> url = engine_->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(url.has_value()) << "the engine did not start:\n" << engine_->err();
    url_ = *url;
  }

  absl::StatusOr<HttpResponse> Fetch(std::string_view method, std::string_view path,
                                     std::string body = {},
                                     std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    FetchOptions options;
    options.timeout = timeout;
    return HttpFetch(method, absl::StrCat(url_, AbslView(path)), std::move(body), options);
  }
  HttpResponse Post(std::string_view path, std::string body) {
    absl::StatusOr<HttpResponse> r = Fetch("POST", path, std::move(body));
    EXPECT_TRUE(r.ok()) << path << ": " << r.status();
    return r.ok() ? *std::move(r) : HttpResponse{0, {}, ""};
  }
  HttpResponse Get(std::string_view path) {
    absl::StatusOr<HttpResponse> r = Fetch("GET", path);
    EXPECT_TRUE(r.ok()) << path << ": " << r.status();
    return r.ok() ? *std::move(r) : HttpResponse{0, {}, ""};
  }

  // The boot checkpoint's tensors (init-model is deterministic) and a
  // trained step of them published as DELTA version 4 of run-a.
  std::vector<HostTensor> PublishStep() {
    std::vector<HostTensor> boot = RandomCheckpointTensors(config_, kSeed);
    std::vector<HostTensor> next = testing::PerturbTensors(boot, 0.05);
    EXPECT_TRUE(testing::PublishDelta(updates_, 4, boot, next, "run-a").ok());
    return next;
  }

  std::string StageBody(std::string_view destination) {
    return absl::StrCat(R"({"base_checkpoint_dir": ")", model_.string(),
                        R"(", "base_version": 3, "target_version": 4, "run_id": "run-a",
                        "destination": ")",
                        AbslView(destination), R"(", "checkpoint_source_dir": ")",
                        updates_.string(), R"(", "local_checkpoint_dir": ")", local_.string(),
                        R"("})");
  }

  static std::string GenerateBody(int max_new_tokens, std::string_view extra = "") {
    return absl::StrCat(R"({"text": "Process", "return_logprob": true,)", AbslView(extra),
                        R"( "sampling_params": {"max_new_tokens": )", max_new_tokens,
                        R"(, "temperature": 0, "ignore_eos": true}})");
  }

  void ExpectGeneratesLike(const std::vector<HostTensor>& tensors, std::string_view version) {
    HttpResponse r = Post("/generate", GenerateBody(20));
    ASSERT_EQ(r.status, 200) << r.body;
    auto weights = testing::BuildWeights(config_, tensors);
    ASSERT_NE(weights, nullptr);
    const auto ref =
        ReferenceGenerate(*weights, EncodeText("Process", BosMode::kPrepend), Greedy(20));
    EXPECT_THAT(JsonInts(r.body, "output_ids"), ElementsAreArray(Wide(Ids(ref))));
    EXPECT_THAT(JsonNumbers(r.body, "meta_info.output_token_logprobs", 0),
                ElementsAreArray(SameDoubles(Logprobs(ref))));
    EXPECT_EQ(JsonGet(r.body, "meta_info.weight_version"), version);
  }

  TempDir tmp_;
  fs::path model_ = tmp_ / "model";
  fs::path updates_ = tmp_ / "store" / "updates";
  fs::path local_ = tmp_ / "local";
  ModelConfig config_;
  std::unique_ptr<ServerProcess> engine_;
  std::string url_;
};

TEST_F(EngineProcessTest, ServesTheReferenceGenerationAndStopsCleanlyOnSigterm) {
  InitSmallModel();
  StartEngine();
  EXPECT_EQ(Get("/health").status, 200);
  ExpectGeneratesLike(RandomCheckpointTensors(config_, kSeed), "3");
  HttpResponse chat = Post("/v1/chat/completions",
                           R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})");
  EXPECT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(JsonGet(Get("/server_info").body, "weight_version_id"), "run-a/weight_v000003");
  engine_->Signal(SIGTERM);
  EXPECT_EQ(engine_->WaitForExit(std::chrono::seconds(30)), 0) << engine_->err();
  EXPECT_THAT(engine_->out(), HasSubstr("SIGTERM"));
}

TEST_F(EngineProcessTest, CommitsACpuStagedVersionUnderARequestInFlight) {
  // A model slow enough that a long generation outlasts a few control calls.
  InitModel({"--layers", "4", "--hidden", "256", "--heads", "4", "--max-positions", "2048"});
  PublishStep();
  StartEngine();
  HttpResponse staged = Post("/stage_weight_update", StageBody("cpu"));
  ASSERT_EQ(staged.status, 200) << staged.body;

  SseClient sse;
  ASSERT_EQ(*sse.Open(url_, "/generate", GenerateBody(800, R"( "stream": true,)")), 200);
  absl::StatusOr<std::optional<std::string>> first = sse.Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  EXPECT_EQ(JsonGet(**first, "meta_info.weight_version"), "3");
  HttpResponse paused = Post("/pause_generation", R"({"mode": "in_place"})");
  ASSERT_EQ(paused.status, 200);
  ASSERT_EQ(JsonGet(paused.body, "affected_requests"), "1")
      << "the request finished before the pause; the test needs a slower model";
  HttpResponse commit = Post("/update_weights_from_cpu", R"({"target_version": 4})");
  ASSERT_EQ(commit.status, 200) << commit.body;
  EXPECT_EQ(JsonGet(commit.body, "resident_requests"), "1");
  ASSERT_EQ(Post("/continue_generation", "{}").status, 200);

  absl::StatusOr<std::vector<std::string>> rest = sse.ReadAll();
  ASSERT_TRUE(rest.ok()) << rest.status();
  ASSERT_GE(rest->size(), 2u);
  EXPECT_EQ(rest->back(), "[DONE]");
  const std::string& last = (*rest)[rest->size() - 2];
  EXPECT_EQ(JsonGet(last, "meta_info.weight_version"), "4");
  EXPECT_EQ(JsonGet(last, "meta_info.completion_tokens"), "800");
  EXPECT_EQ(JsonGet(last, "meta_info.finish_reason.type"), "length");
  // Some tokens came before the commit, under the boot weights, the rest
  // after it.
  size_t before_commit = JsonInts(**first, "output_ids").size();
  for (const std::string& event : *rest) {
    if (JsonGet(event, "meta_info.weight_version") == "3") {
      before_commit = JsonInts(event, "output_ids").size();
    }
  }
  EXPECT_GE(before_commit, 1u);
  EXPECT_LT(before_commit, 800u);
}

TEST_F(EngineProcessTest, StagesToDiskAndLoadsTheTarget) {
  InitSmallModel();
  std::vector<HostTensor> next = PublishStep();
  StartEngine();
  HttpResponse staged = Post("/stage_weight_update", StageBody("disk"));
  ASSERT_EQ(staged.status, 200) << staged.body;
  HttpResponse commit = Post("/update_weights_from_disk",
                             absl::StrCat(R"({"model_path": ")", local_.string(),
                                          R"(", "weight_version": "run-a/weight_v000004"})"));
  ASSERT_EQ(commit.status, 200) << commit.body;
  ExpectGeneratesLike(next, "4");
}

TEST_F(EngineProcessTest, BadInputIsRefusedAndTheEngineKeepsServing) {
  InitSmallModel();
  StartEngine();
  HttpResponse malformed = Post("/generate", "{\"text\"");
  EXPECT_EQ(malformed.status, 400);
  EXPECT_THAT(malformed.body, HasSubstr("not valid JSON"));
  HttpResponse unknown = Post("/generate", R"({"text": "a", "sampling_params": {"beam": 2}})");
  EXPECT_EQ(unknown.status, 400);
  HttpResponse never = Post("/update_weights_from_cpu", R"({"target_version": 4})");
  EXPECT_EQ(never.status, 400);
  EXPECT_THAT(never.body, HasSubstr("never staged"));
  HttpResponse missing = Post("/stage_weight_update", StageBody("cpu"));
  EXPECT_EQ(missing.status, 400);
  EXPECT_THAT(missing.body, HasSubstr("checkpoint_source_dir"));
  ExpectGeneratesLike(RandomCheckpointTensors(config_, kSeed), "3");
}

TEST_F(EngineProcessTest, FaultFlagsFailStagingsAndCommits) {
  InitSmallModel();
  std::vector<HostTensor> next = PublishStep();
  StartEngine({"--fault-fail-stagings", "1", "--fault-fail-commits", "1"});
  HttpResponse stage_fault = Post("/stage_weight_update", StageBody("cpu"));
  EXPECT_EQ(stage_fault.status, 500);
  EXPECT_THAT(stage_fault.body, HasSubstr("injected fault"));
  ASSERT_EQ(Post("/stage_weight_update", StageBody("cpu")).status, 200);
  HttpResponse commit_fault = Post("/update_weights_from_cpu", R"({"target_version": 4})");
  EXPECT_EQ(commit_fault.status, 500);
  EXPECT_THAT(commit_fault.body, HasSubstr("injected fault"));
  EXPECT_EQ(JsonGet(commit_fault.body, "success"), "false");
  ExpectGeneratesLike(RandomCheckpointTensors(config_, kSeed), "3");
  ASSERT_EQ(Post("/update_weights_from_cpu", R"({"target_version": 4})").status, 200);
  ExpectGeneratesLike(next, "4");
}

TEST_F(EngineProcessTest, FaultFlagMakesHealthHang) {
  InitSmallModel();
  StartEngine({"--fault-hang-health-after", "1"});
  EXPECT_EQ(Get("/health").status, 200);
  absl::StatusOr<HttpResponse> hung = Fetch("GET", "/health", "", std::chrono::milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(hung.status())) << hung.status();
  // Everything else still answers.
  EXPECT_EQ(Get("/server_info").status, 200);
}

TEST_F(EngineProcessTest, FaultFlagExitsInTheMiddleOfACommit) {
  InitSmallModel();
  PublishStep();
  StartEngine({"--fault-exit-on-commit", "1"});
  ASSERT_EQ(Post("/stage_weight_update", StageBody("cpu")).status, 200);
  absl::StatusOr<HttpResponse> commit =
      Fetch("POST", "/update_weights_from_cpu", R"({"target_version": 4})");
  EXPECT_FALSE(commit.ok()) << commit->status << " " << commit->body;
  EXPECT_EQ(engine_->WaitForExit(std::chrono::seconds(30)), kFaultExitCode);
  EXPECT_THAT(engine_->err(), HasSubstr("injected fault"));
}

TEST_F(EngineProcessTest, RefusesToStartWithoutAUsableModel) {
  ProcessResult no_model = RunStitch({"engine", "--port", "0"});
  EXPECT_EQ(no_model.exit_code, 1);
  EXPECT_THAT(no_model.err, HasSubstr("--model"));
  ProcessResult missing = RunStitch({"engine", "--model", (tmp_ / "none").string(), "--port", "0"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("stitch: engine: --model"));
  EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1);
}

}  // namespace
}  // namespace stitch
