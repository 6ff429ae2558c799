// The engine's weight updates over real HTTP, in-process: in-place commits
// with requests in flight, staging from disk and into memory, corrupt
// deltas, the labels a load may give, and injected faults.

#include "stitch/refengine/server_test_fixture.h"

namespace stitch::server_test {
namespace {

TEST_F(EngineServerTest, InPlacePauseAndCpuCommitWithARequestInFlight) {
  Publish();
  Start();
  HttpResponse staged = Post("/stage_weight_update", StageBody(1, "cpu"));
  ASSERT_EQ(staged.status, 200) << staged.body;
  EXPECT_EQ(JsonGet(staged.body, "staged_version"), "1");

  SseClient sse;
  HttpResponse paused = PauseInPlaceWhileStreaming(sse, "Flight", 40, 5);
  ASSERT_EQ(paused.status, 200) << paused.body;
  EXPECT_EQ(JsonGet(paused.body, "affected_requests"), "1");
  EXPECT_EQ(JsonGet(Get("/server_info").body, "num_running_requests"), "1");

  HttpResponse commit = Post("/update_weights_from_cpu", R"({"target_version": 1})");
  ASSERT_EQ(commit.status, 200) << commit.body;
  EXPECT_EQ(JsonGet(commit.body, "success"), "true");
  EXPECT_EQ(JsonGet(commit.body, "weight_version"), "1");
  EXPECT_EQ(JsonGet(commit.body, "resident_requests"), "1");
  ASSERT_EQ(Post("/continue_generation", "{}").status, 200);

  const std::vector<std::string> events = ExpectStreamSwitched(sse, "Flight", 40, 5, 0, 1);
  ASSERT_GE(events.size(), 3u);
  const std::string& last = events[events.size() - 2];
  const auto prompt = EncodeText("Flight", BosMode::kPrepend);
  EXPECT_NE(JsonInts(last, "output_ids"),
            Wide(Ids(ReferenceGenerate(*Weights(0), prompt, Greedy(40)))));
  EXPECT_EQ(JsonGet(last, "meta_info.weight_version"), "1");
  EXPECT_EQ(JsonGet(events.front(), "meta_info.weight_version"), "0");
  EXPECT_EQ(JsonGet(Get("/server_info").body, "weight_version"), "1");
}

TEST_F(EngineServerTest, CpuCommitsOfSparseDeltasArePatchesAppliedInPlaceMidGeneration) {
  MakeVersionsSparse();
  Publish();
  Start();
  HttpResponse staged = Post("/stage_weight_update", StageBody(1, "cpu"));
  ASSERT_EQ(staged.status, 200) << staged.body;
  EXPECT_EQ(JsonGet(staged.body, "commit_path"), "patch");
  EXPECT_EQ(JsonGet(staged.body, "commit_reason"), "");

  SseClient sse;
  HttpResponse paused = PauseInPlaceWhileStreaming(sse, "Patch", 30, 6);
  ASSERT_EQ(paused.status, 200) << paused.body;
  HttpResponse commit = Post("/update_weights_from_cpu", R"({"target_version": 1})");
  ASSERT_EQ(commit.status, 200) << commit.body;
  EXPECT_EQ(JsonGet(commit.body, "commit_path"), "patch");
  EXPECT_EQ(JsonGet(commit.body, "weight_version"), "1");
  EXPECT_EQ(JsonGet(commit.body, "resident_requests"), "1");
  ASSERT_EQ(Post("/continue_generation", "{}").status, 200);

  EXPECT_GE(ExpectStreamSwitched(sse, "Patch", 30, 6, 0, 1).size(), 3u);

  // The next version patches the patched weights; what the engine reports
  // is the target's fingerprint.
  ASSERT_EQ(Post("/stage_weight_update", StageBody(2, "cpu")).status, 200);
  commit = Post("/update_weights_from_cpu", R"({"target_version": 2})");
  ASSERT_EQ(commit.status, 200) << commit.body;
  EXPECT_EQ(JsonGet(commit.body, "commit_path"), "patch");
  ExpectGeneratesLike(*Weights(2), "2");
  EXPECT_EQ(JsonGet(Get("/server_info").body, "weights_fingerprint"),
            Weights(2)->fingerprint().ToHex());
}

TEST_F(EngineServerTest, APatchThatFailsIsUndoneAndTheTargetIsThenSwappedIn) {
  MakeVersionsSparse();
  Publish();
  EngineOptions options;
  options.faults.fail_patches = 1;
  Start(std::move(options));
  ASSERT_EQ(Post("/stage_weight_update", StageBody(1, "cpu")).status, 200);
  HttpResponse failed = Post("/update_weights_from_cpu", R"({"target_version": 1})");
  EXPECT_EQ(failed.status, 409) << failed.body;
  EXPECT_EQ(JsonGet(failed.body, "undone"), "true");
  EXPECT_EQ(JsonGet(failed.body, "weight_version"), "0");
  EXPECT_THAT(JsonGet(failed.body, "message").value_or(""), HasSubstr("injected fault"));
  ExpectGeneratesLike(*Weights(0), "0");
  EXPECT_EQ(JsonGet(Get("/server_info").body, "weights_fingerprint"),
            Weights(0)->fingerprint().ToHex());

  HttpResponse staged = Post("/stage_weight_update", StageBody(1, "cpu"));
  ASSERT_EQ(staged.status, 200) << staged.body;
  EXPECT_EQ(JsonGet(staged.body, "commit_path"), "swap");
  EXPECT_EQ(JsonGet(staged.body, "commit_reason"), "patch-failed");
  HttpResponse commit = Post("/update_weights_from_cpu", R"({"target_version": 1})");
  ASSERT_EQ(commit.status, 200) << commit.body;
  EXPECT_EQ(JsonGet(commit.body, "commit_path"), "swap");
  ExpectGeneratesLike(*Weights(1), "1");
}

TEST_F(EngineServerTest, CpuStagingOfADeltaChainAndOfAFullThenCommit) {
  Publish();
  Start();
  for (int v : {2, 4}) {
    HttpResponse staged = Post("/stage_weight_update", StageBody(v, "cpu"));
    ASSERT_EQ(staged.status, 200) << staged.body;
    EXPECT_EQ(JsonGet(staged.body, "anchor_version"), v == 2 ? "0" : "3");
    HttpResponse commit =
        Post("/update_weights_from_cpu", absl::StrCat(R"({"target_version": "run-a/weight_v00000)",
                                                      v, R"(", "flush_cache": true})"));
    ASSERT_EQ(commit.status, 200) << commit.body;
    ExpectGeneratesLike(*Weights(v), absl::StrCat(v));
  }
  const std::string info = Get("/server_info").body;
  EXPECT_EQ(JsonGet(info, "weight_version_id"), "run-a/weight_v000004");
  EXPECT_EQ(JsonGet(info, "weight_swaps"), "2");
}

TEST_F(EngineServerTest, DiskStagingOfADeltaChainAndOfAFullThenLoad) {
  Publish();
  Start();
  for (int v : {2, 4}) {
    HttpResponse staged = Post("/stage_weight_update", StageBody(v, "disk"));
    ASSERT_EQ(staged.status, 200) << staged.body;
    HttpResponse commit = Post("/update_weights_from_disk",
                               absl::StrCat(R"({"model_path": ")", local_.string(), R"("})"));
    ASSERT_EQ(commit.status, 200) << commit.body;
    ExpectGeneratesLike(*Weights(v), absl::StrCat(v));
  }
  // A version named in the request wins over the directory's.
  HttpResponse named = Post("/update_weights_from_disk",
                            absl::StrCat(R"({"model_path": ")", boot_.string(),
                                         R"(", "weight_version": "run-a/weight_v000009"})"));
  ASSERT_EQ(named.status, 200) << named.body;
  ExpectGeneratesLike(*Weights(0), "9");
}

