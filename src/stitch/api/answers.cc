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
    conflict["applied"] = applied->version;
    conflict["applied_identity"] = applied->ToString();
  } else {
    conflict["applied"] = nullptr;
    conflict["applied_identity"] = nullptr;
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
  // The identity when the body has one (ours); the original's bare number
  // otherwise, which names no run.
  const json::object& o = doc.get_object();
  if (const json::value* identity = o.if_contains("applied_identity");
      identity != nullptr && identity->is_string()) {
    absl::StatusOr<VersionRef> ref = VersionRef::Parse(std::string_view(identity->get_string()));
    if (ref.ok()) return *std::move(ref);
  }
  const json::value* applied = o.if_contains("applied");
  if (applied == nullptr || !applied->is_int64() || applied->get_int64() < 0) return std::nullopt;
  return VersionRef{"", applied->get_int64()};
}

HttpResponse RouteBlockedResponse(std::string_view path, std::string_view why) {
  return JsonResponse(
      403,
      JsonErrorBody("RouteBlocked",
                    absl::StrCat(AbslView(path), " is an engine control route: ", AbslView(why))));
}

HttpResponse RouteNotForwardedResponse(std::string_view why) {
  return JsonResponse(403, JsonErrorBody("RouteNotForwarded", why));
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
