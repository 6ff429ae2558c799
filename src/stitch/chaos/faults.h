// The chaos run's fault injector: applies each fault of the schedule at its
// time and undoes it when it ends, recording what was done in the history
// (docs/chaos.md, "The faults").
//
//   engine_kill, sidecar_kill, gateway_kill, s3_kill   kill -9, restart at the end
//   engine_stop, s3_stall        SIGSTOP, SIGCONT at the end (an S3 server
//                                that answers nothing is a slow store)
//   publisher_kill               the trainer's next `stitch publish` is killed
//                                with SIGKILL partway through
//   store_unreadable             the filesystem store's root is renamed away and
//                                back (root ignores permissions, so chmod 000
//                                would not do)
//   store_full                   the store's file system, a small tmpfs, is
//                                filled with one file, deleted at the end
//   client_disconnect            rollout clients leave their requests midway
//   store_gc                     retention (`stitch gc --keep-last 1`) runs
//                                over the store again and again while
//                                replicas materialize, deleting every version
//                                but the pointer's chain
//
// Each fault runs on its own thread from its start to its end, so faults
// overlap as the schedule says.
#pragma once

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>
#include "absl/synchronization/mutex.h"

#include "absl/base/thread_annotations.h"
#include "stitch/chaos/client.h"
#include "stitch/chaos/fleet.h"
#include "stitch/chaos/history.h"
#include "stitch/chaos/schedule.h"
#include "stitch/chaos/trainer.h"
#include "stitch/store/store.h"

namespace stitch {

struct InjectorTargets {
  ChaosFleet* fleet = nullptr;
  ChaosTrainer* trainer = nullptr;
  RolloutLoad* load = nullptr;
  // The filesystem store's root (store_unreadable), and the mount point of
  // the tmpfs it lives on (store_full); empty when not used.
  std::filesystem::path store_root;
  std::filesystem::path store_mount;
  // The store's own view, for store_gc; null when not used.
  Store* store = nullptr;
};

class FaultInjector {
 public:
  // Times are on `now` (seconds); the schedule's are relative to `origin`.
  FaultInjector(std::vector<Fault> schedule, InjectorTargets targets, HistoryWriter& history,
                std::function<double()> now, double origin);
  // Cancel(), Join().
  ~FaultInjector();
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  void Start();
  // Ends every fault now (undoing it) and starts no more.
  void Cancel();
  // Returns once every fault has ended.
  void Join();

  // What the injector noticed beyond the faults themselves ("a store
  // appeared at the store's path while it was renamed away").
  std::vector<std::string> Findings();

 private:
  void Dispatch();
  void Run(const Fault& fault);
  // Waits until `at_s` on the run's clock or until cancelled; false if cancelled.
  bool WaitUntil(double at_s);
  std::string Apply(const Fault& fault, bool* skipped);
  std::string Undo(const Fault& fault);

  const std::vector<Fault> schedule_;
  const InjectorTargets targets_;
  HistoryWriter& history_;
  const std::function<double()> now_;
  const double origin_;

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> findings_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> running_ ABSL_GUARDED_BY(mu_);
  std::thread dispatcher_;
};

// Mounts a tmpfs of `megabytes` at `dir` (created). FailedPrecondition,
// saying why, where the process may not mount.
[[nodiscard]] absl::Status MountTmpfs(const std::filesystem::path& dir, int megabytes);
// Unmounts it (lazily if busy).
[[nodiscard]] absl::Status Unmount(const std::filesystem::path& dir);

}  // namespace stitch
