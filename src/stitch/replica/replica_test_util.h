// Test fakes for src/stitch/replica: a scripted in-process engine, a store
// wrapper that injects failures, version directories for an in-memory store,
// and coroutine helpers for tests that run on an event loop.
#pragma once

#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stitch/engine/engine.h"
#include "stitch/format/index.h"
#include "stitch/replica/admission_gate.h"
#include "stitch/store/store.h"
#include "tests/support/version_dirs.h"

namespace stitch::testing {

using boost::asio::awaitable;

// Yields to the loop until `condition` holds; false after `limit` (real
// time), so that a broken test fails instead of hanging.
inline awaitable<bool> Until(std::function<bool()> condition,
                             std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  auto executor = co_await boost::asio::this_coro::executor;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int spins = 0;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) co_return false;
    if (++spins < 200) {
      co_await boost::asio::post(executor, boost::asio::use_awaitable);
    } else {
      // Other threads (the worker pool) need the CPU more than this loop.
      boost::asio::steady_timer pause(executor, std::chrono::microseconds(200));
      co_await pause.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    }
  }
  co_return true;
}

// Lets the loop run everything that is ready (a few rounds of posts).
inline awaitable<void> Settle(int rounds = 50) {
  auto executor = co_await boost::asio::this_coro::executor;
  for (int i = 0; i < rounds; ++i) co_await boost::asio::post(executor, boost::asio::use_awaitable);
}

// A one-shot latch for coroutines on one loop: Wait() returns once Open()
// was called. Loop thread only.
class LoopLatch {
 public:
  explicit LoopLatch(const boost::asio::any_io_executor& executor) : timer_(executor) {
    timer_.expires_at(boost::asio::steady_timer::time_point::max());
  }
  void Open() {
    open_ = true;
    timer_.cancel();
  }
  // Closes it again for later waiters; those already released stay so.
  void Reset() {
    open_ = false;
    ++generation_;
  }
  bool is_open() const { return open_; }
  awaitable<void> Wait() {
    const uint64_t generation = generation_;
    while (!open_ && generation == generation_) {
      co_await timer_.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));
    }
  }

 private:
  boost::asio::steady_timer timer_;
  bool open_ = false;
  uint64_t generation_ = 0;
};

// An engine whose every answer the test scripts. Records calls as
// "init:<identity>", "stage:<version>", "pause", "commit:<version>",
// "resume", "flush", "reset:<identity>" (reports are only counted). A method can be held (it
// waits until released, like a slow engine), then runs its synchronous
// callback, then returns the next scripted status of its queue (OK when the
// queue is empty). Everything it awaits lives in the engine, so suspended
// calls never outlive what they reference. Loop thread only.
//
// Like a real engine it knows what it holds (`holds`): the boot version the
// first InitializeDestination names unless the test set it, then every
// successful commit's target and reset's boot. Report() says so (label
// `holds`'s identity, instance `instance`, fingerprint `fingerprint`) unless
// a scripted report is queued.
class ScriptedEngine final : public Engine {
 public:
  enum Op { kInit, kStage, kCommit, kResume, kReset, kOps };

  explicit ScriptedEngine(const boost::asio::any_io_executor& loop) {
    for (int i = 0; i < kOps; ++i) holds_[i] = std::make_unique<Hold>(loop);
  }

  std::string_view name() const override { return "scripted"; }
  bool PlacesCommitsExactly() const override { return places_commits_exactly; }

