#include "stitch/refengine/sequence.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "stitch/refengine/test_models.h"

namespace stitch {
namespace {

using testing::GqaConfig;
using testing::MhaTiedConfig;

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams params;
  int join_step = 0;  // the batch step at which it is admitted
};

std::vector<Request> MixedRequests() {
  std::vector<Request> r;
  r.push_back({{256, 72, 101, 108, 108, 111}, {1.0f, -1, 1.0f, 1}, 0});
  r.push_back({{256, 1}, {0.0f, -1, 1.0f, 2}, 0});
  r.push_back({{256, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 200, 201}, {0.8f, 20, 1.0f, 3}, 2});
  r.push_back({{256, 33, 34}, {1.3f, -1, 0.9f, 4}, 3});
  r.push_back({{256, 5, 5, 5, 5}, {1.0f, 5, 0.7f, 1}, 5});  // same seed as the first
  return r;
}

struct Outcome {
  std::vector<int32_t> ids;
  std::vector<double> logprobs;
};

// Runs one request alone for `steps` tokens.
Outcome RunAlone(const ModelWeights& w, const Request& r, int steps,
                 const StepOptions& options = {}) {
  auto seq = Sequence::Create(w.config(), r.prompt, r.params);
  EXPECT_TRUE(seq.ok()) << seq.status();
  Outcome out;
  Sequence* one[] = {&*seq};
  while (static_cast<int>(out.ids.size()) < steps) {
    auto step = StepSequences(w, one, options);
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    if ((*step)[0]) {
      out.ids.push_back((*step)[0]->id);
      out.logprobs.push_back((*step)[0]->logprob);
    }
  }
  EXPECT_EQ(std::vector<int32_t>(seq->generated().begin(), seq->generated().end()), out.ids);
  return out;
}

TEST(StepSequences, BatchedDecodeMatchesOneAtATimeExactly) {
  const ModelConfig c = GqaConfig();
  auto w = testing::RandomWeights(c, 5);
  const std::vector<Request> requests = MixedRequests();
  const int steps = 12;

  // Continuous batching: requests join at different steps and leave when done.
  std::vector<std::optional<Sequence>> live(requests.size());
  std::vector<Outcome> batched(requests.size());
  for (int t = 0; t < 40; ++t) {
    std::vector<Sequence*> active;
    std::vector<size_t> which;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].join_step == t) {
        auto s = Sequence::Create(c, requests[i].prompt, requests[i].params);
        ASSERT_TRUE(s.ok());
        live[i].emplace(std::move(*s));
      }
      if (live[i] && static_cast<int>(batched[i].ids.size()) < steps) {
        active.push_back(&*live[i]);
        which.push_back(i);
      }
    }
    if (active.empty()) continue;
    auto step = StepSequences(*w, active);
    ASSERT_TRUE(step.ok()) << step.status();
    for (size_t k = 0; k < active.size(); ++k) {
      ASSERT_TRUE((*step)[k].has_value());
      batched[which[k]].ids.push_back((*step)[k]->id);
      batched[which[k]].logprobs.push_back((*step)[k]->logprob);
    }
  }
  bool any_sampled_non_greedy = false;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Outcome alone = RunAlone(*w, requests[i], steps);
    ASSERT_EQ(batched[i].ids.size(), static_cast<size_t>(steps));
    EXPECT_EQ(batched[i].ids, alone.ids) << "request " << i;
    EXPECT_EQ(batched[i].logprobs, alone.logprobs) << "request " << i;
    for (double lp : alone.logprobs) {
      EXPECT_LE(lp, 0.0);
      any_sampled_non_greedy = any_sampled_non_greedy || lp < -0.7;
    }
  }
  // The comparison covers real sampling, not only near-certain tokens.
  EXPECT_TRUE(any_sampled_non_greedy);
}

TEST(StepSequences, ChunkedPrefillAndCacheDropsGiveTheSameTokens) {
  const ModelConfig c = MhaTiedConfig();
  auto w = testing::RandomWeights(c, 6);
  const Request r = MixedRequests()[2];
  const Outcome whole = RunAlone(*w, r, 10);
  const Outcome chunked = RunAlone(*w, r, 10, StepOptions{.max_tokens_per_sequence = 4});
  EXPECT_EQ(whole.ids, chunked.ids);
  EXPECT_EQ(whole.logprobs, chunked.logprobs);

  // A 13-token prompt in chunks of 4 produces its first token on the 4th step.
  auto seq = Sequence::Create(c, r.prompt, r.params);
  ASSERT_TRUE(seq.ok());
  Sequence* one[] = {&*seq};
  for (int i = 0; i < 3; ++i) {
    auto step = StepSequences(*w, one, StepOptions{.max_tokens_per_sequence = 4});
    ASSERT_TRUE(step.ok());
    EXPECT_FALSE((*step)[0].has_value());
    EXPECT_EQ(seq->cached_length(), 4 * (i + 1));
  }

  // Dropping the cache mid-generation: the prefix is recomputed, and the
  // tokens continue exactly as without the drop.
  auto again = Sequence::Create(c, r.prompt, r.params);
  ASSERT_TRUE(again.ok());
  Sequence* s[] = {&*again};
  std::vector<int32_t> ids;
  for (int i = 0; i < 10; ++i) {
    if (i == 4) {
      again->DropCache();
      EXPECT_EQ(again->cached_length(), 0);
    }
    auto step = StepSequences(*w, s);
    ASSERT_TRUE(step.ok());
    ids.push_back((*step)[0]->id);
  }
  EXPECT_EQ(ids, whole.ids);
}

