#include "stitch/demo/batch.h"

#include <algorithm>

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
    if (const std::optional<VersionSpans>& spans = generated[i].spans; spans.has_value()) {
      // The sidecar placed every version exactly: weigh each token by its own.
      std::vector<std::pair<int64_t, int64_t>> pairs;
      for (const VersionSpan& s : *spans) pairs.emplace_back(s.offset, s.version);
      r.token_weights = TokenStalenessWeights(pairs, r.completion.size(), trainer_version, max_lag);
      r.weight = 1;
      if (spans->size() > 1) ++local.crossed_exact;
      if (std::all_of(r.token_weights.begin(), r.token_weights.end(),
                      [](double w) { return w == 0; })) {
        ++local.dropped;
      }
    } else if (r.weight == 0) {
      ++local.dropped;
    }
    const bool crossed = generated[i].spans.has_value()
                             ? generated[i].spans->size() > 1
                             : generated[i].version_start != generated[i].version_end;
    if (crossed) ++local.crossed;
    local.mean_reward += rewards[i];
    batch.push_back(std::move(r));
  }
  if (!generated.empty()) local.mean_reward /= static_cast<double>(generated.size());
  if (stats != nullptr) *stats = local;
  return batch;
}

}  // namespace stitch
