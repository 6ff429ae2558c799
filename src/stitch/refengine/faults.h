// Fault injection for the reference engine, so that a sidecar's failure paths
// can be tested against a real engine process. Everything is off unless the
// command line asks for it (docs/engine.md lists the flags).
//
// Thread-safe: the HTTP loop, the worker threads and the scheduler thread
// consult one injector.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace stitch {

// The exit status of a process ended by FaultOptions::exit_on_commit.
inline constexpr int kFaultExitCode = 86;
// The exit status of an engine whose in-place patch failed and could not be
// undone: its weights are neither version's, so it serves nothing.
inline constexpr int kUnknownWeightsExitCode = 87;

struct FaultOptions {
  // The next N stagings (POST /stage_weight_update) fail before touching
  // anything.
  int64_t fail_stagings = 0;
  // The next N commits (POST /update_weights_from_disk or _from_cpu) fail
  // before touching anything.
  int64_t fail_commits = 0;
  // -1: never. N >= 0: the first N GET /health requests are answered
  // normally, every later one hangs (no answer until the client goes away).
  int64_t hang_health_after = -1;
  // 0: never. N >= 1: the N-th commit that reaches the scheduler ends the
  // process with _exit(kFaultExitCode) while generation is paused for it,
  // before the weights change.
  int64_t exit_on_commit = 0;
  // The next N in-place patches (cpu commits of a staged patch) fail after
  // writing half their tensors, and are undone.
  int64_t fail_patches = 0;

  // InvalidArgument naming the field: counts must be >= 0,
  // hang_health_after >= -1.
  [[nodiscard]] absl::Status Validate() const;
  bool any() const {
    return fail_stagings > 0 || fail_commits > 0 || hang_health_after >= 0 || exit_on_commit > 0 ||
           fail_patches > 0;
  }
};

class FaultInjector {
 public:
  explicit FaultInjector(FaultOptions options) : options_(options) {}

  // Internal ("injected fault: ...") while stagings are left to fail; OK
  // otherwise. Each call that fails consumes one.
  [[nodiscard]] absl::Status OnStaging();
  // The same for commits.
  [[nodiscard]] absl::Status OnCommit();
  // Whether this health check must hang (counts every call).
  bool OnHealthCheck();
  // Called by the scheduler thread while paused for a commit; ends the
  // process when this is the commit chosen by exit_on_commit.
  void OnCommitPaused();
  // For a patch of `tensors` tensors: after how many it must fail (half of
  // them) while patches are left to fail, else -1. Each call that fails
  // consumes one.
  int64_t OnPatch(size_t tensors);

  const FaultOptions& options() const { return options_; }

 private:
  const FaultOptions options_;
  absl::Mutex mu_;
  int64_t stagings_failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t commits_failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t health_checks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t commits_paused_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t patches_failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stitch
