// The chaos run's trainer and its watch on the store's pointer.
//
// ChaosTrainer publishes version after version of the oracle's weights
// (oracle.h): it writes each version directory (a FULL anchor every
// `anchor_every` versions, an XOR+zstd DELTA against the version before
// otherwise) and publishes it with a separate `stitch publish` process, so
// that a publisher_kill fault is a real kill -9 at any point of a publish. A
// publish that failed or was killed is retried with the same bytes; the
// pointer, read afterwards, says whether the version made it.
//
// PointerWatcher reads the pointer every few hundred milliseconds and, for
// every value it sees, checks that the version's bytes in the store are
// complete and are exactly the oracle's weights of that version
// (VerifyVersionBytes), recording each value in the history.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include "absl/synchronization/mutex.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "stitch/chaos/history.h"
#include "stitch/chaos/oracle.h"
#include "stitch/demo/supervisor.h"
#include "stitch/store/store.h"

namespace stitch {

// OK when `version` of `store` materializes (its chain back to an anchor, or
// to the boot checkpoint `base_checkpoint` as version 0), every delta's
// checksums hold, and the result's WeightsFingerprint is the oracle's
// fingerprint of that version. Otherwise the error says what is wrong.
[[nodiscard]] absl::Status VerifyVersionBytes(Store& store, Oracle& oracle,
                                              const std::filesystem::path& base_checkpoint,
                                              int64_t version);

struct ChaosTrainerOptions {
  std::filesystem::path work_dir;  // version directories, before they are published
  std::filesystem::path logs_dir;  // one log per publish process
  std::string store_uri;
  std::string run_id;
  std::string pool_spec;                  // woken by each publish
  std::vector<std::string> publish_args;  // extra arguments of `stitch publish`
  int64_t anchor_every = 5;
  double interval_s = 2;  // between two publishes
  // A publish process running longer than this is killed and retried.
  std::chrono::milliseconds publish_timeout = std::chrono::seconds(120);
};

class ChaosTrainer {
 public:
  // `store` is the harness's own view of the run's store (to read the
  // pointer); everything passed must outlive the trainer. `now` gives the
  // run's clock in seconds.
  ChaosTrainer(ProcessSupervisor& supervisor, Oracle& oracle, Store& store, HistoryWriter& history,
               ChaosTrainerOptions options, std::function<double()> now);
  ~ChaosTrainer();
  ChaosTrainer(const ChaosTrainer&) = delete;
  ChaosTrainer& operator=(const ChaosTrainer&) = delete;

  void Start();
  // Publishes nothing more; returns once the publish in progress ended.
  void Stop();

  // The highest version known to be published.
  int64_t published() const;

  // publisher_kill: the next publish process (started at once) is killed
  // with SIGKILL `fraction` of the way through a typical publish.
  void ArmKill(double fraction);
  // What became of the last armed kill: "killed the publish of v7 after
  // 12 ms (it was published)", or nullopt while none happened yet.
  std::optional<std::string> KillReport();
  // Drops an armed kill that found no publish.
  void Disarm();

 private:
  void Loop();
  absl::Status PrepareVersion(int64_t version, bool* full);
  // Reads the pointer; nullopt when it cannot be read.
  std::optional<int64_t> Pointer();

  ProcessSupervisor& supervisor_;
  Oracle& oracle_;
  Store& store_;
  HistoryWriter& history_;
  const ChaosTrainerOptions options_;
  const std::function<double()> now_;

  // Whether Loop() should stop waiting: stopping, or a publish asked for.
  bool StopOrPublish() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || publish_now_;
  }

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool kill_armed_ ABSL_GUARDED_BY(mu_) = false;
  // An armed kill starts one publish at once; if that one ends before its
  // kill, the kill waits for the next regular publish.
  bool publish_now_ ABSL_GUARDED_BY(mu_) = false;
  double kill_fraction_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<std::string> kill_report_ ABSL_GUARDED_BY(mu_);
  int64_t published_ ABSL_GUARDED_BY(mu_) = 0;
  double typical_publish_s_ ABSL_GUARDED_BY(mu_) = 0.05;
  std::thread thread_;
};

class PointerWatcher {
 public:
  PointerWatcher(Store& store, Oracle& oracle, std::filesystem::path base_checkpoint,
                 HistoryWriter& history, std::function<double()> now,
                 std::chrono::milliseconds every = std::chrono::milliseconds(200));
  ~PointerWatcher();
  PointerWatcher(const PointerWatcher&) = delete;
  PointerWatcher& operator=(const PointerWatcher&) = delete;

  void Start();
  void Stop();
  // The latest pointer value read (0 before any).
  int64_t latest() const { return latest_.load(); }

 private:
  void Loop();

  Store& store_;
  Oracle& oracle_;
  const std::filesystem::path base_checkpoint_;
  HistoryWriter& history_;
  const std::function<double()> now_;
  const std::chrono::milliseconds every_;
  std::atomic<int64_t> latest_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace stitch
