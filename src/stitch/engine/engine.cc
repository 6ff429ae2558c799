#include "stitch/engine/engine.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/string.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"

namespace stitch {

std::string_view UpdateDestinationName(UpdateDestination d) {
  return d == UpdateDestination::kDisk ? "disk" : "cpu";
}

absl::StatusOr<UpdateDestination> ParseUpdateDestination(std::string_view name) {
  if (name == "disk") return UpdateDestination::kDisk;
  if (name == "cpu") return UpdateDestination::kCpu;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown update mode \"", AbslView(name), "\" (expected disk|cpu)"));
}

std::optional<VersionRef> ParseEngineLabel(std::string_view label) {
  if (label.empty()) return std::nullopt;
  absl::StatusOr<VersionRef> ref = VersionRef::Parse(label);
  if (!ref.ok()) return std::nullopt;
  return *std::move(ref);
}

absl::StatusOr<EngineReport> ParseEngineReport(std::string_view body) {
  boost::system::error_code ec;
  boost::json::value doc = boost::json::parse(body, ec);
  if (ec || !doc.is_object()) {
    return absl::InvalidArgumentError("the engine's model info is not a JSON object");
  }
  const boost::json::object& o = doc.get_object();
  auto text = [&](std::string_view key) -> absl::StatusOr<std::optional<std::string>> {
    const boost::json::value* v = o.if_contains(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    if (v->is_string()) return std::string(v->get_string());
    if (v->is_int64()) return std::to_string(v->get_int64());
    if (v->is_uint64()) return std::to_string(v->get_uint64());
    return absl::InvalidArgumentError(absl::StrCat("the engine's model info has a ", AbslView(key),
                                                   " that is neither a string nor an integer"));
  };
  EngineReport report;
  for (std::string_view key : {"weight_version_id", "weight_version"}) {
    absl::StatusOr<std::optional<std::string>> label = text(key);
    if (!label.ok()) return label.status();
    if (label->has_value()) {
      report.label = **label;
      break;
    }
  }
  report.held = ParseEngineLabel(report.label);
  absl::StatusOr<std::optional<std::string>> instance = text("instance_id");
  if (!instance.ok()) return instance.status();
  report.instance = instance->value_or("");
  absl::StatusOr<std::optional<std::string>> fingerprint = text("weights_fingerprint");
  if (!fingerprint.ok()) return fingerprint.status();
  if (fingerprint->has_value()) {
    absl::StatusOr<Checksum128> parsed = Checksum128::FromHex(**fingerprint);
    if (!parsed.ok()) return Annotate(parsed.status(), "the engine's weights_fingerprint");
    report.fingerprint = *parsed;
  }
  return report;
}

std::optional<std::string> ResponseWeightLabel(const boost::json::value& body) {
  const boost::json::value* item = &body;
  if (body.is_array()) {
    if (body.get_array().empty()) return std::nullopt;
    item = &body.get_array().front();
  }
  if (!item->is_object()) return std::nullopt;
  for (std::string_view holder : {"meta_info", "metadata"}) {
    const boost::json::value* h = item->get_object().if_contains(holder);
    if (h == nullptr || !h->is_object()) continue;
    const boost::json::value* label = h->get_object().if_contains("weight_version");
    if (label == nullptr) continue;
    if (label->is_string()) return std::string(label->get_string());
    if (label->is_int64()) return std::to_string(label->get_int64());
    return std::string();
  }
  return std::nullopt;
}

std::optional<int64_t> StampedEndVersion(std::string_view body) {
  JsonArena arena;
  boost::system::error_code ec;
  boost::json::value doc = boost::json::parse(body, ec, arena.storage());
  if (ec) return std::nullopt;
  const boost::json::value* item = &doc;
  if (doc.is_array()) {
    if (doc.get_array().empty()) return std::nullopt;
    item = &doc.get_array().front();
  }
  if (!item->is_object()) return std::nullopt;
  const boost::json::object& o = item->get_object();
  const boost::json::value* end = o.if_contains("weight_version_end");
  if (end == nullptr) {
    if (const boost::json::value* meta = o.if_contains("meta_info");
        meta != nullptr && meta->is_object()) {
      end = meta->get_object().if_contains("weight_version_end");
    }
  }
  if (end == nullptr || !end->is_int64()) return std::nullopt;
  return end->get_int64();
}

std::string CacheIsolationPrefix(const VersionRef& serving) {
  return absl::StrCat("wv", serving.version, ";", serving.run_id, "/");
}

namespace {

// Prepends the isolation prefix to the caller's own string value of `key`.
// A non-string value is replaced: the engine would refuse it anyway, and a
// request must never reach the cache untagged.
void PrefixKey(boost::json::object& body, std::string_view key, const std::string& prefix) {
  std::string value = prefix;
  if (const boost::json::value* own = body.if_contains(key); own != nullptr && own->is_string()) {
    value.append(own->get_string().data(), own->get_string().size());
  }
  body[key] = value;
}

}  // namespace

void Engine::TagRequest(ApiRoute route, boost::json::object& body,
                        const VersionRef& serving) const {
  PrefixKey(body, route == ApiRoute::kGenerate ? "extra_key" : "cache_salt",
            CacheIsolationPrefix(serving));
}

void Engine::StampResponse(ApiRoute route, boost::json::object& body, VersionStamp stamp) const {
  if (route != ApiRoute::kGenerate) {
    body["weight_version_start"] = stamp.start;
    body["weight_version_end"] = stamp.end;
    return;
  }
  boost::json::value& meta = body["meta_info"];
  if (!meta.is_object()) meta = boost::json::object();
  boost::json::object& m = meta.get_object();
  m["weight_version_start"] = stamp.start;
  m["weight_version_end"] = stamp.end;
  m["weight_version"] = std::to_string(stamp.end);
}

}  // namespace stitch
