// Writing generation responses and events (protocol.h), in SGLang's shapes
// and OpenAI's, and the error and success bodies every route shares.
#include <span>
#include <utility>

#include <boost/json.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/refengine/json_fields.h"
#include "stitch/refengine/protocol.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {

// This folder's JSON reading helpers, and their `json` (boost::json).
using namespace refengine_internal;

namespace {

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

}  // namespace

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

}  // namespace stitch
