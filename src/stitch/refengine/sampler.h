// Token sampling: temperature, top-k and top-p over one row of logits, with
// counter-based seeded randomness, and the log-probabilities the RL trainer
// compares against.
//
// A draw depends only on (logits, params, draw index): the n-th token of a
// request with seed s uses the n-th number of s's stream, whatever else runs
// in the batch and however often the request's cache is rebuilt.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace stitch {

struct SamplingParams {
  // 0 picks the most likely token (greedy; ties go to the lowest id).
  float temperature = 1.0f;
  // Keep only the k most likely tokens; <= 0 keeps all (SGLang uses -1).
  int32_t top_k = -1;
  // Keep the smallest set of most likely tokens whose probability reaches
  // top_p, in (0, 1]; 1 keeps all.
  float top_p = 1.0f;
  uint64_t seed = 0;

  // InvalidArgument naming the field: temperature must be finite and >= 0,
  // top_p finite and in (0, 1].
  [[nodiscard]] absl::Status Validate() const;
};

struct SampledToken {
  int32_t id = 0;
  // log softmax(logits / temperature)[id] over the whole vocabulary, before
  // top-k / top-p truncation; with temperature 0, log softmax(logits)[id].
  double logprob = 0;
};

// log softmax(logits / temperature) for every token, computed in double. A
// temperature of 0 means 1 here. This is the exact function behind
// SampledToken::logprob; a trainer that calls it on the same logits gets the
// same bits. REQUIRES: temperature >= 0, logits non-empty.
std::vector<double> LogSoftmax(std::span<const float> logits, float temperature);

// The number in [0, 1) that draw `index` of stream `seed` uses (splitmix64
// of a Weyl sequence, 53 bits).
double UniformDraw(uint64_t seed, uint64_t index);

// Samples one token. With temperature > 0, the candidates are ordered by
// probability (ties by lower id); top_k keeps the first k, top_p keeps those
// whose preceding cumulative probability (over the untruncated distribution,
// as SGLang computes it) is below top_p; the draw UniformDraw(seed, index) is
// mapped through the kept candidates' cumulative probability, renormalised.
// Without truncation the walk is in token-id order and nothing is sorted.
// REQUIRES: params.Validate() is OK, logits non-empty and finite.
SampledToken SampleToken(std::span<const float> logits, const SamplingParams& params,
                         uint64_t draw_index);

}  // namespace stitch
