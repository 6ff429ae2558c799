#include "stitch/publish/request.h"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/json.h"

namespace stitch {

absl::StatusOr<std::string> ConstrainRequestBody(std::string_view json_body,
                                                 const VersionConstraint& constraint) {
  boost::json::error_code ec;
  boost::json::value body = boost::json::parse(json_body, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("request body is not valid JSON: ", ec.message()));
  }
  boost::json::object* object = body.if_object();
  if (object == nullptr) {
    return absl::InvalidArgumentError("request body must be a JSON object to carry weight_version");
  }
  if (constraint.empty()) {
    object->erase("weight_version");
  } else {
    (*object)["weight_version"] = ConstraintToJsonValue(constraint);
  }
  return boost::json::serialize(body);
}

absl::StatusOr<std::string> ConstrainRequestBodyToLatest(std::string_view json_body,
                                                         std::optional<int64_t> latest, int64_t lag,
                                                         std::optional<int64_t> exact,
                                                         std::optional<int64_t> max_staleness) {
  auto constraint = MakeRequestConstraint(latest, lag, exact, max_staleness);
  if (!constraint.ok()) return constraint.status();
  return ConstrainRequestBody(json_body, *constraint);
}

}  // namespace stitch
