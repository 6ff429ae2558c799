// The reference engine's forward pass: a Llama decoder (RMSNorm, rotary
// positions, causal multi-head / grouped-query attention over a KV cache,
// SwiGLU MLP, tied or untied LM head) computed in float32 on one CPU thread.
//
// One call advances many sequences together: every new token of every input
// goes through each projection as one matrix product, a prompt is processed as
// a block of rows (prefill) and a decoding sequence as one row, in any mix.
// Results are bit-for-bit independent of how sequences are batched and of
// whether a prefix was computed in one call or token by token (kernels.h).
//
// Weights and caches are separate: a call reads one immutable ModelWeights
// snapshot and appends to caches owned by the caller, so a cache built under
// one version can continue under another with the same shapes (an in-place
// weight update), or be cleared (a cache flush) and rebuilt.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch {

// A dense row-major float matrix.
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> data;  // rows * cols

  Matrix() = default;
  Matrix(int64_t r, int64_t c) : rows(r), cols(c), data(static_cast<size_t>(r * c)) {}
  std::span<float> row(int64_t r) { return {data.data() + r * cols, static_cast<size_t>(cols)}; }
  std::span<const float> row(int64_t r) const {
    return {data.data() + r * cols, static_cast<size_t>(cols)};
  }
};

// The keys and values of one sequence's past positions, for every layer.
// Grows as tokens are appended, up to max_position_embeddings positions.
// Movable; not thread-safe (one sequence is advanced by one thread at a time).
class KvCache {
 public:
  // An empty cache shaped for `config`. REQUIRES: config.Validate() is OK.
  explicit KvCache(const ModelConfig& config);

  int64_t length() const { return length_; }      // positions held
  int64_t capacity() const { return capacity_; }  // max_position_embeddings

  // Whether weights of `config` can continue this cache: same layer count,
  // key/value width and context length.
  bool CompatibleWith(const ModelConfig& config) const;

  // Drops every position and releases the memory.
  void Clear();

  // Makes this cache hold the first `n` positions of `from` (a prefix cache
  // hit). REQUIRES: from is compatible with this cache's shape, and
  // 0 <= n <= from.length().
  void CopyPrefix(const KvCache& from, int64_t n);

  size_t memory_bytes() const;

 private:
  friend class ForwardPass;

  int64_t layers_;
  int64_t kv_dim_;
  int64_t capacity_;
  int64_t length_ = 0;
  std::vector<std::vector<float>> keys_;    // per layer, [length, kv_dim], rotary applied
  std::vector<std::vector<float>> values_;  // per layer, [length, kv_dim]
};

// New tokens for one sequence: they take positions cache->length(),
// cache->length() + 1, ... and are appended to the cache.
struct ForwardInput {
  KvCache* cache = nullptr;
  std::span<const int32_t> tokens;
};

// Runs `inputs` through `weights` and returns the logits of each input's last
// token: row i is for inputs[i], [inputs.size(), vocab_size]. Errors, all
// InvalidArgument and detected before any cache changes: a null or
// incompatible cache, a cache named twice, an input without tokens, a token
// outside [0, vocab_size), or more tokens than the cache has room for.
[[nodiscard]] absl::StatusOr<Matrix> Forward(const ModelWeights& weights,
                                             std::span<const ForwardInput> inputs);

// The final hidden state (after the final RMSNorm, the LM head's input) at
// every position of `tokens`, computed from an empty cache:
// [tokens.size(), hidden_size]. ApplyLmHead of row i gives the logits that
// predict tokens[i + 1], bit-for-bit the logits Forward returns for that
// prefix. Errors as Forward's.
[[nodiscard]] absl::StatusOr<Matrix> ComputeHiddenStates(const ModelWeights& weights,
                                                         std::span<const int32_t> tokens);

// Logits for hidden states: hidden [n, hidden_size] times the LM head's
// transpose, [n, vocab_size]. REQUIRES: hidden.cols == hidden_size.
Matrix ApplyLmHead(const ModelWeights& weights, const Matrix& hidden);

}  // namespace stitch
