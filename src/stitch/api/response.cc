#include "stitch/api/response.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"

namespace stitch {

namespace json = boost::json;

namespace {

// The first document of a batch, or the document itself; null when there
// is no object to read.
const json::object* FirstItem(const json::value& doc) {
  const json::value* item = &doc;
  if (doc.is_array()) {
    if (doc.get_array().empty()) return nullptr;
    item = &doc.get_array().front();
  }
  return item->is_object() ? &item->get_object() : nullptr;
}

}  // namespace

void StampResponse(ApiRoute route, json::object& item, VersionStamp stamp) {
  if (route != ApiRoute::kGenerate) {
    item["weight_version_start"] = stamp.start;
    item["weight_version_end"] = stamp.end;
    return;
  }
  json::value& meta = item["meta_info"];
  if (!meta.is_object()) meta = json::object();
  json::object& m = meta.get_object();
  m["weight_version_start"] = stamp.start;
  m["weight_version_end"] = stamp.end;
  m["weight_version"] = std::to_string(stamp.start);
}

namespace {

// The object holding the versions on `route`: meta_info on /generate (made
// when `create`), the item itself otherwise; null when absent.
const json::object* VersionHolder(ApiRoute route, const json::object& item) {
  if (route != ApiRoute::kGenerate) return &item;
  const json::value* meta = item.if_contains("meta_info");
  return meta != nullptr && meta->is_object() ? &meta->get_object() : nullptr;
}

}  // namespace

void StampSpans(ApiRoute route, json::object& item, const std::optional<VersionSpans>& spans) {
  json::object* holder = &item;
  if (route == ApiRoute::kGenerate) {
    json::value& meta = item["meta_info"];
    if (!meta.is_object()) meta = json::object();
    holder = &meta.get_object();
  }
  if (!spans.has_value()) {
    (*holder)["weight_version_spans"] = "unknown";
    return;
  }
  json::array out;
  out.reserve(spans->size());
  for (const VersionSpan& span : *spans) {
    json::array pair;
    pair.emplace_back(span.offset);
    pair.emplace_back(span.version);
    out.emplace_back(std::move(pair));
  }
  (*holder)["weight_version_spans"] = std::move(out);
}

absl::StatusOr<std::optional<VersionSpans>> ReportedSpans(ApiRoute route,
                                                          const json::object& item) {
  const json::object* holder = VersionHolder(route, item);
  const json::value* v = holder != nullptr ? holder->if_contains("weight_version_spans") : nullptr;
  if (v == nullptr || v->is_null() || (v->is_string() && v->get_string() == "unknown")) {
    return std::nullopt;
  }
  auto bad = [](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("the engine's weight_version_spans ", AbslView(why),
                     " (expected [offset, version] pairs, offsets rising from 0)"));
  };
  if (!v->is_array()) return bad("is not a list");
  VersionSpans spans;
  for (const json::value& pair : v->get_array()) {
    if (!pair.is_array() || pair.get_array().size() != 2 || !pair.get_array()[0].is_int64() ||
        !pair.get_array()[1].is_int64()) {
      return bad("holds something that is not a pair of integers");
    }
    const VersionSpan span{pair.get_array()[0].get_int64(), pair.get_array()[1].get_int64()};
    if (span.version < 0) return bad("holds a negative version");
    if (spans.empty() ? span.offset != 0 : span.offset <= spans.back().offset) {
      return bad("has offsets that do not rise from 0");
    }
    spans.push_back(span);
  }
  return spans;
}

std::optional<int64_t> ReportedCompletionTokens(ApiRoute route, const json::object& item) {
  if (route == ApiRoute::kGenerate) {
    if (const json::object* meta = VersionHolder(route, item)) {
      const json::value* n = meta->if_contains("completion_tokens");
      if (n != nullptr && n->is_int64()) return n->get_int64();
    }
    const json::value* ids = item.if_contains("output_ids");
    if (ids != nullptr && ids->is_array()) return static_cast<int64_t>(ids->get_array().size());
    return std::nullopt;
  }
  const json::value* usage = item.if_contains("usage");
  if (usage == nullptr || !usage->is_object()) return std::nullopt;
  const json::value* n = usage->get_object().if_contains("completion_tokens");
  if (n == nullptr || !n->is_int64()) return std::nullopt;
  return n->get_int64();
}

namespace {

// Where `weight_versions` sits on `route`: meta_info on /generate; on an
// OpenAI answer with one choice, its `metadata`, else the choice.
const json::value* WeightVersionsOf(ApiRoute route, const json::object& item) {
  if (route == ApiRoute::kGenerate) {
    const json::object* meta = VersionHolder(route, item);
    return meta != nullptr ? meta->if_contains("weight_versions") : nullptr;
  }
  const json::value* choices = item.if_contains("choices");
  if (choices == nullptr || !choices->is_array() || choices->get_array().size() != 1) {
    return nullptr;
  }
  const json::value* metadata = item.if_contains("metadata");
  if (metadata != nullptr && metadata->is_object() &&
      metadata->get_object().contains("weight_versions")) {
    return metadata->get_object().if_contains("weight_versions");
  }
  const json::value& choice = choices->get_array().front();
  return choice.is_object() ? choice.get_object().if_contains("weight_versions") : nullptr;
}

absl::Status BadWeightVersions(std::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("the engine's weight_versions ", AbslView(why),
                   " (expected {version, start, end} spans, contiguous from token 0)"));
}

