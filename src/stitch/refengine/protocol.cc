#include "stitch/refengine/protocol.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <limits>
#include <utility>

#include <boost/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/net/prometheus.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {

namespace json = boost::json;

namespace {

std::string_view View(const json::string& s) { return {s.data(), s.size()}; }
json::string_view JsonView(std::string_view s) { return {s.data(), s.size()}; }

std::string_view KindName(const json::value& v) {
  switch (v.kind()) {
    case json::kind::null:
      return "null";
    case json::kind::bool_:
      return "bool";
    case json::kind::int64:
    case json::kind::uint64:
      return "integer";
    case json::kind::double_:
      return "number";
    case json::kind::string:
      return "string";
    case json::kind::array:
      return "array";
    case json::kind::object:
      return "object";
  }
  return "value";
}

// A JSON integer, or a number with an integral value, as int64.
std::optional<int64_t> AsInteger(const json::value& v) {
  if (v.is_int64()) return v.get_int64();
  if (v.is_uint64()) {
    if (v.get_uint64() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(v.get_uint64());
  }
  if (v.is_double()) {
    const double d = v.get_double();
    if (std::isfinite(d) && std::trunc(d) == d && std::fabs(d) < 9.0e15) {
      return static_cast<int64_t>(d);
    }
  }
  return std::nullopt;
}

std::optional<double> AsNumber(const json::value& v) {
  if (v.is_int64()) return static_cast<double>(v.get_int64());
  if (v.is_uint64()) return static_cast<double>(v.get_uint64());
  if (v.is_double()) return v.get_double();
  return std::nullopt;
}

// Reads the fields of one JSON object; the first error is kept and later
// reads return nullopt. Absent fields and JSON nulls read as absent.
class FieldReader {
 public:
  FieldReader(const json::object& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  const json::object& object() const { return object_; }
  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  std::string Path(std::string_view name) const { return absl::StrCat(prefix_, AbslView(name)); }

  void Fail(std::string message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(std::move(message));
  }
  void FailType(std::string_view name, std::string_view wanted, const json::value& got) {
    Fail(absl::StrCat("field \"", Path(name), "\" must be ", AbslView(wanted), ", got ",
                      AbslView(KindName(got))));
  }

  const json::value* Find(std::string_view name) const {
    auto it = object_.find(JsonView(name));
    if (it == object_.end() || it->value().is_null()) return nullptr;
    return &it->value();
  }

  std::optional<bool> Bool(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_bool()) {
      FailType(name, "true or false", *v);
      return std::nullopt;
    }
    return v->get_bool();
  }

  std::optional<int64_t> Int(std::string_view name, int64_t min, int64_t max) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    std::optional<int64_t> n = AsInteger(*v);
    if (!n.has_value() || *n < min || *n > max) {
      Fail(absl::StrCat("field \"", Path(name), "\" must be an integer in [", min, ", ", max,
                        "], got ", json::serialize(*v)));
      return std::nullopt;
    }
    return n;
  }

  std::optional<double> Number(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    std::optional<double> d = AsNumber(*v);
    if (!d.has_value() || !std::isfinite(*d)) {
      FailType(name, "a number", *v);
      return std::nullopt;
    }
    return d;
  }

  std::optional<std::string> String(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) {
      FailType(name, "a string", *v);
      return std::nullopt;
    }
    return std::string(View(v->get_string()));
  }

  // A string or an array of strings (OpenAI's and SGLang's `stop`).
  std::optional<std::vector<std::string>> Strings(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    std::vector<std::string> out;
    if (v->is_string()) {
      out.emplace_back(View(v->get_string()));
    } else if (v->is_array()) {
      for (const json::value& item : v->get_array()) {
        if (!item.is_string()) {
          FailType(name, "a string or an array of strings", item);
          return std::nullopt;
        }
        out.emplace_back(View(item.get_string()));
      }
    } else {
      FailType(name, "a string or an array of strings", *v);
      return std::nullopt;
    }
    for (const std::string& s : out) {
      if (s.empty()) {
        Fail(absl::StrCat("field \"", Path(name),
                          "\" holds an empty string; stop strings must "
                          "not be empty"));
        return std::nullopt;
      }
    }
    return out;
  }

  std::optional<std::vector<int32_t>> TokenIds(std::string_view name, int64_t vocab) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array()) {
      FailType(name, "an array of token ids", *v);
      return std::nullopt;
    }
    std::vector<int32_t> out;
    for (const json::value& item : v->get_array()) {
      std::optional<int64_t> id = AsInteger(item);
      if (!id.has_value() || *id < 0 || *id >= vocab) {
        Fail(absl::StrCat("field \"", Path(name), "\" must hold token ids in [0, ", vocab,
                          "), got ", json::serialize(item)));
        return std::nullopt;
      }
      out.push_back(static_cast<int32_t>(*id));
    }
    return out;
  }

  const json::object* Object(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) {
      FailType(name, "an object", *v);
      return nullptr;
    }
    return &v->get_object();
  }

  // Refuses a parameter this engine does not implement unless it holds its
  // neutral value.
  void RefuseUnless(std::string_view name, const std::function<bool(const json::value&)>& neutral,
                    std::string_view neutral_text) {
    const json::value* v = Find(name);
    if (v == nullptr || neutral(*v)) return;
    Fail(absl::StrCat("\"", Path(name), "\" is not supported by the reference engine (only ",
                      AbslView(neutral_text), "); remove it from the request"));
  }
  void RefuseNumberUnless(std::string_view name, double neutral) {
    RefuseUnless(
        name,
        [neutral](const json::value& v) {
          std::optional<double> d = AsNumber(v);
          return d.has_value() && *d == neutral;
        },
        absl::StrCat(neutral));
  }
  void RefuseSet(std::string_view name) {
    RefuseUnless(
        name,
        [](const json::value& v) {
          return (v.is_bool() && !v.get_bool()) || (v.is_object() && v.get_object().empty()) ||
                 (v.is_array() && v.get_array().empty());
        },
        "null, false or empty");
  }

 private:
  const json::object& object_;
  std::string prefix_;
  absl::Status status_;
};

