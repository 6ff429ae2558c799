#include "stitch/demo/policy_gradient.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "stitch/refengine/model.h"

namespace stitch {
namespace {

constexpr std::string_view kLmHeadName = "lm_head.weight";

int64_t CompletionTokens(std::span<const Rollout> batch) {
  int64_t tokens = 0;
  for (const Rollout& r : batch) tokens += static_cast<int64_t>(r.completion.size());
  return tokens;
}

}  // namespace

ByteSet MakeByteSet(std::string_view bytes) {
  ByteSet set;
  for (char c : bytes) set.set(static_cast<unsigned char>(c));
  return set;
}

double ByteSetReward(std::span<const int32_t> completion, const ByteSet& targets) {
  if (completion.empty()) return 0;
  int64_t hits = 0;
  for (int32_t id : completion) {
    if (id >= 0 && id < 256 && targets.test(static_cast<size_t>(id))) ++hits;
  }
  return static_cast<double>(hits) / static_cast<double>(completion.size());
}

std::vector<double> GroupRelativeAdvantages(std::span<const double> rewards, int group_size) {
  std::vector<double> out(rewards.size());
  for (size_t g = 0; g < rewards.size(); g += static_cast<size_t>(group_size)) {
    double mean = 0;
    for (int i = 0; i < group_size; ++i) mean += rewards[g + i];
    mean /= group_size;
    double var = 0;
    for (int i = 0; i < group_size; ++i) var += (rewards[g + i] - mean) * (rewards[g + i] - mean);
    double sd = std::sqrt(var / group_size);
    for (int i = 0; i < group_size; ++i) out[g + i] = (rewards[g + i] - mean) / (sd + 1e-6);
  }
  return out;
}

double StalenessWeight(int64_t version_start, int64_t version_end, int64_t trainer_version,
                       int64_t max_lag) {
  if (version_start < trainer_version - max_lag) return 0;
  return version_start == version_end ? 1.0 : 0.5;
}

absl::StatusOr<std::unique_ptr<LmHeadTrainer>> LmHeadTrainer::Create(
    const ModelConfig& config, std::vector<HostTensor> tensors, TrainerOptions options) {
  if (config.tie_word_embeddings) {
    return absl::InvalidArgumentError("demo trainer: the LM head must not be tied");
  }
  std::vector<TensorView> views;
  for (const HostTensor& t : tensors) views.push_back(t.view());
  auto frozen = ModelWeights::FromTensors(config, views);
  if (!frozen.ok()) return frozen.status();
  std::unique_ptr<LmHeadTrainer> trainer(new LmHeadTrainer());
  trainer->config_ = config;
  trainer->options_ = options;
  trainer->frozen_ = *std::move(frozen);
  auto head = trainer->frozen_->lm_head();
  trainer->lm_head_.assign(head.begin(), head.end());
  trainer->tensors_ = std::move(tensors);
  for (size_t i = 0; i < trainer->tensors_.size(); ++i) {
    if (trainer->tensors_[i].name == kLmHeadName) trainer->head_index_ = i;
  }
  return trainer;
}

absl::StatusOr<std::vector<float>> LmHeadTrainer::Hidden(const Rollout& rollout) {
  if (rollout.prompt.empty()) return absl::InvalidArgumentError("demo trainer: empty prompt");
  std::vector<int32_t> tokens = rollout.prompt;
  // The last completion token predicts nothing we train on.
  if (!rollout.completion.empty()) {
    tokens.insert(tokens.end(), rollout.completion.begin(), rollout.completion.end() - 1);
  }
  auto hidden = ComputeHiddenStates(*frozen_, tokens);
  if (!hidden.ok()) return hidden.status();
  const int64_t h = config_.hidden_size;
  const int64_t first = static_cast<int64_t>(rollout.prompt.size()) - 1;
  std::vector<float> out(rollout.completion.size() * static_cast<size_t>(h));
  for (size_t t = 0; t < rollout.completion.size(); ++t) {
    auto row = hidden->row(first + static_cast<int64_t>(t));
    std::copy(row.begin(), row.end(), out.begin() + static_cast<ptrdiff_t>(t * h));
  }
  return out;
}

std::vector<double> LmHeadTrainer::LogProbs(std::span<const float> h) const {
  const int64_t vocab = config_.vocab_size;
  const int64_t hidden = config_.hidden_size;
  std::vector<double> logits(static_cast<size_t>(vocab));
  double max = -INFINITY;
  for (int64_t v = 0; v < vocab; ++v) {
    double s = 0;
    const float* w = lm_head_.data() + v * hidden;
    for (int64_t k = 0; k < hidden; ++k) s += static_cast<double>(w[k]) * h[k];
    logits[v] = s;
    max = std::max(max, s);
  }
  double z = 0;
  for (double l : logits) z += std::exp(l - max);
  double log_z = max + std::log(z);
  for (double& l : logits) l -= log_z;
  return logits;
}

absl::StatusOr<std::vector<std::vector<float>>> LmHeadTrainer::BatchHidden(
    std::span<const Rollout> batch) {
  const int64_t vocab = config_.vocab_size;
  std::vector<std::vector<float>> out;
  out.reserve(batch.size());
  for (const Rollout& r : batch) {
    if (r.behaviour_logprobs.size() != r.completion.size()) {
      return absl::InvalidArgumentError(absl::StrCat("demo trainer: ", r.behaviour_logprobs.size(),
                                                     " log-probabilities for ", r.completion.size(),
                                                     " completion tokens"));
    }
    auto hidden = Hidden(r);
    if (!hidden.ok()) return hidden.status();
    for (const int32_t y : r.completion) {
      if (y < 0 || y >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("demo trainer: token ", y, " out of range"));
      }
    }
    out.push_back(*std::move(hidden));
  }
  return out;
}