TEST(StepSequences, WeightSwapBetweenStepsKeepsCachesAndUsesNewWeights) {
  const ModelConfig c = GqaConfig();
  std::shared_ptr<const ModelWeights> live = testing::RandomWeights(c, 30);
  const std::shared_ptr<const ModelWeights> next = testing::RandomWeights(c, 31);
  const Request r{{256, 10, 20, 30, 40}, {0.0f, -1, 1.0f, 0}, 0};

  auto seq = Sequence::Create(c, r.prompt, r.params);
  ASSERT_TRUE(seq.ok());
  Sequence* one[] = {&*seq};
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(StepSequences(*live, one).ok());
  ASSERT_EQ(seq->cached_length(), 8);  // 5 prompt tokens + 3 fed back

  // Continuations of the same state to compare with: under the old weights,
  // and under the new weights recomputed from scratch.
  Sequence on_old = *seq, recomputed = *seq;
  recomputed.DropCache();
  Sequence* old_one[] = {&on_old};
  Sequence* recomputed_one[] = {&recomputed};
  auto old_step = StepSequences(*live, old_one);
  auto fresh_step = StepSequences(*next, recomputed_one);
  ASSERT_TRUE(old_step.ok() && fresh_step.ok());

  // The commit: a pointer swap between two steps; the cache is kept.
  live = next;
  auto step = StepSequences(*live, one);
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(seq->cached_length(), 9);  // the cache continued rather than restarted
  EXPECT_NE((*step)[0]->logprob, (*old_step)[0]->logprob);
  EXPECT_NE((*step)[0]->logprob, (*fresh_step)[0]->logprob);
}

TEST(StepSequences, RefusesWhatCannotAdvanceWithoutChangingAnything) {
  const ModelConfig c = MhaTiedConfig();
  auto w = testing::RandomWeights(c, 2);
  std::vector<int32_t> full(static_cast<size_t>(c.max_position_embeddings), 7);
  auto at_limit = Sequence::Create(c, full, {});
  ASSERT_TRUE(at_limit.ok());
  auto small = Sequence::Create(c, {256, 1}, {});
  ASSERT_TRUE(small.ok());

  // A prompt filling the context still yields exactly one token.
  Sequence* one[] = {&*at_limit};
  ASSERT_TRUE(at_limit->CanAdvance());
  ASSERT_TRUE(StepSequences(*w, one).ok());
  EXPECT_FALSE(at_limit->CanAdvance());
  Sequence* both[] = {&*small, &*at_limit};
  auto r = StepSequences(*w, both);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("sequence 1"), std::string::npos);
  EXPECT_EQ(small->cached_length(), 0);
  EXPECT_EQ(small->generated().size(), 0u);

  Sequence* twice[] = {&*small, &*small};
  EXPECT_FALSE(StepSequences(*w, twice).ok());
  Sequence* null[] = {nullptr};
  EXPECT_FALSE(StepSequences(*w, null).ok());

  // A cache shaped for another model.
  auto other_w = testing::RandomWeights(GqaConfig(), 2);
  Sequence* s[] = {&*small};
  auto wrong = StepSequences(*other_w, s);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(std::string(wrong.status().message()).find("shaped for other weights"),
            std::string::npos);
}

TEST(Sequence, CreateValidatesThePromptAndParams) {
  const ModelConfig c = MhaTiedConfig();
  EXPECT_FALSE(Sequence::Create(c, {}, {}).ok());
  EXPECT_FALSE(Sequence::Create(c, {1, 258}, {}).ok());
  EXPECT_FALSE(Sequence::Create(c, {-1}, {}).ok());
  EXPECT_FALSE(
      Sequence::Create(
          c, std::vector<int32_t>(static_cast<size_t>(c.max_position_embeddings) + 1, 1), {})
          .ok());
  EXPECT_FALSE(Sequence::Create(c, {1}, {-1.0f, -1, 1.0f, 0}).ok());
  auto s = Sequence::Create(c, {256, 3}, {});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->prompt_length(), 2);
  EXPECT_EQ(s->tokens().size(), 2u);
  EXPECT_TRUE(s->generated().empty());
}

TEST(CompletionLogprobs, ReproducesTheEngineLogprobsExactly) {
  for (const ModelConfig& c : {GqaConfig(), MhaTiedConfig()}) {
    auto w = testing::RandomWeights(c, 40);
    for (float temperature : {0.0f, 0.7f, 1.0f}) {
      const Request r{{256, 70, 71, 72}, {temperature, -1, 1.0f, 5}, 0};
      const Outcome gen = RunAlone(*w, r, 15);
      std::vector<int32_t> tokens = r.prompt;
      tokens.insert(tokens.end(), gen.ids.begin(), gen.ids.end());
      auto scored =
          CompletionLogprobs(*w, tokens, static_cast<int64_t>(r.prompt.size()), temperature);
      ASSERT_TRUE(scored.ok()) << scored.status();
      EXPECT_EQ(*scored, gen.logprobs) << "temperature " << temperature;
    }
  }
}

TEST(CompletionLogprobs, RefusesBadArguments) {
  const ModelConfig c = MhaTiedConfig();
  auto w = testing::RandomWeights(c, 1);
  const std::vector<int32_t> tokens = {256, 1, 2};
  EXPECT_FALSE(CompletionLogprobs(*w, tokens, 0, 1.0f).ok());
  EXPECT_FALSE(CompletionLogprobs(*w, tokens, 4, 1.0f).ok());
  EXPECT_FALSE(CompletionLogprobs(*w, tokens, 1, -1.0f).ok());
  EXPECT_FALSE(CompletionLogprobs(*w, std::vector<int32_t>{256, 1, 258}, 1, 1.0f).ok());
  auto none = CompletionLogprobs(*w, tokens, 3, 1.0f);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace stitch
