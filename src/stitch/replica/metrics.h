// The sidecar's metrics in the Prometheus text format (GET /metrics). The
// values are a plain snapshot, so rendering needs nothing but this struct.
#pragma once

#include <vector>

#include "stitch/engine/engine.h"

#include <cstdint>
#include <optional>
#include <string>

#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/net/server.h"
#include "stitch/replica/proxy.h"
#include "stitch/replica/reconciler.h"

namespace stitch {

struct SidecarMetrics {
  std::optional<VersionRef> applied;  // nullopt while the engine is not verified
  bool ready = false;
  bool terminal = false;
  SyncState sync_state = SyncState::kIdle;
  uint64_t admitted = 0;
  uint64_t rejected_not_ready = 0;
  uint64_t rejected_terminal = 0;
  uint64_t rejected_unverified = 0;
  int64_t in_flight = 0;
  ProxyCounters proxy;
  ReconcilerCounters reconciler;
  uint64_t watchdog_probes = 0;
  uint64_t watchdog_failures = 0;
  StoreTraffic store;
  std::vector<Engine::CommitPath> commit_paths;  // the engine's (Engine::CommitPaths)
  // Whether the engine's own metrics were read for this scrape.
  bool engine_metrics_up = false;
  ServerStats server;  // the sidecar's HTTP server's
};

// Every metric has a `stitch_sidecar_` name, HELP and TYPE lines:
//   requests_admitted_total, requests_rejected_total{reason}, requests_in_flight,
//   applied_version{run_id} (only while verified), engine_verified,
//   unvouched_responses_total, engine_distrusts_total,
//   engine_unreachable_total, ready, terminal, sync_state{state} (one-hot),
//   stage_duration_seconds_{sum,count}, commit_duration_seconds_{sum,count},
//   last_stage_seconds, last_commit_seconds, commits_total,
//   skipped_updates_total, run_switches_total, pointer_rewinds_total,
//   reconcile_passes_total,
//   reconcile_errors_total, client_disconnects_total, streamed_requests_total,
//   forwarded_requests_total, watchdog_probes_total, watchdog_failures_total,
//   store_files_downloaded_total, store_bytes_downloaded_total,
//   engine_commits_total{path,reason} (engines that say how they commit:
//   path "patch", "patch-undone" or "reload", with why it reloaded),
//   commits_undone_total, engine_metrics_up, and the body budget's
//   (WriteBodyBudgetMetrics, net/server.h).
std::string RenderPrometheus(const SidecarMetrics& m);

}  // namespace stitch
