// The gateway: one front door for a rollout pool that routes by policy
// version (docs/design.md, "Gateway").
//
// It discovers replicas through a Pool, polls each one's /server_info, and
// also learns a replica's applied version from the 409 bodies and version
// stamps of the responses it relays. Versioned requests (POST /generate,
// /v1/completions, /v1/chat/completions) go only to ready replicas whose
// applied version satisfies the body's `weight_version`:
//   - a session (the `session_header` header) stays on its previous replica
//     while that replica is ready and satisfies the constraint;
//   - otherwise the less loaded of two random satisfying replicas (fewest
//     requests outstanding from this gateway) is chosen;
//   - a 409, a 503 or a connection failure is retried on another replica, at
//     most `max_attempts` replicas per request, never one twice;
//   - when no replica satisfies the constraint, the fleet is woken and the
//     request waits up to `admission_wait` for one to catch up; then the
//     gateway answers 409 WeightVersionNotReady itself, in the sidecar's
//     body shape ({"type", "target_version", "applied", "message"});
//   - `stream: true` responses are relayed as they arrive.
// The body is forwarded unchanged: the sidecar consumes `weight_version`.
// Every relayed response carries `X-Stitch-Replica: <replica URL>`.
// Engine control routes are refused (403 RouteBlocked). Other routes are
// forwarded to any ready replica. The gateway's own routes:
//   GET /health    200 {"ready": true, ...} when a replica is ready, else 503
//   GET /replicas  PoolState JSON: url, reachable, ready, applied, sync
//                  state, in_flight, last_error of each replica
//   GET /metrics   Prometheus text: routed, retried, waited, rejected, and
//                  per-replica in-flight, ready and version
// With a bearer token (GatewayOptions::auth_token) /replicas needs it, with
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
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/pool/pool.h"

namespace stitch {

struct GatewayOptions {
  // Where the gateway listens (port 0 picks one).
  ServerOptions server;
  // Requests carrying the same value of this header stick to one replica.
  std::string session_header = "X-Session-Id";
  // How long a request waits for a replica that satisfies its constraint.
  std::chrono::milliseconds admission_wait = std::chrono::seconds(30);
  // How often the pool is discovered and every replica's /server_info read.
  // While requests wait for the fleet, replicas are polled at least every
  // 200 ms.
  std::chrono::milliseconds poll_interval = std::chrono::seconds(1);
  // Timeout of one /server_info probe.
  std::chrono::milliseconds probe_timeout = std::chrono::seconds(2);
  // For a non-streamed request, the whole exchange with a replica; for a
  // streamed one, until its response header.
  std::chrono::milliseconds upstream_timeout = std::chrono::hours(1);
  // Replicas tried per request (the first included).
  int max_attempts = 3;
  // The fleet's bearer token (net/auth.h); empty: none.
  std::string auth_token;
  bool auth_data_plane = false;
};

// Counters for /metrics and tests.
struct GatewayCounters {
  uint64_t requests = 0;  // versioned requests received
  uint64_t routed = 0;    // attempts sent to a replica
  uint64_t retried = 0;   // attempts after the first (409, 503, connection failure)
  uint64_t waited = 0;    // requests that waited for the fleet to catch up
  uint64_t rejected = 0;  // 409s answered by the gateway after waiting
  uint64_t blocked = 0;   // 403 RouteBlocked
  uint64_t wakes = 0;     // fleet wakes started
};

class Gateway {
 public:
  // Starts listening and polling. `pool` and `workers` must outlive the
  // gateway; `executor` is its event loop. Errors: those of
  // HttpServer::Start. Call on any thread but the loop's.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Gateway>> Start(
      boost::asio::any_io_executor executor, Pool& pool, WorkerPool& workers,
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
  const GatewayCounters& counters() const;

  struct Impl;

 private:
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stitch
