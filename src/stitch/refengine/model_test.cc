#include "stitch/refengine/model.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "stitch/refengine/test_models.h"

namespace stitch {
namespace {

using testing::GqaConfig;
using testing::MhaTiedConfig;
using testing::RandomTensors;
using testing::Views;

// ---------------------------------------------------------------------------
// A reference forward pass written from the Llama definition with plain loops
// in double precision, over the Hugging Face tensors (q/k/v and gate/up
// separate), recomputing the whole sequence with no cache.

using Tensors = std::map<std::string, std::vector<double>>;

Tensors ToMap(const std::vector<HostTensor>& tensors) {
  Tensors m;
  for (const HostTensor& t : tensors) {
    std::vector<double>& v = m[t.name];
    const size_t n = t.dtype == DType::kBF16 ? t.data.size() / 2 : t.data.size() / 4;
    for (size_t i = 0; i < n; ++i) {
      if (t.dtype == DType::kBF16) {
        uint16_t h;
        std::memcpy(&h, t.data.data() + 2 * i, 2);
        v.push_back(FloatFromBf16(h));
      } else {
        float f;
        std::memcpy(&f, t.data.data() + 4 * i, 4);
        v.push_back(f);
      }
    }
  }
  return m;
}

// y = W x for W [out, in] row-major.
std::vector<double> MatVec(const std::vector<double>& w, const std::vector<double>& x,
                           int64_t out) {
  const size_t in = x.size();
  std::vector<double> y(static_cast<size_t>(out), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) y[o] += w[o * in + i] * x[i];
  }
  return y;
}

std::vector<double> Norm(const std::vector<double>& x, const std::vector<double>& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  ms /= static_cast<double>(x.size());
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] / std::sqrt(ms + eps);
  return y;
}

// Hugging Face's rotate_half rotary embedding of each head of `v`.
void Rope(std::vector<double>& v, int64_t heads, int64_t dim, int64_t pos, double theta) {
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<double> x(v.begin() + h * dim, v.begin() + (h + 1) * dim);
    for (int64_t i = 0; i < dim; ++i) {
      const int64_t k = i % (dim / 2);
      const double angle = static_cast<double>(pos) * std::pow(theta, -2.0 * k / dim);
      const double rotated = i < dim / 2 ? -x[i + dim / 2] : x[i - dim / 2];
      v[h * dim + i] = x[i] * std::cos(angle) + rotated * std::sin(angle);
    }
  }
}

