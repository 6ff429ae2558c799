// Where the client (client.h) meets the server (server.h): a proxy's call
// upstream, made while it serves a request of its own. Kept apart so that
// neither side includes the other.
#pragma once

#include "stitch/net/client.h"
#include "stitch/net/server.h"

namespace stitch {

// Options for a proxy's upstream call that ends, closing its connection,
// when the client of `exchange` disconnects (HttpExchange::AbortOnDisconnect).
inline CallOptions EndedWithTheClient(HttpExchange& exchange) {
  CallOptions options;
  options.abort = &exchange.AbortOnDisconnect();
  return options;
}

}  // namespace stitch
