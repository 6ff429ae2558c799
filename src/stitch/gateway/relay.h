// The gateway's relay: how one client request reaches a replica and its
// answer comes back (docs/gateway.md).
//   - a versioned request goes to the replica the chooser picks (its
//     session's replica while that one qualifies); a 409, a 503 or a
//     connection failure is retried on another replica, at most
//     `max_attempts` replicas, never one twice; when none qualifies, the
//     fleet is woken and the request waits (on the gateway's clock) up to
//     `admission_wait` for one to catch up, then the gateway answers 409
//     itself, at once for an exact version the whole pool has passed;
//   - `stream: true` answers are relayed as they arrive; a stream the
//     replica cuts after it began ends without a proper end of body;
//   - any other route is forwarded once to any ready replica;
//   - bodies pass unchanged (api/headers.h, BodyRelay::kUnchanged), and
//     every relayed answer names its replica in X-Stitch-Replica; a client
//     that leaves ends the call or stream to its replica.
// What the answers teach (a 409's applied version, a stamp's end version, a
// failure) goes to the replica table.
//
// Threading: confined to the gateway's event loop.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "stitch/gateway/chooser.h"
#include "stitch/gateway/gateway_options.h"
#include "stitch/gateway/replica_table.h"
#include "stitch/gateway/session_table.h"
#include "stitch/net/client.h"
#include "stitch/net/clock.h"
#include "stitch/net/server.h"

namespace stitch {

class Relay {
 public:
  // Everything must outlive the relay.
  Relay(HttpClient& client, ReplicaTable& table, Clock& clock, const GatewayOptions& options,
        GatewayCounters& counters);
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // A POST to a versioned route.
  boost::asio::awaitable<void> Versioned(HttpExchange& exchange);
  // Any other route that is not blocked.
  boost::asio::awaitable<void> Other(HttpExchange& exchange);

  const SessionTable<ReplicaPtr>& sessions() const { return sessions_; }

 private:
  enum class Outcome { kDone, kRetry, kClientGone };
  // The headers a replica gets: the client's as api/headers.h passes them.
  // The gateway's own token goes on only for a client that presented it to
  // the gateway; any other request keeps the caller's Authorization (or
  // none), so that the gateway never lends its credential.
  HttpHeaders UpstreamHeaders(const HttpHeaders& from) const;
  // Why the gateway answers 409 itself.
  enum class NotServed { kAfterWaiting, kNeverServable };

  boost::asio::awaitable<Outcome> Attempt(HttpExchange& exchange, ReplicaEntry& r,
                                          HttpRequest request,
                                          std::optional<HttpResponse>* last_failure);
  boost::asio::awaitable<Outcome> AttemptStream(HttpExchange& exchange, ReplicaEntry& r,
                                                HttpRequest request,
                                                std::optional<HttpResponse>* last_failure);
  boost::asio::awaitable<Outcome> RelayStream(HttpExchange& exchange, ReplicaEntry& r,
                                              HttpRequest request,
                                              std::optional<HttpResponse>* last_failure);
  bool Refused(ReplicaEntry& r, HttpResponse& out, std::optional<HttpResponse>* last_failure);
  HttpResponse Unreachable(ReplicaEntry& r, const absl::Status& status);
  HttpResponse NotReady(const VersionConstraint& constraint, NotServed why);

  HttpClient& client_;
  ReplicaTable& table_;
  Clock& clock_;
  const GatewayOptions& options_;
  GatewayCounters& counters_;
  Chooser chooser_;
  SessionTable<ReplicaPtr> sessions_;
};

}  // namespace stitch
