#include "stitch/demo/rollout.h"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"

namespace stitch {
namespace {

absl::Status Bad(std::string_view what, std::string_view route = "/generate") {
  return absl::InvalidArgumentError(
      absl::StrCat("demo: ", AbslView(route), " response: ", AbslView(what)));
}

std::optional<int64_t> AsInt(const boost::json::value* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_int64()) return v->as_int64();
  if (v->is_uint64()) return static_cast<int64_t>(v->as_uint64());
  return std::nullopt;
}

std::optional<double> AsDouble(const boost::json::value& v) {
  if (v.is_double()) return v.as_double();
  if (v.is_int64()) return static_cast<double>(v.as_int64());
  if (v.is_uint64()) return static_cast<double>(v.as_uint64());
  return std::nullopt;
}

}  // namespace

std::string GenerateRequestBody(const RolloutRequest& request) {
  boost::json::object body;
  boost::json::array ids;
  for (int32_t id : request.prompt) ids.emplace_back(id);
  body["input_ids"] = std::move(ids);
  boost::json::object sampling;
  sampling["max_new_tokens"] = request.max_new_tokens;
  sampling["temperature"] = request.temperature;
  sampling["seed"] = request.seed;
  sampling["ignore_eos"] = true;
  body["sampling_params"] = std::move(sampling);
  body["return_logprob"] = true;
  if (request.min_version.has_value()) {
    body["weight_version"] =
        ConstraintToJsonValue(VersionConstraint::AtLeast(*request.min_version));
  }
  return boost::json::serialize(body);
}

absl::StatusOr<GeneratedRollout> ParseGenerateResponse(std::string_view body) {
  boost::system::error_code ec;
  boost::json::value doc =
      boost::json::parse(boost::json::string_view(body.data(), body.size()), ec);
  if (ec || !doc.is_object()) return Bad("not a JSON object");
  const boost::json::object& root = doc.as_object();
  const boost::json::value* ids = root.if_contains("output_ids");
  if (ids == nullptr || !ids->is_array()) return Bad("no output_ids array");
  const boost::json::value* meta = root.if_contains("meta_info");
  if (meta == nullptr || !meta->is_object()) return Bad("no meta_info object");
  const boost::json::object& info = meta->as_object();
  GeneratedRollout out;
  for (const boost::json::value& id : ids->as_array()) {
    std::optional<int64_t> v = AsInt(&id);
    if (!v.has_value()) return Bad("output_ids holds a non-integer");
    out.output_ids.push_back(static_cast<int32_t>(*v));
  }
  std::optional<int64_t> start = AsInt(info.if_contains("weight_version_start"));
  std::optional<int64_t> end = AsInt(info.if_contains("weight_version_end"));
  if (!start.has_value() || !end.has_value()) {
    return Bad("meta_info lacks weight_version_start/end (is a sidecar in front of the engine?)");
  }
  out.version_start = *start;
  out.version_end = *end;
  absl::StatusOr<std::optional<VersionSpans>> spans = ReportedSpans(ApiRoute::kGenerate, root);
  if (!spans.ok()) return Bad(std::string(spans.status().message()));
  out.spans = *std::move(spans);
  const boost::json::value* logprobs = info.if_contains("output_token_logprobs");
  if (logprobs == nullptr || !logprobs->is_array()) {
    return Bad("meta_info lacks output_token_logprobs (send return_logprob)");
  }
  for (const boost::json::value& triple : logprobs->as_array()) {
    if (!triple.is_array() || triple.as_array().empty()) return Bad("bad output_token_logprobs");
    std::optional<double> lp = AsDouble(triple.as_array()[0]);
    if (!lp.has_value()) return Bad("bad output_token_logprobs");
    out.logprobs.push_back(*lp);
  }
  if (out.logprobs.size() != out.output_ids.size()) {
    return Bad("output_token_logprobs and output_ids differ in length");
  }
  return out;
}

std::string CompletionRequestBody(const RolloutRequest& request) {
  boost::json::object body;
  boost::json::array ids;
  for (int32_t id : request.prompt) ids.emplace_back(id);
  body["prompt"] = std::move(ids);
  body["max_tokens"] = request.max_new_tokens;
  body["temperature"] = request.temperature;
  body["seed"] = request.seed;
  body["ignore_eos"] = true;
  body["logprobs"] = 0;
  body["return_tokens_as_token_ids"] = true;
  if (request.min_version.has_value()) {
    body["weight_version"] =
        ConstraintToJsonValue(VersionConstraint::AtLeast(*request.min_version));
  }
  return boost::json::serialize(body);
}

absl::StatusOr<GeneratedRollout> ParseCompletionResponse(std::string_view body) {
  constexpr std::string_view kRoute = "/v1/completions";
  boost::system::error_code ec;
  boost::json::value doc =
      boost::json::parse(boost::json::string_view(body.data(), body.size()), ec);
  if (ec || !doc.is_object()) return Bad("not a JSON object", kRoute);
  const boost::json::object& root = doc.as_object();
  GeneratedRollout out;
  std::optional<int64_t> start = AsInt(root.if_contains("weight_version_start"));
  std::optional<int64_t> end = AsInt(root.if_contains("weight_version_end"));
  if (!start.has_value() || !end.has_value()) {
    return Bad("no weight_version_start/end (is a sidecar in front of the engine?)", kRoute);
  }
  out.version_start = *start;
  out.version_end = *end;
  const boost::json::value* choices = root.if_contains("choices");
  if (choices == nullptr || !choices->is_array() || choices->as_array().size() != 1 ||
      !choices->as_array()[0].is_object()) {
    return Bad("choices is not a list of one choice", kRoute);
  }
  const boost::json::value* logprobs = choices->as_array()[0].as_object().if_contains("logprobs");
  if (logprobs == nullptr || !logprobs->is_object()) {
    return Bad("the choice has no logprobs (send logprobs: 0)", kRoute);
  }
  const boost::json::value* tokens = logprobs->as_object().if_contains("tokens");
  const boost::json::value* values = logprobs->as_object().if_contains("token_logprobs");
  if (tokens == nullptr || !tokens->is_array() || values == nullptr || !values->is_array() ||
      tokens->as_array().size() != values->as_array().size()) {
    return Bad("logprobs.tokens and logprobs.token_logprobs are not lists of one length", kRoute);
  }
  constexpr std::string_view kPrefix = "token_id:";
  for (const boost::json::value& token : tokens->as_array()) {
    int32_t id = 0;
    if (!token.is_string()) return Bad("a token is not a string", kRoute);
    std::string_view text(token.as_string().data(), token.as_string().size());
    if (!text.starts_with(kPrefix) ||
        !absl::SimpleAtoi(AbslView(text.substr(kPrefix.size())), &id)) {
      return Bad("a token is not \"token_id:<id>\" (send return_tokens_as_token_ids)", kRoute);
    }
    out.output_ids.push_back(id);
  }
  for (const boost::json::value& v : values->as_array()) {
    std::optional<double> lp = AsDouble(v);
    if (!lp.has_value()) return Bad("a token log-probability is not a number", kRoute);
    out.logprobs.push_back(*lp);
  }
  return out;
}

}  // namespace stitch