double LmHeadTrainer::ObjectiveOn(std::span<const Rollout> batch,
                                  const std::vector<std::vector<float>>& hidden, int64_t tokens,
                                  std::vector<double>* gradient) const {
  const int64_t vocab = config_.vocab_size;
  const int64_t hidden_size = config_.hidden_size;
  if (gradient != nullptr) gradient->assign(lm_head_.size(), 0.0);
  const double eps = options_.clip_epsilon;
  double objective = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Rollout& r = batch[i];
    for (size_t t = 0; t < r.completion.size(); ++t) {
      const int32_t y = r.completion[t];
      std::span<const float> h(hidden[i].data() + t * static_cast<size_t>(hidden_size),
                               static_cast<size_t>(hidden_size));
      std::vector<double> logp = LogProbs(h);
      const double ratio = std::exp(logp[y] - r.behaviour_logprobs[t]);
      const double a = r.advantage;
      const double clipped = std::clamp(ratio, 1 - eps, 1 + eps);
      const double scale = r.weight / static_cast<double>(tokens);
      const bool unclipped_active = ratio * a <= clipped * a;
      objective += scale * (unclipped_active ? ratio * a : clipped * a);
      const double beta = options_.entropy_bonus;
      if (beta > 0) {
        double entropy = 0;
        for (int64_t v = 0; v < vocab; ++v) entropy -= std::exp(logp[v]) * logp[v];
        objective += scale * beta * std::min(entropy, options_.entropy_floor);
        if (gradient != nullptr && entropy < options_.entropy_floor) {
          // dH/d logit_v = -p_v (log p_v + H).
          for (int64_t v = 0; v < vocab; ++v) {
            const double d = -scale * beta * std::exp(logp[v]) * (logp[v] + entropy);
            double* g = gradient->data() + v * hidden_size;
            for (int64_t k = 0; k < hidden_size; ++k) g[k] += d * h[k];
          }
        }
      }
      if (gradient == nullptr || !unclipped_active) continue;
      // d(ratio * a)/d logit_v = ratio * a * (1[v == y] - p_v); d logit_v / d W_v = h.
      const double coef = scale * ratio * a;
      for (int64_t v = 0; v < vocab; ++v) {
        const double d = coef * ((v == y ? 1.0 : 0.0) - std::exp(logp[v]));
        double* g = gradient->data() + v * hidden_size;
        for (int64_t k = 0; k < hidden_size; ++k) g[k] += d * h[k];
      }
    }
  }
  return objective;
}

absl::StatusOr<double> LmHeadTrainer::Objective(std::span<const Rollout> batch,
                                                std::vector<double>* gradient) {
  const int64_t tokens = CompletionTokens(batch);
  if (tokens == 0) {
    if (gradient != nullptr) gradient->assign(lm_head_.size(), 0.0);
    return 0.0;
  }
  auto hidden = BatchHidden(batch);
  if (!hidden.ok()) return hidden.status();
  return ObjectiveOn(batch, *hidden, tokens, gradient);
}

absl::StatusOr<StepStats> LmHeadTrainer::Step(std::span<const Rollout> batch, int epochs) {
  StepStats stats;
  stats.tokens = CompletionTokens(batch);
  if (stats.tokens > 0) {
    // The rest of the model is frozen: the hidden states serve every epoch.
    auto hidden = BatchHidden(batch);
    if (!hidden.ok()) return hidden.status();
    std::vector<double> gradient;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      const double objective = ObjectiveOn(batch, *hidden, stats.tokens, &gradient);
      if (epoch == 0) stats.objective = objective;
      for (size_t i = 0; i < lm_head_.size(); ++i) {
        lm_head_[i] += static_cast<float>(options_.learning_rate * gradient[i]);
      }
    }
  }
  HostTensor& head = tensors_[head_index_];
  head = HostTensor::FromFloats(head.name, head.shape, lm_head_, head.dtype);
  return stats;
}

absl::StatusOr<std::vector<double>> LmHeadTrainer::PolicyLogProbs(const Rollout& rollout) {
  auto hidden = Hidden(rollout);
  if (!hidden.ok()) return hidden.status();
  std::vector<double> out;
  for (size_t t = 0; t < rollout.completion.size(); ++t) {
    std::span<const float> h(hidden->data() + t * static_cast<size_t>(config_.hidden_size),
                             static_cast<size_t>(config_.hidden_size));
    const int32_t y = rollout.completion[t];
    if (y < 0 || y >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("demo trainer: token ", y, " out of range"));
    }
    out.push_back(LogProbs(h)[static_cast<size_t>(y)]);
  }
  return out;
}

absl::StatusOr<double> LmHeadTrainer::TargetMass(std::span<const Rollout> batch,
                                                 const ByteSet& targets) {
  double mass = 0;
  int64_t positions = 0;
  for (const Rollout& r : batch) {
    auto hidden = Hidden(r);
    if (!hidden.ok()) return hidden.status();
    for (size_t t = 0; t < r.completion.size(); ++t) {
      std::span<const float> h(hidden->data() + t * static_cast<size_t>(config_.hidden_size),
                               static_cast<size_t>(config_.hidden_size));
      std::vector<double> logp = LogProbs(h);
      for (int v = 0; v < 256; ++v) {
        if (targets.test(static_cast<size_t>(v))) mass += std::exp(logp[v]);
      }
      ++positions;
    }
  }
  return positions == 0 ? 0.0 : mass / static_cast<double>(positions);
}

std::vector<TensorView> LmHeadTrainer::Tensors() const {
  std::vector<TensorView> views;
  for (const HostTensor& t : tensors_) views.push_back(t.view());
  return views;
}

}  // namespace stitch
