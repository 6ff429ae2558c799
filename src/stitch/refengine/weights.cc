#include "stitch/refengine/weights.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"

namespace stitch {

static_assert(std::endian::native == std::endian::little,
              "safetensors bytes are little-endian; the loader copies them as they are");

uint16_t Bf16FromFloat(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float FloatFromBf16(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

HostTensor HostTensor::FromFloats(std::string name, std::vector<int64_t> shape,
                                  std::span<const float> values, DType dtype) {
  HostTensor t{std::move(name), dtype, std::move(shape), {}};
  if (dtype == DType::kBF16) {
    t.data.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t h = Bf16FromFloat(values[i]);
      std::memcpy(t.data.data() + 2 * i, &h, 2);
    }
  } else {
    t.data.resize(values.size() * 4);
    std::memcpy(t.data.data(), values.data(), t.data.size());
  }
  return t;
}

namespace {

std::string ShapeText(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Appends the tensor's values, widened to float32, to `out`.
void AppendFloats(const TensorView& t, std::vector<float>& out) {
  const size_t begin = out.size();
  if (t.dtype == DType::kBF16) {
    const size_t n = t.data.size() / 2;
    out.resize(begin + n);
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t.data.data() + 2 * i, 2);
      out[begin + i] = FloatFromBf16(h);
    }
  } else {
    out.resize(begin + t.data.size() / 4);
    std::memcpy(out.data() + begin, t.data.data(), t.data.size());
  }
}

}  // namespace

absl::Status ValidateTensors(const ModelConfig& config, std::span<const TensorView> tensors) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  const std::string want_dtype = absl::StrCat(AbslView(DTypeName(config.weight_dtype)), " (",
                                              AbslView(TorchDTypeName(config.weight_dtype)), ")");

  std::map<std::string_view, const TensorView*> by_name;
  for (const TensorView& t : tensors) {
    if (!by_name.emplace(t.name, &t).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, " appears more than once"));
    }
  }
  const std::vector<TensorSpec> specs = ExpectedTensors(config);
  std::set<std::string_view> expected;
  for (const TensorSpec& spec : specs) {
    expected.insert(spec.name);
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.name,
                                                     " is missing; the checkpoint does not match "
                                                     "its config.json"));
    }
    const TensorView& t = *it->second;
    if (t.shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.name, " has shape ",
                                                     ShapeText(t.shape), ", config.json needs ",
                                                     ShapeText(spec.shape)));
    }
    if (t.dtype != config.weight_dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", spec.name, " has dtype ", AbslView(DTypeName(t.dtype)),
                       ", config.json's torch_dtype needs ", want_dtype));
    }
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    const uint64_t want_bytes = static_cast<uint64_t>(numel) * DTypeSize(t.dtype);
    if (t.data.size() != want_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", spec.name, " has ", t.data.size(),
                                                     " bytes, its shape needs ", want_bytes));
    }
  }
  for (const TensorView& t : tensors) {
    if (!expected.contains(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected tensor ", t.name,
                       ": not part of a LlamaForCausalLM with this "
                       "config.json",
                       config.tie_word_embeddings && t.name == "lm_head.weight"
                           ? " (tie_word_embeddings is true)"
                           : ""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> ModelWeights::FromTensors(
    const ModelConfig& config, std::span<const TensorView> tensors) {
  if (absl::Status s = ValidateTensors(config, tensors); !s.ok()) return s;
  std::map<std::string_view, const TensorView*> by_name;
  std::map<std::string, Checksum128, std::less<>> checksums;
  for (const TensorView& t : tensors) {
    by_name.emplace(t.name, &t);
    checksums.emplace(t.name, Xxh3Checksum(t.data));
  }

  auto get = [&](const std::string& name, std::vector<float>& out) {
    AppendFloats(*by_name.at(name), out);
  };
  std::shared_ptr<ModelWeights> w(new ModelWeights());
  w->config_ = config;
  w->fingerprint_ = WeightsFingerprint(checksums);
  get("model.embed_tokens.weight", w->embedding_);
  w->layers_.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    Layer& layer = w->layers_[static_cast<size_t>(l)];
    get(p + "input_layernorm.weight", layer.input_norm);
    get(p + "self_attn.q_proj.weight", layer.qkv);
    get(p + "self_attn.k_proj.weight", layer.qkv);
    get(p + "self_attn.v_proj.weight", layer.qkv);
    get(p + "self_attn.o_proj.weight", layer.o);
    get(p + "post_attention_layernorm.weight", layer.post_norm);
    get(p + "mlp.gate_proj.weight", layer.gate_up);
    get(p + "mlp.up_proj.weight", layer.gate_up);
    get(p + "mlp.down_proj.weight", layer.down);
  }
  get("model.norm.weight", w->final_norm_);
  if (!config.tie_word_embeddings) get("lm_head.weight", w->lm_head_);

  const int64_t half = config.head_dim() / 2;
  w->rope_inv_freq_.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    w->rope_inv_freq_[static_cast<size_t>(i)] = std::pow(
        config.rope_theta, -static_cast<double>(2 * i) / static_cast<double>(config.head_dim()));
  }
  return std::shared_ptr<const ModelWeights>(std::move(w));
}

absl::StatusOr<std::shared_ptr<const ModelWeights>> LoadCheckpoint(
    const std::filesystem::path& dir) {
  const std::string where = absl::StrCat("checkpoint ", dir.string());
  absl::StatusOr<ModelConfig> config = ReadModelConfig(dir);
  if (!config.ok()) return Annotate(config.status(), where);
  absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
  if (!index.ok()) return Annotate(index.status(), where);

  std::map<std::string, SafetensorsFile> files;
  for (const auto& [name, file] : index->weight_map) {
    if (files.contains(file)) continue;
    absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir / file);
    if (!f.ok()) return Annotate(f.status(), where);
    files.emplace(file, std::move(*f));
  }
  std::vector<TensorView> views;
  views.reserve(index->weight_map.size());
  for (const auto& [name, file] : index->weight_map) {
    const SafetensorsFile& f = files.at(file);
    const TensorInfo* info = f.Find(name);
    if (info == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor ", name, " is mapped to ",
                                                     file,
                                                     " by the index, but that file lacks it"));
    }
    views.push_back(TensorView{name, info->dtype, info->shape, f.Data(*info)});
  }
  absl::StatusOr<std::shared_ptr<const ModelWeights>> weights =
      ModelWeights::FromTensors(*config, views);
  if (!weights.ok()) return Annotate(weights.status(), where);
  return weights;
}

}  // namespace stitch
