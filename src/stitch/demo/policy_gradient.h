// The demo's reinforcement learning: a verifiable toy task and a
// policy-gradient trainer on the reference model's LM head.
//
// Task: continue a prompt; the reward of a completion is the fraction of its
// byte tokens that belong to a target byte set (non-byte tokens count as
// misses). Trainer: only `lm_head.weight` learns; the rest of the model is
// frozen, so each sample's final hidden states are computed once
// (ComputeHiddenStates) and the gradient of the objective with respect to the
// LM head is exact and computed here, in double precision:
//
//   J = sum_s w_s / T * sum_t [min(r_t A_s, clip(r_t, 1 - eps, 1 + eps) A_s)
//                              + beta min(H(pi(. | h_t)), H0)]
//   r_t = exp(log pi(y_t | h_t) - behaviour_logprob_t)
//
// with A_s the group-relative advantage, T the number of completion tokens in
// the batch and w_s the staleness weight of the sample (StalenessWeight).
// Not thread-safe; one trainer per thread.
#pragma once

#include <bitset>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/format/safetensors.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch {

using ByteSet = std::bitset<256>;

// The set of the bytes of `bytes`.
ByteSet MakeByteSet(std::string_view bytes);

// The fraction of `completion` that are byte tokens in `targets`; 0 for an
// empty completion.
double ByteSetReward(std::span<const int32_t> completion, const ByteSet& targets);

// Group-relative advantages: each reward minus its group's mean, divided by
// the group's standard deviation plus 1e-6. Groups are consecutive runs of
// `group_size` rewards. REQUIRES: group_size > 0 and divides rewards.size().
std::vector<double> GroupRelativeAdvantages(std::span<const double> rewards, int group_size);

// How much a sample generated on versions [start, end] counts when the trainer
// is at `trainer_version`: 1 when it is at most `max_lag` behind, 0 (dropped)
// when further behind; a sample that crossed a weight change (start != end)
// counts half, since its behaviour log-probabilities mix two policies.
double StalenessWeight(int64_t version_start, int64_t version_end, int64_t trainer_version,
                       int64_t max_lag);

// One rollout as the engine returned it.
struct Rollout {
  std::vector<int32_t> prompt;             // as sent (BOS first)
  std::vector<int32_t> completion;         // output_ids
  std::vector<double> behaviour_logprobs;  // one per completion token
  double advantage = 0;
  double weight = 1;  // StalenessWeight
};

struct TrainerOptions {
  double learning_rate = 0.5;
  double clip_epsilon = 0.2;
  // beta and H0: J gains beta * min(H, H0) per completion position
  // (weighted like the samples), H the policy's entropy there in nats. A
  // floor, not a push towards uniform: a policy above H0 is left to the
  // reward, one collapsing onto a few tokens (below H0) is pulled back, so
  // that it keeps spreading over the many tokens the reward accepts.
  double entropy_bonus = 0;
  double entropy_floor = 0;
};

struct StepStats {
  double objective = 0;  // J before the update
  double clipped_fraction = 0;
  int64_t tokens = 0;
};

class LmHeadTrainer {
 public:
  // A trainer starting from the checkpoint `tensors` of `config` (validated).
  // REQUIRES: config.tie_word_embeddings is false.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<LmHeadTrainer>> Create(
      const ModelConfig& config, std::vector<HostTensor> tensors, TrainerOptions options);

  // J for `batch` under the current head, and its exact gradient with
  // respect to the head ([vocab, hidden], row-major) when `gradient` is not
  // null. InvalidArgument for a rollout whose log-probabilities do not match
  // its completion, or tokens the model cannot take.
  [[nodiscard]] absl::StatusOr<double> Objective(std::span<const Rollout> batch,
                                                 std::vector<double>* gradient);

  // log pi(completion[t] | prefix) under the current head, per token.
  [[nodiscard]] absl::StatusOr<std::vector<double>> PolicyLogProbs(const Rollout& rollout);

  // `epochs` gradient-ascent steps on J for `batch` (its hidden states are
  // computed once for all of them); `objective` is J before the first.
  [[nodiscard]] absl::StatusOr<StepStats> Step(std::span<const Rollout> batch, int epochs = 1);

  // The policy's probability mass on `targets` averaged over every completion
  // position of `batch`: the expected reward of the next token there.
  [[nodiscard]] absl::StatusOr<double> TargetMass(std::span<const Rollout> batch,
                                                  const ByteSet& targets);

  std::span<float> lm_head() { return lm_head_; }
  // The whole checkpoint with the current head, for EncodeDelta /
  // WriteFullVersion. Valid until the next Step.
  std::vector<TensorView> Tensors() const;
  const ModelConfig& config() const { return config_; }

 private:
  LmHeadTrainer() = default;
  // Final hidden states predicting each completion token: [completion, hidden].
  absl::StatusOr<std::vector<float>> Hidden(const Rollout& rollout);
  // Hidden(r) for every rollout of `batch`, after checking that its
  // log-probabilities match its completion and its tokens are in the vocabulary.
  absl::StatusOr<std::vector<std::vector<float>>> BatchHidden(std::span<const Rollout> batch);
  // J (and its gradient when `gradient` is not null) for `batch` given its
  // BatchHidden and its `tokens` > 0 completion tokens.
  double ObjectiveOn(std::span<const Rollout> batch, const std::vector<std::vector<float>>& hidden,
                     int64_t tokens, std::vector<double>* gradient) const;
  // log-softmax of the current head at hidden state `h`.
  std::vector<double> LogProbs(std::span<const float> h) const;

  ModelConfig config_;
  TrainerOptions options_;
  std::vector<HostTensor> tensors_;
  size_t head_index_ = 0;
  std::vector<float> lm_head_;
  std::shared_ptr<const ModelWeights> frozen_;
};

}  // namespace stitch
