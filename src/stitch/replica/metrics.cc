#include "stitch/replica/metrics.h"

#include "absl/strings/str_cat.h"
#include "stitch/net/prometheus.h"

namespace stitch {

std::string RenderPrometheus(const SidecarMetrics& m) {
  PrometheusText w("stitch_sidecar_");
  w.One("requests_admitted_total", "counter", "Versioned requests admitted by the gate.",
        m.admitted);
  w.Header("requests_rejected_total", "counter", "Versioned requests refused, by reason.");
  w.Sample("requests_rejected_total", PromLabels("reason", "version_not_ready"),
           m.rejected_not_ready);
  w.Sample("requests_rejected_total", PromLabels("reason", "terminal"), m.rejected_terminal);
  w.Sample("requests_rejected_total", PromLabels("reason", "engine_unverified"),
           m.rejected_unverified);
  w.Sample("requests_rejected_total", PromLabels("reason", "bad_request"), m.proxy.bad_requests);
  w.Sample("requests_rejected_total", PromLabels("reason", "route_blocked"), m.proxy.route_blocked);
  w.Sample("requests_rejected_total", PromLabels("reason", "engine_unavailable"),
           m.proxy.engine_unavailable);
  w.One("requests_in_flight", "gauge", "Versioned requests holding admission now.", m.in_flight);
  w.One("client_disconnects_total", "counter",
        "Requests whose client went away; their generation was aborted.",
        m.proxy.client_disconnects);
  w.One("streamed_requests_total", "counter", "Versioned requests with stream: true.",
        m.proxy.streamed);
  w.One("assembled_responses_total", "counter",
        "Whole /generate answers assembled from the engine's stream, for exact version spans.",
        m.proxy.assembled);
  w.One("forwarded_requests_total", "counter", "Other requests forwarded to the engine as is.",
        m.proxy.forwarded);
  w.Header("applied_version", "gauge",
           "The version the engine serves (absent while its weights are not verified).");
  if (m.applied.has_value()) {
    w.Sample("applied_version", PromLabels("run_id", m.applied->run_id), m.applied->version);
  }
  w.One("engine_verified", "gauge",
        "1 while the sidecar vouches for the engine's weights (verified or loaded by it).",
        m.applied.has_value() ? 1 : 0);
  w.One("unvouched_responses_total", "counter",
        "Responses answered 503 because the engine's weights changed or were mislabelled while "
        "they ran.",
        m.proxy.unvouched);
  w.One("engine_spans_disagreed_total", "counter",
        "Generations whose spans the engine reported differ from those its events' labels "
        "suggested (the engine's are stamped).",
        m.proxy.spans_disagreed);
  w.One("engine_distrusts_total", "counter",
        "Times the sidecar withdrew trust in the engine's weights (a restart, a change it did not "
        "make).",
        m.reconciler.distrusted);
  w.One("engine_unreachable_total", "counter",
        "Times the engine did not answer a probe or a request.", m.reconciler.unreachable);
  w.One("ready", "gauge", "1 once the replica caught up with the pointer (and is not terminal).",
        m.ready ? 1 : 0);
  w.One("terminal", "gauge", "1 once the replica hit a terminal error and is exiting.",
        m.terminal ? 1 : 0);
  w.Header("sync_state", "gauge", "The reconciler's state (one-hot).");
  for (SyncState s : {SyncState::kIdle, SyncState::kFetching, SyncState::kStaging,
                      SyncState::kCommitting, SyncState::kError}) {
    w.Sample("sync_state", PromLabels("state", SyncStateName(s)), s == m.sync_state ? 1 : 0);
  }
  const ReconcilerCounters& r = m.reconciler;
  w.Header("stage_duration_seconds", "summary", "Time spent staging versions while serving.");
  w.Sample("stage_duration_seconds_sum", "", r.stage_seconds_sum);
  w.Sample("stage_duration_seconds_count", "", r.stages);
  w.Header("commit_duration_seconds", "summary", "Time the engine spent paused for commits.");
  w.Sample("commit_duration_seconds_sum", "", r.commit_seconds_sum);
  w.Sample("commit_duration_seconds_count", "", r.commits);
  w.One("last_stage_seconds", "gauge", "Duration of the last staging.", r.last_stage_seconds);
  w.One("last_commit_seconds", "gauge", "Duration of the last commit.", r.last_commit_seconds);
  w.One("commits_total", "counter", "Engine commits.", r.commits);
  w.One("commits_undone_total", "counter",
        "Commits the engine undid after a part-way failure; the previous version kept serving.",
        r.commits_undone);
  w.Header("engine_commits_total", "counter",
           "Engine commits by how the weights were updated: an in-place patch of the values that "
           "changed, or a reload of the whole checkpoint (with the reason).");
  for (const Engine::CommitPath& c : m.commit_paths) {
    const std::string path = PromLabels("path", c.path);
    w.Sample("engine_commits_total",
             absl::StrCat(path.substr(0, path.size() - 1), ",",
                          PromLabels("reason", c.reason).substr(1)),
             c.count);
  }
  w.One("skipped_updates_total", "counter",
        "Served-version moves without an engine update (empty deltas).", r.skipped);
  w.One("run_switches_total", "counter", "Run changes followed.", r.run_switches);
  w.One("pointer_rewinds_total", "counter",
        "Pointers seen behind the applied version of the same run (the applied one is kept).",
        r.pointer_rewinds);
  w.One("reconcile_passes_total", "counter", "Reconcile passes.", r.passes);
  w.One("reconcile_errors_total", "counter", "Reconcile passes that hit a transient error.",
        r.errors);
  w.One("store_files_downloaded_total", "counter",
        "Files downloaded from a remote store to materialize versions (not those found in the "
        "cache).",
        m.store.files_downloaded);
  w.One("store_bytes_downloaded_total", "counter",
        "Bytes downloaded from a remote store to materialize versions.", m.store.bytes_downloaded);
  w.One("peer_files_downloaded_total", "counter",
        "Version files taken from peers (--peers) instead of the store, verified.",
        m.store.peer_files);
  w.One("peer_bytes_downloaded_total", "counter", "Bytes of those files.", m.store.peer_bytes);
  w.One("peer_files_rejected_total", "counter",
        "Files a peer sent that were not the store's bytes (then taken from elsewhere).",
        m.store.peer_rejected);
  w.One("watchdog_probes_total", "counter", "Engine health probes.", m.watchdog_probes);
  w.One("watchdog_failures_total", "counter", "Failed engine health probes.", m.watchdog_failures);
  w.One("engine_metrics_up", "gauge",
        "1 when the engine's own metrics follow in this exposition, 0 when it gave none.",
        m.engine_metrics_up ? 1 : 0);
  WriteBodyBudgetMetrics(m.server, w);
  return w.Take();
}

}  // namespace stitch
