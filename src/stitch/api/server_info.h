// The wire forms of what replicas and gateways report (docs/sidecar.md,
// docs/gateway.md): a sidecar's GET /server_info (also its answer to
// POST /wake), and a gateway's GET /replicas, which `stitch status` reads.
// The values are core/state.h's.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/core/state.h"

namespace stitch {

// {"ready", "applied" (an identity or null), "applied_version", "sync_state",
// "reason", "run_id", "commit_mode", "active_requests",
// "update_destination_ready", "update_destination_error", "terminal_error",
// "sync_error", "metrics": {name: number}, "pointer" (the store's pointer as
// the replica last read it: an identity or null; max_staleness is judged
// against it), "pointer_version", "pointer_notice", "held" (null, or
// {"version": identity, "holder": name} while the replica is held for
// evaluation) (ReplicaState)}.
// "reason", "update_destination_error", "terminal_error", "sync_error" and
// "pointer_notice" are null when there is nothing to say (the original
// Python Stitch's form), never "".
std::string ServerInfoJson(const ReplicaState& state);

// Reads ServerInfoJson's form; absent fields keep their defaults, unknown
// ones are ignored, and a string field may be null (read as "": the null of
// this form and the "" of earlier sidecars read the same). InvalidArgument
// naming the field ("server_info.ready must be a boolean") for a field of
// the wrong type, or a body that is not a JSON object.
[[nodiscard]] absl::StatusOr<ReplicaState> ParseServerInfo(std::string_view body);

// {"replicas": [ServerInfoJson's fields plus "url", "reachable",
// "in_flight", "stalled", "last_error"], "ready": <ready_count()>}, and
// "pointer" last when `pointer` is not empty (`stitch status --json` adds
// the store's).
std::string ReplicasJson(const PoolState& pool, std::string_view pointer = {});

// Reads ReplicasJson's form. Lenient, for a tool showing what a gateway
// knows: an item that is not an object is skipped, and a field of the wrong
// type keeps its default. InvalidArgument when there is no replica list.
[[nodiscard]] absl::StatusOr<PoolState> ParseReplicas(std::string_view body);

}  // namespace stitch