absl::StatusOr<json::object> ParseObject(std::string_view body, std::string_view what) {
  boost::system::error_code ec;
  json::value v = json::parse(JsonView(body), ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("the ", AbslView(what),
                                                   " body is not valid JSON (", ec.message(),
                                                   "); send a JSON object"));
  }
  if (!v.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", AbslView(what), " body must be a JSON object, got ", AbslView(KindName(v))));
  }
  return std::move(v.get_object());
}

// Sampling fields shared by SGLang's sampling_params and the OpenAI bodies
// (OpenAI names in `openai_names` mode): temperature, top_p, top_k, stop,
// stop_token_ids, ignore_eos, no_stop_trim, the special-token switches
// (honoured: the byte tokenizer gives special tokens no text), seed, and the
// refusals of parameters the engine does not implement.
void ReadCommonSampling(FieldReader& r, const ModelConfig& config, ApiRequest* out) {
  GenerationRequest& g = out->generation;
  if (auto t = r.Number("temperature")) {
    if (*t < 0) {
      r.Fail(absl::StrCat("field \"", r.Path("temperature"), "\" must be >= 0 (0 is greedy)"));
    }
    g.sampling.temperature = static_cast<float>(*t);
  }
  if (auto p = r.Number("top_p")) {
    if (!(*p > 0 && *p <= 1)) {
      r.Fail(absl::StrCat("field \"", r.Path("top_p"), "\" must be in (0, 1], got ", *p));
    }
    g.sampling.top_p = static_cast<float>(*p);
  }
  if (auto k = r.Int("top_k", -1, std::numeric_limits<int32_t>::max())) {
    if (*k == 0) {
      r.Fail(absl::StrCat("field \"", r.Path("top_k"),
                          "\" must be -1 (every token) or at least 1, got 0"));
    }
    g.sampling.top_k = static_cast<int32_t>(*k);
  }
  if (auto stop = r.Strings("stop")) g.stop = *std::move(stop);
  if (auto ids = r.TokenIds("stop_token_ids", config.vocab_size)) g.stop_token_ids = *ids;
  if (auto b = r.Bool("ignore_eos")) g.ignore_eos = *b;
  if (auto b = r.Bool("no_stop_trim")) g.keep_stop_string = *b;
  (void)r.Bool("skip_special_tokens");
  (void)r.Bool("spaces_between_special_tokens");
  std::optional<int64_t> seed = r.Int("seed", 0, std::numeric_limits<int64_t>::max());
  std::optional<int64_t> sampling_seed =
      r.Int("sampling_seed", 0, std::numeric_limits<int64_t>::max());
  if (seed && sampling_seed && *seed != *sampling_seed) {
    r.Fail(absl::StrCat("\"", r.Path("seed"), "\" and \"", r.Path("sampling_seed"),
                        "\" disagree; send one of them"));
  }
  if (seed || sampling_seed) out->seed = static_cast<uint64_t>(seed ? *seed : *sampling_seed);
  r.RefuseNumberUnless("min_p", 0);
  r.RefuseNumberUnless("frequency_penalty", 0);
  r.RefuseNumberUnless("presence_penalty", 0);
  r.RefuseNumberUnless("repetition_penalty", 1);
  r.RefuseNumberUnless("n", 1);
  for (std::string_view name : {"json_schema", "regex", "ebnf", "structural_tag", "stop_regex",
                                "custom_params", "logit_bias"}) {
    r.RefuseSet(name);
  }
}

// Top-level SGLang features the engine does not implement.
void RefuseUnsupportedTopLevel(FieldReader& r) {
  for (std::string_view name :
       {"image_data", "video_data", "audio_data", "input_embeds", "lora_path", "lora_id",
        "session_params", "custom_logit_processor", "return_hidden_states", "token_ids_logprob",
        "bootstrap_host", "bootstrap_port", "bootstrap_room", "modalities"}) {
    r.RefuseSet(name);
  }
}

void ReadCacheKey(FieldReader& r, ApiRequest* out) {
  if (out->api == EngineApi::kVllm) {
    if (auto salt = r.String("cache_salt")) {
      // vLLM's rule for a salt, so that what a sidecar sends is checked
      // here as the real engine checks it.
      if (salt->size() > 128 ||
          salt->find_first_of(std::string_view("@/\\\0", 4)) != std::string::npos) {
        r.Fail(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', "
            "'/', '\\', or NUL.");
      }
      out->generation.extra_key = *salt;
    }
    if (auto id = r.String("request_id")) out->response_rid = *id;
    return;
  }
  std::optional<std::string> extra_key = r.String("extra_key");
  std::optional<std::string> cache_salt = r.String("cache_salt");
  if (extra_key && cache_salt && *extra_key != *cache_salt) {
    r.Fail("\"extra_key\" and \"cache_salt\" disagree; send one of them");
  }
  if (extra_key) out->generation.extra_key = *extra_key;
  if (cache_salt) out->generation.extra_key = *cache_salt;
  if (auto rid = r.String("rid")) out->generation.rid = *rid;
}

