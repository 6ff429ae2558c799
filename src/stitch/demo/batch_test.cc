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

}  // namespace
}  // namespace stitch