  awaitable<absl::Status> InitializeDestination(const VersionRef& boot) override {
    calls.push_back(absl::StrCat("init:", boot.ToString()));
    if (!holds_set_) {
      holds = boot;
      holds_set_ = true;
    }
    co_await holds_[kInit]->Pass();
    co_return Next(init_results);
  }
  awaitable<absl::Status> Stage(const StagePlan& plan) override {
    calls.push_back(absl::StrCat("stage:", plan.target.version));
    staged.push_back(plan.target.version);
    plans.push_back(plan);
    if (hold_stage_version_ < 0 || hold_stage_version_ == plan.target.version) {
      co_await holds_[kStage]->Pass();
    }
    if (on_stage) on_stage(plan);
    co_return Next(stage_results);
  }
  awaitable<absl::Status> Commit(const VersionRef& target, CommitOptions options) override {
    calls.push_back(absl::StrCat("commit:", target.version));
    flushed_on_commit.push_back(options.flush_cache);
    co_await holds_[kCommit]->Pass();
    absl::Status s = Next(commit_results);
    if (s.ok() || loads_despite_error) {
      committed.push_back(target.version);
      holds = target;
    }
    co_return s;
  }
  awaitable<absl::Status> Pause() override {
    calls.push_back("pause");
    co_return Next(pause_results);
  }
  awaitable<absl::Status> Resume() override {
    calls.push_back("resume");
    co_await holds_[kResume]->Pass();
    if (on_resume) on_resume();
    co_return Next(resume_results);
  }
  awaitable<absl::Status> FlushCache() override {
    calls.push_back("flush");
    co_return absl::OkStatus();
  }
  awaitable<absl::Status> ResetToBoot(const VersionRef& boot) override {
    calls.push_back(absl::StrCat("reset:", boot.ToString()));
    co_await holds_[kReset]->Pass();
    absl::Status s = Next(reset_results);
    if (s.ok()) holds = boot;
    co_return s;
  }
  awaitable<absl::Status> Health(std::chrono::milliseconds) override {
    ++health_calls;
    co_return Next(health_results);
  }
  awaitable<absl::StatusOr<EngineReport>> Report(std::chrono::milliseconds) override {
    ++report_calls;
    if (!report_results.empty()) {
      absl::StatusOr<EngineReport> r = std::move(report_results.front());
      report_results.pop_front();
      co_return r;
    }
    EngineReport r;
    if (holds.has_value()) {
      r.label = holds->ToString();
      r.held = holds;
    }
    r.instance = instance;
    r.fingerprint = fingerprint;
    if (holds.has_value()) {
      if (auto it = fingerprint_of.find(holds->version); it != fingerprint_of.end()) {
        r.fingerprint = it->second;
      }
    }
    co_return r;
  }
  awaitable<void> Abort(std::vector<std::string> rids) override {
    for (std::string& rid : rids) aborted.push_back(std::move(rid));
    co_return;
  }

  // Calls of `op` wait from now on until Release(op). For kStage, only the
  // staging of `version` when given.
  void HoldNext(Op op, int64_t version = -1) {
    holds_[op]->armed = true;
    if (op == kStage) hold_stage_version_ = version;
  }
  void Release(Op op) {
    holds_[op]->armed = false;
    holds_[op]->latch.Open();
    holds_[op]->latch.Reset();
  }
  // Whether a call of `op` is waiting now.
  bool held(Op op) const { return holds_[op]->waiting > 0; }
  // Drops the callbacks (they may reference the test's locals).
  void ClearCallbacks() {
    on_stage = nullptr;
    on_resume = nullptr;
  }

  size_t Count(std::string_view call) const {
    size_t n = 0;
    for (const std::string& c : calls) n += (c == call) ? 1 : 0;
    return n;
  }
  // Index of the first call equal to `call`, or -1.
  int IndexOf(std::string_view call) const {
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i] == call) return static_cast<int>(i);
    }
    return -1;
  }

  std::vector<std::string> calls;
  std::vector<int64_t> staged;
  std::vector<int64_t> committed;
  std::vector<StagePlan> plans;
  std::vector<bool> flushed_on_commit;
  std::vector<std::string> aborted;
  int health_calls = 0;
  int report_calls = 0;
  // What the engine holds and says about itself (see above).
  std::optional<VersionRef> holds;
  std::string instance = "scripted-1";
  std::optional<Checksum128> fingerprint;
  // The fingerprint reported while holding a version, when listed here
  // (else `fingerprint`).
  std::map<int64_t, Checksum128> fingerprint_of;
  // Set `holds` before the reconciler starts (InitializeDestination keeps it).
  void Holds(std::optional<VersionRef> v) {
    holds = std::move(v);
    holds_set_ = true;
  }
  std::deque<absl::StatusOr<EngineReport>> report_results;

  // A failed commit loads the target all the same (SGLang answers 400 when
  // the weights changed but its cache could not be flushed).
  bool loads_despite_error = false;
  // What PlacesCommitsExactly answers.
  bool places_commits_exactly = true;
  std::deque<absl::Status> init_results, stage_results, commit_results, pause_results,
      resume_results, reset_results, health_results;
  // Synchronous callbacks, run inside the call after its hold.
  std::function<void(const StagePlan&)> on_stage;
  std::function<void()> on_resume;

 private:
  struct Hold {
    explicit Hold(const boost::asio::any_io_executor& loop) : latch(loop) {}
    awaitable<void> Pass() {
      if (!armed) co_return;
      ++waiting;
      co_await latch.Wait();
      --waiting;
    }
    bool armed = false;
    int waiting = 0;
    LoopLatch latch;
  };
  static absl::Status Next(std::deque<absl::Status>& queue) {
    if (queue.empty()) return absl::OkStatus();
    absl::Status s = std::move(queue.front());
    queue.pop_front();
    return s;
  }
  std::unique_ptr<Hold> holds_[kOps];
  int64_t hold_stage_version_ = -1;
  bool holds_set_ = false;
};

