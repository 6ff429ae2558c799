// Continuous batching's unit of work: one generation's tokens, KV cache and
// sampling state, and the step that advances many of them together.
//
// A scheduler keeps a set of Sequences and calls StepSequences with the ones
// to advance and the weights snapshot of that step; sequences join and leave
// between steps, and the weights may change between steps (an in-place update:
// each cache keeps the keys and values it computed under earlier weights).
// DropCache makes a sequence recompute its whole prefix on its next step,
// under the weights of that step. Stopping (EOS, stop strings, token limits)
// is the caller's decision: it simply stops stepping the sequence.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/refengine/model.h"
#include "stitch/refengine/sampler.h"

namespace stitch {

struct StepOptions {
  // The most uncached tokens one sequence feeds in one step (chunked prefill,
  // so that a long prompt does not stall the others); 0 feeds them all.
  int64_t max_tokens_per_sequence = 0;
};

class Sequence;

// Advances every sequence by one step of one forward pass under `weights`:
// each feeds its uncached tokens (at most max_tokens_per_sequence), and each
// that has then fed all its tokens samples and appends its next token, which
// the result holds at the sequence's index (nullopt for a sequence still in
// its prefill). The n-th generated token of a sequence is drawn with draw
// index n of its seed, so tokens and logprobs are the same for any batching,
// any chunking and any cache drop, given the same weights.
// InvalidArgument, before anything changes, when a sequence is null, listed
// twice, cannot advance, or has a cache incompatible with `weights`.
[[nodiscard]] absl::StatusOr<std::vector<std::optional<SampledToken>>> StepSequences(
    const ModelWeights& weights, std::span<Sequence* const> sequences,
    const StepOptions& options = {});

// The log-probability of each token after the prompt, tokens[i] for i in
// [prompt_length, tokens.size()), under `weights` at `temperature`: what a
// trainer compares with the behaviour log-probabilities of a generation.
// Bit-for-bit the SampledToken::logprob values StepSequences reported when
// it generated those tokens with the same weights and temperature (from an
// unchanged cache). InvalidArgument when prompt_length is not in
// [1, tokens.size()], or as ComputeHiddenStates.
[[nodiscard]] absl::StatusOr<std::vector<double>> CompletionLogprobs(
    const ModelWeights& weights, std::span<const int32_t> tokens, int64_t prompt_length,
    float temperature);

// Movable; not thread-safe: one thread steps a sequence at a time.
class Sequence {
 public:
  // A sequence that will continue `prompt` under `config`'s model.
  // InvalidArgument when the prompt is empty, holds an id outside
  // [0, vocab_size), or is longer than max_position_embeddings, or when
  // `params` are invalid.
  [[nodiscard]] static absl::StatusOr<Sequence> Create(const ModelConfig& config,
                                                       std::vector<int32_t> prompt,
                                                       const SamplingParams& params);

  // The prompt followed by every generated token.
  std::span<const int32_t> tokens() const { return tokens_; }
  int64_t prompt_length() const { return prompt_length_; }
  std::span<const int32_t> generated() const {
    return std::span<const int32_t>(tokens_).subspan(static_cast<size_t>(prompt_length_));
  }
  const SamplingParams& params() const { return params_; }

  // Tokens whose keys and values are in the cache; the rest are fed on the
  // next step. Always < tokens().size().
  int64_t cached_length() const { return cache_.length(); }

  // Whether a step can produce another token: every token so far must fit in
  // the context (tokens().size() <= max_position_embeddings), so a prompt of
  // the full context length still yields one token.
  bool CanAdvance() const { return static_cast<int64_t>(tokens_.size()) <= cache_.capacity(); }

  // Forgets the cache; the next step recomputes every token.
  void DropCache() { cache_.Clear(); }

  // Starts the cache from the first `n` positions of `from`, which must hold
  // the keys and values of tokens()[0, n) under the weights of the next
  // step (a prefix cache hit: the result is then the same as computing
  // them). REQUIRES: n < tokens().size(), n <= from.length(), compatible.
  void SeedCache(const KvCache& from, int64_t n) { cache_.CopyPrefix(from, n); }

  const KvCache& cache() const { return cache_; }

 private:
  friend absl::StatusOr<std::vector<std::optional<SampledToken>>> StepSequences(
      const ModelWeights&, std::span<Sequence* const>, const StepOptions&);

  Sequence(const ModelConfig& config, std::vector<int32_t> prompt, const SamplingParams& params);

  std::vector<int32_t> tokens_;
  int64_t prompt_length_;
  SamplingParams params_;
  KvCache cache_;
};

}  // namespace stitch
