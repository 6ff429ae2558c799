// How a server of the rollout API routes the requests it does not serve
// itself (the sidecar's proxy, the gateway), the same way in both. The
// target is first put in its canonical form (routes.h CanonicalizeTarget; a
// target that has none is a 400 BadRequest), and the request carries that
// form from then on. Then a POST to a versioned route is handled as one
// (another method is a 405); an engine control route is refused with 403
// RouteBlocked; one of the read-only routes of the engines behind this
// server (routes.h ReadOnlyRoutes) is forwarded; anything else is refused
// with 403 RouteNotForwarded, which names the routes to use.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "stitch/api/routes.h"
#include "stitch/net/server.h"

namespace stitch {

struct ApiHandlers {
  // A POST to a versioned route.
  std::function<boost::asio::awaitable<void>(HttpExchange&, ApiRoute)> versioned;
  // A read-only route of one of `dialects`.
  std::function<boost::asio::awaitable<void>(HttpExchange&)> other;
  // The dialects of the engines behind this server: whose read-only routes
  // are forwarded (none: only versioned routes are).
  std::vector<EngineDialect> dialects;
  // Why this server refuses engine control routes, for the 403's message
  // ("<path> is an engine control route: <why>").
  std::string blocked_why;
  // Told of each route refused, a control route or one not forwarded (may
  // be empty).
  std::function<void()> on_blocked;
};

// Routes `exchange` as the top of this file says. `handlers` must outlive
// the returned coroutine.
boost::asio::awaitable<void> DispatchApiRequest(HttpExchange& exchange,
                                                const ApiHandlers& handlers);

}  // namespace stitch
