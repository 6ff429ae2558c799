#include "stitch/api/answers.h"

#include <cstdint>

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/json.h"
#include "stitch/net/sse.h"

namespace stitch {

namespace json = boost::json;

namespace {

std::string_view UnavailableType(Unavailable kind) {
  switch (kind) {
    case Unavailable::kEngine:
      return "EngineUnavailable";
    case Unavailable::kReplica:
      return "ReplicaUnavailable";
    case Unavailable::kNoReadyReplica:
      return "NoReadyReplica";
  }
  return "ReplicaUnavailable";
}

}  // namespace

HttpResponse BadRequestResponse(std::string_view message) {
  return JsonResponse(400, JsonErrorBody("BadRequest", message));
}

std::string NotReadyBody(const VersionConstraint& constraint,
                         const std::optional<VersionRef>& applied, std::string_view message,
                         std::optional<VersionConstraint::Bound> failed) {
  json::object conflict;
  conflict["type"] = "WeightVersionNotReady";
  if (std::optional<int64_t> t = constraint.target(); t.has_value()) {
    conflict["target_version"] = *t;
  } else {
    conflict["target_version"] = nullptr;
  }
  if (applied.has_value()) {
    conflict["applied"] = applied->ToString();
    conflict["applied_version"] = applied->version;
  } else {
    conflict["applied"] = nullptr;
    conflict["applied_version"] = nullptr;
  }
  if (failed.has_value()) {
    conflict["failed_bound"] = std::string(BoundName(*failed));
  } else {
    conflict["failed_bound"] = nullptr;
  }
  conflict["message"] = message;
  return json::serialize(conflict);
}

HttpResponse NotReadyResponse(const VersionConstraint& constraint,
                              const std::optional<VersionRef>& applied, std::string_view message,
                              std::optional<VersionConstraint::Bound> failed) {
  return JsonResponse(409, NotReadyBody(constraint, applied, message, failed));
}

std::optional<VersionRef> NotReadyApplied(std::string_view body) {
  JsonArena arena;
  boost::system::error_code ec;
  json::value doc = json::parse(body, ec, arena.storage());
  if (ec || !doc.is_object()) return std::nullopt;
  const json::value* applied = doc.get_object().if_contains("applied");
  if (applied == nullptr || !applied->is_string()) return std::nullopt;
  absl::StatusOr<VersionRef> ref = VersionRef::Parse(std::string_view(applied->get_string()));
  if (!ref.ok()) return std::nullopt;
  return *std::move(ref);
}

HttpResponse RouteBlockedResponse(std::string_view path, std::string_view why) {
  return JsonResponse(
      403,
      JsonErrorBody("RouteBlocked",
                    absl::StrCat(AbslView(path), " is an engine control route: ", AbslView(why))));
}

HttpResponse UnavailableResponse(Unavailable kind, std::string_view message) {
  HttpResponse response =
      JsonResponse(503, JsonErrorBody(UnavailableType(kind), message, /*retryable=*/true));
  response.headers.Set("Retry-After", "1");
  return response;
}

std::string UnavailableEvent(Unavailable kind, std::string_view message) {
  return SseEvent(JsonErrorBody(UnavailableType(kind), message, /*retryable=*/true));
}

}  // namespace stitch
