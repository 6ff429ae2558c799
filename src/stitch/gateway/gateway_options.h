// What a gateway is configured with (GatewayOptions) and what it counts
// (GatewayCounters): shared by the gateway (gateway.h) and its relay
// (relay.h), which needs nothing else of the gateway.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "stitch/core/constraint.h"
#include "stitch/net/server.h"

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
  // While requests wait for a version no replica in rotation has, the fleet
  // is woken (POST /wake) at most this often, again and again: a replica
  // idle in its reconcile backoff reads the pointer only when woken or at
  // its next backstop, so a version published while requests already wait
  // for it is found within about this long.
  std::chrono::milliseconds waiting_wake_interval = std::chrono::seconds(2);
  // Timeout of one /server_info probe.
  std::chrono::milliseconds probe_timeout = std::chrono::seconds(2);
  // For a non-streamed request, the whole exchange with a replica; for a
  // streamed one, until its response header.
  std::chrono::milliseconds upstream_timeout = std::chrono::hours(1);
  // Replicas tried per request (the first included).
  int max_attempts = 3;
  // The constraint of requests that carry none (an empty one: none), used
  // in routing and passed on in the body so that the replica enforces it.
  VersionConstraint default_constraint;
  // Prefix-affine routing (chooser.h): requests whose version and first
  // affinity_prefix_bytes bytes of prompt agree go to one replica while its
  // load stays within affinity_load_factor × the mean. 0: off (the two
  // random choices alone).
  size_t affinity_prefix_bytes = 0;
  double affinity_load_factor = 1.25;
  // How long a replica may keep requests from this gateway outstanding
  // while sending nothing back before it counts as stalled (see the top of
  // this file); zero disables the watch. A busy replica answers or streams
  // far more often than every 5 s, and a false alarm (one long unstreamed
  // generation and nothing else) only steers new work to other replicas
  // for a while: a stalled replica still serves what no other one can.
  std::chrono::milliseconds stall_timeout = std::chrono::seconds(5);
  // Longest session id accepted (400 beyond): ids are names, not payloads.
  size_t max_session_id_bytes = 256;
  // Memory the session table may count (ids and entries): 64 MiB holds
  // about 200,000 sessions of 256-byte ids, far more of typical ones.
  size_t session_table_bytes = size_t{64} << 20;
  // The fleet's bearer token (net/auth.h); empty: none.
  std::string auth_token;
  bool auth_data_plane = false;
};

// Counters for /metrics and tests.
struct GatewayCounters {
  uint64_t requests = 0;    // versioned requests received
  uint64_t routed = 0;      // attempts sent to a replica
  uint64_t retried = 0;     // attempts after the first (409, 503, connection failure)
  uint64_t waited = 0;      // requests that waited for the fleet to catch up
  uint64_t rejected = 0;    // 409s answered by the gateway itself
  uint64_t unservable = 0;  // of which at once: an exact version every replica passed
  uint64_t stalls = 0;      // replicas found stalled
  uint64_t blocked = 0;     // 403 RouteBlocked
  uint64_t wakes = 0;       // fleet wakes started
};

}  // namespace stitch
