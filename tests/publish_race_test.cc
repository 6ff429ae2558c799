// Processes racing to publish against one predecessor: exactly one moves the
// pointer, and a watcher reading the pointer throughout always finds a
// complete version.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/core/errors.h"
#include "stitch/publish/claim.h"
#include "stitch/publish/publish.h"
#include "stitch/store/fs_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::stitch::testing::TestVersionOptions;
using ::stitch::testing::VerifyVersionDir;
using ::stitch::testing::WriteTestVersion;

constexpr int kProcesses = 8;

// Child exit codes.
constexpr int kWon = 0;
constexpr int kConflict = 10;
constexpr int kRewind = 11;
constexpr int kOtherError = 12;
constexpr int kAlreadyPublished = 13;

// Big enough that copying a version takes a moment (2 shards x 2 x 256 KiB).
const TestVersionOptions kShardOptions{.shards = 2, .tensors_per_shard = 2, .elements = 1 << 16};

int ExitCodeFor(const absl::StatusOr<PublishOutcome>& outcome) {
  if (outcome.ok()) return outcome->already_published ? kAlreadyPublished : kWon;
  return ExitCodeFor(outcome.status());
}

int ExitCodeFor(const absl::Status& s) {
  if (s.ok()) return kWon;
  std::fprintf(stderr, "publisher %d: %s\n", ::getpid(), std::string(s.message()).c_str());
  switch (GetErrorKind(s)) {
    case ErrorKind::kPointerConflict:
      return kConflict;
    case ErrorKind::kPointerRewind:
      return kRewind;
    default:
      return kOtherError;
  }
}

// Blocks until the write end of `pipe_read_fd`'s pipe is closed everywhere.
void WaitForRelease(int pipe_read_fd) {
  char c;
  while (::read(pipe_read_fd, &c, 1) > 0) {
  }
}

// Wraps a store so that the first ReadPointer reports "read" on `ready_fd`
// and then waits for the release: every publisher reads the same
// predecessor before any of them may move the pointer.
class ReadBarrierStore final : public Store {
 public:
  ReadBarrierStore(Store& inner, int ready_fd, int go_fd)
      : inner_(inner), ready_fd_(ready_fd), go_fd_(go_fd) {}
  std::string uri() const override { return inner_.uri(); }
  const std::string& run_id() const override { return inner_.run_id(); }
  absl::Status Refresh() override { return inner_.Refresh(); }
  absl::StatusOr<std::optional<VersionRef>> ReadPointer() override {
    auto p = inner_.ReadPointer();
    if (!released_) {
      released_ = true;
      char c = 'r';
      if (::write(ready_fd_, &c, 1) != 1) std::_Exit(kOtherError);
      WaitForRelease(go_fd_);
    }
    return p;
  }
  absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                              const VersionRef& proposed) override {
    return inner_.AdvancePointer(expected, proposed);
  }
  absl::Status PublishFiles(int64_t version, const fs::path& dir) override {
    return inner_.PublishFiles(version, dir);
  }
  absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override {
    return inner_.ReadManifest(version);
  }
  absl::StatusOr<fs::path> Materialize(int64_t version) override {
    return inner_.Materialize(version);
  }

 private:
  Store& inner_;
  int ready_fd_;
  int go_fd_;
  bool released_ = false;
};

// A publisher that skips PublishVersion's rule that only the pointer's
// version + 1 may follow it: reads the pointer, uploads `dir` as `version`
// and moves the pointer from what it read. The store's compare-and-swap
// must hold on its own against such writers.
absl::Status PublishAnyVersion(Store& store, int64_t version, const fs::path& dir) {
  auto pointer = store.ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (absl::Status s = store.PublishFiles(version, dir); !s.ok()) return s;
  return store.AdvancePointer(*pointer, VersionRef{store.run_id(), version});
}

// Reads the pointer over and over until stopped, checking that it always
// names a complete version of run-a.
class Watcher {
 public:
  explicit Watcher(fs::path root) : root_(std::move(root)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Watcher() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int reads() const { return reads_; }
  const std::vector<std::string>& problems() const { return problems_; }
  const std::set<int64_t>& seen() const { return seen_; }

 private:
  void Run() {
    auto store = FsStore::Open(root_, "");
    if (!store.ok()) {
      problems_.push_back(std::string(store.status().message()));
      return;
    }
    while (!stop_) {
      auto p = (*store)->ReadPointer();
      ++reads_;
      if (!p.ok() || !p->has_value() || (*p)->run_id != "run-a") {
        problems_.push_back(p.ok() ? "pointer unset or of another run"
                                   : std::string(p.status().message()));
        continue;
      }
      seen_.insert((*p)->version);
      auto dir = (*store)->Materialize((*p)->version);
      absl::Status s = dir.ok() ? VerifyVersionDir(*dir) : dir.status();
      if (!s.ok()) problems_.push_back(std::string(s.message()));
    }
  }

  const fs::path root_;
  std::atomic<bool> stop_{false};
  int reads_ = 0;
  std::vector<std::string> problems_;
  std::set<int64_t> seen_;
  std::thread thread_;
};

class PublishRaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = FsStore::Open(root_, "run-a");
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(ClaimRun(**store, 0, nullptr).ok());
    // The predecessor every racer publishes against: a complete version.
    auto v1 = WriteTestVersion(tmp_ / "v1", 1, kShardOptions);
    ASSERT_TRUE(v1.ok());
    ASSERT_TRUE(PublishVersion(**store, *v1, nullptr).ok());
  }

  // Waits for every child; returns their exit codes.
  static std::vector<int> WaitAll(const std::vector<pid_t>& pids) {
    std::vector<int> codes;
    for (pid_t pid : pids) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    return codes;
  }

  std::set<std::string> Updates() {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(root_ / "updates")) {
      out.insert(e.path().filename().string());
    }
    return out;
  }

  TempDir tmp_;
  fs::path root_ = tmp_ / "store";
};

