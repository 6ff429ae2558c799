// The fixture of the engine's server tests: an engine over real HTTP,
// in-process, on a small test model with four perturbed versions of it.
#pragma once

#include "stitch/refengine/server.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/delta/weights_checksums.h"
#include "stitch/net/client.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/tokenizer.h"
#include "tests/support/temp_dir.h"

namespace stitch::server_test {

namespace fs = std::filesystem;
using ::stitch::testing::EngineTestConfig;
using ::stitch::testing::EngineTestTensors;
using ::stitch::testing::Ids;
using ::stitch::testing::JsonGet;
using ::stitch::testing::JsonInts;
using ::stitch::testing::JsonNumbers;
using ::stitch::testing::Logprobs;
using ::stitch::testing::PerturbTensors;
using ::stitch::testing::ReferenceGenerate;
using ::stitch::testing::ReferenceOptions;
using ::stitch::testing::SchedulerGate;
using ::stitch::testing::SseClient;
using ::stitch::testing::TempDir;
using ::stitch::testing::WaitFor;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::StartsWith;

inline std::vector<int64_t> Wide(const std::vector<int32_t>& ids) {
  return std::vector<int64_t>(ids.begin(), ids.end());
}

// Log-probabilities that went through JSON: the engine writes the shortest
// text that round-trips, but Boost.JSON 1.81 may parse it back one unit in
// the last place off, so compare within DoubleEq's 4 ULPs.
inline std::vector<::testing::Matcher<double>> SameDoubles(const std::vector<double>& values) {
  std::vector<::testing::Matcher<double>> out;
  for (double v : values) out.push_back(::testing::DoubleEq(v));
  return out;
}

inline std::string IdsJson(const std::vector<int32_t>& ids) {
  return absl::StrCat("[", absl::StrJoin(ids, ","), "]");
}

// A greedy (or seeded) /generate body for `prompt` that ignores EOS.
inline std::string GenerateBody(const std::string& prompt, int max_new_tokens,
                                double temperature = 0, int seed = 0,
                                const std::string& extra = "") {
  return absl::StrCat(R"({"text": ")", prompt, R"(", "return_logprob": true,)", extra,
                      R"( "sampling_params": {"max_new_tokens": )", max_new_tokens,
                      R"(, "temperature": )", temperature, R"(, "seed": )", seed,
                      R"(, "ignore_eos": true}})");
}

inline ReferenceOptions Greedy(int max_new_tokens, double temperature = 0, int seed = 0) {
  ReferenceOptions o;
  o.sampling.temperature = static_cast<float>(temperature);
  o.sampling.seed = static_cast<uint64_t>(seed);
  o.max_new_tokens = max_new_tokens;
  o.ignore_eos = true;
  return o;
}

class EngineServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = EngineTestConfig();
    versions_.push_back(EngineTestTensors(config_, 1));
    for (int v = 1; v <= 4; ++v) versions_.push_back(PerturbTensors(versions_.back(), 0.05 * v));
    ASSERT_TRUE(testing::WriteModel(boot_, config_, versions_[0]).ok());
  }
  void TearDown() override {
    gate_.Release();
    if (server_) server_->Shutdown();
  }

  void Start(EngineOptions options = {}) {
    options.model_dir = boot_;
    options.run_id = "run-a";
    options.served_model_name = "test-model";
    options.codec_threads = 1;
    if (!options.scheduler.before_iteration) options.scheduler.before_iteration = gate_.Hook();
    absl::StatusOr<std::unique_ptr<EngineServer>> s = EngineServer::Start(std::move(options));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  // Starts the server with a hook that swaps weights in place at the top of
  // the first scheduler iteration after tokens_generated reaches a planned
  // count (so the token at that count is the first under the new weights).
  void StartSwappingAtPlannedSteps() {
    EngineOptions options;
    options.scheduler.before_iteration = [this] {
      Scheduler* scheduler = swapping_.load();
      if (scheduler == nullptr) return;
      const uint64_t generated = scheduler->stats().tokens_generated;
      absl::MutexLock lock(&plan_mu_);
      while (!plan_.empty() && generated >= plan_.front().first) {
        const int v = plan_.front().second;
        plan_.erase(plan_.begin());
        scheduler->SwapWeights(
            Weights(v), VersionRef{"run-a", v}, [] {},
            [this](absl::StatusOr<SwapResult> r) {
              absl::MutexLock done(&plan_mu_);
              swap_errors_ += r.ok() ? 0 : 1;
            });
      }
    };
    Start(std::move(options));
    swapping_.store(&server_->mutable_scheduler());
  }
  // Plans swaps `after` tokens from now (to version `to`), in order.
  void PlanSwaps(std::vector<std::pair<uint64_t, int>> swaps) {
    const uint64_t base = TokensGenerated();
    absl::MutexLock lock(&plan_mu_);
    for (const auto& [after, to] : swaps) plan_.emplace_back(base + after, to);
  }
  bool PlanDone() {
    absl::MutexLock lock(&plan_mu_);
    return plan_.empty() && swap_errors_ == 0;
  }

  // The standard store: v1 DELTA, v2 DELTA, v3 FULL, v4 DELTA of run-a.
  void Publish() {
    ASSERT_TRUE(testing::PublishDelta(updates_, 1, versions_[0], versions_[1], "run-a").ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 2, versions_[1], versions_[2], "run-a").ok());
    ASSERT_TRUE(testing::PublishFull(updates_, 3, versions_[3], "run-a").ok());
    ASSERT_TRUE(testing::PublishDelta(updates_, 4, versions_[3], versions_[4], "run-a").ok());
  }

  // Versions 1 to 4 each change a tenth of the values (sparse, as a trained
  // step's bfloat16 values mostly stay): their cpu commits are patches.
  void MakeVersionsSparse() {
    for (size_t v = 1; v <= 4; ++v) {
      versions_[v] = testing::SparselyPerturbTensors(versions_[v - 1], 10, 0.03 * v, v);
    }
  }

  std::shared_ptr<const ModelWeights> Weights(int v) {
    return testing::BuildWeights(config_, versions_[static_cast<size_t>(v)]);
  }

  HttpResponse Call(std::string_view method, std::string_view path, std::string body = {},
                    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    FetchOptions options;
    options.timeout = timeout;
    absl::StatusOr<HttpResponse> r =
        HttpFetch(method, absl::StrCat(server_->url(), AbslView(path)), std::move(body), options);
    EXPECT_TRUE(r.ok()) << method << " " << path << ": " << r.status();
    return r.ok() ? *std::move(r) : HttpResponse{0, {}, ""};
  }
  HttpResponse Post(std::string_view path, std::string body) {
    return Call("POST", path, std::move(body));
  }
  HttpResponse Get(std::string_view path) { return Call("GET", path); }

  std::string StageBody(int64_t target, std::string_view destination) {
    return absl::StrCat(R"({"base_checkpoint_dir": ")", boot_.string(),
                        R"(", "base_version": 0, "target_version": )", target,
                        R"(, "run_id": "run-a", "destination": ")", AbslView(destination),
                        R"(", "checkpoint_source_dir": ")", updates_.string(),
                        R"(", "local_checkpoint_dir": ")", local_.string(), R"("})");
  }

  // Generates greedily through HTTP and checks the result against the
  // reference forward pass under `weights`.
  void ExpectGeneratesLike(const ModelWeights& weights, std::string_view version) {
    HttpResponse r = Post("/generate", GenerateBody("Check", 24));
    ASSERT_EQ(r.status, 200) << r.body;
    const auto ref = ReferenceGenerate(weights, EncodeText("Check", BosMode::kPrepend), Greedy(24));
    EXPECT_THAT(JsonInts(r.body, "output_ids"), ElementsAreArray(Wide(Ids(ref))));
    EXPECT_THAT(JsonNumbers(r.body, "meta_info.output_token_logprobs", 0),
                ElementsAreArray(SameDoubles(Logprobs(ref))));
    EXPECT_EQ(JsonGet(r.body, "meta_info.weight_version"), version);
  }

  // Arms the scheduler gate with `when`, runs `start` (which sends the
  // requests), then, once the gate holds the scheduler, pauses it there
  // through HTTP and returns the pause's response: requests running at that
  // moment stay running (in_place) with exactly the tokens they had.
  HttpResponse PauseWhen(std::function<bool()> when, std::string_view mode,
                         const std::function<void()>& start) {
    gate_.Arm(std::move(when));
    start();
    EXPECT_TRUE(gate_.WaitHeld());
    auto pause = std::async(std::launch::async, [this, mode] {
      return Post("/pause_generation", absl::StrCat(R"({"mode": ")", AbslView(mode), R"("})"));
    });
    EXPECT_TRUE(WaitFor([this] { return server_->scheduler().stats().pending_commands > 0; }));
    gate_.Release();
    return pause.get();
  }

  // Streams a greedy generation of `text` (`tokens` long) on `sse` and
  // pauses the engine in place once `after` tokens were generated: the
  // pause's response.
  HttpResponse PauseInPlaceWhileStreaming(SseClient& sse, const std::string& text, int tokens,
                                          uint64_t after) {
    return PauseWhen([this, after] { return TokensGenerated() >= after; }, "in_place",
                     [&] {
                       EXPECT_EQ(*sse.Open(server_->url(), "/generate",
                                           GenerateBody(text, tokens, 0, 0, R"( "stream": true,)")),
                                 200);
                     });
  }
  // Reads that stream to its end and checks its answer (output ids and
  // logprobs) against the generation that switches from version `from` to
  // `to` after `after` tokens; returns the stream's events (the answer is
  // the one before the last), none when it failed.
  std::vector<std::string> ExpectStreamSwitched(SseClient& sse, const std::string& text, int tokens,
                                                int after, int from, int to) {
    absl::StatusOr<std::vector<std::string>> events = sse.ReadAll();
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok() || events->size() < 3) {
      ADD_FAILURE() << "the stream ended with fewer than 3 events";
      return {};
    }
    const std::string& last = (*events)[events->size() - 2];
    const auto expected =
        testing::SplitGenerate(*Weights(from), *Weights(to), EncodeText(text, BosMode::kPrepend),
                               Greedy(tokens), after, false);
    EXPECT_EQ(JsonInts(last, "output_ids"), Wide(Ids(expected)));
    EXPECT_THAT(JsonNumbers(last, "meta_info.output_token_logprobs", 0),
                ElementsAreArray(SameDoubles(Logprobs(expected))));
    return *std::move(events);
  }

  uint64_t TokensGenerated() const { return server_->scheduler().stats().tokens_generated; }

  TempDir tmp_;
  fs::path boot_ = tmp_ / "boot";
  fs::path updates_ = tmp_ / "store" / "updates";
  fs::path local_ = tmp_ / "local";
  ModelConfig config_;
  std::vector<std::vector<HostTensor>> versions_;
  SchedulerGate gate_;
  std::unique_ptr<EngineServer> server_;
  std::atomic<Scheduler*> swapping_{nullptr};
  absl::Mutex plan_mu_;
  std::vector<std::pair<uint64_t, int>> plan_ ABSL_GUARDED_BY(plan_mu_);
  int swap_errors_ ABSL_GUARDED_BY(plan_mu_) = 0;
};

}  // namespace stitch::server_test
