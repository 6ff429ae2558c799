#include "stitch/api/assembly.h"

#include <string>
#include <string_view>
#include <utility>

#include <boost/json/array.hpp>
#include <boost/json/string.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"

namespace stitch {

namespace json = boost::json;

namespace {

// The meta_info lists that hold one entry per output token, and that an
// incremental stream slices to the event's own tokens.
constexpr std::string_view kPerTokenMeta[] = {"output_token_logprobs", "output_top_logprobs",
                                              "output_token_ids_logprobs"};

// `key` of `o` unless it is absent or null.
const json::value* Present(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v == nullptr || v->is_null() ? nullptr : v;
}

bool IsTokenIdList(const json::value& v) {
  if (!v.is_array()) return false;
  for (const json::value& id : v.get_array()) {
    if (!id.is_int64() && !id.is_uint64()) return false;
  }
  return true;
}

// Appends `more` to the list `key` of `into`, where both hold lists; keeps
// `into`'s own when `more` has none.
void AppendList(json::object& into, const json::object& from, const json::object& more,
                std::string_view key) {
  const json::value* before = from.if_contains(key);
  const json::value* after = more.if_contains(key);
  if (before == nullptr || !before->is_array()) return;
  json::array joined = before->get_array();
  if (after != nullptr && after->is_array()) {
    for (const json::value& v : after->get_array()) joined.push_back(v);
  }
  into[key] = std::move(joined);
}

}  // namespace

bool IsSingleGeneration(const json::object& body) {
  const json::value* text = Present(body, "text");
  const json::value* ids = Present(body, "input_ids");
  if (Present(body, "input_embeds") != nullptr) return false;
  const bool one_prompt =
      (text != nullptr && text->is_string() && ids == nullptr) ||
      (ids != nullptr && IsTokenIdList(*ids) && !ids->get_array().empty() && text == nullptr);
  if (!one_prompt) return false;
  const json::value* sampling = Present(body, "sampling_params");
  if (sampling == nullptr) return true;
  if (!sampling->is_object()) return false;
  const json::value* n = Present(sampling->get_object(), "n");
  return n == nullptr || (n->is_int64() && n->get_int64() == 1) ||
         (n->is_uint64() && n->get_uint64() == 1);
}

absl::Status GenerateAssembler::Add(json::object event) {
  if (spent_) return absl::FailedPreconditionError("the stream was already refused");
  ++events_;
  auto refuse = [&](const std::string& why) {
    spent_ = true;
    return absl::InvalidArgumentError(absl::StrCat(
        "event ", events_, " of the engine's stream cannot be placed in the answer: ", why));
  };
  const json::value* ids = event.if_contains("output_ids");
  if (ids == nullptr || !ids->is_array()) return refuse("it carries no output_ids list");
  const json::value* meta = event.if_contains("meta_info");
  const json::value* counted = meta != nullptr && meta->is_object()
                                   ? meta->get_object().if_contains("completion_tokens")
                                   : nullptr;
  if (counted == nullptr || !counted->is_int64() || counted->get_int64() < 0) {
    return refuse("it carries no meta_info.completion_tokens count");
  }
  const int64_t n = static_cast<int64_t>(ids->get_array().size());
  const int64_t c = counted->get_int64();
  if (tokens_ == 0 && n == c) {
    // Nothing before it was a token: in either form the event is the whole
    // answer so far.
    answer_ = std::move(event);
  } else if (n == c && c >= tokens_ && form_ != Form::kIncremental) {
    form_ = Form::kCumulative;
    answer_ = std::move(event);
  } else if (tokens_ + n == c && form_ != Form::kCumulative) {
    form_ = Form::kIncremental;
    json::object next = std::move(event);
    const json::object& before = *answer_;
    const json::value* text_before = before.if_contains("text");
    json::value* text_now = next.if_contains("text");
    if (text_before != nullptr && text_before->is_string()) {
      if (text_now != nullptr && text_now->is_string()) {
        json::string joined = text_before->get_string();
        joined.append(text_now->get_string());
        *text_now = std::move(joined);
      } else if (text_now == nullptr) {
        next["text"] = *text_before;
      }
    }
    AppendList(next, before, next, "output_ids");
    const json::value* meta_before = before.if_contains("meta_info");
    if (meta_before != nullptr && meta_before->is_object()) {
      json::object& meta_now = next["meta_info"].as_object();
      for (std::string_view key : kPerTokenMeta) {
        AppendList(meta_now, meta_before->get_object(), meta_now, key);
      }
    }
    answer_ = std::move(next);
  } else {
    return refuse(absl::StrCat("output_ids holds ", n, " tokens and completion_tokens says ", c,
                               " after ", tokens_,
                               ", so it is neither the whole answer so far nor what is new"));
  }
  tokens_ = c;
  return absl::OkStatus();
}

absl::StatusOr<json::object> GenerateAssembler::Finish() && {
  if (spent_) return absl::FailedPreconditionError("the engine's stream was refused");
  if (!answer_.has_value()) {
    return absl::FailedPreconditionError("the engine's stream ended before its first event");
  }
  return std::move(*answer_);
}

}  // namespace stitch
