#include "stitch/refengine/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "stitch/refengine/kernels.h"

namespace stitch {

KvCache::KvCache(const ModelConfig& config)
    : layers_(config.num_hidden_layers),
      kv_dim_(config.kv_dim()),
      capacity_(config.max_position_embeddings),
      keys_(static_cast<size_t>(layers_)),
      values_(static_cast<size_t>(layers_)) {}

bool KvCache::CompatibleWith(const ModelConfig& config) const {
  return layers_ == config.num_hidden_layers && kv_dim_ == config.kv_dim() &&
         capacity_ == config.max_position_embeddings;
}

void KvCache::Clear() {
  for (auto& k : keys_) std::vector<float>().swap(k);
  for (auto& v : values_) std::vector<float>().swap(v);
  length_ = 0;
}

void KvCache::CopyPrefix(const KvCache& from, int64_t n) {
  const auto floats = static_cast<size_t>(n * kv_dim_);
  for (size_t l = 0; l < keys_.size(); ++l) {
    keys_[l].assign(from.keys_[l].begin(), from.keys_[l].begin() + static_cast<ptrdiff_t>(floats));
    values_[l].assign(from.values_[l].begin(),
                      from.values_[l].begin() + static_cast<ptrdiff_t>(floats));
  }
  length_ = n;
}

size_t KvCache::memory_bytes() const {
  size_t n = 0;
  for (const auto& k : keys_) n += k.capacity() * sizeof(float);
  for (const auto& v : values_) n += v.capacity() * sizeof(float);
  return n;
}

// One forward call. The rows of every matrix below are the call's new tokens,
// input by input; `row_input_` and `row_pos_` say whose token each row is and
// at which position.
class ForwardPass {
 public:
  ForwardPass(const ModelWeights& weights, std::span<const ForwardInput> inputs)
      : w_(weights), c_(weights.config()), inputs_(inputs) {}

