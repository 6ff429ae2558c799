// TrainerComms: what the multi-host publisher needs from a distributed
// trainer's process group. A trainer implements it over its own collectives
// (torch.distributed, MPI); SingleProcessComms serves a one-process trainer
// and ThreadCommsGroup simulates several hosts inside one process (tests).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stitch {

class TrainerComms {
 public:
  virtual ~TrainerComms() = default;

  // This process's rank in [0, world_size()).
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // True for exactly one rank on each host: the one that uploads the files
  // that host wrote.
  virtual bool IsHostLeader() const = 0;

  // A collective: every rank calls it with a small value (a few KiB) and
  // gets every rank's value, indexed by rank. Blocks until all ranks called
  // it. Errors (a rank that never arrives, a broken group) are returned,
  // never thrown.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> AllGather(
      std::string_view value) = 0;
};

// One process that is the whole trainer: rank 0 of 1, its host's leader.
class SingleProcessComms final : public TrainerComms {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  bool IsHostLeader() const override { return true; }
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> AllGather(
      std::string_view value) override {
    return std::vector<std::string>{std::string(value)};
  }
};

// `world_size` ranks as threads of one process, `ranks_per_host` to a
// simulated host (rank r is its host's leader when r % ranks_per_host == 0).
// Each thread uses its own member, comms(r).
//
// An AllGather that does not complete within `timeout` (a rank never came)
// fails with DeadlineExceeded and breaks the group: every later AllGather
// fails at once, as a crashed process group would.
//
// Thread-safety: each member is used by one thread; members may be used
// concurrently.
class ThreadCommsGroup {
 public:
  // REQUIRES: world_size >= 1, ranks_per_host >= 1.
  ThreadCommsGroup(int world_size, int ranks_per_host, absl::Duration timeout = absl::Seconds(120));
  ~ThreadCommsGroup();
  ThreadCommsGroup(const ThreadCommsGroup&) = delete;
  ThreadCommsGroup& operator=(const ThreadCommsGroup&) = delete;

  // REQUIRES: 0 <= rank < world_size.
  TrainerComms& comms(int rank);

 private:
  class Member;
  absl::StatusOr<std::vector<std::string>> Gather(int rank, std::string_view value);

  const int world_size_;
  const int ranks_per_host_;
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<Member>> members_;

  absl::Mutex mu_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::optional<std::string>> slots_ ABSL_GUARDED_BY(mu_);
  // The values of the last completed generation.
  std::vector<std::string> result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stitch