// A Store that forwards to another, with a host's view of the pointer (as
// a shared filesystem or a bucket seen through a cache): Refresh() takes a
// snapshot of the pointer and ReadPointer() returns that snapshot. It can
// fail on purpose and hold a refresh open. Thread-safe (the reconciler
// calls it from worker threads).
class FlakyStore final : public Store {
 public:
  explicit FlakyStore(Store& inner) : inner_(inner) {}

  std::string uri() const override { return inner_.uri(); }
  const std::string& run_id() const override { return inner_.run_id(); }

  absl::Status Refresh() override {
    absl::MutexLock lock(&mu_);
    ++refreshes_;
    if (fail_refresh_at_ == refreshes_ || fail_refreshes_ > 0) {
      if (fail_refreshes_ > 0) --fail_refreshes_;
      return absl::UnavailableError("store flake: refresh failed");
    }
    if (absl::Status s = inner_.Refresh(); !s.ok()) return s;
    view_ = inner_.ReadPointer();
    if (hold_next_) {
      hold_next_ = false;
      held_ = true;
      mu_.Await(absl::Condition(
          +[](bool* held) { return !*held; }, &held_));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<VersionRef>> ReadPointer() override {
    absl::MutexLock lock(&mu_);
    return view_;
  }
  absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                              const VersionRef& proposed) override {
    return inner_.AdvancePointer(expected, proposed);
  }
  absl::Status PublishFiles(int64_t version, const std::filesystem::path& dir) override {
    return inner_.PublishFiles(version, dir);
  }
  absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override {
    {
      absl::MutexLock lock(&mu_);
      if (fail_manifests_ > 0) {
        --fail_manifests_;
        return absl::UnavailableError("store flake: reading a manifest failed");
      }
      ++manifest_reads_[version];
      if (broken_.contains(version)) {
        return absl::InvalidArgumentError(absl::StrCat("version ", version, ": malformed index"));
      }
    }
    return inner_.ReadManifest(version);
  }
  absl::StatusOr<std::filesystem::path> Materialize(int64_t version) override {
    return inner_.Materialize(version);
  }

  // The next `n` refreshes fail.
  void FailRefreshes(int n) {
    absl::MutexLock lock(&mu_);
    fail_refreshes_ = n;
  }
  // The refresh number `n` (counting from 1 since the store was made) fails.
  void FailRefreshNumber(int n) {
    absl::MutexLock lock(&mu_);
    fail_refresh_at_ = n;
  }
  // The next `n` manifest reads fail.
  void FailManifests(int n) {
    absl::MutexLock lock(&mu_);
    fail_manifests_ = n;
  }
  // The next refresh takes its snapshot, then blocks until ReleaseRefresh().
  void HoldNextRefresh() {
    absl::MutexLock lock(&mu_);
    hold_next_ = true;
  }
  bool refresh_held() const {
    absl::MutexLock lock(&mu_);
    return held_;
  }
  void ReleaseRefresh() {
    absl::MutexLock lock(&mu_);
    held_ = false;
  }
  int refreshes() const {
    absl::MutexLock lock(&mu_);
    return refreshes_;
  }
  // Reading `version`'s manifest fails as a malformed one does, for good.
  void BreakVersion(int64_t version) {
    absl::MutexLock lock(&mu_);
    broken_.insert(version);
  }
  int manifest_reads(int64_t version) const {
    absl::MutexLock lock(&mu_);
    auto it = manifest_reads_.find(version);
    return it == manifest_reads_.end() ? 0 : it->second;
  }

 private:
  Store& inner_;
  mutable absl::Mutex mu_;
  absl::StatusOr<std::optional<VersionRef>> view_ ABSL_GUARDED_BY(mu_) = std::nullopt;
  int refreshes_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_refreshes_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_refresh_at_ ABSL_GUARDED_BY(mu_) = -1;
  int fail_manifests_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int64_t> broken_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int> manifest_reads_ ABSL_GUARDED_BY(mu_);
  bool hold_next_ ABSL_GUARDED_BY(mu_) = false;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
};

// Writes a DELTA version directory for `version` (base version - 1) under
// `parent` with `files` payload files (dummy bytes: the scripted engine
// never reads them) and returns it. No files: an empty delta.
inline std::filesystem::path WriteDeltaDir(const std::filesystem::path& parent, int64_t version,
                                           int files) {
  std::filesystem::path dir = parent / absl::StrCat("delta-", VersionDirName(version));
  std::filesystem::create_directories(dir);
  CheckpointIndex index;
  index.metadata["version"] = VersionMetadataString(version);
  index.metadata["base_version"] = VersionMetadataString(version - 1);
  index.metadata["delta_encoding"] = "xor";
  index.metadata["compression_format"] = "zstd";
  index.metadata["checksum_format"] = "xxh3-128";
  for (int i = 0; i < files; ++i) {
    std::string name = absl::StrCat("delta-", i, ".safetensors");
    index.weight_map[absl::StrCat("t", i)] = name;
    std::FILE* f = std::fopen((dir / name).c_str(), "wb");
    std::fputs("not decoded by the scripted engine", f);
    std::fclose(f);
  }
  EXPECT_TRUE(WriteIndex(dir, index).ok());
  return dir;
}

// Publishes a FULL version into `store`.
inline void PublishFull(Store& store, const std::filesystem::path& scratch, int64_t version) {
  auto dir = WriteTestVersion(scratch / absl::StrCat("full-", version), version);
  ASSERT_TRUE(dir.ok()) << dir.status();
  absl::Status s = store.PublishFiles(version, *dir);
  ASSERT_TRUE(s.ok()) << s;
}

// Publishes a DELTA version with `files` payload files into `store`.
inline void PublishDelta(Store& store, const std::filesystem::path& scratch, int64_t version,
                         int files) {
  absl::Status s = store.PublishFiles(version, WriteDeltaDir(scratch, version, files));
  ASSERT_TRUE(s.ok()) << s;
}

// A request that holds admission until `release` opens.
struct RollingRequest {
  bool admitted = false;
  bool done = false;
  absl::Status status;
  std::optional<VersionRef> start;
  std::optional<VersionStamp> stamp;  // at release
};

inline awaitable<void> Roll(AdmissionGate& gate, VersionConstraint constraint, LoopLatch* release,
                            RollingRequest* out) {
  auto ticket = co_await gate.Admit(constraint);
  if (!ticket.ok()) {
    out->status = ticket.status();
    out->done = true;
    co_return;
  }
  out->admitted = true;
  out->start = ticket->start();
  if (release != nullptr) co_await release->Wait();
  out->stamp = ticket->Stamp();
  out->done = true;
}

inline void SpawnRoll(const boost::asio::any_io_executor& loop, AdmissionGate& gate,
                      VersionConstraint constraint, LoopLatch* release, RollingRequest* out) {
  boost::asio::co_spawn(loop, Roll(gate, constraint, release, out), boost::asio::detached);
}

}  // namespace stitch::testing
