#include "stitch/refengine/config.h"

#include <charconv>
#include <cmath>
#include <exception>
#include <optional>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/io/fileio.h"

namespace stitch {
namespace json = boost::json;

namespace {

// Limits that keep every size product far from overflow and refuse configs
// that could never be served on a CPU.
constexpr int64_t kMaxHidden = 1 << 16;
constexpr int64_t kMaxIntermediate = 1 << 18;
constexpr int64_t kMaxLayers = 1 << 10;
constexpr int64_t kMaxHeads = 1 << 10;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxPositions = 1 << 20;
constexpr int64_t kMaxParameters = int64_t{1} << 32;

absl::Status CheckRange(std::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(field), " must be in [", lo, ", ", hi, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status FieldError(std::string_view field, std::string_view want, const json::value& got) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", AbslView(field), " must be ",
                                                 AbslView(want), ", got ", json::serialize(got)));
}

absl::StatusOr<int64_t> GetInt(const json::value& v, std::string_view field) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64()) return FieldError(field, "an integer within range", v);
  if (v.is_double()) {
    const double d = v.get_double();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return FieldError(field, "an integer", v);
}

absl::StatusOr<double> GetNumber(const json::value& v, std::string_view field) {
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  if (v.is_double()) return v.get_double();
  return FieldError(field, "a number", v);
}

// A token id field: an integer, or (as Hugging Face allows for EOS) an array
// of integers of which the byte tokenizer needs exactly `want`.
absl::StatusOr<int32_t> GetTokenId(const json::value& v, std::string_view field, int32_t want) {
  if (v.is_array()) {
    for (const json::value& e : v.get_array()) {
      absl::StatusOr<int64_t> id = GetInt(e, field);
      if (!id.ok()) return id.status();
      if (*id == want) return want;
    }
    return FieldError(field, absl::StrCat(want, " (the byte tokenizer's id)"), v);
  }
  absl::StatusOr<int64_t> id = GetInt(v, field);
  if (!id.ok()) return id.status();
  if (*id < 0 || *id > INT32_MAX) return FieldError(field, "a token id", v);
  return static_cast<int32_t>(*id);
}

