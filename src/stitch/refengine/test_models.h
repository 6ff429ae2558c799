// Small models for the refengine tests: odd sizes that exercise every kernel
// edge (an inner size that is not a multiple of 8, an odd vocabulary, grouped
// query attention) and weights large enough that every layer matters.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch::testing {

// 3 heads of 12 sharing 1 key/value head, untied, intermediate 52, vocab 259.
inline ModelConfig GqaConfig() {
  ModelConfig c;
  c.hidden_size = 36;
  c.intermediate_size = 52;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 3;
  c.num_key_value_heads = 1;
  c.vocab_size = 259;
  c.max_position_embeddings = 48;
  c.rope_theta = 500.0;
  c.tie_word_embeddings = false;
  return c;
}

// 4 heads of 8 with their own key/value heads, tied, intermediate 64.
inline ModelConfig MhaTiedConfig() {
  ModelConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.vocab_size = 258;
  c.max_position_embeddings = 40;
  c.tie_word_embeddings = true;
  return c;
}

// 1 layer, 2 heads of 8 with their own key/value heads, intermediate 32,
// context 64, default vocabulary: the smallest model, for tests of the code
// around one (trainers, publishers).
inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  return c;
}

// Tensors of `config` with values of standard deviation `scale` (norms
// 1 + noise), from a generator seeded by `seed`, as config.weight_dtype.
inline std::vector<HostTensor> RandomTensors(const ModelConfig& config, uint64_t seed,
                                             double scale = 0.3) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 12345;
  auto next = [&state] {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
  };
  std::vector<HostTensor> out;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    const bool norm = spec.shape.size() == 1;
    for (float& x : v) {
      x = static_cast<float>(norm ? 1.0 + 0.2 * next() : scale * std::sqrt(3.0) * next());
    }
    out.push_back(HostTensor::FromFloats(spec.name, spec.shape, v, config.weight_dtype));
  }
  return out;
}

inline std::vector<TensorView> Views(const std::vector<HostTensor>& tensors) {
  std::vector<TensorView> views;
  for (const HostTensor& t : tensors) views.push_back(t.view());
  return views;
}

inline std::shared_ptr<const ModelWeights> RandomWeights(const ModelConfig& config, uint64_t seed,
                                                         double scale = 0.3) {
  std::vector<HostTensor> tensors = RandomTensors(config, seed, scale);
  auto w = ModelWeights::FromTensors(config, Views(tensors));
  return w.ok() ? *w : nullptr;
}

}  // namespace stitch::testing
