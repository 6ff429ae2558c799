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
  json::value* id = item.if_contains("id");
  if (id == nullptr || !id->is_string()) return;
  std::string_view text(id->get_string().data(), id->get_string().size());
  if (!text.ends_with(upstream)) return;
  *id = absl::StrCat(AbslView(text.substr(0, text.size() - upstream.size())), AbslView(client));
}

}  // namespace stitch
