#include "stitch/api/dispatch.h"

#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/api/answers.h"
#include "stitch/core/errors.h"

namespace stitch {

namespace {

// The own route `path` (canonical) names, if any.
const OwnRoute* OwnRouteOf(std::string_view path, const std::vector<OwnRoute>& own) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  for (const OwnRoute& route : own) {
    if (absl::EqualsIgnoreCase(AbslView(path), route.path)) return &route;
  }
  return nullptr;
}

// The answer to a request for `own` that the router did not match as
// spelled: another method on its exact path (405), or another spelling (404).
HttpResponse OwnRouteAnswer(const HttpRequest& request, const OwnRoute& own) {
  const std::string_view path = TargetPath(request.target);
  if (path == own.path) {
    HttpResponse response = JsonResponse(
        405, JsonErrorBody("MethodNotAllowed",
                           absl::StrCat(request.method, " ", own.path, ": this server's ", own.path,
                                        " takes ", own.method)));
    response.headers.Add("Allow", own.method);
    return response;
  }
  return JsonResponse(
      404, JsonErrorBody("NotFound", absl::StrCat(request.method, " ", AbslView(path),
                                                  " is this server's ", own.path,
                                                  " spelled otherwise, which is neither served "
                                                  "nor forwarded: send ",
                                                  own.method, " ", own.path)));
}

}  // namespace

boost::asio::awaitable<void> DispatchApiRequest(HttpExchange& exchange,
                                                const ApiHandlers& handlers) {
  absl::StatusOr<CanonicalTarget> canonical = CanonicalizeTarget(exchange.request().target);
  if (!canonical.ok()) {
    HttpResponse refused = BadRequestResponse(std::string(canonical.status().message()));
    (void)co_await exchange.Respond(std::move(refused));
    co_return;
  }
  if (const OwnRoute* own = OwnRouteOf(canonical->path, handlers.own_routes); own != nullptr) {
    HttpResponse response = OwnRouteAnswer(exchange.request(), *own);
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  // Whatever is forwarded from here on names the path that was classified.
  exchange.request().target = std::move(canonical->target);
  const std::string path = std::move(canonical->path);
  const ClassifiedRoute route = ClassifyRoute(path);
  if (route.kind == RouteClass::kVersioned) {
    if (exchange.request().method == "POST") {
      co_await handlers.versioned(exchange, *route.api);
      co_return;
    }
    HttpResponse response = JsonResponse(
        405, JsonErrorBody("MethodNotAllowed",
                           absl::StrCat(exchange.request().method, " is not allowed on ", path,
                                        "; it is a versioned route: use POST")));
    response.headers.Add("Allow", "POST");
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  if (route.kind == RouteClass::kBlocked) {
    if (handlers.on_blocked) handlers.on_blocked();
    HttpResponse response = RouteBlockedResponse(path, handlers.blocked_why);
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  if (std::optional<std::string> why = NotForwardedWhy(path, handlers.dialects)) {
    if (handlers.on_blocked) handlers.on_blocked();
    HttpResponse response = RouteNotForwardedResponse(*why);
    (void)co_await exchange.Respond(std::move(response));
    co_return;
  }
  co_await handlers.other(exchange);
}

}  // namespace stitch
