#include "stitch/chaos/oracle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/sequence.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {
namespace {

constexpr int64_t kTokens = 10;

OracleOptions Options() {
  OracleOptions o;
  o.config = testing::EngineTestConfig();
  o.seed = 11;
  o.prompts = {EncodeText("Once upon a time", BosMode::kPrepend),
               EncodeText("GET /generate", BosMode::kPrepend)};
  return o;
}

testing::ReferenceOptions Greedy() {
  testing::ReferenceOptions r;
  r.sampling.temperature = 0;
  r.max_new_tokens = kTokens;
  r.ignore_eos = true;
  return r;
}

// What the engine produces when a commit from `a` to `b` lands after the
// first `first` tokens (an in-place commit keeps the request's cache).
std::vector<int32_t> Crossing(Oracle& oracle, int prompt, int64_t a, int64_t b, int64_t first) {
  return testing::Ids(testing::SplitGenerate(*oracle.Weights(a), *oracle.Weights(b),
                                             oracle.options().prompts[prompt], Greedy(), first,
                                             /*drop_cache=*/false));
}

TEST(OracleTest, VersionsDifferOnlyInTheLmHeadAndGiveDistinctAnswers) {
  Oracle oracle(Options());
  const std::vector<HostTensor> v0 = oracle.Tensors(0);
  const std::vector<HostTensor> v1 = oracle.Tensors(1);
  ASSERT_EQ(v0.size(), v1.size());
  for (size_t i = 0; i < v0.size(); ++i) {
    EXPECT_EQ(v0[i].data != v1[i].data, v0[i].name == "lm_head.weight") << v0[i].name;
  }
  EXPECT_EQ(oracle.Tensors(5)[0].data, Oracle(Options()).Tensors(5)[0].data);
  for (int64_t v = 1; v < 8; ++v) {
    EXPECT_NE(oracle.Fingerprint(v), oracle.Fingerprint(v - 1));
    for (int p = 0; p < 2; ++p) {
      EXPECT_EQ(oracle.Greedy(v, p, kTokens).size(), static_cast<size_t>(kTokens));
      EXPECT_NE(oracle.Greedy(v, p, kTokens), oracle.Greedy(v - 1, p, kTokens))
          << "v" << v << " prompt " << p;
    }
  }
}

TEST(OracleTest, GreedyIsWhatTheReferenceGenerationGives) {
  Oracle oracle(Options());
  EXPECT_EQ(oracle.Greedy(3, 1, kTokens),
            testing::Ids(testing::ReferenceGenerate(*oracle.Weights(3), oracle.options().prompts[1],
                                                    Greedy())));
}

TEST(OracleTest, AnAnswerOnOneVersionIsThatVersionsGreedyOutput) {
  Oracle oracle(Options());
  const std::vector<int32_t> v4 = oracle.Greedy(4, 0, kTokens);
  EXPECT_EQ(oracle.JudgeTokens(0, kTokens, v4, 4, 4).verdict, Verdict::kSame);
  const Judgement wrong = oracle.JudgeTokens(0, kTokens, v4, 5, 5);
  EXPECT_EQ(wrong.verdict, Verdict::kMismatch);
  EXPECT_EQ(wrong.matches, 4);
  const Judgement noise = oracle.JudgeTokens(0, kTokens, std::vector<int32_t>(kTokens, 'x'), 4, 4);
  EXPECT_EQ(noise.verdict, Verdict::kMismatch);
  EXPECT_FALSE(noise.matches.has_value());
}

TEST(OracleTest, ACrossingIsExplainedAtEverySwitchPoint) {
  Oracle oracle(Options());
  for (int64_t first = 0; first <= kTokens; ++first) {
    const std::vector<int32_t> tokens = Crossing(oracle, 1, 6, 7, first);
    const Judgement j = oracle.JudgeTokens(1, kTokens, tokens, 6, 7);
    ASSERT_EQ(j.verdict, Verdict::kCrossed) << "switch at " << first;
    // Replaying the explanation gives the same tokens.
    ASSERT_FALSE(j.versions.empty());
    if (j.versions.size() == 1) {
      EXPECT_EQ(oracle.Greedy(j.versions[0], 1, kTokens), tokens);
    } else {
      ASSERT_EQ(j.versions, (std::vector<int64_t>{6, 7}));
      ASSERT_EQ(j.switch_at.size(), 1u);
      EXPECT_EQ(Crossing(oracle, 1, 6, 7, j.switch_at[0]), tokens);
    }
    // A commit keeps the cache, but since versions differ only in the LM
    // head, dropping it gives the same tokens.
    EXPECT_EQ(testing::Ids(testing::SplitGenerate(*oracle.Weights(6), *oracle.Weights(7),
                                                  oracle.options().prompts[1], Greedy(), first,
                                                  /*drop_cache=*/true)),
              tokens);
  }
}

TEST(OracleTest, TwoCommitsInOneRequestAreExplained) {
  Oracle oracle(Options());
  // 3 tokens on v2, 4 on v3, the rest on v4.
  SamplingParams greedy;
  greedy.temperature = 0;
  auto seq = Sequence::Create(oracle.options().config, oracle.options().prompts[0], greedy);
  ASSERT_TRUE(seq.ok());
  for (int n = 0; n < kTokens; ++n) {
    const int64_t v = n < 3 ? 2 : n < 7 ? 3 : 4;
    Sequence* s = &*seq;
    std::optional<SampledToken> t;
    while (!t.has_value()) {
      auto step = StepSequences(*oracle.Weights(v), std::span<Sequence* const>(&s, 1));
      ASSERT_TRUE(step.ok());
      t = (*step)[0];
    }
  }
  const std::vector<int32_t> tokens(seq->generated().begin(), seq->generated().end());
  // The spans that say so explain it; spans one token off, or naming other
  // versions, do not.
  EXPECT_TRUE(oracle.SpansExplainTokens(0, kTokens, tokens, {{0, 2}, {3, 3}, {7, 4}}));
  EXPECT_FALSE(oracle.SpansExplainTokens(0, kTokens, tokens, {{0, 2}, {4, 3}, {7, 4}}));
  EXPECT_FALSE(oracle.SpansExplainTokens(0, kTokens, tokens, {{0, 2}, {3, 3}, {6, 4}}));
  EXPECT_FALSE(oracle.SpansExplainTokens(0, kTokens, tokens, {{0, 2}, {3, 4}}));
  EXPECT_FALSE(oracle.SpansExplainTokens(0, kTokens, tokens, {{0, 3}}));
  // A span that covers no token claims what is not there.
  EXPECT_FALSE(
      oracle.SpansExplainTokens(0, kTokens, tokens, {{0, 2}, {3, 3}, {7, 4}, {kTokens, 5}}));
  EXPECT_FALSE(oracle.SpansExplainTokens(0, kTokens, tokens, {}));
  EXPECT_FALSE(oracle.SpansExplainText(0, kTokens, DecodeTokens(tokens), {{1, 2}}));
  EXPECT_TRUE(oracle.SpansExplainText(0, kTokens, DecodeTokens(tokens), {{0, 2}, {3, 3}, {7, 4}}));
  // One version: its greedy output.
  EXPECT_TRUE(oracle.SpansExplainTokens(0, kTokens, oracle.Greedy(3, 0, kTokens), {{0, 3}}));
  const Judgement j = oracle.JudgeTokens(0, kTokens, tokens, 2, 4);
  EXPECT_EQ(j.verdict, Verdict::kCrossed);
  EXPECT_EQ(j.versions, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(j.switch_at, (std::vector<int>{3, 7}));
  // The same answer labelled as if it never left v3 is not explained.
  EXPECT_EQ(oracle.JudgeTokens(0, kTokens, tokens, 3, 4).verdict, Verdict::kMismatch);
}

TEST(OracleTest, LongerAnswersAreJudgedAtTheirOwnLength) {
  Oracle oracle(Options());
  constexpr int64_t kLong = 48;
  testing::ReferenceOptions greedy = Greedy();
  greedy.max_new_tokens = kLong;
  const std::vector<int32_t> tokens = testing::Ids(testing::SplitGenerate(
      *oracle.Weights(2), *oracle.Weights(3), oracle.options().prompts[0], greedy, 30, false));
  ASSERT_EQ(tokens.size(), static_cast<size_t>(kLong));
  const Judgement j = oracle.JudgeTokens(0, kLong, tokens, 2, 3);
  EXPECT_EQ(j.verdict, Verdict::kCrossed);
  EXPECT_EQ(oracle.Greedy(2, 0, kLong).size(), static_cast<size_t>(kLong));
  EXPECT_EQ(oracle.JudgeTokens(0, kLong, oracle.Greedy(3, 0, kLong), 3, 3).verdict, Verdict::kSame);
  // The first tokens of a long answer are the short one.
  const std::vector<int32_t> shorter = oracle.Greedy(3, 0, kTokens);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), oracle.Greedy(3, 0, kLong).begin()));
}

