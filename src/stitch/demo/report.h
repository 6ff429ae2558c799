// What `stitch demo` recorded, what it concludes from it, and how it shows
// it: the end-of-run summary table, the invariant checks, and the
// self-contained HTML report (inline SVG charts, no scripts, no external
// files). Plain values and pure functions: no I/O, so that every number the
// demo prints can be tested.
//
// Times are seconds since the demo started (one steady clock for the whole
// run).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stitch {

// One training step: the batch it learned from and the version it published.
struct DemoStep {
  int64_t step = 0;     // 1-based
  int64_t version = 0;  // the version this step published
  bool full = false;    // a FULL anchor, else an XOR delta
  uint64_t payload_bytes = 0;
  double published_at = 0;  // when the store's pointer named the version
  double publish_s = 0;     // encode + durable publish
  double mean_reward = 0;   // of the batch the step learned from
  int64_t rollouts = 0;
  int64_t dropped = 0;        // too stale: weight 0
  int64_t crossed = 0;        // generated across a weight change
  int64_t crossed_exact = 0;  // of those, weighted per token from exact spans
};

// One change seen on a replica's /server_info (applied version or
// readiness); the first sample is the first successful poll.
struct DemoReplicaSample {
  double t = 0;
  int64_t applied = -1;  // -1: nothing applied yet
  bool ready = false;
};

struct DemoReplica {
  std::string name;  // "r0", "r1", ...
  std::string url;   // the sidecar's URL
  double started_at = 0;
  bool joined = false;  // started while training ran
  std::optional<double> killed_at;
  std::vector<DemoReplicaSample> timeline;
  // Per weight update the replica applied: the last reconcile pass's
  // stage_s and commit_s from /server_info.
  std::vector<double> stage_s;
  std::vector<double> commit_s;
  // The applied version at the end of the run (after the final wait).
  std::optional<int64_t> final_applied;

  // When the replica first reported ready.
  std::optional<double> ready_at() const;
  // When it first reported an applied version >= `version`.
  std::optional<double> reached_at(int64_t version) const;
};

// One rollout response.
struct DemoResponse {
  int64_t min_version = 0;  // the request's constraint
  int64_t version_start = 0;
  int64_t version_end = 0;
  double received_at = 0;
  std::string replica;  // X-Stitch-Replica
};

struct DemoRecord {
  std::string run_id;
  std::string targets;  // the task's target bytes
  std::string engines;  // what ran the replicas' engines, in words
  int64_t lag = 1;
  int64_t boot_version = 0;
  std::vector<DemoStep> steps;
  std::vector<DemoReplica> replicas;
  std::vector<DemoResponse> responses;
  // Failed attempts of rollout requests that the demo sent again.
  int64_t client_retries = 0;
  // Attempts the gateway retried on another replica (its retried_total).
  int64_t gateway_retries = 0;
  // A few completions, as text, from the start, the middle and the end of
  // the run: (step, completions of that step's batch), in step order.
  std::vector<std::pair<int64_t, std::vector<std::string>>> samples;
  double wall_s = 0;

  // The version the last step published (the boot version without steps).
  int64_t final_version() const;
  // The store's pointer at time `t`: the newest version published by then.
  int64_t pointer_at(double t) const;
};

// The nearest-rank percentile (p in [0, 100]) of `values`; 0 when empty.
double Percentile(std::vector<double> values, double p);

// `text` with &, <, >, " and ' escaped for HTML text and attribute values.
std::string HtmlEscape(std::string_view text);

// Bytes as text for a terminal or a report: printable ASCII as is, every
// other byte as \xHH.
std::string PrintableBytes(std::string_view bytes);

struct DemoSummary {
  int64_t versions = 0;
  int64_t full_versions = 0;
  double delta_bytes_p50 = 0;
  double delta_bytes_max = 0;
  double full_bytes = 0;  // of the last anchor
  // Mean reward of the first and of the last quarter of the steps (at least
  // one step each).
  double reward_first = 0;
  double reward_last = 0;
  // Publish-to-fleet convergence: for each published version, the time from
  // its publication until every replica that was ready then (and was not
  // killed before it got there) had applied it.
  std::vector<double> convergence_s;
  int64_t not_converged = 0;
  int64_t joined = 0;
  int64_t killed = 0;
  // Rollouts per serving version (weight_version_end), ascending.
  std::vector<std::pair<int64_t, int64_t>> served_per_version;
  // Staleness of what was served: responses by how many versions their end
  // version was behind the store's pointer when they arrived; the last
  // bucket counts kStalenessBuckets - 1 behind or more.
  static constexpr size_t kStalenessBuckets = 6;
  std::vector<int64_t> staleness;
  int64_t violations = 0;  // responses that did not satisfy their constraint
};

DemoSummary Summarize(const DemoRecord& record);

// The demo's self-checks, each failure one line saying what went wrong:
//   - every response satisfied its constraint (start >= min_version, and
//     end >= start);
//   - no response is attributed to an unpublished version: each stamped
//     version is the boot version or one the store holds, and was published
//     before the response arrived;
//   - every replica that was ready and not killed ended on the final version;
//   - the reward improved (last quarter above the first by `min_improvement`).
// `store_versions` are the versions whose manifests the store holds.
std::vector<std::string> CheckDemo(const DemoRecord& record, const DemoSummary& summary,
                                   const std::set<int64_t>& store_versions, double min_improvement);

// The end-of-run table, for a terminal or a log (ends with a newline).
std::string FormatSummary(const DemoRecord& record, const DemoSummary& summary,
                          const std::vector<std::string>& failures);

// The self-contained HTML report: the summary, the reward over the steps,
// sample completions from the start, middle and end, each replica's applied
// version against the store's pointer in a lane of its own (the lag shaded,
// joins, readiness and kills marked), the staleness of what was served, and
// the rollouts served per version.
std::string RenderHtmlReport(const DemoRecord& record, const DemoSummary& summary,
                             const std::vector<std::string>& failures);

}  // namespace stitch
