// Turning one step's rollouts, as the fleet returned them, into the trainer's
// batch: rewards from the task, group-relative advantages, and staleness
// weights from the versions each response was generated on.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "stitch/demo/policy_gradient.h"
#include "stitch/demo/rollout.h"

namespace stitch {

struct BatchStats {
  double mean_reward = 0;
  int64_t dropped = 0;        // too stale: weight 0
  int64_t crossed = 0;        // generated across a weight change (a commit mid-generation)
  int64_t crossed_exact = 0;  // of those, weighted per token from exact spans
};

// prompts[i] produced generated[i]; consecutive runs of `group_size`
// rollouts share a prompt. The trainer is at `trainer_version` and accepts
// samples up to `max_lag` versions behind: per token when the response's
// spans say which version generated which tokens (TokenStalenessWeights),
// else per sample (StalenessWeight).
// REQUIRES: prompts.size() == generated.size(), a multiple of group_size > 0.
std::vector<Rollout> BuildBatch(std::span<const std::vector<int32_t>> prompts,
                                std::span<const GeneratedRollout> generated, int group_size,
                                const ByteSet& targets, int64_t trainer_version, int64_t max_lag,
                                BatchStats* stats);

}  // namespace stitch