absl::Status ParseGenerate(const json::object& body, const ModelConfig& config, ApiRequest* out) {
  FieldReader r(body, "");
  GenerationRequest& g = out->generation;
  const json::value* text = r.Find("text");
  const json::value* ids = r.Find("input_ids");
  if (text != nullptr && ids != nullptr) {
    return absl::InvalidArgumentError("send either \"text\" or \"input_ids\", not both");
  }
  if (text == nullptr && ids == nullptr) {
    return absl::InvalidArgumentError("the request needs \"text\" or \"input_ids\"");
  }
  if (text != nullptr) {
    if (text->is_array()) {
      return absl::InvalidArgumentError(
          "batched /generate requests (\"text\" as a list) are not supported; send one request "
          "per prompt");
    }
    if (std::optional<std::string> t = r.String("text")) {
      g.prompt = EncodeText(*t, BosMode::kPrepend);
    }
  } else {
    if (ids->is_array() && !ids->get_array().empty() && ids->get_array()[0].is_array()) {
      return absl::InvalidArgumentError(
          "batched /generate requests (\"input_ids\" as a list of lists) are not supported; send "
          "one request per prompt");
    }
    if (auto tokens = r.TokenIds("input_ids", config.vocab_size)) g.prompt = *std::move(tokens);
  }
  if (const json::value* rid = r.Find("rid"); rid != nullptr && rid->is_array()) {
    return absl::InvalidArgumentError(
        "\"rid\" must be a string (batched requests are not "
        "supported)");
  }
  ReadCacheKey(r, out);
  if (auto b = r.Bool("stream")) out->stream = *b;
  if (auto b = r.Bool("return_logprob")) out->return_logprob = *b;
  if (auto b = r.Bool("return_text_in_logprobs")) out->return_text_in_logprobs = *b;
  (void)r.Bool("log_metrics");
  r.RefuseNumberUnless("logprob_start_len", -1);
  r.RefuseNumberUnless("top_logprobs_num", 0);
  RefuseUnsupportedTopLevel(r);
  if (!r.ok()) return r.status();

  g.max_new_tokens = 128;  // SGLang's default
  if (const json::value* sp = r.Find("sampling_params")) {
    if (!sp->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field \"sampling_params\" must be an object, got ", AbslView(KindName(*sp))));
    }
    static const absl::flat_hash_set<std::string> kKnown = {"max_new_tokens",
                                                            "temperature",
                                                            "top_p",
                                                            "top_k",
                                                            "stop",
                                                            "stop_token_ids",
                                                            "ignore_eos",
                                                            "no_stop_trim",
                                                            "skip_special_tokens",
                                                            "spaces_between_special_tokens",
                                                            "seed",
                                                            "sampling_seed",
                                                            "min_p",
                                                            "frequency_penalty",
                                                            "presence_penalty",
                                                            "repetition_penalty",
                                                            "n",
                                                            "json_schema",
                                                            "regex",
                                                            "ebnf",
                                                            "structural_tag",
                                                            "stop_regex",
                                                            "custom_params",
                                                            "logit_bias",
                                                            "min_new_tokens"};
    FieldReader s(sp->get_object(), "sampling_params.");
    for (const auto& field : sp->get_object()) {
      const std::string_view key(field.key().data(), field.key().size());
      if (!kKnown.contains(AbslView(key))) {
        s.Fail(absl::StrCat("unknown sampling parameter \"", AbslView(key),
                            "\"; the reference engine honours max_new_tokens, temperature, top_p, "
                            "top_k, stop, stop_token_ids, ignore_eos, no_stop_trim, seed "
                            "(docs/engine.md)"));
      }
    }
    if (auto n = s.Int("max_new_tokens", 0, config.max_position_embeddings)) g.max_new_tokens = *n;
    s.RefuseNumberUnless("min_new_tokens", 0);
    ReadCommonSampling(s, config, out);
    if (!s.ok()) return s.status();
  }
  return absl::OkStatus();
}

// The OpenAI fields shared by both routes.
void ReadOpenAiCommon(FieldReader& r, const ModelConfig& config, ApiRequest* out) {
  if (auto m = r.String("model")) out->model = *m;
  if (auto b = r.Bool("stream")) out->stream = *b;
  if (const json::object* options = r.Object("stream_options")) {
    FieldReader o(*options, "stream_options.");
    if (auto b = o.Bool("include_usage")) out->include_usage = *b;
    if (!o.ok()) r.Fail(std::string(o.status().message()));
  }
  (void)r.String("user");
  ReadCacheKey(r, out);
  ReadCommonSampling(r, config, out);
  r.RefuseNumberUnless("min_tokens", 0);
  r.RefuseNumberUnless("best_of", 1);
  r.RefuseUnless(
      "response_format",
      [](const json::value& v) {
        if (!v.is_object()) return false;
        const json::value* type = v.get_object().if_contains("type");
        return v.get_object().size() == 1 && type != nullptr && type->is_string() &&
               type->get_string() == "text";
      },
      "{\"type\": \"text\"}");
  RefuseUnsupportedTopLevel(r);
}

absl::Status ParseCompletions(const json::object& body, const ModelConfig& config,
                              ApiRequest* out) {
  FieldReader r(body, "");
  GenerationRequest& g = out->generation;
  const json::value* prompt = r.Find("prompt");
  if (prompt == nullptr) return absl::InvalidArgumentError("the request needs \"prompt\"");
  const json::value* one = prompt;
  if (prompt->is_array() && !prompt->get_array().empty() &&
      (prompt->get_array()[0].is_string() || prompt->get_array()[0].is_array())) {
    if (prompt->get_array().size() != 1) {
      return absl::InvalidArgumentError(
          "\"prompt\" holds several prompts; send one request per prompt");
    }
    one = &prompt->get_array()[0];
  }
  if (one->is_string()) {
    g.prompt = EncodeText(View(one->get_string()), BosMode::kPrepend);
  } else if (one->is_array()) {
    json::object holder;
    holder["prompt"] = *one;
    FieldReader ids(holder, "");
    if (auto tokens = ids.TokenIds("prompt", config.vocab_size)) g.prompt = *std::move(tokens);
    if (!ids.ok()) return ids.status();
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("field \"prompt\" must be a string or an array of token ids, got ",
                     AbslView(KindName(*one))));
  }
  g.max_new_tokens = 16;  // OpenAI's default
  if (auto n = r.Int("max_tokens", 0, config.max_position_embeddings)) g.max_new_tokens = *n;
  if (auto lp = r.Int("logprobs", 0, 20)) {
    if (*lp > 0) {
      r.Fail(
          "\"logprobs\" > 0 (top alternatives) is not supported by the reference engine; use "
          "0 for the sampled tokens' log-probabilities");
    }
    out->return_logprob = true;
  }
  if (out->api == EngineApi::kVllm) {
    if (auto b = r.Bool("return_tokens_as_token_ids")) out->tokens_as_ids = *b;
  }
  r.RefuseSet("echo");
  r.RefuseUnless(
      "suffix", [](const json::value& v) { return v.is_string() && v.get_string().empty(); },
      "an empty string");
  ReadOpenAiCommon(r, config, out);
  return r.status();
}