TEST_F(EngineServerTest, ACorruptDeltaIsRejectedAndGenerationStaysTheSame) {
  Publish();
  Start();
  HttpResponse before = Post("/generate", GenerateBody("Same", 20));
  ASSERT_EQ(before.status, 200);
  ASSERT_TRUE(testing::CorruptVersion(updates_ / "weight_v000001").ok());
  for (std::string_view destination : {"cpu", "disk"}) {
    HttpResponse staged = Post("/stage_weight_update", StageBody(2, destination));
    EXPECT_EQ(staged.status, 422) << staged.body;
    EXPECT_THAT(staged.body, HasSubstr("weight_v000001"));
    EXPECT_THAT(staged.body, HasSubstr("serving weights are unchanged"));
  }
  HttpResponse commit = Post("/update_weights_from_cpu", R"({"target_version": 2})");
  EXPECT_EQ(commit.status, 400);
  EXPECT_THAT(commit.body, HasSubstr("never staged"));
  HttpResponse after = Post("/generate", GenerateBody("Same", 20));
  ASSERT_EQ(after.status, 200);
  EXPECT_EQ(JsonGet(after.body, "output_ids"), JsonGet(before.body, "output_ids"));
  EXPECT_EQ(JsonGet(after.body, "meta_info.output_token_logprobs"),
            JsonGet(before.body, "meta_info.output_token_logprobs"));
  EXPECT_EQ(JsonGet(after.body, "meta_info.weight_version"), "0");
}

