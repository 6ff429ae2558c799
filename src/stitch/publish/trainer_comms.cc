#include "stitch/publish/trainer_comms.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace stitch {

class ThreadCommsGroup::Member final : public TrainerComms {
 public:
  Member(ThreadCommsGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size_; }
  bool IsHostLeader() const override { return rank_ % group_->ranks_per_host_ == 0; }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view value) override {
    return group_->Gather(rank_, value);
  }

 private:
  ThreadCommsGroup* const group_;
  const int rank_;
};

ThreadCommsGroup::ThreadCommsGroup(int world_size, int ranks_per_host, absl::Duration timeout)
    : world_size_(world_size), ranks_per_host_(ranks_per_host), timeout_(timeout) {
  // A group of no ranks cannot exist; this is a programming error.
  if (world_size < 1 || ranks_per_host < 1) std::abort();
  for (int r = 0; r < world_size; ++r) members_.push_back(std::make_unique<Member>(this, r));
  absl::MutexLock lock(&mu_);
  slots_.resize(static_cast<size_t>(world_size));
}

ThreadCommsGroup::~ThreadCommsGroup() = default;

TrainerComms& ThreadCommsGroup::comms(int rank) {
  if (rank < 0 || rank >= world_size_) std::abort();
  return *members_[static_cast<size_t>(rank)];
}

absl::StatusOr<std::vector<std::string>> ThreadCommsGroup::Gather(int rank,
                                                                  std::string_view value) {
  absl::MutexLock lock(&mu_);
  if (broken_) {
    return absl::UnavailableError(
        absl::StrCat("rank ", rank, ": the process group is broken by an earlier failure"));
  }
  std::optional<std::string>& slot = slots_[static_cast<size_t>(rank)];
  if (slot.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, ": all-gather called again before the last one completed"));
  }
  slot = std::string(value);
  const int64_t generation = generation_;
  if (++arrived_ == world_size_) {
    result_.clear();
    for (std::optional<std::string>& s : slots_) {
      result_.push_back(std::move(*s));
      s.reset();
    }
    arrived_ = 0;
    ++generation_;
    return result_;
  }
  auto done = [&]()
                  ABSL_SHARED_LOCKS_REQUIRED(mu_) { return generation_ != generation || broken_; };
  const absl::Time deadline = absl::Now() + timeout_;
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline) || broken_) {
    if (!broken_) {
      broken_ = true;
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank, ": all-gather timed out after ", absl::FormatDuration(timeout_),
          " waiting for ", world_size_ - arrived_, " other rank(s)"));
    }
    return absl::UnavailableError(
        absl::StrCat("rank ", rank, ": the process group broke during an all-gather"));
  }
  // The next generation cannot complete without this rank, so result_ still
  // holds this generation's values.
  return result_;
}

}  // namespace stitch
