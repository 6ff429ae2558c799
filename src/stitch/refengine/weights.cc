#include "stitch/refengine/weights.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "absl/strings/numbers.h"
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
  w->checksums_ = std::move(checksums);
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

// In-place patches ---------------------------------------------------------------

std::span<float> ModelWeights::Storage(std::string_view name) {
  if (name == "model.embed_tokens.weight") return embedding_;
  if (name == "model.norm.weight") return final_norm_;
  if (name == "lm_head.weight") {
    return config_.tie_word_embeddings ? std::span<float>() : std::span<float>(lm_head_);
  }
  constexpr std::string_view kLayers = "model.layers.";
  if (!name.starts_with(kLayers)) return {};
  const std::string_view rest = name.substr(kLayers.size());
  const size_t dot = rest.find('.');
  int64_t l = 0;
  if (dot == std::string_view::npos || !absl::SimpleAtoi(AbslView(rest.substr(0, dot)), &l) ||
      l < 0 || l >= config_.num_hidden_layers) {
    return {};
  }
  const std::string_view part = rest.substr(dot + 1);
  Layer& layer = layers_[static_cast<size_t>(l)];
  const size_t hidden = static_cast<size_t>(config_.hidden_size);
  const size_t q = hidden * hidden;
  const size_t kv = static_cast<size_t>(config_.kv_dim()) * hidden;
  const size_t gate = static_cast<size_t>(config_.intermediate_size) * hidden;
  std::span<float> qkv(layer.qkv);
  std::span<float> gate_up(layer.gate_up);
  if (part == "input_layernorm.weight") return layer.input_norm;
  if (part == "post_attention_layernorm.weight") return layer.post_norm;
  if (part == "self_attn.q_proj.weight") return qkv.subspan(0, q);
  if (part == "self_attn.k_proj.weight") return qkv.subspan(q, kv);
  if (part == "self_attn.v_proj.weight") return qkv.subspan(q + kv, kv);
  if (part == "self_attn.o_proj.weight") return layer.o;
  if (part == "mlp.gate_proj.weight") return gate_up.subspan(0, gate);
  if (part == "mlp.up_proj.weight") return gate_up.subspan(gate, gate);
  if (part == "mlp.down_proj.weight") return layer.down;
  return {};
}

namespace {

// One element of a patch, as the float32 bits the weights hold it in.
uint32_t WidenedBits(const std::byte* element, DType dtype) {
  if (dtype == DType::kBF16) {
    uint16_t h;
    std::memcpy(&h, element, 2);
    return uint32_t{h} << 16;
  }
  uint32_t f;
  std::memcpy(&f, element, 4);
  return f;
}

}  // namespace

absl::Status ModelWeights::Rewrite(const TensorPatch& t, std::span<float> storage,
                                   bool undo) const {
  const size_t width = DTypeSize(t.dtype);
  auto element = [&](size_t k, uint32_t& old_bits, uint32_t& new_bits) {
    std::byte bits[4];
    for (size_t b = 0; b < width; ++b) {
      bits[b] = t.new_bits[k * width + b] ^ t.xor_bits[k * width + b];
    }
    old_bits = WidenedBits(bits, t.dtype);
    new_bits = WidenedBits(t.new_bits.data() + k * width, t.dtype);
  };
  for (size_t k = 0; k < t.idx.size(); ++k) {
    uint32_t old_bits = 0;
    uint32_t new_bits = 0;
    element(k, old_bits, new_bits);
    const uint32_t want = undo ? new_bits : old_bits;
    const uint32_t held = std::bit_cast<uint32_t>(storage[static_cast<size_t>(t.idx[k])]);
    if (held != want) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor ", t.name, " holds another value at element ", t.idx[k], " than ",
                       undo ? "the patch wrote" : "the version the patch starts from has"));
    }
  }
  for (size_t k = 0; k < t.idx.size(); ++k) {
    uint32_t old_bits = 0;
    uint32_t new_bits = 0;
    element(k, old_bits, new_bits);
    storage[static_cast<size_t>(t.idx[k])] = std::bit_cast<float>(undo ? old_bits : new_bits);
  }
  return absl::OkStatus();
}

