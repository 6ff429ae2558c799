#include "stitch/demo/batch.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(BuildBatch, RewardsAdvantagesAndStalenessFromTheResponses) {
  std::vector<std::vector<int32_t>> prompts(4, std::vector<int32_t>{256, 'q'});
  std::vector<GeneratedRollout> generated(4);
  generated[0] = {{'a', 'a'}, {-1, -1}, 5, 5};  // reward 1
  generated[1] = {{'z', 'z'}, {-1, -1}, 5, 5};  // reward 0
  generated[2] = {{'a', 'z'}, {-1, -1}, 3, 3};  // too stale at version 6, lag 1
  generated[3] = {{'a', 'z'}, {-1, -1}, 5, 6};  // crossed a commit
  BatchStats stats;
  std::vector<Rollout> batch = BuildBatch(prompts, generated, 2, MakeByteSet("a"), 6, 1, &stats);
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_GT(batch[0].advantage, 0);
  EXPECT_LT(batch[1].advantage, 0);
  EXPECT_EQ(batch[2].weight, 0);
  EXPECT_EQ(batch[3].weight, 0.5);
  EXPECT_EQ(batch[0].weight, 1);
  EXPECT_EQ(stats.dropped, 1);
  EXPECT_EQ(stats.crossed, 1);
  EXPECT_DOUBLE_EQ(stats.mean_reward, 0.5);
  EXPECT_EQ(batch[0].behaviour_logprobs, (std::vector<double>{-1, -1}));
}

TEST(BuildBatch, ExactSpansWeighEachTokenByTheVersionThatGeneratedIt) {
  std::vector<std::vector<int32_t>> prompts(2, std::vector<int32_t>{256, 'q'});
  std::vector<GeneratedRollout> generated(2);
  // Started on 3 (too stale at 6 with lag 1), crossed to 5 at token 2.
  generated[0] = {{'a', 'a', 'z', 'z'}, {-1, -1, -1, -1}, 3, 5, VersionSpans{{0, 3}, {2, 5}}};
  // Spans unknown across a commit: per sample, halved.
  generated[1] = {{'a', 'z'}, {-1, -1}, 5, 6, std::nullopt};
  BatchStats stats;
  std::vector<Rollout> batch = BuildBatch(prompts, generated, 2, MakeByteSet("a"), 6, 1, &stats);
  EXPECT_EQ(batch[0].token_weights, (std::vector<double>{0, 0, 1, 1}));
  EXPECT_TRUE(batch[1].token_weights.empty());
  EXPECT_EQ(batch[1].weight, 0.5);
  EXPECT_EQ(stats.crossed, 2);
  EXPECT_EQ(stats.crossed_exact, 1);
  EXPECT_EQ(stats.dropped, 0);
}

TEST(TokenStalenessWeights, EachSpanWeighsItsTokens) {
  const std::vector<std::pair<int64_t, int64_t>> spans{{0, 1}, {3, 4}, {5, 6}};
  EXPECT_EQ(TokenStalenessWeights(spans, 7, 6, 2), (std::vector<double>{0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(TokenStalenessWeights({}, 2, 6, 2), (std::vector<double>{0, 0}));
}

}  // namespace
}  // namespace stitch