// Logits at every position of `tokens`. Position p (its own hidden states,
// query, key and value) is computed with *weights_at[p]; it attends to the
// keys and values earlier positions computed with their own weights. With one
// weight set this is the ordinary forward pass; with two it is what a KV
// cache built under old weights and continued under new ones must give.
std::vector<std::vector<double>> ReferenceLogits(const ModelConfig& c,
                                                 const std::vector<const Tensors*>& weights_at,
                                                 const std::vector<int32_t>& tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hidden = c.hidden_size, dim = c.head_dim();
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads;
  std::vector<std::vector<double>> x(n);
  for (int64_t p = 0; p < n; ++p) {
    const std::vector<double>& e = weights_at[p]->at("model.embed_tokens.weight");
    x[p].assign(e.begin() + tokens[p] * hidden, e.begin() + (tokens[p] + 1) * hidden);
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    std::vector<std::vector<double>> q(n), k(n), v(n);
    for (int64_t p = 0; p < n; ++p) {
      const Tensors& w = *weights_at[p];
      const std::vector<double> h =
          Norm(x[p], w.at(pre + "input_layernorm.weight"), c.rms_norm_eps);
      q[p] = MatVec(w.at(pre + "self_attn.q_proj.weight"), h, hidden);
      k[p] = MatVec(w.at(pre + "self_attn.k_proj.weight"), h, kv_heads * dim);
      v[p] = MatVec(w.at(pre + "self_attn.v_proj.weight"), h, kv_heads * dim);
      Rope(q[p], heads, dim, p, c.rope_theta);
      Rope(k[p], kv_heads, dim, p, c.rope_theta);
    }
    for (int64_t p = 0; p < n; ++p) {
      const Tensors& w = *weights_at[p];
      std::vector<double> attn(static_cast<size_t>(hidden), 0.0);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / (heads / kv_heads);
        std::vector<double> s(static_cast<size_t>(p + 1));
        double max = -1e300;
        for (int64_t j = 0; j <= p; ++j) {
          s[j] = 0;
          for (int64_t d = 0; d < dim; ++d) s[j] += q[p][h * dim + d] * k[j][g * dim + d];
          s[j] /= std::sqrt(static_cast<double>(dim));
          max = std::max(max, s[j]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - max));
        for (int64_t j = 0; j <= p; ++j) {
          for (int64_t d = 0; d < dim; ++d) attn[h * dim + d] += s[j] / z * v[j][g * dim + d];
        }
      }
      const std::vector<double> o = MatVec(w.at(pre + "self_attn.o_proj.weight"), attn, hidden);
      for (int64_t i = 0; i < hidden; ++i) x[p][i] += o[i];
      const std::vector<double> h2 =
          Norm(x[p], w.at(pre + "post_attention_layernorm.weight"), c.rms_norm_eps);
      const std::vector<double> gate =
          MatVec(w.at(pre + "mlp.gate_proj.weight"), h2, c.intermediate_size);
      const std::vector<double> up =
          MatVec(w.at(pre + "mlp.up_proj.weight"), h2, c.intermediate_size);
      std::vector<double> act(gate.size());
      for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1 + std::exp(-gate[i])) * up[i];
      const std::vector<double> down = MatVec(w.at(pre + "mlp.down_proj.weight"), act, hidden);
      for (int64_t i = 0; i < hidden; ++i) x[p][i] += down[i];
    }
  }
  std::vector<std::vector<double>> logits(n);
  for (int64_t p = 0; p < n; ++p) {
    const Tensors& w = *weights_at[p];
    const std::vector<double> h = Norm(x[p], w.at("model.norm.weight"), c.rms_norm_eps);
    const char* head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    logits[p] = MatVec(w.at(head), h, c.vocab_size);
  }
  return logits;
}

// ---------------------------------------------------------------------------

std::vector<int32_t> SomeTokens(int n, int32_t vocab, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + salt * 11 + i * i * 5) % vocab);
  return t;
}

void ExpectNear(std::span<const float> got, const std::vector<double>& want, double tol,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::fabs(got[i] - want[i]));
  EXPECT_LT(max_err, tol) << what;
}