// Long on purpose: config.json's fields read one after another, each with
// its own check and message.
absl::StatusOr<ModelConfig> ParseObject(const json::object& o) {
  ModelConfig c;
  auto required_int = [&](std::string_view key, int64_t& out) -> absl::Status {
    const json::value* v = o.if_contains(key);
    if (v == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("config.json: missing required field ", AbslView(key)));
    }
    absl::StatusOr<int64_t> n = GetInt(*v, key);
    if (!n.ok()) return n.status();
    out = *n;
    return absl::OkStatus();
  };
  for (auto [key, out] : {std::pair<std::string_view, int64_t*>{"hidden_size", &c.hidden_size},
                          {"intermediate_size", &c.intermediate_size},
                          {"num_hidden_layers", &c.num_hidden_layers},
                          {"num_attention_heads", &c.num_attention_heads},
                          {"vocab_size", &c.vocab_size},
                          {"max_position_embeddings", &c.max_position_embeddings}}) {
    if (absl::Status s = required_int(key, *out); !s.ok()) return s;
  }
  c.num_key_value_heads = c.num_attention_heads;
  if (const json::value* v = o.if_contains("num_key_value_heads"); v && !v->is_null()) {
    absl::StatusOr<int64_t> n = GetInt(*v, "num_key_value_heads");
    if (!n.ok()) return n.status();
    c.num_key_value_heads = *n;
  }
  for (auto [key, out] : {std::pair<std::string_view, double*>{"rms_norm_eps", &c.rms_norm_eps},
                          {"rope_theta", &c.rope_theta}}) {
    if (const json::value* v = o.if_contains(key)) {
      absl::StatusOr<double> d = GetNumber(*v, key);
      if (!d.ok()) return d.status();
      *out = *d;
    }
  }
  if (const json::value* v = o.if_contains("tie_word_embeddings")) {
    if (!v->is_bool()) return FieldError("tie_word_embeddings", "a boolean", *v);
    c.tie_word_embeddings = v->get_bool();
  }
  // Newer Hugging Face releases write "dtype" instead of "torch_dtype".
  for (std::string_view key : {"torch_dtype", "dtype"}) {
    const json::value* v = o.if_contains(key);
    if (v == nullptr || v->is_null()) continue;
    if (!v->is_string()) return FieldError(key, "\"float32\" or \"bfloat16\"", *v);
    absl::StatusOr<DType> d = ParseTorchDType(std::string_view(v->get_string()));
    if (!d.ok()) return FieldError(key, "\"float32\" or \"bfloat16\"", *v);
    c.weight_dtype = *d;
    break;
  }
  if (const json::value* v = o.if_contains("bos_token_id"); v && !v->is_null()) {
    absl::StatusOr<int32_t> id = GetTokenId(*v, "bos_token_id", c.bos_token_id);
    if (!id.ok()) return id.status();
    c.bos_token_id = *id;
  }
  if (const json::value* v = o.if_contains("eos_token_id"); v && !v->is_null()) {
    absl::StatusOr<int32_t> id = GetTokenId(*v, "eos_token_id", c.eos_token_id);
    if (!id.ok()) return id.status();
    c.eos_token_id = *id;
  }

  // Fields that would change the computation: only the values this engine
  // implements are accepted.
  if (const json::value* v = o.if_contains("architectures"); v && !v->is_null()) {
    bool llama = false;
    if (v->is_array()) {
      for (const json::value& e : v->get_array()) {
        llama = llama || (e.is_string() && e.get_string() == "LlamaForCausalLM");
      }
    }
    if (!llama) return FieldError("architectures", "[\"LlamaForCausalLM\"]", *v);
  }
  if (const json::value* v = o.if_contains("model_type");
      v && !(v->is_string() && v->get_string() == "llama")) {
    return FieldError("model_type", "\"llama\"", *v);
  }
  if (const json::value* v = o.if_contains("hidden_act");
      v && !(v->is_string() && v->get_string() == "silu")) {
    return FieldError("hidden_act", "\"silu\"", *v);
  }
  for (std::string_view key : {"attention_bias", "mlp_bias"}) {
    if (const json::value* v = o.if_contains(key); v && !(v->is_bool() && !v->get_bool())) {
      return FieldError(key, "false (the reference engine has no biases)", *v);
    }
  }
  if (const json::value* v = o.if_contains("rope_scaling"); v && !v->is_null()) {
    return FieldError("rope_scaling", "null (the reference engine has no rope scaling)", *v);
  }
  if (const json::value* v = o.if_contains("head_dim"); v && !v->is_null()) {
    absl::StatusOr<int64_t> n = GetInt(*v, "head_dim");
    if (!n.ok()) return n.status();
    if (c.num_attention_heads <= 0 || *n * c.num_attention_heads != c.hidden_size) {
      return FieldError("head_dim", "hidden_size / num_attention_heads", *v);
    }
  }
  if (absl::Status s = c.Validate(); !s.ok()) return Annotate(s, "config.json");
  return c;
}

}  // namespace

namespace {

// The shortest text that reads back as exactly `d`, written the way Python's
// repr writes floats: positional from 1e-4 up to 1e16 ("10000.0",
// "0.001"), scientific outside ("1e-05"). REQUIRES: d is finite.
std::string FloatText(double d) {
  char buf[64];
  const double a = std::fabs(d);
  const bool positional = a == 0 || (a >= 1e-4 && a < 1e16);
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof buf, d,
                    positional ? std::chars_format::fixed : std::chars_format::scientific);
  std::string out(buf, r.ptr);
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

}  // namespace

std::string_view TorchDTypeName(DType dtype) {
  return dtype == DType::kBF16 ? "bfloat16" : "float32";
}

absl::StatusOr<DType> ParseTorchDType(std::string_view name) {
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  return absl::InvalidArgumentError(absl::StrCat("weight dtype \"", AbslView(name),
                                                 "\" is not supported: use float32 or bfloat16"));
}