absl::Status ParseChat(const json::object& body, const ModelConfig& config, ApiRequest* out) {
  FieldReader r(body, "");
  GenerationRequest& g = out->generation;
  const json::value* messages = r.Find("messages");
  if (messages == nullptr || !messages->is_array()) {
    return absl::InvalidArgumentError("the request needs \"messages\", an array of messages");
  }
  std::vector<ChatMessage> chat;
  for (size_t i = 0; i < messages->get_array().size(); ++i) {
    const json::value& m = messages->get_array()[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, " must be an object"));
    }
    FieldReader mr(m.get_object(), where + ".");
    ChatMessage message;
    if (auto role = mr.String("role")) message.role = *role;
    mr.RefuseSet("tool_calls");
    const json::value* content = mr.Find("content");
    if (content == nullptr) {
      mr.Fail(absl::StrCat(where, " needs \"content\""));
    } else if (content->is_string()) {
      message.content = std::string(View(content->get_string()));
    } else if (content->is_array()) {
      for (const json::value& part : content->get_array()) {
        const json::object* p = part.if_object();
        const json::value* type = p != nullptr ? p->if_contains("type") : nullptr;
        const json::value* text = p != nullptr ? p->if_contains("text") : nullptr;
        if (type == nullptr || !type->is_string() || type->get_string() != "text" ||
            text == nullptr || !text->is_string()) {
          mr.Fail(absl::StrCat(where,
                               ".content holds a part that is not {\"type\": \"text\", "
                               "\"text\": ...}; the reference engine takes text only"));
          break;
        }
        message.content += View(text->get_string());
      }
    } else {
      mr.FailType("content", "a string or an array of text parts", *content);
    }
    if (!mr.ok()) return mr.status();
    chat.push_back(std::move(message));
  }
  absl::StatusOr<std::string> templated = ApplyChatTemplate(chat);
  if (!templated.ok()) return templated.status();
  g.prompt = EncodeText(*templated, BosMode::kPrepend);

  // Without a limit a chat reply may fill the context.
  g.max_new_tokens = config.max_position_embeddings;
  std::optional<int64_t> max_tokens = r.Int("max_tokens", 0, config.max_position_embeddings);
  std::optional<int64_t> max_completion =
      r.Int("max_completion_tokens", 0, config.max_position_embeddings);
  if (max_tokens && max_completion && *max_tokens != *max_completion) {
    r.Fail("\"max_tokens\" and \"max_completion_tokens\" disagree; send one of them");
  }
  if (max_tokens) g.max_new_tokens = *max_tokens;
  if (max_completion) g.max_new_tokens = *max_completion;
  if (auto b = r.Bool("logprobs")) out->return_logprob = *b;
  r.RefuseNumberUnless("top_logprobs", 0);
  r.RefuseSet("tools");
  r.RefuseUnless(
      "tool_choice",
      [](const json::value& v) {
        return v.is_string() && (v.get_string() == "none" || v.get_string() == "auto");
      },
      "\"none\" or \"auto\" without tools");
  (void)r.Bool("parallel_tool_calls");
  r.RefuseSet("continue_final_message");
  r.RefuseSet("chat_template_kwargs");
  ReadOpenAiCommon(r, config, out);
  return r.status();
}

// --- Responses ------------------------------------------------------------

json::value SglangFinishReason(const std::optional<FinishReason>& finish,
                               int64_t completion_tokens) {
  if (!finish.has_value()) return nullptr;
  json::object o;
  switch (finish->type) {
    case FinishType::kStop:
      o["type"] = "stop";
      if (finish->matched_text) {
        o["matched"] = *finish->matched_text;
      } else if (finish->matched_token) {
        o["matched"] = *finish->matched_token;
      }
      break;
    case FinishType::kLength:
      o["type"] = "length";
      o["length"] = completion_tokens;
      break;
    case FinishType::kAbort:
      o["type"] = "abort";
      o["message"] = finish->message;
      break;
  }
  return o;
}

json::value OpenAiFinishReason(const std::optional<FinishReason>& finish) {
  if (!finish.has_value()) return nullptr;
  switch (finish->type) {
    case FinishType::kStop:
      return "stop";
    case FinishType::kLength:
      return "length";
    case FinishType::kAbort:
      return "abort";
  }
  return nullptr;
}

json::value MatchedStop(const std::optional<FinishReason>& finish) {
  if (!finish.has_value() || finish->type != FinishType::kStop) return nullptr;
  if (finish->matched_text) return json::value(*finish->matched_text);
  if (finish->matched_token) return json::value(*finish->matched_token);
  return nullptr;
}

std::string TokenText(int32_t id) { return DecodeTokens(std::span<const int32_t>(&id, 1)); }

json::object Usage(const GenerationProgress& p) {
  json::object u;
  const auto completion = static_cast<int64_t>(p.tokens.size());
  u["prompt_tokens"] = p.prompt_tokens;
  u["completion_tokens"] = completion;
  u["total_tokens"] = p.prompt_tokens + completion;
  json::object details;
  details["cached_tokens"] = p.cached_tokens;
  u["prompt_tokens_details"] = std::move(details);
  return u;
}

json::array Spans(const GenerationProgress& p) {
  json::array spans;
  spans.reserve(p.spans.size());
  for (const auto& [offset, version] : p.spans) {
    json::array pair;
    pair.emplace_back(offset);
    pair.emplace_back(version);
    spans.emplace_back(std::move(pair));
  }
  return spans;
}