TEST_F(EngineServerTest, ARoundTripOfAnUnchangedModelKeepsTokensAndLogprobs) {
  ASSERT_TRUE(testing::PublishDelta(updates_, 1, versions_[0], versions_[0], "run-a").ok());
  ASSERT_TRUE(testing::PublishDelta(updates_, 2, versions_[0], versions_[0], "run-a").ok());
  Start();
  const std::string body = GenerateBody("Round trip", 25, 0.9, 77);
  HttpResponse before = Post("/generate", body);
  ASSERT_EQ(before.status, 200);
  ASSERT_EQ(Post("/stage_weight_update", StageBody(1, "cpu")).status, 200);
  ASSERT_EQ(Post("/update_weights_from_cpu", R"({"target_version": 1})").status, 200);
  HttpResponse cpu = Post("/generate", body);
  ASSERT_EQ(Post("/stage_weight_update", StageBody(2, "disk")).status, 200);
  ASSERT_EQ(Post("/update_weights_from_disk",
                 absl::StrCat(R"({"model_path": ")", local_.string(), R"("})"))
                .status,
            200);
  HttpResponse disk = Post("/generate", body);
  for (const HttpResponse* r : {&cpu, &disk}) {
    EXPECT_EQ(JsonGet(r->body, "output_ids"), JsonGet(before.body, "output_ids"));
    EXPECT_EQ(JsonGet(r->body, "meta_info.output_token_logprobs"),
              JsonGet(before.body, "meta_info.output_token_logprobs"));
  }
  EXPECT_EQ(JsonGet(cpu.body, "meta_info.weight_version"), "1");
  EXPECT_EQ(JsonGet(disk.body, "meta_info.weight_version"), "2");
}

TEST_F(EngineServerTest, ALoadNeverLeavesALabelOnWeightsItDoesNotName) {
  Publish();
  Start();
  HttpResponse unlabelled = Post("/update_weights_from_disk",
                                 absl::StrCat(R"({"model_path": ")", boot_.string(), R"("})"));
  EXPECT_EQ(unlabelled.status, 400) << unlabelled.body;
  EXPECT_THAT(unlabelled.body, HasSubstr("records no version"));

  ASSERT_EQ(Post("/stage_weight_update", StageBody(4, "disk")).status, 200);
  HttpResponse relabelled = Post("/update_weights_from_disk",
                                 absl::StrCat(R"({"model_path": ")", local_.string(),
                                              R"(", "weight_version": "run-a/weight_v000000"})"));
  EXPECT_EQ(relabelled.status, 400) << relabelled.body;
  EXPECT_THAT(relabelled.body, HasSubstr("names one set of weights"));
  ExpectGeneratesLike(*Weights(0), "0");

  // Reloading the same weights under their own label is fine.
  HttpResponse reload = Post("/update_weights_from_disk",
                             absl::StrCat(R"({"model_path": ")", boot_.string(),
                                          R"(", "weight_version": "run-a/weight_v000000"})"));
  EXPECT_EQ(reload.status, 200) << reload.body;
}

TEST_F(EngineServerTest, FaultInjectionFailsStagingsCommitsAndHangsHealth) {
  Publish();
  EngineOptions options;
  options.faults.fail_stagings = 1;
  options.faults.fail_commits = 1;
  options.faults.hang_health_after = 1;
  Start(options);
  HttpResponse failed = Post("/stage_weight_update", StageBody(1, "cpu"));
  EXPECT_EQ(failed.status, 500);
  EXPECT_THAT(failed.body, HasSubstr("injected fault"));
  ASSERT_EQ(Post("/stage_weight_update", StageBody(1, "cpu")).status, 200);
  HttpResponse no_commit = Post("/update_weights_from_cpu", R"({"target_version": 1})");
  EXPECT_EQ(no_commit.status, 500);
  EXPECT_THAT(no_commit.body, HasSubstr("injected fault"));
  EXPECT_EQ(JsonGet(Get("/server_info").body, "weight_version"), "0");
  ASSERT_EQ(Post("/update_weights_from_cpu", R"({"target_version": 1})").status, 200);
  ExpectGeneratesLike(*Weights(1), "1");

  EXPECT_EQ(Get("/health").status, 200);
  FetchOptions quick;
  quick.timeout = std::chrono::milliseconds(300);
  absl::StatusOr<HttpResponse> hung = HttpFetch("GET", server_->url() + "/health", "", quick);
  EXPECT_TRUE(absl::IsDeadlineExceeded(hung.status())) << hung.status();
}

}  // namespace
}  // namespace stitch::server_test
