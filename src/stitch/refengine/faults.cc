#include "stitch/refengine/faults.h"

#include <unistd.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace stitch {

absl::Status FaultOptions::Validate() const {
  if (fail_stagings < 0) {
    return absl::InvalidArgumentError("--fault-fail-stagings must be >= 0");
  }
  if (fail_commits < 0) return absl::InvalidArgumentError("--fault-fail-commits must be >= 0");
  if (hang_health_after < -1) {
    return absl::InvalidArgumentError("--fault-hang-health-after must be >= -1 (-1: never)");
  }
  if (exit_on_commit < 0) {
    return absl::InvalidArgumentError("--fault-exit-on-commit must be >= 0 (0: never)");
  }
  if (fail_patches < 0) return absl::InvalidArgumentError("--fault-fail-patches must be >= 0");
  return absl::OkStatus();
}

absl::Status FaultInjector::OnStaging() {
  absl::MutexLock lock(&mu_);
  if (stagings_failed_ >= options_.fail_stagings) return absl::OkStatus();
  ++stagings_failed_;
  return absl::InternalError(absl::StrCat("injected fault (--fault-fail-stagings ",
                                          options_.fail_stagings, "): staging ", stagings_failed_,
                                          " fails; nothing was changed"));
}

absl::Status FaultInjector::OnCommit() {
  absl::MutexLock lock(&mu_);
  if (commits_failed_ >= options_.fail_commits) return absl::OkStatus();
  ++commits_failed_;
  return absl::InternalError(absl::StrCat("injected fault (--fault-fail-commits ",
                                          options_.fail_commits, "): commit ", commits_failed_,
                                          " fails; the serving weights were not changed"));
}

int64_t FaultInjector::OnPatch(size_t tensors) {
  absl::MutexLock lock(&mu_);
  if (patches_failed_ >= options_.fail_patches) return -1;
  ++patches_failed_;
  return static_cast<int64_t>(tensors / 2);
}

bool FaultInjector::OnHealthCheck() {
  absl::MutexLock lock(&mu_);
  ++health_checks_;
  return options_.hang_health_after >= 0 && health_checks_ > options_.hang_health_after;
}

void FaultInjector::OnCommitPaused() {
  bool exit_now = false;
  {
    absl::MutexLock lock(&mu_);
    ++commits_paused_;
    exit_now = options_.exit_on_commit > 0 && commits_paused_ == options_.exit_on_commit;
  }
  if (!exit_now) return;
  std::fprintf(stderr,
               "stitch: engine: injected fault (--fault-exit-on-commit %lld): exiting in "
               "the middle of commit %lld\n",
               static_cast<long long>(options_.exit_on_commit),
               static_cast<long long>(options_.exit_on_commit));
  std::fflush(stderr);
  ::_exit(kFaultExitCode);
}

}  // namespace stitch
