#include "stitch/refengine/sequence.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"

namespace stitch {

Sequence::Sequence(const ModelConfig& config, std::vector<int32_t> prompt,
                   const SamplingParams& params)
    : tokens_(std::move(prompt)),
      prompt_length_(static_cast<int64_t>(tokens_.size())),
      params_(params),
      cache_(config) {}

absl::StatusOr<Sequence> Sequence::Create(const ModelConfig& config, std::vector<int32_t> prompt,
                                          const SamplingParams& params) {
  if (absl::Status s = params.Validate(); !s.ok()) return s;
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  if (static_cast<int64_t>(prompt.size()) > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt.size(),
                                                   " tokens, more than the model's context of ",
                                                   config.max_position_embeddings));
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                     ", outside the vocabulary [0, ",
                                                     config.vocab_size, ")"));
    }
  }
  return Sequence(config, std::move(prompt), params);
}

absl::StatusOr<std::vector<std::optional<SampledToken>>> StepSequences(
    const ModelWeights& weights, std::span<Sequence* const> sequences, const StepOptions& options) {
  std::set<const Sequence*> seen;
  for (size_t i = 0; i < sequences.size(); ++i) {
    const Sequence* s = sequences[i];
    if (s == nullptr) return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " is null"));
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", i, " is listed twice"));
    }
    if (!s->CanAdvance()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", i, " has ", s->tokens().size(), " tokens, the whole context of ",
          s->cache_.capacity(), " positions; it cannot generate more"));
    }
  }

  std::vector<ForwardInput> inputs;
  inputs.reserve(sequences.size());
  std::vector<bool> completes;
  for (Sequence* s : sequences) {
    const int64_t total = static_cast<int64_t>(s->tokens_.size());
    int64_t n = total - s->cache_.length();
    if (options.max_tokens_per_sequence > 0) n = std::min(n, options.max_tokens_per_sequence);
    inputs.push_back(ForwardInput{
        &s->cache_, std::span<const int32_t>(s->tokens_)
                        .subspan(static_cast<size_t>(s->cache_.length()), static_cast<size_t>(n))});
    completes.push_back(s->cache_.length() + n == total);
  }
  absl::StatusOr<Matrix> logits = Forward(weights, inputs);
  if (!logits.ok()) return logits.status();

  std::vector<std::optional<SampledToken>> out(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (!completes[i]) continue;
    Sequence& s = *sequences[i];
    const uint64_t draw =
        static_cast<uint64_t>(s.tokens_.size()) - static_cast<uint64_t>(s.prompt_length_);
    out[i] = SampleToken(logits->row(static_cast<int64_t>(i)), s.params_, draw);
    s.tokens_.push_back(out[i]->id);
  }
  return out;
}

absl::StatusOr<std::vector<double>> CompletionLogprobs(const ModelWeights& weights,
                                                       std::span<const int32_t> tokens,
                                                       int64_t prompt_length, float temperature) {
  if (prompt_length < 1 || prompt_length > static_cast<int64_t>(tokens.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_length ", prompt_length, " must be in [1, ", tokens.size(), "]"));
  }
  if (!(std::isfinite(temperature) && temperature >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be a finite number >= 0, got ", temperature));
  }
  std::vector<double> out;
  if (static_cast<int64_t>(tokens.size()) == prompt_length) return out;
  if (tokens.back() < 0 || tokens.back() >= weights.config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("token id ", tokens.back(),
                                                   " is outside the vocabulary [0, ",
                                                   weights.config().vocab_size, ")"));
  }
  // Hidden state i predicts token i + 1; the last token predicts nothing.
  absl::StatusOr<Matrix> hidden = ComputeHiddenStates(weights, tokens.first(tokens.size() - 1));
  if (!hidden.ok()) return hidden.status();
  Matrix wanted(static_cast<int64_t>(tokens.size()) - prompt_length, weights.config().hidden_size);
  for (int64_t r = 0; r < wanted.rows; ++r) {
    const std::span<const float> h = hidden->row(prompt_length - 1 + r);
    std::copy(h.begin(), h.end(), wanted.row(r).begin());
  }
  const Matrix logits = ApplyLmHead(weights, wanted);
  for (int64_t r = 0; r < logits.rows; ++r) {
    out.push_back(LogSoftmax(logits.row(r), temperature)[tokens[prompt_length + r]]);
  }
  return out;
}

}  // namespace stitch
