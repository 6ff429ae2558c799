// How a server of the rollout API routes the requests it does not serve
// itself (the sidecar's proxy, the gateway), the same way in both. The
// target is first put in its canonical form (routes.h CanonicalizeTarget; a
// target that has none is a 400 BadRequest), and the request carries that
// form from then on. A route the server serves itself, reaching here in
// another spelling or with another method, is answered 404 or 405 (never
// forwarded: an engine would read it as its own route, with the key the
// server adds). Then a POST to a versioned route is handled as one
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

// A route a server serves itself, as its router matches it.
struct OwnRoute {
  std::string method;
  std::string path;
};

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
  // The routes this server serves itself: a request naming one of them
  // (its canonical path, in any letter case, with trailing slashes) that
  // reached dispatch, so that its router did not match it as spelled, is
  // answered here.
  std::vector<OwnRoute> own_routes;
};

// Routes `exchange` as the top of this file says. `handlers` must outlive
// the returned coroutine.
boost::asio::awaitable<void> DispatchApiRequest(HttpExchange& exchange,
                                                const ApiHandlers& handlers);

}  // namespace stitch
