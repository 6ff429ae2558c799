// The reference engine's model configuration: a Hugging Face `config.json` for
// a decoder-only Llama (`LlamaForCausalLM`) with a byte-level vocabulary.
//
// Reading accepts the fields Hugging Face writes for Llama and refuses, with a
// message naming the field, anything the reference engine would otherwise
// compute differently (another architecture, another activation, attention
// bias, rope scaling, a head_dim other than hidden_size / num_attention_heads,
// BOS/EOS ids other than the byte tokenizer's). Unknown fields are ignored.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/format/safetensors.h"

namespace stitch {

// The file name of a checkpoint's configuration.
inline constexpr std::string_view kModelConfigFileName = "config.json";

struct ModelConfig {
  int64_t hidden_size = 256;
  int64_t intermediate_size = 688;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;  // < num_attention_heads: grouped-query attention
  int64_t vocab_size = 258;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  DType weight_dtype = DType::kF32;  // `torch_dtype`: kF32 ("float32") or kBF16 ("bfloat16")
  int32_t bos_token_id = 256;
  int32_t eos_token_id = 257;

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t kv_dim() const { return head_dim() * num_key_value_heads; }

  // The number of weights in a checkpoint of this configuration.
  // REQUIRES: the sizes are positive and within the engine's limits.
  int64_t ParameterCount() const;

  // OK when the configuration describes a model this engine runs: positive
  // sizes within the engine's limits, hidden_size divisible by the heads into
  // an even head_dim, heads divisible by key/value heads, vocab_size >= 258,
  // BOS 256 and EOS 257, a finite positive rms_norm_eps and rope_theta, and
  // weight_dtype F32 or BF16. The message names the offending field.
  [[nodiscard]] absl::Status Validate() const;

  // Parses and validates a config.json document.
  [[nodiscard]] static absl::StatusOr<ModelConfig> FromJson(std::string_view json);

  // A config.json document, one field per line, identical bytes for equal
  // configurations. REQUIRES: Validate() is OK.
  std::string ToJson() const;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// Reads `<dir>/config.json`. Errors name the file.
[[nodiscard]] absl::StatusOr<ModelConfig> ReadModelConfig(const std::filesystem::path& dir);

// "float32" / "bfloat16" for the two weight dtypes; ParseTorchDType is the
// inverse and refuses every other name.
std::string_view TorchDTypeName(DType dtype);
[[nodiscard]] absl::StatusOr<DType> ParseTorchDType(std::string_view name);

// One tensor a checkpoint of a configuration must hold, with its shape.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor of the configuration, in Hugging Face order: embeddings, each
// layer's attention, MLP and norms, the final norm, and `lm_head.weight` when
// the LM head is not tied. Shapes are [out_features, in_features] for
// projections, [vocab_size, hidden_size] for embeddings and LM head, and
// [hidden_size] for norms. REQUIRES: config.Validate() is OK.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

}  // namespace stitch