class ForwardVsReference : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardVsReference, KvCacheForwardMatchesReferenceWithoutCache) {
  const ModelConfig c = GetParam() == "Gqa" ? GqaConfig() : MhaTiedConfig();
  const std::vector<HostTensor> tensors = RandomTensors(c, 7);
  auto w = ModelWeights::FromTensors(c, Views(tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  const Tensors ref_w = ToMap(tensors);
  const std::vector<int32_t> tokens = SomeTokens(21, static_cast<int32_t>(c.vocab_size), 3);
  const auto want = ReferenceLogits(c, std::vector<const Tensors*>(tokens.size(), &ref_w), tokens);

  // The reference is not degenerate: logits vary by more than the tolerance.
  double spread = 0;
  for (double v : want.back()) spread = std::max(spread, std::fabs(v - want.back()[0]));
  ASSERT_GT(spread, 0.5);

  // Prefill of a prompt, then the rest token by token through the cache.
  KvCache cache(c);
  const int prompt = 9;
  const ForwardInput first{&cache, std::span<const int32_t>(tokens).first(prompt)};
  auto logits = Forward(**w, {&first, 1});
  ASSERT_TRUE(logits.ok()) << logits.status();
  ExpectNear(logits->row(0), want[prompt - 1], 1e-4, "prefill");
  for (size_t p = prompt; p < tokens.size(); ++p) {
    const ForwardInput step{&cache, std::span<const int32_t>(tokens).subspan(p, 1)};
    logits = Forward(**w, {&step, 1});
    ASSERT_TRUE(logits.ok()) << logits.status();
    ExpectNear(logits->row(0), want[p], 1e-4, "decode position " + std::to_string(p));
  }
  EXPECT_EQ(cache.length(), static_cast<int64_t>(tokens.size()));

  // Every position at once, through the hidden states.
  auto hidden = ComputeHiddenStates(**w, tokens);
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  const Matrix all = ApplyLmHead(**w, *hidden);
  for (size_t p = 0; p < tokens.size(); ++p) {
    ExpectNear(all.row(static_cast<int64_t>(p)), want[p], 1e-4,
               "hidden position " + std::to_string(p));
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, ForwardVsReference, ::testing::Values("Gqa", "MhaTied"),
                         [](const auto& info) { return info.param; });

TEST(Forward, TokenByTokenIsBitIdenticalToPrefill) {
  const ModelConfig c = GqaConfig();
  auto w = testing::RandomWeights(c, 3);
  const std::vector<int32_t> tokens = SomeTokens(17, 259, 5);
  auto hidden = ComputeHiddenStates(*w, tokens);
  ASSERT_TRUE(hidden.ok());
  const Matrix all = ApplyLmHead(*w, *hidden);
  KvCache cache(c);
  for (size_t p = 0; p < tokens.size(); ++p) {
    const ForwardInput in{&cache, std::span<const int32_t>(tokens).subspan(p, 1)};
    auto logits = Forward(*w, {&in, 1});
    ASSERT_TRUE(logits.ok());
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      ASSERT_EQ(logits->row(0)[v], all.row(static_cast<int64_t>(p))[v]) << "position " << p;
    }
  }
}

TEST(Forward, BatchRowsAreBitIdenticalToSingleSequences) {
  const ModelConfig c = MhaTiedConfig();
  auto w = testing::RandomWeights(c, 4);
  const std::vector<std::vector<int32_t>> prompts = {SomeTokens(1, 258, 1), SomeTokens(13, 258, 2),
                                                     SomeTokens(6, 258, 3), SomeTokens(9, 258, 4)};
  std::vector<KvCache> caches(prompts.size(), KvCache(c));
  std::vector<ForwardInput> inputs;
  for (size_t i = 0; i < prompts.size(); ++i) inputs.push_back({&caches[i], prompts[i]});
  auto batched = Forward(*w, inputs);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    KvCache alone(c);
    const ForwardInput in{&alone, prompts[i]};
    auto single = Forward(*w, {&in, 1});
    ASSERT_TRUE(single.ok());
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      ASSERT_EQ(batched->row(static_cast<int64_t>(i))[v], single->row(0)[v]) << "sequence " << i;
    }
    EXPECT_EQ(caches[i].length(), static_cast<int64_t>(prompts[i].size()));
  }
}

TEST(Forward, HiddenStatesThroughTheLmHeadGiveTheLogits) {
  for (const ModelConfig& c : {GqaConfig(), MhaTiedConfig()}) {
    const std::vector<HostTensor> tensors = RandomTensors(c, 11);
    auto w = ModelWeights::FromTensors(c, Views(tensors));
    ASSERT_TRUE(w.ok());
    const std::vector<int32_t> tokens = SomeTokens(12, static_cast<int32_t>(c.vocab_size), 9);
    auto hidden = ComputeHiddenStates(**w, tokens);
    ASSERT_TRUE(hidden.ok());
    ASSERT_EQ(hidden->rows, 12);
    ASSERT_EQ(hidden->cols, c.hidden_size);
    // A trainer multiplying the hidden state by the LM head tensor itself
    // (from the checkpoint, in double) gets the engine's logits.
    const Tensors m = ToMap(tensors);
    const std::vector<double>& head =
        m.at(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    for (int64_t p = 0; p < hidden->rows; ++p) {
      const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + p + 1);
      KvCache cache(c);
      const ForwardInput in{&cache, prefix};
      auto logits = Forward(**w, {&in, 1});
      ASSERT_TRUE(logits.ok());
      const std::span<const float> h = hidden->row(p);
      std::vector<double> manual(static_cast<size_t>(c.vocab_size), 0.0);
      for (int64_t v = 0; v < c.vocab_size; ++v) {
        for (int64_t i = 0; i < c.hidden_size; ++i) manual[v] += head[v * c.hidden_size + i] * h[i];
      }
      ExpectNear(logits->row(0), manual, 1e-5, "position " + std::to_string(p));
      const Matrix from_hidden = ApplyLmHead(**w, *hidden);
      for (int64_t v = 0; v < c.vocab_size; ++v)
        ASSERT_EQ(from_hidden.row(p)[v], logits->row(0)[v]);
    }
  }
}

