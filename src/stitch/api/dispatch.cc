#include "stitch/api/dispatch.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stitch/api/answers.h"

namespace stitch {

boost::asio::awaitable<void> DispatchApiRequest(HttpExchange& exchange,
                                                const ApiHandlers& handlers) {
  absl::StatusOr<CanonicalTarget> canonical = CanonicalizeTarget(exchange.request().target);
  if (!canonical.ok()) {
    HttpResponse refused = BadRequestResponse(std::string(canonical.status().message()));
    (void)co_await exchange.Respond(std::move(refused));
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
