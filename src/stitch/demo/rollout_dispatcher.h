// The demo's rollouts in flight: requests sent through the gateway from a
// fixed set of threads, a failed attempt (a 409 after the gateway's
// admission wait, a 503, a dropped connection) sent again a bounded number
// of times.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/demo/report.h"
#include "stitch/demo/rollout.h"
#include "stitch/refengine/dialect.h"

namespace stitch {

struct RolloutOutcome {
  GeneratedRollout generated;
  DemoResponse response;
};

// One step's rollouts in flight.
struct PendingBatch {
  // Set before the batch is launched, then only read.
  std::vector<std::vector<int32_t>> prompts;
  int64_t min_version = 0;

  absl::Mutex mu;
  std::vector<std::optional<RolloutOutcome>> results ABSL_GUARDED_BY(mu);
  int remaining ABSL_GUARDED_BY(mu) = 0;
  std::optional<absl::Status> error ABSL_GUARDED_BY(mu);

  bool Done() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return remaining == 0 || error.has_value();
  }
};

class RolloutDispatcher {
 public:
  // Sends to `gateway` (a base URL) in `api`'s dialect; `now` stamps each
  // response; every attempt and wait gives up once `*stop` is set.
  RolloutDispatcher(std::string gateway, EngineApi api, std::function<double()> now,
                    const std::atomic<bool>* stop);
  // Sends what is still queued (a request gives up once `*stop` is set),
  // then joins the threads.
  ~RolloutDispatcher();

  // Queues every request; the batch's results come back in their order.
  std::shared_ptr<PendingBatch> Launch(std::vector<RolloutRequest> requests);

  // Waits for every rollout of `batch`. The first rollout that failed every
  // attempt fails the batch; Cancelled when `stop` is set (looked at every
  // 100 ms).
  absl::StatusOr<std::vector<RolloutOutcome>> Wait(PendingBatch& batch);

  // Attempts sent again so far.
  int64_t retries() const { return retries_.load(); }

 private:
  struct Job {
    std::shared_ptr<PendingBatch> batch;
    size_t index = 0;
    RolloutRequest request;
  };

  bool HasWorkOrClosing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closing_ || !jobs_.empty();
  }
  void Work();
  absl::StatusOr<RolloutOutcome> Run(const RolloutRequest& request);

  const std::string gateway_;
  const EngineApi api_;
  const std::function<double()> now_;
  const std::atomic<bool>* stop_;
  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> retries_{0};
  std::vector<std::thread> threads_;
};

}  // namespace stitch
