// The gateway: one front door for a rollout pool that routes by policy
// version (docs/design.md, "Gateway").
//
// It discovers replicas through a Pool, polls each one's /server_info, and
// also learns a replica's applied version from the 409 bodies and version
// stamps of the responses it relays. Versioned requests (POST /generate,
// /v1/completions, /v1/chat/completions) go only to ready replicas whose
// applied version satisfies the body's `weight_version`:
//   - a session (the `session_header` header, at most
//     `max_session_id_bytes`, else 400) stays on its previous replica while
//     that replica is ready, not stalled and satisfies the constraint; the
//     session table is bounded by `session_table_bytes` (least recently used
//     sessions forgotten first);
//   - otherwise the less loaded of two distinct random satisfying replicas
//     (fewest requests outstanding from this gateway) is chosen, among the
//     replicas that are not stalled when any of them satisfies the request;
//   - a 409, a 503 or a connection failure is retried on another replica, at
//     most `max_attempts` replicas per request, never one twice;
//   - when no replica satisfies the constraint, the fleet is woken and the
//     request waits up to `admission_wait` for one to catch up; then the
//     gateway answers 409 WeightVersionNotReady itself, in the sidecar's
//     body shape ({"type", "target_version", "applied", "message"}). An exact
//     version below every replica's applied version (all of one run, every
//     replica probed) can never be served: 409 at once, without waiting;
//   - `stream: true` responses are relayed as they arrive.
// Stalls (a frozen engine behind a sidecar that still answers /server_info):
// a replica with requests outstanding from this gateway that sends nothing
// back (no answer, no response header, no stream bytes) for `stall_timeout`
// is stalled. New requests go to other replicas while one satisfies them;
// once its outstanding requests are gone it gets one request at a time; the
// first answer or byte from it ends the stall. A replica whose /server_info
// probe fails or times out (`probe_timeout`) leaves rotation until a probe
// succeeds. Requests already on a stalled replica are left to run.
// The body is forwarded unchanged: the sidecar consumes `weight_version`.
// Every relayed response carries `X-Stitch-Replica: <replica URL>`. Request
// bodies are bounded per request and in total by `server`
// (ServerOptions::max_body_bytes, max_total_body_bytes: 413 and 503).
// Engine control routes are refused (403 RouteBlocked). Other routes are
// forwarded to any ready replica. The gateway's own routes:
//   GET /health    200 {"ready": true, ...} when a replica is ready, else 503
//   GET /replicas  PoolState JSON: url, reachable, ready, applied, sync
//                  state, in_flight, stalled, last_error of each replica
//   GET /metrics   Prometheus text: routed, retried, waited, rejected,
//                  stalls, sessions, request body bytes, and per-replica
//                  in-flight, ready, stalled and version
//   GET /ui        the dashboard: a self-contained page (dashboard_page.h)
//   GET /ui/state  what it draws: the fleet's bounded history as JSON
//                  (fleet_history.h), serialized at most every 250 ms
//
// Time (polls, probe timeouts, waits for the fleet, the stall watch) comes
// from the injected Clock.
//
// Inside: a replica table (replica_table.h: discovery, probes, stalls), a
// pure chooser (chooser.h), and a relay (relay.h: forwarding, streams,
// retries, waits). docs/gateway.md is the operator's view.
// With a bearer token (GatewayOptions::auth_token) /replicas and /ui/state
// need it, with
// auth_data_plane every route but /health and /metrics does, and the
// gateway presents it to the replicas in place of the client's.
//
// Threading: everything runs on one event loop; Pool calls (blocking) run on
// a worker pool. Choosing a replica costs the same whatever the pool's size:
// ready replicas are indexed by applied version, rebuilt only when a
// replica's readiness or version changes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/statusor.h"
#include "stitch/core/state.h"
#include "stitch/gateway/gateway_options.h"
#include "stitch/net/clock.h"
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/pool/pool.h"

namespace stitch {

class Gateway {
 public:
  // Starts listening and polling. `pool`, `workers` and `clock` must outlive
  // the gateway; `executor` is its event loop. Errors: those of
  // HttpServer::Start. Call on any thread but the loop's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gateway>> Start(
      boost::asio::any_io_executor executor, Pool& pool, WorkerPool& workers, Clock& clock,
      GatewayOptions options);

  // REQUIRES: Shutdown() completed, or the executor's loop stopped for good.
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // "http://host:port".
  std::string url() const;
  uint16_t port() const;

  // Stops serving and polling and returns once every request handler and
  // background task ended. Must be awaited on the executor.
  boost::asio::awaitable<void> Shutdown();

  // What the gateway knows now. On the executor only.
  PoolState Snapshot() const;
  GatewayCounters counters() const;

  struct Impl;

 private:
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stitch