json::object Metadata(const GenerationProgress& p) {
  json::object m;
  m["weight_version"] = WeightVersionString(p.weight_version);
  return m;
}

json::object GenerateObject(const ApiRequest& request, const GenerationProgress& p) {
  json::object o;
  o["text"] = p.text;
  json::array ids;
  ids.reserve(p.tokens.size());
  for (const GeneratedToken& t : p.tokens) ids.emplace_back(t.id);
  o["output_ids"] = std::move(ids);
  json::object meta;
  const auto completion = static_cast<int64_t>(p.tokens.size());
  meta["id"] = p.rid;
  meta["finish_reason"] = SglangFinishReason(p.finish, completion);
  meta["prompt_tokens"] = p.prompt_tokens;
  meta["completion_tokens"] = completion;
  meta["cached_tokens"] = p.cached_tokens;
  meta["weight_version"] = WeightVersionString(p.weight_version);
  if (request.report_spans) meta["weight_version_spans"] = Spans(p);
  if (request.return_logprob) {
    json::array logprobs;
    logprobs.reserve(p.tokens.size());
    for (const GeneratedToken& t : p.tokens) {
      json::array triple;
      triple.emplace_back(t.logprob);
      triple.emplace_back(t.id);
      if (request.return_text_in_logprobs) {
        triple.emplace_back(TokenText(t.id));
      } else {
        triple.emplace_back(nullptr);
      }
      logprobs.emplace_back(std::move(triple));
    }
    meta["output_token_logprobs"] = std::move(logprobs);
  }
  if (p.finish.has_value()) meta["e2e_latency"] = p.e2e_latency_seconds;
  o["meta_info"] = std::move(meta);
  return o;
}

// OpenAI log-probabilities of tokens [from, to).
json::value CompletionLogprobs(const ApiRequest& request, const GenerationProgress& p, size_t from,
                               size_t to) {
  json::array tokens;
  json::array token_logprobs;
  for (size_t i = from; i < to; ++i) {
    if (request.tokens_as_ids) {
      tokens.emplace_back(absl::StrCat("token_id:", p.tokens[i].id));
    } else {
      tokens.emplace_back(TokenText(p.tokens[i].id));
    }
    token_logprobs.emplace_back(p.tokens[i].logprob);
  }
  json::object o;
  o["tokens"] = std::move(tokens);
  o["token_logprobs"] = std::move(token_logprobs);
  o["top_logprobs"] = nullptr;
  return o;
}

json::value ChatLogprobs(const GenerationProgress& p, size_t from, size_t to) {
  json::array content;
  for (size_t i = from; i < to; ++i) {
    json::object t;
    t["token"] = TokenText(p.tokens[i].id);
    t["logprob"] = p.tokens[i].logprob;
    json::array bytes;
    if (p.tokens[i].id < 256) bytes.emplace_back(p.tokens[i].id);
    t["bytes"] = std::move(bytes);
    t["top_logprobs"] = json::array();
    content.emplace_back(std::move(t));
  }
  json::object o;
  o["content"] = std::move(content);
  return o;
}

std::string CompletionId(const ApiRequest& request, const GenerationProgress& p) {
  return absl::StrCat(request.route == ApiRoute::kChatCompletions ? "chatcmpl-" : "cmpl-", p.rid);
}

json::object OpenAiEnvelope(const ApiRequest& request, const GenerationProgress& p,
                            const ResponseContext& context, std::string_view object) {
  json::object o;
  o["id"] = CompletionId(request, p);
  o["object"] = JsonView(object);
  o["created"] = context.created;
  o["model"] = request.model.empty() ? context.model : request.model;
  return o;
}

std::string VersionText(const VersionRef& v) { return v.ToString(); }

}  // namespace

std::string_view EngineApiName(EngineApi api) {
  return api == EngineApi::kVllm ? "vllm" : "sglang";
}

absl::StatusOr<EngineApi> ParseEngineApi(std::string_view name) {
  if (name == "sglang") return EngineApi::kSglang;
  if (name == "vllm") return EngineApi::kVllm;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown engine API \"", AbslView(name), "\" (expected sglang|vllm)"));
}

std::string VllmEngineRid(ApiRoute route, std::string_view request_id) {
  if (route == ApiRoute::kChatCompletions) return absl::StrCat("chatcmpl-", AbslView(request_id));
  return absl::StrCat("cmpl-", AbslView(request_id), "-0");
}

std::string VllmErrorJson(int http_status, std::string_view message) {
  std::string_view type = "InternalServerError";
  switch (http_status) {
    case 400:
      type = "BadRequestError";
      break;
    case 404:
      type = "NotFoundError";
      break;
    case 409:
      type = "ConflictError";
      break;
    case 422:
      type = "UnprocessableEntityError";
      break;
    case 503:
      type = "ServiceUnavailableError";
      break;
    default:
      break;
  }
  json::object error;
  error["message"] = JsonView(message);
  error["type"] = JsonView(type);
  error["param"] = nullptr;
  error["code"] = http_status;
  json::object o;
  o["error"] = std::move(error);
  return json::serialize(o);
}

absl::StatusOr<ApiRequest> ParseApiRequest(ApiRoute route, std::string_view body,
                                           const ModelConfig& config, EngineApi api) {
  absl::StatusOr<json::object> object = ParseObject(body, RoutePath(route));
  if (!object.ok()) return object.status();
  ApiRequest request;
  request.route = route;
  request.api = api;
  absl::Status status;
  switch (route) {
    case ApiRoute::kGenerate:
      status = ParseGenerate(*object, config, &request);
      break;
    case ApiRoute::kCompletions:
      status = ParseCompletions(*object, config, &request);
      break;
    case ApiRoute::kChatCompletions:
      status = ParseChat(*object, config, &request);
      break;
  }
  if (!status.ok()) return status;
  return request;
}

