#include "stitch/refengine/config.h"

#include <string>

#include "gtest/gtest.h"

namespace stitch {
namespace {

std::string ErrorOf(std::string_view json) {
  auto c = ModelConfig::FromJson(json);
  return c.ok() ? std::string("OK") : std::string(c.status().message());
}

TEST(ModelConfig, JsonRoundTripsAndIsStable) {
  ModelConfig c;
  c.num_key_value_heads = 2;
  c.tie_word_embeddings = true;
  c.weight_dtype = DType::kBF16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 500000.0;
  const std::string json = c.ToJson();
  auto back = ModelConfig::FromJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);
  EXPECT_EQ(back->ToJson(), json);
  EXPECT_NE(json.find("\"architectures\": [\"LlamaForCausalLM\"]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"torch_dtype\": \"bfloat16\""), std::string::npos);
  EXPECT_NE(json.find("\"rms_norm_eps\": 1e-06"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rope_theta\": 500000.0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tie_word_embeddings\": true"), std::string::npos);
}

TEST(ModelConfig, ReadsAHuggingFaceStyleConfig) {
  auto c = ModelConfig::FromJson(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 300, "max_position_embeddings": 128,
    "rms_norm_eps": 1e-05, "rope_theta": 10000, "tie_word_embeddings": false,
    "torch_dtype": "float32", "bos_token_id": 256, "eos_token_id": [257],
    "transformers_version": "4.44.0", "use_cache": true, "pretraining_tp": 1,
    "initializer_range": 0.02, "attention_dropout": 0.0})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_key_value_heads, 4);  // defaults to the attention heads
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->head_dim(), 16);
  EXPECT_EQ(c->eos_token_id, 257);
  EXPECT_EQ(c->weight_dtype, DType::kF32);
}

TEST(ModelConfig, RefusesWhatTheEngineWouldComputeDifferently) {
  const std::string base = R"("hidden_size": 64, "intermediate_size": 172, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 258, "max_position_embeddings": 128)";
  auto with = [&](std::string extra) { return ErrorOf("{" + base + ", " + extra + "}"); };
  EXPECT_EQ(ErrorOf("{" + base + "}"), "OK");
  EXPECT_NE(with(R"("architectures": ["MistralForCausalLM"])").find("architectures"),
            std::string::npos);
  EXPECT_NE(with(R"("hidden_act": "gelu")").find("hidden_act"), std::string::npos);
  EXPECT_NE(with(R"("attention_bias": true)").find("attention_bias"), std::string::npos);
  EXPECT_NE(with(R"("rope_scaling": {"type": "linear", "factor": 2.0})").find("rope_scaling"),
            std::string::npos);
  EXPECT_NE(with(R"("head_dim": 32)").find("head_dim"), std::string::npos);
  EXPECT_NE(with(R"("torch_dtype": "float16")").find("torch_dtype"), std::string::npos);
  EXPECT_NE(with(R"("bos_token_id": 1)").find("bos_token_id"), std::string::npos);
  EXPECT_NE(with(R"("eos_token_id": [2, 3])").find("eos_token_id"), std::string::npos);
  EXPECT_NE(with(R"("num_key_value_heads": 3)").find("num_key_value_heads"), std::string::npos);
  EXPECT_NE(with(R"("rms_norm_eps": -1)").find("rms_norm_eps"), std::string::npos);
  EXPECT_NE(ErrorOf(R"({"hidden_size": 64})").find("missing required field intermediate_size"),
            std::string::npos);
  EXPECT_NE(ErrorOf(R"({"hidden_size": "64"})").find("hidden_size"), std::string::npos);
  EXPECT_NE(ErrorOf("[1]").find("object"), std::string::npos);
  EXPECT_NE(ErrorOf("{").find("not valid JSON"), std::string::npos);
}

TEST(ModelConfig, ValidateNamesTheField) {
  auto message = [](ModelConfig c) { return std::string(c.Validate().message()); };
  EXPECT_TRUE(ModelConfig{}.Validate().ok());
  ModelConfig c;
  c.vocab_size = 257;
  EXPECT_NE(message(c).find("vocab_size"), std::string::npos);
  c = {};
  c.hidden_size = 250;  // not divisible by 4 heads
  EXPECT_NE(message(c).find("hidden_size 250"), std::string::npos);
  c = {};
  c.hidden_size = 12;
  c.num_attention_heads = 4;  // head_dim 3 is odd: no rotary pairs
  EXPECT_NE(message(c).find("even"), std::string::npos);
  c = {};
  c.num_hidden_layers = 0;
  EXPECT_NE(message(c).find("num_hidden_layers"), std::string::npos);
  c = {};
  c.hidden_size = 65536;
  c.intermediate_size = 262144;
  c.num_hidden_layers = 64;
  EXPECT_NE(message(c).find("parameters"), std::string::npos);
}

TEST(ExpectedTensors, ListsHuggingFaceNamesAndShapes) {
  ModelConfig c;
  c.hidden_size = 64;
  c.intermediate_size = 100;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.vocab_size = 260;
  std::vector<TensorSpec> t = ExpectedTensors(c);
  ASSERT_EQ(t.size(), 1 + 2 * 9 + 2u);
  EXPECT_EQ(t[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(t[0].shape, (std::vector<int64_t>{260, 64}));
  EXPECT_EQ(t[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(t[7].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(t[7].shape, (std::vector<int64_t>{64, 100}));
  EXPECT_EQ(t[10].name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(t.back().name, "lm_head.weight");
  EXPECT_EQ(c.ParameterCount(),
            2 * 260 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 100 + 2 * 64) + 64);
  c.tie_word_embeddings = true;
  t = ExpectedTensors(c);
  EXPECT_EQ(t.back().name, "model.norm.weight");
}

}  // namespace
}  // namespace stitch
