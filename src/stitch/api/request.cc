#include "stitch/api/request.h"

#include <xxhash.h>

#include <utility>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"

namespace stitch {

namespace json = boost::json;

namespace {

constexpr std::string_view kConstraintField = "weight_version";

// How many prompts a /generate body asks for at once (a list of prompts);
// 0 for a single prompt.
size_t BatchSize(const json::object& body) {
  if (const json::value* text = body.if_contains("text"); text != nullptr && text->is_array()) {
    return text->get_array().size();
  }
  if (const json::value* ids = body.if_contains("input_ids"); ids != nullptr && ids->is_array()) {
    const json::array& a = ids->get_array();
    if (!a.empty() && a.front().is_array()) return a.size();
  }
  return 0;
}

size_t Digits(size_t n) {
  size_t digits = 1;
  while (n >= 10) {
    n /= 10;
    ++digits;
  }
  return digits;
}

// Prepends the isolation prefix to the caller's own string value of `key`.
// A non-string value is replaced: the engine would refuse it anyway, and a
// request must never reach the cache untagged.

}  // namespace

absl::StatusOr<VersionedAsk> ParseVersionedBody(std::string_view body, json::value& doc) {
  absl::StatusOr<json::value> parsed = ParseVersionedBodyJson(body, doc.storage());
  if (!parsed.ok()) return parsed.status();
  doc = *std::move(parsed);
  if (!doc.is_object()) {
    return absl::InvalidArgumentError("the request body must be a JSON object");
  }
  const json::object& o = doc.get_object();
  VersionedAsk ask;
  if (const json::value* wv = o.if_contains(kConstraintField); wv != nullptr) {
    auto c = ConstraintFromJsonValue(*wv);
    if (!c.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("weight_version: ", c.status().message()));
    }
    ask.constraint = *c;
  }
  const json::value* stream = o.if_contains("stream");
  ask.stream = stream != nullptr && stream->is_bool() && stream->get_bool();
  return ask;
}

absl::StatusOr<VersionedAsk> ReadVersionedAsk(std::string_view body) {
  JsonArena arena;
  json::value parsed(arena.storage());
  return ParseVersionedBody(body, parsed);
}

absl::StatusOr<std::string> WithConstraint(std::string_view body,
                                           const VersionConstraint& constraint) {
  JsonArena arena;
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec, arena.storage());
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("the request body is not valid JSON: ", ec.message()));
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        "the request body is not a JSON object, so it cannot carry weight_version");
  }
  if (constraint.empty()) {
    doc.get_object().erase(kConstraintField);
  } else {
    doc.get_object()[kConstraintField] = ConstraintToJsonValue(constraint);
  }
  return json::serialize(doc);
}

std::string PromptPrefix(std::string_view body, size_t n) {
  JsonArena arena;
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec, arena.storage());
  if (ec || !doc.is_object()) return "";
  for (std::string_view field : {"text", "input_ids", "prompt", "messages"}) {
    const json::value* v = doc.get_object().if_contains(field);
    if (v == nullptr || v->is_null()) continue;
    std::string text = v->is_string() ? std::string(v->get_string()) : json::serialize(*v);
    if (text.size() > n) text.resize(n);
    return text;
  }
  return "";
}

void StripConstraint(json::object& body) { body.erase(kConstraintField); }

absl::StatusOr<EngineRids> AssignEngineRids(ApiRoute route, json::object& body,
                                            std::string_view base, EngineRidField field) {
  EngineRids rids;
  const std::string_view key = field == EngineRidField::kRid ? "rid" : "request_id";
  const size_t batch =
      route == ApiRoute::kGenerate && field == EngineRidField::kRid ? BatchSize(body) : 0;
  const json::value* given = body.if_contains(key);
  if (given != nullptr && given->is_null()) given = nullptr;
  if (batch > 0) {
    if (given != nullptr) {
      if (!given->is_array() || given->get_array().size() != batch) {
        return absl::InvalidArgumentError(
            absl::StrCat("rid must be a list of ", batch, " strings, one per prompt of the batch"));
      }
      for (const json::value& r : given->get_array()) {
        if (!r.is_string()) {
          return absl::InvalidArgumentError(
              "rid must be a list of strings, one per prompt of the batch");
        }
        rids.client.emplace_back(r.get_string().data(), r.get_string().size());
      }
    } else {
      rids.client.resize(batch);
    }
    const size_t width = Digits(batch - 1);
    json::array ids(body.storage());
    for (size_t i = 0; i < batch; ++i) {
      std::string index = std::to_string(i);
      std::string rid =
          absl::StrCat(AbslView(base), "-", std::string(width - index.size(), '0'), index);
      if (!rids.client[i].empty()) absl::StrAppend(&rid, "-", rids.client[i]);
      ids.emplace_back(rid);
      rids.engine.push_back(std::move(rid));
    }
    body["rid"] = std::move(ids);
    return rids;
  }
  if (given != nullptr && !given->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(key), " must be a string"));
  }
  std::string client = given != nullptr
                           ? std::string(given->get_string().data(), given->get_string().size())
                           : std::string();
  std::string rid(base);
  if (!client.empty()) absl::StrAppend(&rid, "-", client);
  body[key] = rid;
  rids.engine.push_back(std::move(rid));
  rids.client.push_back(std::move(client));
  return rids;
}

namespace {

std::string Hex128(std::string_view bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return absl::StrCat(absl::Hex(h.high64, absl::kZeroPad16), absl::Hex(h.low64, absl::kZeroPad16));
}

}  // namespace

std::string CacheIsolationPrefix(const VersionRef& serving) {
  // The run id goes in hashed: run ids may hold '@' and be 128 bytes long,
  // which vLLM refuses in a salt, and a fixed width keeps the prefix
  // unambiguous whatever the caller's own value is.
  return absl::StrCat("wv", serving.version, ".", Hex128(serving.run_id), ":");
}

std::string IsolationKey(const VersionRef& serving, std::string_view own) {
  std::string key = CacheIsolationPrefix(serving);
  if (key.size() + own.size() <= kMaxIsolationKeyBytes) {
    absl::StrAppend(&key, AbslView(own));
  } else {
    // Too long for vLLM with the prefix: the caller's value is kept as its
    // hash, which isolates as well as the value itself.
    absl::StrAppend(&key, "h", Hex128(own));
  }
  return key;
}

void TagRequest(ApiRoute route, json::object& body, const VersionRef& serving) {
  // (A list of keys, one per prompt of a batch, is tagged item by item; a
  // value that is not a string is replaced, never left untagged.)
  const std::string_view field = route == ApiRoute::kGenerate ? "extra_key" : "cache_salt";
  auto tagged = [&](const json::value* own) {
    const bool text = own != nullptr && own->is_string();
    return IsolationKey(serving,
                        text ? std::string_view(own->get_string().data(), own->get_string().size())
                             : std::string_view());
  };
  json::value* own = body.if_contains(field);
  if (own != nullptr && own->is_array()) {
    for (json::value& item : own->get_array()) item = tagged(&item);
    return;
  }
  body[field] = tagged(own);
}

}  // namespace stitch