// `weight_versions` read as spans; empty spans (no tokens) are left out.
absl::StatusOr<LabelledSpans> ReadWeightVersions(const json::value& list) {
  if (!list.is_array()) return BadWeightVersions("is not a list");
  LabelledSpans spans;
  int64_t covered = 0;
  for (const json::value& entry : list.get_array()) {
    const json::object* span = entry.is_object() ? &entry.get_object() : nullptr;
    const json::value* version = span != nullptr ? span->if_contains("version") : nullptr;
    const json::value* start = span != nullptr ? span->if_contains("start") : nullptr;
    const json::value* end = span != nullptr ? span->if_contains("end") : nullptr;
    if (version == nullptr || start == nullptr || end == nullptr || !start->is_int64() ||
        !end->is_int64() || !(version->is_string() || version->is_int64())) {
      return BadWeightVersions("hold a span without a version, start and end");
    }
    if (start->get_int64() != covered || end->get_int64() < covered) {
      return BadWeightVersions("leave a gap or overlap");
    }
    if (end->get_int64() == covered) continue;
    spans.push_back({covered, version->is_string() ? std::string(version->get_string())
                                                   : std::to_string(version->get_int64())});
    covered = end->get_int64();
  }
  return spans;
}

}  // namespace

absl::StatusOr<std::optional<LabelledSpans>> EngineReportedSpans(ApiRoute route,
                                                                 const json::object& item) {
  const std::optional<int64_t> tokens = ReportedCompletionTokens(route, item);
  const json::value* list = WeightVersionsOf(route, item);
  if (list == nullptr || list->is_null()) {
    // The reference engine's [offset, version] pairs, if any.
    absl::StatusOr<std::optional<VersionSpans>> numbered = ReportedSpans(route, item);
    if (!numbered.ok()) return numbered.status();
    if (!numbered->has_value()) return std::nullopt;
    LabelledSpans spans;
    for (const VersionSpan& span : **numbered) {
      spans.push_back({span.offset, std::to_string(span.version)});
    }
    if (tokens.has_value() && !spans.empty() && spans.back().offset >= *tokens) {
      return BadWeightVersions(
          absl::StrCat("start a span at token ", spans.back().offset, " of ", *tokens));
    }
    return spans;
  }
  absl::StatusOr<LabelledSpans> spans = ReadWeightVersions(*list);
  if (!spans.ok()) return spans.status();
  const int64_t covered =
      list->get_array().empty() ? 0 : list->get_array().back().get_object().at("end").get_int64();
  if (tokens.has_value() && covered != *tokens) {
    return BadWeightVersions(
        absl::StrCat("cover ", covered, " output tokens, the answer says ", *tokens));
  }
  return *std::move(spans);
}

void SpanDeriver::Observe(std::optional<int64_t> label, std::optional<int64_t> tokens) {
  if (lost_) return;
  if (!label.has_value() || !tokens.has_value() || *tokens < tokens_ || *label < floor_) {
    lost_ = true;
    return;
  }
  const int64_t fresh = *tokens - tokens_;
  if (fresh > 0) {
    // The new tokens carry labels in [floor_, label], in order, the newest
    // exactly `label`.
    if (fresh > 1 && *label != floor_) {
      lost_ = true;
      return;
    }
    if (spans_.empty() || spans_.back().version != *label) spans_.push_back({tokens_, *label});
  }
  tokens_ = *tokens;
  floor_ = *label;
}

std::optional<VersionSpans> SpanDeriver::spans() const {
  if (lost_) return std::nullopt;
  return spans_;
}

std::optional<int64_t> StampedEndVersion(std::string_view body) {
  JsonArena arena;
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec, arena.storage());
  if (ec) return std::nullopt;
  const json::object* item = FirstItem(doc);
  if (item == nullptr) return std::nullopt;
  const json::value* end = item->if_contains("weight_version_end");
  if (end == nullptr) {
    if (const json::value* meta = item->if_contains("meta_info");
        meta != nullptr && meta->is_object()) {
      end = meta->get_object().if_contains("weight_version_end");
    }
  }
  if (end == nullptr || !end->is_int64()) return std::nullopt;
  return end->get_int64();
}

std::optional<std::string> ResponseWeightLabel(const json::value& body) {
  const json::object* item = FirstItem(body);
  if (item == nullptr) return std::nullopt;
  for (std::string_view holder : {"meta_info", "metadata"}) {
    const json::value* h = item->if_contains(holder);
    if (h == nullptr || !h->is_object()) continue;
    const json::value* label = h->get_object().if_contains("weight_version");
    if (label == nullptr) continue;
    if (label->is_string()) return std::string(label->get_string());
    if (label->is_int64()) return std::to_string(label->get_int64());
    return std::string();
  }
  return std::nullopt;
}

void RestoreRid(ApiRoute route, json::object& item, std::string_view upstream,
                std::string_view client) {
  if (route == ApiRoute::kGenerate) {
    json::value* meta = item.if_contains("meta_info");
    if (meta == nullptr || !meta->is_object()) return;
    json::value* id = meta->get_object().if_contains("id");
    if (id != nullptr && id->is_string() && std::string_view(id->get_string()) == upstream) {
      *id = client;
    }
    return;
  }
  json::value* id = item.if_contains(route == ApiRoute::kTokens ? "request_id" : "id");
  if (id == nullptr || !id->is_string()) return;
  std::string_view text(id->get_string().data(), id->get_string().size());
  if (!text.ends_with(upstream)) return;
  *id = absl::StrCat(AbslView(text.substr(0, text.size() - upstream.size())), AbslView(client));
}

}  // namespace stitch