  absl::Status Validate() const {
    std::set<const KvCache*> seen;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const ForwardInput& in = inputs_[i];
      const std::string which = absl::StrCat("forward input ", i);
      if (in.cache == nullptr) return absl::InvalidArgumentError(which + " has no KV cache");
      if (!seen.insert(in.cache).second) {
        return absl::InvalidArgumentError(which + " names a KV cache already in this batch");
      }
      if (!in.cache->CompatibleWith(c_)) {
        return absl::InvalidArgumentError(
            which + " has a KV cache shaped for other weights; clear it before continuing");
      }
      if (in.tokens.empty()) return absl::InvalidArgumentError(which + " has no tokens");
      const int64_t room = in.cache->capacity() - in.cache->length();
      if (static_cast<int64_t>(in.tokens.size()) > room) {
        return absl::InvalidArgumentError(absl::StrCat(
            which, " has ", in.tokens.size(), " tokens at position ", in.cache->length(),
            " but the context holds ", in.cache->capacity(), " positions"));
      }
      for (int32_t t : in.tokens) {
        if (t < 0 || t >= c_.vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat(
              which, " has token id ", t, " outside the vocabulary [0, ", c_.vocab_size, ")"));
        }
      }
    }
    return absl::OkStatus();
  }

  // Runs every layer, appending to the caches, and returns the final hidden
  // state of the rows in `wanted` (indices into the call's rows), in order.
  // REQUIRES: Validate() is OK.
  Matrix Run(std::span<const int64_t> wanted) {
    const int64_t h = c_.hidden_size;
    for (size_t i = 0; i < inputs_.size(); ++i) {
      for (size_t j = 0; j < inputs_[i].tokens.size(); ++j) {
        row_input_.push_back(i);
        row_pos_.push_back(inputs_[i].cache->length() + static_cast<int64_t>(j));
      }
    }
    rows_ = static_cast<int64_t>(row_input_.size());
    ComputeRope();

    Matrix x(rows_, h);
    int64_t r = 0;
    for (const ForwardInput& in : inputs_) {
      for (int32_t t : in.tokens) {
        std::memcpy(x.row(r++).data(), w_.embedding().data() + t * h, sizeof(float) * h);
      }
    }
    for (size_t l = 0; l < w_.layers().size(); ++l) Layer(l, x);
    for (const ForwardInput& in : inputs_) {
      in.cache->length_ += static_cast<int64_t>(in.tokens.size());
    }

    Matrix out(static_cast<int64_t>(wanted.size()), h);
    for (size_t i = 0; i < wanted.size(); ++i) {
      RmsNorm(x.row(wanted[i]), w_.final_norm(), out.row(static_cast<int64_t>(i)));
    }
    return out;
  }

 private:
  // y = rmsnorm(x) * weight, the mean of squares accumulated in double.
  void RmsNorm(std::span<const float> x, std::span<const float> weight, std::span<float> y) const {
    double sum = 0;
    for (float v : x) sum += static_cast<double>(v) * v;
    const float scale =
        static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(x.size()) + c_.rms_norm_eps));
    for (size_t i = 0; i < x.size(); ++i) y[i] = weight[i] * (x[i] * scale);
  }

  // cos/sin of position * inv_freq for every row, [rows, head_dim / 2].
  void ComputeRope() {
    const size_t half = w_.rope_inv_freq().size();
    cos_.resize(static_cast<size_t>(rows_) * half);
    sin_.resize(static_cast<size_t>(rows_) * half);
    for (int64_t r = 0; r < rows_; ++r) {
      for (size_t i = 0; i < half; ++i) {
        const double angle = static_cast<double>(row_pos_[r]) * w_.rope_inv_freq()[i];
        cos_[r * half + i] = static_cast<float>(std::cos(angle));
        sin_[r * half + i] = static_cast<float>(std::sin(angle));
      }
    }
  }

  // Rotates each head of `v` (heads * head_dim floats) in place, pairing
  // element i with element i + head_dim / 2 as Hugging Face's rotate_half.
  void Rotate(float* v, int64_t heads, int64_t row) const {
    const int64_t half = c_.head_dim() / 2;
    const float* cs = cos_.data() + row * half;
    const float* sn = sin_.data() + row * half;
    for (int64_t hd = 0; hd < heads; ++hd) {
      float* a = v + hd * c_.head_dim();
      float* b = a + half;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = a[i];
        const float x1 = b[i];
        a[i] = x0 * cs[i] - x1 * sn[i];
        b[i] = x1 * cs[i] + x0 * sn[i];
      }
    }
  }

  void Layer(size_t l, Matrix& x) {
    const ModelWeights::Layer& lw = w_.layers()[l];
    const int64_t h = c_.hidden_size;
    const int64_t kv = c_.kv_dim();
    const int64_t hd = c_.head_dim();
    const int64_t qkv_cols = h + 2 * kv;

    Matrix normed(rows_, h);
    for (int64_t r = 0; r < rows_; ++r) RmsNorm(x.row(r), lw.input_norm, normed.row(r));
    Matrix qkv(rows_, qkv_cols);
    kernels::MatMulTransposed(normed.data.data(), rows_, lw.qkv.data(), qkv_cols, h,
                              qkv.data.data());
    for (int64_t r = 0; r < rows_; ++r) {
      float* q = qkv.row(r).data();
      Rotate(q, c_.num_attention_heads, r);
      Rotate(q + h, c_.num_key_value_heads, r);
      KvCache& cache = *inputs_[row_input_[r]].cache;
      cache.keys_[l].insert(cache.keys_[l].end(), q + h, q + h + kv);
      cache.values_[l].insert(cache.values_[l].end(), q + h + kv, q + h + 2 * kv);
    }

    // Causal attention: the row at position p attends to positions 0..p of
    // its own cache, which now holds this call's earlier rows too.
    Matrix attn(rows_, h);
    const int64_t group = c_.num_attention_heads / c_.num_key_value_heads;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
    std::vector<float> scores;
    for (int64_t r = 0; r < rows_; ++r) {
      const KvCache& cache = *inputs_[row_input_[r]].cache;
      const int64_t n = row_pos_[r] + 1;
      scores.resize(static_cast<size_t>(group * n));
      for (int64_t g = 0; g < c_.num_key_value_heads; ++g) {
        // The group's query heads against its key head: [group, n] scores.
        const float* keys = cache.keys_[l].data() + g * hd;
        const float* values = cache.values_[l].data() + g * hd;
        kernels::MatMulTransposed(qkv.row(r).data() + g * group * hd, group, hd, keys, n, kv, hd,
                                  scores.data(), n);
        for (int64_t k = 0; k < group; ++k) {
          float* s = scores.data() + k * n;
          float max = -INFINITY;
          for (int64_t j = 0; j < n; ++j) {
            s[j] *= scale;
            max = std::max(max, s[j]);
          }
          double sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            s[j] = std::exp(s[j] - max);
            sum += s[j];
          }
          const float inv = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j < n; ++j) s[j] *= inv;
          kernels::AccumulateWeightedRows(s, n, values, kv, hd,
                                          attn.row(r).data() + (g * group + k) * hd);
        }
      }
    }

    Matrix proj(rows_, h);
    kernels::MatMulTransposed(attn.data.data(), rows_, lw.o.data(), h, h, proj.data.data());
    for (size_t i = 0; i < x.data.size(); ++i) x.data[i] += proj.data[i];

    const int64_t ffn = c_.intermediate_size;
    for (int64_t r = 0; r < rows_; ++r) RmsNorm(x.row(r), lw.post_norm, normed.row(r));
    Matrix gate_up(rows_, 2 * ffn);
    kernels::MatMulTransposed(normed.data.data(), rows_, lw.gate_up.data(), 2 * ffn, h,
                              gate_up.data.data());
    Matrix act(rows_, ffn);
    for (int64_t r = 0; r < rows_; ++r) {
      const float* g = gate_up.row(r).data();
      const float* u = g + ffn;
      float* a = act.row(r).data();
      for (int64_t i = 0; i < ffn; ++i) a[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    }
    kernels::MatMulTransposed(act.data.data(), rows_, lw.down.data(), h, ffn, proj.data.data());
    for (size_t i = 0; i < x.data.size(); ++i) x.data[i] += proj.data[i];
  }

  const ModelWeights& w_;
  const ModelConfig& c_;
  std::span<const ForwardInput> inputs_;
  int64_t rows_ = 0;
  std::vector<size_t> row_input_;
  std::vector<int64_t> row_pos_;
  std::vector<float> cos_;
  std::vector<float> sin_;
};