TEST_F(PublishRaceTest, EightProcessesPublishingOneVersionMoveThePointerOnceAndAllSucceed) {
  std::vector<fs::path> sources;
  for (int i = 0; i < kProcesses; ++i) {
    // Identical bytes: every upload succeeds, the pointer's compare-and-swap
    // decides which publish moves it, and the others find it published.
    auto dir = WriteTestVersion(tmp_ / "src" / std::to_string(i), 2, kShardOptions);
    ASSERT_TRUE(dir.ok());
    sources.push_back(*dir);
  }
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      WaitForRelease(go[0]);
      auto store = FsStore::Open(root_, "run-a");
      if (!store.ok()) std::_Exit(kOtherError);
      std::_Exit(ExitCodeFor(PublishVersion(**store, sources[static_cast<size_t>(i)], nullptr)));
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  Watcher watcher(root_);
  ::close(go[1]);  // release every publisher at once
  std::vector<int> codes = WaitAll(pids);
  watcher.Stop();

  EXPECT_EQ(std::count(codes.begin(), codes.end(), kWon), 1) << ::testing::PrintToString(codes);
  EXPECT_EQ(std::count(codes.begin(), codes.end(), kAlreadyPublished), kProcesses - 1)
      << ::testing::PrintToString(codes);
  auto store = FsStore::Open(root_, "");
  EXPECT_EQ(*(*store)->ReadPointer(), (VersionRef{"run-a", 2}));
  EXPECT_TRUE(VerifyVersionDir(root_ / "updates" / "weight_v000002").ok());
  EXPECT_EQ(Updates(), (std::set<std::string>{"weight_v000001", "weight_v000002"}));
  EXPECT_GT(watcher.reads(), 0);
  EXPECT_THAT(watcher.problems(), ::testing::IsEmpty());
  EXPECT_THAT(watcher.seen(), ::testing::IsSubsetOf({1, 2}));
}

TEST_F(PublishRaceTest, EightProcessesPublishingDifferentVersionsFromOneReadHaveOneWinner) {
  std::vector<fs::path> sources;
  for (int i = 0; i < kProcesses; ++i) {
    auto dir = WriteTestVersion(tmp_ / "src" / std::to_string(i), 2 + i, kShardOptions);
    ASSERT_TRUE(dir.ok());
    sources.push_back(*dir);
  }
  int ready[2];
  int go[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(go[1]);
      ::close(ready[0]);
      auto store = FsStore::Open(root_, "run-a");
      if (!store.ok()) std::_Exit(kOtherError);
      ReadBarrierStore barrier(**store, ready[1], go[0]);
      std::_Exit(ExitCodeFor(PublishAnyVersion(barrier, 2 + i, sources[static_cast<size_t>(i)])));
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  ::close(ready[1]);
  // Every publisher has read the pointer (version 1) before any may move it.
  int reported = 0;
  char c;
  while (reported < kProcesses && ::read(ready[0], &c, 1) == 1) ++reported;
  ::close(ready[0]);
  ASSERT_EQ(reported, kProcesses);
  Watcher watcher(root_);
  ::close(go[1]);
  std::vector<int> codes = WaitAll(pids);
  watcher.Stop();

  ASSERT_EQ(std::count(codes.begin(), codes.end(), kWon), 1) << ::testing::PrintToString(codes);
  // Without the lock a later version would still look like a forward move;
  // every loser must have lost the compare-and-swap itself.
  EXPECT_EQ(std::count(codes.begin(), codes.end(), kConflict), kProcesses - 1);
  int winner = static_cast<int>(std::find(codes.begin(), codes.end(), kWon) - codes.begin());
  auto store = FsStore::Open(root_, "");
  EXPECT_EQ(*(*store)->ReadPointer(), (VersionRef{"run-a", 2 + winner}));
  EXPECT_GT(watcher.reads(), 0);
  EXPECT_THAT(watcher.problems(), ::testing::IsEmpty());
  EXPECT_THAT(watcher.seen(), ::testing::IsSubsetOf({1, 2 + winner}));
}

}  // namespace
}  // namespace stitch
