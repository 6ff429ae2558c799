// The chaos run's checker: reads a history (history.h) and computes the
// figures the run prints, and the checks that fail it (docs/chaos.md,
// "Reading the figures"). Pure: no I/O besides what the caller reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stitch/chaos/history.h"
#include "stitch/chaos/schedule.h"

namespace stitch {

struct CheckOptions {
  // Resource growth is judged only for processes sampled over at least this
  // long (restarted processes start new series).
  double growth_min_span_s = 480;
  int growth_min_samples = 9;
  // A series fails when the mean of its last third exceeds the mean of its
  // first third by more than max(floor, fraction * first third).
  int64_t rss_growth_floor_kib = 16 * 1024;
  double rss_growth_fraction = 0.2;
  int64_t files_growth_floor = 16;
  double files_growth_fraction = 0.5;
  // A fault that no probe saw recover from within this long fails the run.
  double max_recovery_s = 60;
  // At most this many example lines per kind of problem.
  size_t max_examples = 5;
};

struct KindFigures {
  FaultKind kind = FaultKind::kEngineKill;
  int injected = 0;      // faults applied
  int skipped = 0;       // faults that could not be applied
  int64_t requests = 0;  // sent while one of its faults was active (left by the client excluded)
  int64_t answered = 0;
  int64_t alone_requests = 0;  // of which while no fault of another kind was active
  int64_t alone_answered = 0;
  std::vector<double> recovery_s;  // one per applied fault that recovered
  int not_recovered = 0;

  double availability() const;        // answered / requests, 1 when none
  double alone_availability() const;  // alone_answered / alone_requests, 1 when none
};

struct GrowthFigures {
  std::string process;  // "sidecar r0 #1"
  double span_s = 0;
  int samples = 0;
  int64_t rss_first_kib = 0;  // mean of the first third
  int64_t rss_last_kib = 0;   // mean of the last third
  int64_t files_first = 0;
  int64_t files_last = 0;
  bool rss_grew = false;
  bool files_grew = false;
};

struct ChaosFigures {
  RunEntry run;
  bool has_run = false;

  int64_t requests = 0;
  int64_t answered = 0;
  int64_t retryable = 0;
  int64_t failed = 0;
  int64_t client_left = 0;
  int64_t via_gateway = 0;
  int64_t via_sidecar = 0;
  int64_t streamed = 0;
  int64_t with_session = 0;
  int64_t probes = 0;
  int64_t unconstrained = 0;
  int64_t min_constrained = 0;
  int64_t exact_constrained = 0;

  int64_t constraint_violations = 0;
  int64_t unpublished = 0;
  int64_t mislabelled = 0;
  int64_t judged_same = 0;
  int64_t judged_crossed = 0;
  int64_t unjudged = 0;
  // Answered, but the judge could not judge them (the transformers judge
  // failed, or the answer carried no token ids for it): never a pass.
  int64_t judge_failed = 0;
  // Answers' version spans: explained by the weights (of which across a
  // commit: more than one span), "unknown", and wrong (must be 0).
  int64_t spans_exact = 0;
  int64_t spans_exact_crossed = 0;
  int64_t spans_unknown = 0;
  int64_t spans_wrong = 0;

  int64_t publish_attempts = 0;
  int64_t published_full = 0;
  int64_t published_delta = 0;
  int64_t publishes_killed = 0;
  int64_t publishes_failed = 0;
  int64_t pointer_values = 0;
  int64_t pointer_incomplete = 0;
  int64_t final_version = -1;

  // Requests sent while no fault was active.
  int64_t calm_requests = 0;
  int64_t calm_answered = 0;

  std::vector<KindFigures> kinds;  // in kAllFaultKinds order, only those scheduled
  std::vector<GrowthFigures> growth;
  bool has_end = false;
  EndEntry end;

  std::vector<std::string> failures;  // one line per failed check
  std::vector<std::string> examples;  // requests and events behind the failures
};

// Computes the figures and runs the checks:
//   - constraint violations, answers attributed to an unpublished version and
//     answers whose label disagrees with the weights are all 0;
//   - no request failed otherwise (every failure is a 409, a 503 or a
//     dropped connection, which a client retries);
//   - every pointer value seen named complete bytes;
//   - every applied fault was recovered from within max_recovery_s;
//   - after the run: the fleet converged to the final pointer, no process
//     and no temporary file was left behind, no generation kept running;
//   - no process grew (resident memory, open files) over a long run.
ChaosFigures CheckHistory(const std::vector<HistoryEntry>& history,
                          const CheckOptions& options = {});

// The figures as the run prints them, ending with the checks' verdict.
std::string FormatFigures(const ChaosFigures& figures);

}  // namespace stitch