Checksum128 ModelWeights::HashStorage(std::span<const float> storage) const {
  if (config_.weight_dtype != DType::kBF16) return Xxh3Checksum(std::as_bytes(storage));
  // Values widened from bfloat16 have 16 zero low bits: dropping them gives
  // the checkpoint's bytes back exactly (NaN payloads included).
  std::vector<uint16_t> narrow(storage.size());
  for (size_t i = 0; i < storage.size(); ++i) {
    narrow[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(storage[i]) >> 16);
  }
  return Xxh3Checksum(std::as_bytes(std::span<const uint16_t>(narrow)));
}

absl::Status ModelWeights::ApplyPatch(const WeightPatch& patch, int64_t fail_after_tensors) {
  const std::string what =
      absl::StrCat("patching ", patch.from.ToString(), " to ", patch.to.ToString(), " in place");
  // Every tensor finds its place before anything is written.
  std::vector<std::span<float>> places;
  for (const TensorPatch& t : patch.tensors) {
    std::span<float> place = Storage(t.name);
    const size_t width = DTypeSize(t.dtype);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    std::string_view fault;
    if (place.empty()) {
      fault = "is not a tensor of this model";
    } else if (t.dtype != config_.weight_dtype) {
      fault = "has another dtype than the model's";
    } else if (static_cast<size_t>(numel) != place.size()) {
      fault = "has another shape than the model's";
    } else if (t.xor_bits.size() != t.idx.size() * width ||
               t.new_bits.size() != t.idx.size() * width) {
      fault = "has another number of values than positions";
    } else if (!std::is_sorted(t.idx.begin(), t.idx.end()) ||
               (!t.idx.empty() && (t.idx.front() < 0 || t.idx.back() >= numel))) {
      fault = "has positions out of order or out of the tensor";
    }
    if (!fault.empty()) {
      return absl::AbortedError(
          absl::StrCat(what, ": tensor ", t.name, " ", AbslView(fault), "; nothing was changed"));
    }
    places.push_back(place);
  }
  size_t written = 0;
  absl::Status failure;
  for (size_t i = 0; i < patch.tensors.size() && failure.ok(); ++i) {
    if (fail_after_tensors >= 0 && static_cast<int64_t>(i) == fail_after_tensors) {
      failure = absl::InternalError(
          absl::StrCat("injected fault: the patch fails after ", fail_after_tensors, " tensors"));
      break;
    }
    failure = Rewrite(patch.tensors[i], places[i], /*undo=*/false);
    if (failure.ok()) ++written;
  }
  std::vector<Checksum128> hashes(patch.tensors.size());
  for (size_t i = 0; i < patch.tensors.size() && failure.ok(); ++i) {
    hashes[i] = HashStorage(places[i]);
    if (hashes[i] != patch.tensors[i].checksum) {
      failure = WithKind(absl::DataLossError(absl::StrCat(
                             "tensor ", patch.tensors[i].name, " hashes to ", hashes[i].ToHex(),
                             " after the patch, ", patch.to.ToString(), " records ",
                             patch.tensors[i].checksum.ToHex())),
                         ErrorKind::kChecksumMismatch);
    }
  }
  if (failure.ok()) {
    for (size_t i = 0; i < patch.tensors.size(); ++i) {
      checksums_.insert_or_assign(patch.tensors[i].name, hashes[i]);
    }
    fingerprint_ = WeightsFingerprint(checksums_);
    return absl::OkStatus();
  }
  // XOR is its own inverse: the tensors written so far get their old values
  // back, and are hashed against the checksums they had.
  for (size_t i = 0; i < written; ++i) {
    const TensorPatch& t = patch.tensors[i];
    absl::Status undone = Rewrite(t, places[i], /*undo=*/true);
    const auto before = checksums_.find(t.name);
    if (undone.ok() && (before == checksums_.end() || HashStorage(places[i]) != before->second)) {
      undone = absl::DataLossError(absl::StrCat("tensor ", t.name, " does not hash as before"));
    }
    if (!undone.ok()) {
      return absl::DataLossError(absl::StrCat(what, " failed (", failure.message(),
                                              ") and could not be undone: ", undone.message(),
                                              "; the weights are unknown"));
    }
  }
  return absl::AbortedError(absl::StrCat(what, " failed and was undone, the weights are ",
                                         patch.from.ToString(), "'s again: ", failure.message()));
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