void GenerationProgress::Apply(GenerationUpdate update) {
  if (!update.tokens.empty() &&
      (spans.empty() || spans.back().second != update.weight_version.version)) {
    spans.emplace_back(static_cast<int64_t>(tokens.size()), update.weight_version.version);
  }
  tokens.insert(tokens.end(), update.tokens.begin(), update.tokens.end());
  text += update.text;
  weight_version = std::move(update.weight_version);
  cached_tokens = std::max(cached_tokens, update.cached_tokens);
  if (update.finish.has_value()) finish = std::move(update.finish);
}

std::string FormatResponse(const ApiRequest& request, const GenerationProgress& p,
                           const ResponseContext& context) {
  if (request.route == ApiRoute::kGenerate) {
    return json::serialize(GenerateObject(request, p));
  }
  const bool chat = request.route == ApiRoute::kChatCompletions;
  json::object o =
      OpenAiEnvelope(request, p, context, chat ? "chat.completion" : "text_completion");
  json::object choice;
  choice["index"] = 0;
  if (chat) {
    json::object message;
    message["role"] = "assistant";
    message["content"] = p.text;
    choice["message"] = std::move(message);
    choice["logprobs"] =
        request.return_logprob ? ChatLogprobs(p, 0, p.tokens.size()) : json::value(nullptr);
  } else {
    choice["text"] = p.text;
    choice["logprobs"] = request.return_logprob ? CompletionLogprobs(request, p, 0, p.tokens.size())
                                                : json::value(nullptr);
  }
  choice["finish_reason"] = OpenAiFinishReason(p.finish);
  const bool vllm = request.api == EngineApi::kVllm;
  choice[vllm ? "stop_reason" : "matched_stop"] = MatchedStop(p.finish);
  json::array choices;
  choices.emplace_back(std::move(choice));
  o["choices"] = std::move(choices);
  o["usage"] = Usage(p);
  if (!vllm) o["metadata"] = Metadata(p);
  if (request.report_spans) o["weight_version_spans"] = Spans(p);
  return json::serialize(o);
}

std::vector<std::string> FormatStreamEvents(const ApiRequest& request, const GenerationProgress& p,
                                            StreamCursor* cursor, const ResponseContext& context) {
  std::vector<std::string> events;
  if (cursor->done) return events;
  const bool finished = p.finish.has_value();
  const bool new_text = p.text.size() > cursor->text_sent;
  const bool new_tokens = p.tokens.size() > cursor->tokens_sent;
  if (request.route == ApiRoute::kGenerate) {
    if (new_text || new_tokens || finished) {
      events.push_back(json::serialize(GenerateObject(request, p)));
    }
  } else {
    const bool chat = request.route == ApiRoute::kChatCompletions;
    const bool send = new_text || finished || (request.return_logprob && new_tokens) ||
                      (chat && !cursor->role_sent);
    if (send) {
      json::object o =
          OpenAiEnvelope(request, p, context, chat ? "chat.completion.chunk" : "text_completion");
      json::object choice;
      choice["index"] = 0;
      const std::string delta = p.text.substr(cursor->text_sent);
      if (chat) {
        json::object d;
        if (!cursor->role_sent) d["role"] = "assistant";
        d["content"] = delta;
        choice["delta"] = std::move(d);
        choice["logprobs"] = request.return_logprob
                                 ? ChatLogprobs(p, cursor->tokens_sent, p.tokens.size())
                                 : json::value(nullptr);
      } else {
        choice["text"] = delta;
        choice["logprobs"] =
            request.return_logprob
                ? CompletionLogprobs(request, p, cursor->tokens_sent, p.tokens.size())
                : json::value(nullptr);
      }
      choice["finish_reason"] = OpenAiFinishReason(p.finish);
      if (finished) {
        choice[request.api == EngineApi::kVllm ? "stop_reason" : "matched_stop"] =
            MatchedStop(p.finish);
      }
      json::array choices;
      choices.emplace_back(std::move(choice));
      o["choices"] = std::move(choices);
      if (request.api != EngineApi::kVllm) o["metadata"] = Metadata(p);
      if (request.report_spans) o["weight_version_spans"] = Spans(p);
      events.push_back(json::serialize(o));
      cursor->role_sent = true;
    }
    if (finished && request.include_usage) {
      json::object u =
          OpenAiEnvelope(request, p, context, chat ? "chat.completion.chunk" : "text_completion");
      u["choices"] = json::array();
      u["usage"] = Usage(p);
      if (request.report_spans) u["weight_version_spans"] = Spans(p);
      events.push_back(json::serialize(u));
    }
  }
  cursor->text_sent = p.text.size();
  cursor->tokens_sent = p.tokens.size();
  cursor->done = finished;
  return events;
}

std::string ErrorJson(std::string_view type, std::string_view message) {
  json::object o;
  o["success"] = false;
  o["type"] = JsonView(type);
  o["message"] = JsonView(message);
  return json::serialize(o);
}

std::string SuccessJson(std::string_view message,
                        std::initializer_list<std::pair<std::string_view, int64_t>> numbers) {
  json::object o;
  o["success"] = true;
  o["message"] = JsonView(message);
  for (const auto& [name, value] : numbers) o[JsonView(name)] = value;
  return json::serialize(o);
}

std::string WeightVersionString(const VersionRef& version) { return absl::StrCat(version.version); }

// --- Control routes -----------------------------------------------------------

