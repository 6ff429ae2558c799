#include "stitch/refengine/json_fields.h"

#include <cmath>
#include <limits>

#include <boost/json/parse.hpp>

namespace stitch::refengine_internal {

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

}  // namespace stitch::refengine_internal
