// How a server of the rollout API routes the requests it does not serve
// itself (the sidecar's proxy, the gateway), the same way in both. The
// target is first put in its canonical form (routes.h CanonicalizeTarget; a
// target that has none is a 400 BadRequest), and the request carries that
// form from then on. Then a POST to a versioned route is handled as one; an
// engine control route is refused with 403 RouteBlocked; everything else, a
// versioned path with another method included, is forwarded.
#pragma once

#include <functional>
#include <string>

#include <boost/asio/awaitable.hpp>

#include "stitch/api/routes.h"
#include "stitch/net/server.h"

namespace stitch {

struct ApiHandlers {
  // A POST to a versioned route.
  std::function<boost::asio::awaitable<void>(HttpExchange&, ApiRoute)> versioned;
  // Any other route that is not an engine control route.
  std::function<boost::asio::awaitable<void>(HttpExchange&)> other;
  // Why this server refuses engine control routes, for the 403's message
  // ("<path> is an engine control route: <why>").
  std::string blocked_why;
  // Told of each engine control route refused (may be empty).
  std::function<void()> on_blocked;
};

// Routes `exchange` as the top of this file says. `handlers` must outlive
// the returned coroutine.
boost::asio::awaitable<void> DispatchApiRequest(HttpExchange& exchange,
                                                const ApiHandlers& handlers);

}  // namespace stitch