TEST(Forward, CacheBuiltUnderOldWeightsContinuesUnderNewWeights) {
  const ModelConfig c = GqaConfig();
  const std::vector<HostTensor> t1 = RandomTensors(c, 21), t2 = RandomTensors(c, 22);
  auto w1 = ModelWeights::FromTensors(c, Views(t1));
  auto w2 = ModelWeights::FromTensors(c, Views(t2));
  ASSERT_TRUE(w1.ok() && w2.ok());
  const Tensors r1 = ToMap(t1), r2 = ToMap(t2);
  const std::vector<int32_t> tokens = SomeTokens(14, 259, 8);
  const int swap_at = 10;

  KvCache cache(c);
  const ForwardInput prefix{&cache, std::span<const int32_t>(tokens).first(swap_at)};
  ASSERT_TRUE(Forward(**w1, {&prefix, 1}).ok());
  std::vector<const Tensors*> mixed(tokens.size(), &r1);
  for (size_t p = swap_at; p < tokens.size(); ++p) mixed[p] = &r2;
  const auto want_mixed = ReferenceLogits(c, mixed, tokens);
  const auto want_new = ReferenceLogits(c, std::vector<const Tensors*>(tokens.size(), &r2), tokens);
  for (size_t p = swap_at; p < tokens.size(); ++p) {
    const ForwardInput step{&cache, std::span<const int32_t>(tokens).subspan(p, 1)};
    auto logits = Forward(**w2, {&step, 1});
    ASSERT_TRUE(logits.ok());
    ExpectNear(logits->row(0), want_mixed[p], 1e-4, "position " + std::to_string(p));
    // The old keys and values really were used: a full recompute differs.
    double diff = 0;
    for (int64_t v = 0; v < c.vocab_size; ++v) {
      diff = std::max(diff, std::fabs(want_mixed[p][v] - want_new[p][v]));
    }
    EXPECT_GT(diff, 1e-3);
  }

  // Clearing the cache (a flush) recomputes everything under the new weights.
  cache.Clear();
  EXPECT_EQ(cache.length(), 0);
  const ForwardInput all{&cache, tokens};
  auto logits = Forward(**w2, {&all, 1});
  ASSERT_TRUE(logits.ok());
  ExpectNear(logits->row(0), want_new.back(), 1e-4, "after clear");
}

TEST(Forward, BadInputsAreRefusedBeforeAnyCacheChanges) {
  const ModelConfig c = MhaTiedConfig();
  auto w = testing::RandomWeights(c, 1);
  KvCache a(c), b(c);
  const std::vector<int32_t> ok_tokens = {1, 2, 3};
  const std::vector<int32_t> bad_id = {1, 258};
  const std::vector<int32_t> too_long(static_cast<size_t>(c.max_position_embeddings) + 1, 5);
  const std::vector<int32_t> empty;

  auto expect_refused = [&](std::vector<ForwardInput> inputs, const std::string& needle) {
    auto r = Forward(*w, inputs);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos) << r.status();
    EXPECT_EQ(a.length(), 0);
    EXPECT_EQ(b.length(), 0);
  };
  expect_refused({{&a, ok_tokens}, {&b, bad_id}}, "token id 258");
  expect_refused({{&a, ok_tokens}, {&a, ok_tokens}}, "already in this batch");
  expect_refused({{&a, ok_tokens}, {&b, too_long}}, "the context holds 40 positions");
  expect_refused({{&a, ok_tokens}, {&b, empty}}, "has no tokens");
  expect_refused({{nullptr, ok_tokens}}, "has no KV cache");
  KvCache other(GqaConfig());
  expect_refused({{&a, ok_tokens}, {&other, ok_tokens}}, "shaped for other weights");
}

TEST(KvCache, ClearReleasesMemory) {
  const ModelConfig c = MhaTiedConfig();
  auto w = testing::RandomWeights(c, 1);
  KvCache cache(c);
  const std::vector<int32_t> tokens = SomeTokens(20, 258, 1);
  const ForwardInput in{&cache, tokens};
  ASSERT_TRUE(Forward(*w, {&in, 1}).ok());
  EXPECT_GE(cache.memory_bytes(), size_t{20} * 2 * 3 * 32 * sizeof(float));
  cache.Clear();
  EXPECT_EQ(cache.memory_bytes(), 0u);
}

}  // namespace
}  // namespace stitch
