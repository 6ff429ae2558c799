#include "stitch/refengine/weights.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/model.h"
#include "stitch/refengine/sequence.h"
#include "stitch/refengine/test_models.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using testing::GqaConfig;
using testing::MhaTiedConfig;
using testing::RandomTensors;
using testing::Views;

std::string LoadError(const ModelConfig& c, const std::vector<TensorView>& views) {
  auto w = ModelWeights::FromTensors(c, views);
  return w.ok() ? std::string("OK") : std::string(w.status().message());
}

TEST(Bf16, RoundsToNearestEvenAndWidensExactly) {
  EXPECT_EQ(Bf16FromFloat(1.0f), 0x3F80);
  EXPECT_EQ(FloatFromBf16(0x3F80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even 1.
  EXPECT_EQ(Bf16FromFloat(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up.
  EXPECT_EQ(Bf16FromFloat(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(Bf16FromFloat(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(Bf16FromFloat(-2.5f), 0xC020);
  EXPECT_TRUE(std::isnan(FloatFromBf16(Bf16FromFloat(NAN))));
  EXPECT_EQ(FloatFromBf16(Bf16FromFloat(INFINITY)), INFINITY);
  for (uint32_t h = 0; h < 0x10000; h += 7) {
    const float f = FloatFromBf16(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(Bf16FromFloat(f), h);
    }
  }
}

TEST(ModelWeights, LoadsEveryTensorIntoTheFusedLayout) {
  const ModelConfig c = GqaConfig();
  const std::vector<HostTensor> tensors = RandomTensors(c, 1);
  auto w = ModelWeights::FromTensors(c, Views(tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config(), c);
  ASSERT_EQ((*w)->layers().size(), 2u);
  const ModelWeights::Layer& l1 = (*w)->layers()[1];
  EXPECT_EQ(l1.qkv.size(), static_cast<size_t>((36 + 2 * 12) * 36));
  EXPECT_EQ(l1.gate_up.size(), static_cast<size_t>(2 * 52 * 36));
  auto floats = [&](const std::string& name) {
    for (const HostTensor& t : tensors) {
      if (t.name == name) {
        std::vector<float> v(t.data.size() / 4);
        std::memcpy(v.data(), t.data.data(), t.data.size());
        return v;
      }
    }
    return std::vector<float>();
  };
  // The v rows follow the q and k rows; the up rows follow the gate rows.
  const std::vector<float> v = floats("model.layers.1.self_attn.v_proj.weight");
  EXPECT_TRUE(std::equal(v.begin(), v.end(), l1.qkv.begin() + (36 + 12) * 36));
  const std::vector<float> up = floats("model.layers.1.mlp.up_proj.weight");
  EXPECT_TRUE(std::equal(up.begin(), up.end(), l1.gate_up.begin() + 52 * 36));
  const std::vector<float> head = floats("lm_head.weight");
  EXPECT_TRUE(std::equal(head.begin(), head.end(), (*w)->lm_head().begin()));
  EXPECT_EQ((*w)->rope_inv_freq().size(), 6u);
  EXPECT_DOUBLE_EQ((*w)->rope_inv_freq()[1], std::pow(500.0, -2.0 / 12));
}

TEST(ModelWeights, TiedHeadIsTheEmbedding) {
  const ModelConfig c = MhaTiedConfig();
  auto w = testing::RandomWeights(c, 2);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->lm_head().data(), w->embedding().data());
}

TEST(ModelWeights, ErrorsNameTheTensorAtFault) {
  const ModelConfig c = GqaConfig();
  const std::vector<HostTensor> tensors = RandomTensors(c, 1);
  const std::string k1 = "model.layers.1.self_attn.k_proj.weight";

  std::vector<TensorView> missing = Views(tensors);
  std::erase_if(missing, [&](const TensorView& t) { return t.name == k1; });
  EXPECT_EQ(LoadError(c, missing),
            "tensor " + k1 + " is missing; the checkpoint does not match its config.json");

  std::vector<TensorView> shape = Views(tensors);
  for (TensorView& t : shape) {
    if (t.name == k1) t.shape = {36, 12};
  }
  EXPECT_EQ(LoadError(c, shape),
            "tensor " + k1 + " has shape [36, 12], config.json needs [12, 36]");

  const std::vector<HostTensor> bf16 = RandomTensors(
      [&] {
        ModelConfig b = c;
        b.weight_dtype = DType::kBF16;
        return b;
      }(),
      1);
  std::vector<TensorView> dtype = Views(tensors);
  for (size_t i = 0; i < dtype.size(); ++i) {
    if (dtype[i].name == "model.norm.weight") dtype[i] = bf16[i].view();
  }
  EXPECT_EQ(
      LoadError(c, dtype),
      "tensor model.norm.weight has dtype BF16, config.json's torch_dtype needs F32 (float32)");

  std::vector<TensorView> bytes = Views(tensors);
  bytes[0].data = bytes[0].data.first(bytes[0].data.size() - 4);
  EXPECT_NE(LoadError(c, bytes).find("tensor model.embed_tokens.weight has"), std::string::npos);

  std::vector<TensorView> extra = Views(tensors);
  const float one = 1.0f;
  extra.push_back(TensorView{"model.layers.0.self_attn.rotary_emb.inv_freq",
                             DType::kF32,
                             {1},
                             std::as_bytes(std::span(&one, 1))});
  EXPECT_NE(
      LoadError(c, extra).find("unexpected tensor model.layers.0.self_attn.rotary_emb.inv_freq"),
      std::string::npos);

  std::vector<TensorView> twice = Views(tensors);
  twice.push_back(twice[3]);
  EXPECT_NE(LoadError(c, twice).find("appears more than once"), std::string::npos);

  // An lm_head beside tied embeddings says why it is unexpected.
  const ModelConfig tied = MhaTiedConfig();
  std::vector<HostTensor> tied_tensors = RandomTensors(tied, 1);
  std::vector<TensorView> with_head = Views(tied_tensors);
  with_head.push_back(TensorView{"lm_head.weight", DType::kF32, {258, 32}, tied_tensors[0].data});
  EXPECT_NE(LoadError(tied, with_head).find("tie_word_embeddings is true"), std::string::npos);
}

TEST(LoadCheckpoint, Bf16CheckpointLoadsAsTheRoundedFloats) {
  stitch::testing::TempDir tmp;
  ModelConfig c = MhaTiedConfig();
  c.weight_dtype = DType::kBF16;
  ModelConfig f32 = c;
  f32.weight_dtype = DType::kF32;
  // The float32 values, then the same values stored as bfloat16.
  const std::vector<HostTensor> exact = RandomTensors(f32, 5);
  std::vector<HostTensor> rounded;
  for (const HostTensor& t : exact) {
    std::vector<float> v(t.data.size() / 4);
    std::memcpy(v.data(), t.data.data(), t.data.size());
    rounded.push_back(HostTensor::FromFloats(t.name, t.shape, v, DType::kBF16));
  }
  ASSERT_TRUE(WriteCheckpoint(tmp / "ckpt", c, Views(rounded), ExistingDir::kRefuse).ok());
  auto w = LoadCheckpoint(tmp / "ckpt");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->config().weight_dtype, DType::kBF16);

  std::vector<float> embed(exact[0].data.size() / 4);
  std::memcpy(embed.data(), exact[0].data.data(), exact[0].data.size());
  ASSERT_EQ((*w)->embedding().size(), embed.size());
  size_t changed = 0;
  for (size_t i = 0; i < embed.size(); ++i) {
    ASSERT_EQ((*w)->embedding()[i], FloatFromBf16(Bf16FromFloat(embed[i]))) << i;
    changed += (*w)->embedding()[i] != embed[i];
  }
  EXPECT_GT(changed, embed.size() / 2);  // the rounding really happened

  // And it computes like float32 weights holding the rounded values.
  std::vector<HostTensor> widened;
  for (const HostTensor& t : rounded) {
    std::vector<float> v(t.data.size() / 2);
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, t.data.data() + 2 * i, 2);
      v[i] = FloatFromBf16(h);
    }
    widened.push_back(HostTensor::FromFloats(t.name, t.shape, v, DType::kF32));
  }
  auto wf = ModelWeights::FromTensors(f32, Views(widened));
  ASSERT_TRUE(wf.ok());
  const std::vector<int32_t> tokens = {256, 1, 2, 3};
  auto a = ComputeHiddenStates(**w, tokens);
  auto b = ComputeHiddenStates(**wf, tokens);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->data, b->data);
}

TEST(LoadCheckpoint, DirectoryErrorsNameTheFileOrTensor) {
  stitch::testing::TempDir tmp;
  const ModelConfig c = MhaTiedConfig();
  const std::vector<HostTensor> tensors = RandomTensors(c, 1);
  ASSERT_TRUE(WriteCheckpoint(tmp / "ok", c, Views(tensors), ExistingDir::kRefuse).ok());
  ASSERT_TRUE(LoadCheckpoint(tmp / "ok").ok());

  auto missing = LoadCheckpoint(tmp / "absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("config.json"), std::string::npos);

  // The index maps a tensor to a file that does not hold it.
  auto index = ReadIndex(tmp / "ok");
  ASSERT_TRUE(index.ok());
  index->weight_map["model.layers.9.mlp.up_proj.weight"] = "model.safetensors";
  ASSERT_TRUE(WriteIndex(tmp / "ok", *index).ok());
  auto lacking = LoadCheckpoint(tmp / "ok");
  ASSERT_FALSE(lacking.ok());
  EXPECT_NE(std::string(lacking.status().message())
                .find("tensor model.layers.9.mlp.up_proj.weight is mapped to model.safetensors"),
            std::string::npos)
      << lacking.status();

  // A config.json that disagrees with the tensors.
  ModelConfig wider = c;
  wider.intermediate_size = 72;
  ASSERT_TRUE(WriteFileAtomically(tmp / "ok" / "config.json", wider.ToJson()).ok());
  index->weight_map.erase("model.layers.9.mlp.up_proj.weight");
  ASSERT_TRUE(WriteIndex(tmp / "ok", *index).ok());
  auto shape = LoadCheckpoint(tmp / "ok");
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(std::string(shape.status().message())
                .find("tensor model.layers.0.mlp.gate_proj.weight has shape [64, 32], config.json "
                      "needs [72, 32]"),
            std::string::npos)
      << shape.status();
  EXPECT_NE(std::string(shape.status().message()).find((tmp / "ok").string()), std::string::npos);
}

TEST(LoadCheckpoint, DiskAndMemoryLoadsGenerateIdentically) {
  stitch::testing::TempDir tmp;
  const ModelConfig c = GqaConfig();
  const std::vector<HostTensor> tensors = RandomTensors(c, 12);
  ASSERT_TRUE(WriteCheckpoint(tmp / "ckpt", c, Views(tensors), ExistingDir::kRefuse).ok());
  auto from_disk = LoadCheckpoint(tmp / "ckpt");
  auto from_memory = ModelWeights::FromTensors(c, Views(tensors));
  ASSERT_TRUE(from_disk.ok() && from_memory.ok());
  auto generate = [&](const ModelWeights& w) {
    auto s = Sequence::Create(c, {256, 65, 66}, SamplingParams{.temperature = 0.9f, .seed = 77});
    EXPECT_TRUE(s.ok());
    std::vector<SampledToken> out;
    Sequence* one[] = {&*s};
    for (int i = 0; i < 12; ++i) {
      auto step = StepSequences(w, one);
      EXPECT_TRUE(step.ok());
      out.push_back(*(*step)[0]);
    }
    return out;
  };
  const std::vector<SampledToken> a = generate(**from_disk), b = generate(**from_memory);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, b[i].id);
    EXPECT_EQ(a[i].logprob, b[i].logprob);
  }
}

}  // namespace
}  // namespace stitch
