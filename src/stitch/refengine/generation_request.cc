// Parsing generation requests (protocol.h): SGLang's /generate and the
// OpenAI routes, in either dialect.
#include <algorithm>
#include <initializer_list>
#include <utility>

#include <boost/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/refengine/json_fields.h"
#include "stitch/refengine/protocol.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {

// This folder's JSON reading helpers, and their `json` (boost::json).
using namespace refengine_internal;

namespace {

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

// /generate's `sampling_params` object `sp`: every name known (to SGLang),
// each honoured or refused.
absl::Status ReadSamplingParams(const json::value* sp, const ModelConfig& config, ApiRequest* out) {
  if (!sp->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field \"sampling_params\" must be an object, got ", AbslView(KindName(*sp))));
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
  if (auto n = s.Int("max_new_tokens", 0, config.max_position_embeddings)) {
    out->generation.max_new_tokens = *n;
  }
  s.RefuseNumberUnless("min_new_tokens", 0);
  ReadCommonSampling(s, config, out);
  return s.status();
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
  if (const json::value* sp = r.Find("sampling_params")) return ReadSamplingParams(sp, config, out);
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

}  // namespace

std::string VllmEngineRid(ApiRoute route, std::string_view request_id) {
  if (route == ApiRoute::kChatCompletions) return absl::StrCat("chatcmpl-", AbslView(request_id));
  return absl::StrCat("cmpl-", AbslView(request_id), "-0");
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
    case ApiRoute::kTokens:
      // Neither dialect registers vLLM's token route (kApiRoutes).
      return absl::InvalidArgumentError(
          "/inference/v1/generate is vLLM's token route, which the reference engine does not "
          "serve: use /v1/completions");
  }
  if (!status.ok()) return status;
  return request;
}

}  // namespace stitch
