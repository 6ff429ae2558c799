// The Pool port: how the control plane finds the replicas of a rollout pool
// and nudges them.
//
// Wakes only cut latency: every replica reconciles against the store's
// pointer on its own schedule, so a lost wake delays convergence but never
// breaks it (docs/design.md, promise 5). Wake therefore never fails; it logs
// what went wrong and reports how many replicas answered.
//
// Thread-safety: implementations are safe to call from several threads.
// Calls block (DNS, network): never call them on an event-loop thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stitch {

class Pool {
 public:
  virtual ~Pool() = default;

  // The pool's spec, for messages ("static:http://a:1,http://b:2").
  virtual std::string spec() const = 0;

  // The base URLs of the replicas ("http://10.0.0.5:8000"), without a
  // trailing slash.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> Discover() = 0;

  // Best effort: POSTs `<url>/wake` to every discovered replica concurrently.
  // Each failure (discovery, connection, timeout, non-2xx answer) is logged
  // as a warning and never returned. Returns how many replicas answered 2xx.
  virtual int Wake() = 0;
};

struct WakeOptions {
  // Per-replica limit on the whole exchange (connect + request + answer).
  std::chrono::milliseconds timeout{2000};
  // At most this many wakes in flight at once.
  int max_concurrency = 32;
  // Sent as "Authorization: Bearer <bearer_token>" when not empty: the
  // replicas' token (docs/sidecar.md, "Bearer tokens").
  std::string bearer_token;
};

// POSTs `<url>/wake` (empty JSON body) to each of `urls` concurrently, as
// Pool::Wake describes, with the rollout API's replica client
// (api/replica_client.h). Shared by the Pool adapters.
int WakeReplicas(const std::vector<std::string>& urls, const WakeOptions& options);

// Discovers `pool`'s replicas and wakes them with WakeReplicas; a failed
// discovery is logged and wakes nobody (returns 0).
int WakeDiscovered(Pool& pool, const WakeOptions& options);

// Makes the pool a spec names:
//   static:URL,URL,...    a fixed list of replica base URLs
//   URL,URL,...           the same, when every entry is an http(s) URL
//   file:PATH             one URL per line of a file, re-read when it changes
//   dns:NAME:PORT         every A/AAAA record of NAME, at PORT
// Errors (InvalidArgument) name the offending entry and list the supported
// forms.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Pool>> MakePool(std::string_view spec,
                                                             const WakeOptions& options = {});

}  // namespace stitch