namespace {

// An integer version or a version identity; the run it names, if any, goes to
// `run`.
std::optional<VersionRef> ReadVersion(FieldReader& r, std::string_view name) {
  const json::value* v = r.Find(name);
  if (v == nullptr) return std::nullopt;
  if (std::optional<int64_t> n = AsInteger(*v)) {
    if (absl::Status s = ValidateVersionNumber(*n); !s.ok()) {
      r.Fail(absl::StrCat("field \"", r.Path(name), "\": ", s.message()));
      return std::nullopt;
    }
    return VersionRef{"", *n};
  }
  if (v->is_string()) {
    absl::StatusOr<VersionRef> parsed = VersionRef::Parse(View(v->get_string()));
    if (!parsed.ok()) {
      r.Fail(absl::StrCat("field \"", r.Path(name), "\": ", parsed.status().message()));
      return std::nullopt;
    }
    return *parsed;
  }
  r.FailType(name, "a version number or a version identity (\"run/weight_v000007\")", *v);
  return std::nullopt;
}

// Merges the run named by a field into `run`; two different runs are an error.
void MergeRun(FieldReader& r, std::string_view field, const std::string& named, std::string* run) {
  if (named.empty()) return;
  if (!run->empty() && *run != named) {
    r.Fail(absl::StrCat("field \"", AbslView(field), "\" names run \"", named,
                        "\" but the request is for run \"", *run,
                        "\"; a staging stays within one run"));
    return;
  }
  *run = named;
}

absl::StatusOr<json::object> ParseControlBody(std::string_view body, std::string_view route) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  return ParseObject(body, route);
}

}  // namespace

absl::StatusOr<PauseMode> ParsePauseRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseControlBody(body, "/pause_generation");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  std::optional<std::string> mode = r.String("mode");
  if (!r.ok()) return r.status();
  return ParsePauseMode(mode.value_or("abort"));
}

absl::StatusOr<AbortRequest> ParseAbortRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/abort_request");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  std::optional<std::string> rid = r.String("rid");
  std::optional<bool> all = r.Bool("abort_all");
  if (!r.ok()) return r.status();
  AbortRequest out;
  if (all.value_or(false)) {
    out.scope = Scheduler::AbortScope::kAll;
    return out;
  }
  if (!rid.has_value() || rid->empty()) {
    return absl::InvalidArgumentError(
        "the request needs a non-empty \"rid\" (a request id prefix) or \"abort_all\": true");
  }
  out.rid_prefix = *std::move(rid);
  return out;
}

absl::StatusOr<StageRequest> ParseStageRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/stage_weight_update");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  StageRequest out;
  std::optional<std::string> base_dir = r.String("base_checkpoint_dir");
  std::optional<VersionRef> base = ReadVersion(r, "base_version");
  std::optional<VersionRef> target = ReadVersion(r, "target_version");
  std::optional<std::string> destination = r.String("destination");
  std::optional<std::string> source = r.String("checkpoint_source_dir");
  std::optional<std::string> local = r.String("local_checkpoint_dir");
  std::optional<std::string> run = r.String("run_id");
  if (!r.ok()) return r.status();
  for (auto [name, present] :
       {std::pair<std::string_view, bool>{"base_checkpoint_dir", base_dir.has_value()},
        {"base_version", base.has_value()},
        {"target_version", target.has_value()},
        {"destination", destination.has_value()}}) {
    if (!present) {
      return absl::InvalidArgumentError(absl::StrCat("the request needs \"", AbslView(name), "\""));
    }
  }
  if (run.has_value() && !run->empty()) {
    if (absl::Status s = ValidateRunId(*run); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("field \"run_id\": ", s.message()));
    }
    out.run_id = *run;
  }
  MergeRun(r, "base_version", base->run_id, &out.run_id);
  MergeRun(r, "target_version", target->run_id, &out.run_id);
  if (!r.ok()) return r.status();
  absl::StatusOr<StageDestination> dest = ParseStageDestination(*destination);
  if (!dest.ok()) return Annotate(dest.status(), "field \"destination\"");
  out.destination = *dest;
  if (base_dir->empty()) {
    return absl::InvalidArgumentError("field \"base_checkpoint_dir\" is empty");
  }
  out.base_checkpoint_dir = *base_dir;
  out.base_version = base->version;
  out.target_version = target->version;
  if (source.has_value()) out.checkpoint_source_dir = std::filesystem::path(*source);
  if (out.destination == StageDestination::kDisk) {
    if (!local.has_value() || local->empty()) {
      return absl::InvalidArgumentError(
          "destination \"disk\" needs \"local_checkpoint_dir\", the directory to materialize "
          "the checkpoint into");
    }
    out.local_checkpoint_dir = *local;
  }
  return out;
}

std::string FormatStageResult(const StageResult& result) {
  json::object o;
  o["success"] = true;
  o["message"] = absl::StrCat("staged ", result.version.ToString(), " for ",
                              AbslView(StageDestinationName(result.destination)), " in ",
                              result.seconds, " s");
  o["destination"] = JsonView(StageDestinationName(result.destination));
  o["staged_version"] = result.version.version;
  o["staged_version_id"] = VersionText(result.version);
  o["anchor"] = result.anchor.string();
  o["anchor_version"] = result.anchor_version;
  o["deltas_applied"] = result.deltas_applied;
  o["reseeded"] = result.reseeded;
  o["seconds"] = result.seconds;
  return json::serialize(o);
}

absl::StatusOr<UpdateFromDiskRequest> ParseUpdateFromDiskRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/update_weights_from_disk");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  UpdateFromDiskRequest out;
  std::optional<std::string> path = r.String("model_path");
  std::optional<std::string> format = r.String("load_format");
  out.weight_version = ReadVersion(r, "weight_version");
  if (auto b = r.Bool("flush_cache")) out.flush_cache = *b;
  if (auto b = r.Bool("abort_all_requests")) out.abort_all_requests = *b;
  if (!r.ok()) return r.status();
  if (!path.has_value() || path->empty()) {
    return absl::InvalidArgumentError("the request needs \"model_path\", a checkpoint directory");
  }
  if (format.has_value() && *format != "auto" && *format != "safetensors") {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_format \"", *format, "\" is not supported; use \"auto\" or \"safetensors\""));
  }
  out.model_path = *path;
  return out;
}

