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