absl::StatusOr<Matrix> Forward(const ModelWeights& weights, std::span<const ForwardInput> inputs) {
  ForwardPass pass(weights, inputs);
  if (absl::Status s = pass.Validate(); !s.ok()) return s;
  std::vector<int64_t> last;
  int64_t end = 0;
  for (const ForwardInput& in : inputs) {
    end += static_cast<int64_t>(in.tokens.size());
    last.push_back(end - 1);
  }
  return ApplyLmHead(weights, pass.Run(last));
}

absl::StatusOr<Matrix> ComputeHiddenStates(const ModelWeights& weights,
                                           std::span<const int32_t> tokens) {
  KvCache cache(weights.config());
  const ForwardInput input{&cache, tokens};
  ForwardPass pass(weights, {&input, 1});
  if (absl::Status s = pass.Validate(); !s.ok()) return s;
  std::vector<int64_t> all(tokens.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  return pass.Run(all);
}

Matrix ApplyLmHead(const ModelWeights& weights, const Matrix& hidden) {
  const ModelConfig& c = weights.config();
  Matrix logits(hidden.rows, c.vocab_size);
  kernels::MatMulTransposed(hidden.data.data(), hidden.rows, weights.lm_head().data(), c.vocab_size,
                            c.hidden_size, logits.data.data());
  return logits;
}

}  // namespace stitch