absl::StatusOr<UpdateFromCpuRequest> ParseUpdateFromCpuRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/update_weights_from_cpu");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  UpdateFromCpuRequest out;
  std::optional<VersionRef> target = ReadVersion(r, "target_version");
  if (auto b = r.Bool("flush_cache")) out.flush_cache = *b;
  if (!r.ok()) return r.status();
  if (!target.has_value()) {
    return absl::InvalidArgumentError("the request needs \"target_version\", the staged version");
  }
  out.target_version = *std::move(target);
  return out;
}

namespace {

json::object CommitObject(const CommitOutcome& c) {
  json::object o;
  o["message"] = c.message;
  o["weight_version"] = WeightVersionString(c.weight_version);
  o["weight_version_id"] = VersionText(c.weight_version);
  o["previous_weight_version"] = WeightVersionString(c.previous_version);
  o["pause_seconds"] = c.pause_seconds;
  o["seconds"] = c.seconds;
  o["resident_requests"] = c.resident_requests;
  return o;
}

json::value OptionalVersion(const std::optional<VersionRef>& v) {
  if (!v.has_value()) return nullptr;
  return json::value(VersionText(*v));
}

}  // namespace

std::string FormatCommitResult(const CommitOutcome& outcome) {
  json::object o = CommitObject(outcome);
  o["success"] = true;
  o["num_paused_requests"] = 0;
  return json::serialize(o);
}

std::string FormatServerInfo(const EngineStatus& s) {
  json::object o;
  o["engine"] = "stitch-refengine";
  o["model_path"] = s.model_path;
  o["served_model_name"] = s.served_model_name;
  o["weight_version"] = WeightVersionString(s.scheduler.weight_version);
  o["weight_version_id"] = VersionText(s.scheduler.weight_version);
  o["run_id"] = s.scheduler.weight_version.run_id;
  o["weights_fingerprint"] = s.scheduler.weights_fingerprint.ToHex();
  o["instance_id"] = s.instance_id;
  o["boot_version"] = s.boot_version;
  o["healthy"] = s.healthy;
  o["seconds_since_heartbeat"] = s.seconds_since_heartbeat;
  o["uptime_seconds"] = s.uptime_seconds;
  o["max_running_requests"] = s.scheduler_options.max_running;
  o["max_queued_requests"] = s.scheduler_options.max_queued;
  o["prefill_chunk"] = s.scheduler_options.prefill_chunk;
  o["num_running_requests"] = s.scheduler.running;
  o["num_queued_requests"] = s.scheduler.queued;
  o["paused"] = s.scheduler.paused;
  o["pause_mode"] =
      s.scheduler.paused ? json::value(JsonView(PauseModeName(s.scheduler.pause_mode))) : nullptr;
  o["pending_commands"] = s.scheduler.pending_commands;
  o["steps"] = s.scheduler.steps;
  o["tokens_generated"] = s.scheduler.tokens_generated;
  o["requests_finished"] = s.scheduler.requests_finished;
  o["requests_aborted"] = s.scheduler.requests_aborted;
  o["weight_swaps"] = s.scheduler.weight_swaps;
  o["last_swap_pause_seconds"] = s.scheduler.last_swap_pause_seconds;
  o["last_commit"] = s.last_commit ? json::value(CommitObject(*s.last_commit)) : nullptr;
  json::object staging;
  staging["in_progress"] = s.staging.staging;
  staging["cpu_prepared"] = OptionalVersion(s.staging.cpu_prepared);
  staging["cpu_image"] = OptionalVersion(s.staging.cpu_image);
  staging["disk_staged"] = OptionalVersion(s.staging.disk_staged);
  staging["disk_dir"] = s.staging.disk_dir.string();
  staging["last_error"] = s.staging.last_error;
  o["staging"] = std::move(staging);
  json::object faults;
  faults["fail_stagings"] = s.faults.fail_stagings;
  faults["fail_commits"] = s.faults.fail_commits;
  faults["hang_health_after"] = s.faults.hang_health_after;
  faults["exit_on_commit"] = s.faults.exit_on_commit;
  o["faults"] = std::move(faults);
  return json::serialize(o);
}

std::string FormatMetrics(const EngineStatus& s) {
  PrometheusText w("sglang:");
  w.One("num_running_reqs", "gauge", "Requests admitted and generating (paused ones included).",
        s.scheduler.running);
  w.One("num_queue_reqs", "gauge", "Requests waiting for admission.", s.scheduler.queued);
  w.One("generation_tokens_total", "counter", "Tokens generated.", s.scheduler.tokens_generated);
  w.One("num_requests_total", "counter", "Requests finished, aborted ones included.",
        s.scheduler.requests_finished);
  return w.Take();
}

std::string FormatModelInfo(const EngineStatus& s) {
  json::object o;
  o["model_path"] = s.model_path;
  o["tokenizer_path"] = nullptr;
  o["served_model_name"] = s.served_model_name;
  o["is_generation"] = true;
  o["architecture"] = "LlamaForCausalLM";
  o["parameters"] = s.parameters;
  o["weight_version"] = WeightVersionString(s.scheduler.weight_version);
  o["weight_version_id"] = VersionText(s.scheduler.weight_version);
  o["weights_fingerprint"] = s.scheduler.weights_fingerprint.ToHex();
  o["instance_id"] = s.instance_id;
  boost::system::error_code ec;
  json::value config = json::parse(s.config.ToJson(), ec);
  o["config"] = ec ? json::value(nullptr) : std::move(config);
  return json::serialize(o);
}

std::string FormatModelList(const EngineStatus& s) {
  json::object model;
  model["id"] = s.served_model_name;
  model["object"] = "model";
  model["owned_by"] = "stitch";
  model["max_model_len"] = s.config.max_position_embeddings;
  json::array data;
  data.emplace_back(std::move(model));
  json::object o;
  o["object"] = "list";
  o["data"] = std::move(data);
  return json::serialize(o);
}

std::string FormatHealth(const EngineStatus& s) {
  json::object o;
  o["healthy"] = true;
  o["weight_version"] = WeightVersionString(s.scheduler.weight_version);
  return json::serialize(o);
}

}  // namespace stitch
