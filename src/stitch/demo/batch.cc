#include "stitch/demo/batch.h"

namespace stitch {

std::vector<Rollout> BuildBatch(std::span<const std::vector<int32_t>> prompts,
                                std::span<const GeneratedRollout> generated, int group_size,
                                const ByteSet& targets, int64_t trainer_version, int64_t max_lag,
                                BatchStats* stats) {
  std::vector<double> rewards;
  rewards.reserve(generated.size());
  for (const GeneratedRollout& g : generated)
    rewards.push_back(ByteSetReward(g.output_ids, targets));
  std::vector<double> advantages = GroupRelativeAdvantages(rewards, group_size);
  BatchStats local;
  std::vector<Rollout> batch;
  batch.reserve(generated.size());
  for (size_t i = 0; i < generated.size(); ++i) {
    Rollout r;
    r.prompt = prompts[i];
    r.completion = generated[i].output_ids;
    r.behaviour_logprobs = generated[i].logprobs;
    r.advantage = advantages[i];
    r.weight = StalenessWeight(generated[i].version_start, generated[i].version_end,
                               trainer_version, max_lag);
    if (r.weight == 0) ++local.dropped;
    if (generated[i].version_start != generated[i].version_end) ++local.crossed;
    local.mean_reward += rewards[i];
    batch.push_back(std::move(r));
  }
  if (!generated.empty()) local.mean_reward /= static_cast<double>(generated.size());
  if (stats != nullptr) *stats = local;
  return batch;
}

}  // namespace stitch
