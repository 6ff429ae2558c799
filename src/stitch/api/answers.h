// The answers the rollout API gives instead of a generation, each written
// here and nowhere else, so that the sidecar and the gateway answer alike
// (docs/design.md, "The rollout API"; errors grouped by where recovery
// happens):
//   400 BadRequest              the request is at fault; do not retry it as is
//   403 RouteBlocked            an engine control route; never forwarded
//   409 WeightVersionNotReady   the constraint is not met here yet; retry
//                               later or on another replica
//   503 (retryable, with Retry-After: 1)
//       EngineUnavailable       the engine behind a replica cannot serve
//       ReplicaUnavailable      a replica cannot serve
//       NoReadyReplica          no replica of a gateway's pool is ready
// Bodies are the original Python Stitch's shapes: the 409 is a flat object
// ({"type", "target_version", "applied", "message"}, `applied` the served
// version number), every other answer `{"error": {"type", "message",
// "retryable"?}}` (net/http.h, JsonErrorBody).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "stitch/core/constraint.h"
#include "stitch/core/version.h"
#include "stitch/net/http.h"

namespace stitch {

// 400 BadRequest with `message`.
HttpResponse BadRequestResponse(std::string_view message);

// The body of a 409 WeightVersionNotReady: the constraint's target
// (`target_version`, null without one), the version served (`applied`, its
// number, as the original answers; `applied_identity`, with its run; both
// null when none), `failed_bound` (the bound of the constraint that failed:
// "exact_version", "min_version" or "max_staleness"; null when no one bound
// is to blame) and `message`.
std::string NotReadyBody(const VersionConstraint& constraint,
                         const std::optional<VersionRef>& applied, std::string_view message,
                         std::optional<VersionConstraint::Bound> failed = std::nullopt);
HttpResponse NotReadyResponse(const VersionConstraint& constraint,
                              const std::optional<VersionRef>& applied, std::string_view message,
                              std::optional<VersionConstraint::Bound> failed = std::nullopt);

// The version a 409 WeightVersionNotReady body says is served; nullopt when
// the body is not such a body or names none.
std::optional<VersionRef> NotReadyApplied(std::string_view body);

// The 403 RouteBlocked answer to an engine control route: "<path> is an
// engine control route: <why>".
HttpResponse RouteBlockedResponse(std::string_view path, std::string_view why);

// The 403 RouteNotForwarded answer to a route that is neither versioned, a
// control route nor one of the engine's read-only routes (`why`, from
// NotForwardedWhy, names the routes to use).
HttpResponse RouteNotForwardedResponse(std::string_view why);

enum class Unavailable { kEngine, kReplica, kNoReadyReplica };

// A retryable 503 of `kind` with `message`, and Retry-After: 1.
HttpResponse UnavailableResponse(Unavailable kind, std::string_view message);

// The same body as one server-sent event: the end of a stream that broke
// after it began (too late for a status code).
std::string UnavailableEvent(Unavailable kind, std::string_view message);

}  // namespace stitch