TEST(OracleTest, TextAnswersAreJudgedByTheirDecoding) {
  Oracle oracle(Options());
  const std::string same = DecodeTokens(oracle.Greedy(9, 0, kTokens));
  EXPECT_EQ(oracle.JudgeText(0, kTokens, same, 9, 9).verdict, Verdict::kSame);
  EXPECT_EQ(oracle.JudgeText(0, kTokens, same, 8, 8).verdict, Verdict::kMismatch);
  const std::string crossed = DecodeTokens(Crossing(oracle, 0, 8, 9, 4));
  EXPECT_EQ(oracle.JudgeText(0, kTokens, crossed, 8, 9).verdict, Verdict::kCrossed);
  EXPECT_EQ(oracle.JudgeText(0, kTokens, crossed + "x", 8, 9).verdict, Verdict::kMismatch);
}

TEST(OracleTest, ASearchOutOfBudgetIsUnjudgedNeverAPass) {
  OracleOptions o = Options();
  o.search_budget = 3;
  Oracle oracle(o);
  const std::vector<int32_t> tokens = Crossing(oracle, 0, 1, 2, 5);
  EXPECT_EQ(oracle.JudgeTokens(0, kTokens, tokens, 1, 2).verdict, Verdict::kUnjudged);
}

}  // namespace
}  // namespace stitch