absl::Status ModelConfig::Validate() const {
  for (auto [field, value, hi] :
       {std::tuple<std::string_view, int64_t, int64_t>{"hidden_size", hidden_size, kMaxHidden},
        {"intermediate_size", intermediate_size, kMaxIntermediate},
        {"num_hidden_layers", num_hidden_layers, kMaxLayers},
        {"num_attention_heads", num_attention_heads, kMaxHeads},
        {"num_key_value_heads", num_key_value_heads, kMaxHeads},
        {"max_position_embeddings", max_position_embeddings, kMaxPositions}}) {
    if (absl::Status s = CheckRange(field, value, 1, hi); !s.ok()) return s;
  }
  if (absl::Status s = CheckRange("vocab_size", vocab_size, 258, kMaxVocab); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (the byte tokenizer needs 256 bytes + BOS + EOS)"));
  }
  if (hidden_size % num_attention_heads != 0 || head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("hidden_size ", hidden_size,
                                                   " must split into num_attention_heads ",
                                                   num_attention_heads, " heads of an even size"));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", num_attention_heads,
                                                   " must be a multiple of num_key_value_heads ",
                                                   num_key_value_heads));
  }
  if (!(std::isfinite(rms_norm_eps) && rms_norm_eps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rms_norm_eps must be a finite positive number, got ", rms_norm_eps));
  }
  if (!(std::isfinite(rope_theta) && rope_theta > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_theta must be a finite positive number, got ", rope_theta));
  }
  if (weight_dtype != DType::kF32 && weight_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("weight dtype ",
                                                   AbslView(DTypeName(weight_dtype)),
                                                   " is not supported: use float32 or bfloat16"));
  }
  if (bos_token_id != 256 || eos_token_id != 257) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bos_token_id and eos_token_id must be 256 and 257 (the byte tokenizer's), got ",
        bos_token_id, " and ", eos_token_id));
  }
  const int64_t params = ParameterCount();
  if (params > kMaxParameters) {
    return absl::InvalidArgumentError(absl::StrCat("the model would have ", params,
                                                   " parameters, above the reference engine's "
                                                   "limit of ",
                                                   kMaxParameters));
  }
  return absl::OkStatus();
}

int64_t ModelConfig::ParameterCount() const {
  int64_t params = 0;
  for (const TensorSpec& t : ExpectedTensors(*this)) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    params += n;
  }
  return params;
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(std::string_view text) {
  json::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec)
    return absl::InvalidArgumentError(
        absl::StrCat("config.json is not valid JSON: ", ec.message()));
  if (!v.is_object()) return absl::InvalidArgumentError("config.json must hold a JSON object");
  try {
    return ParseObject(v.get_object());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json: ", e.what()));
  }
}

std::string ModelConfig::ToJson() const {
  // Field order follows Hugging Face's LlamaConfig output; each value is
  // serialized by Boost.JSON so numbers print the same way everywhere.
  std::vector<std::pair<std::string_view, json::value>> fields = {
      {"architectures", json::array{"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim()},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings},
      {"rms_norm_eps", nullptr},
      {"rope_theta", nullptr},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", tie_word_embeddings},
      {"torch_dtype", json::string(TorchDTypeName(weight_dtype))},
      {"bos_token_id", bos_token_id},
      {"eos_token_id", eos_token_id},
  };
  std::string out = "{\n";
  for (size_t i = 0; i < fields.size(); ++i) {
    const std::string_view key = fields[i].first;
    std::string value = json::serialize(fields[i].second);
    if (key == "rms_norm_eps") value = FloatText(rms_norm_eps);
    if (key == "rope_theta") value = FloatText(rope_theta);
    absl::StrAppend(&out, "  \"", AbslView(key), "\": ", value,
                    i + 1 < fields.size() ? ",\n" : "\n");
  }
  out += "}\n";
  return out;
}

absl::StatusOr<ModelConfig> ReadModelConfig(const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kModelConfigFileName;
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(*text);
  if (!config.ok()) return Annotate(config.status(), path.string());
  return config;
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t kv = c.kv_dim();
  const int64_t ffn = c.intermediate_size;
  std::vector<TensorSpec> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    out.push_back({p + "self_attn.q_proj.weight", {h, h}});
    out.push_back({p + "self_attn.k_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.v_proj.weight", {kv, h}});
    out.push_back({p + "self_attn.o_proj.weight", {h, h}});
    out.push_back({p + "mlp.gate_proj.weight", {ffn, h}});
    out.push_back({p + "mlp.up_proj.weight", {ffn, h}});
    out.push_back({p + "mlp.down_proj.weight", {h, ffn}});
    out.push_back({p + "input_layernorm.weight", {h}});
    out.push_back({p + "post_attention_layernorm.weight", {h}});
  }
  out.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, h}});
  return out;
}

}  // namespace stitch
