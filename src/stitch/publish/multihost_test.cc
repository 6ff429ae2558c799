// The multi-host publisher over stores every host mounts (a shared
// filesystem store, the in-memory store). The S3 variant runs against a
// real S3 protocol server in tests/s3_multihost_test.cc.
#include "stitch/publish/multihost.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/publish/claim.h"
#include "stitch/publish/publish.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using testing::TestShardName;
using testing::TestVersionOptions;

// Runs PublishFromHosts on `world` threads (ranks_per_host to a host), each
// rank with its own store from `open` and its own file list.
std::vector<absl::StatusOr<PublishOutcome>> RunRanks(
    int world, int ranks_per_host, const std::function<std::unique_ptr<Store>()>& open,
    const fs::path& dir, const std::vector<std::vector<std::string>>& files) {
  ThreadCommsGroup group(world, ranks_per_host);
  std::vector<std::unique_ptr<Store>> stores;
  for (int r = 0; r < world; ++r) stores.push_back(open());
  std::vector<absl::StatusOr<PublishOutcome>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      MultiHostPublishOptions options;
      options.files = files[static_cast<size_t>(r)];
      results[r] = PublishFromHosts(*stores[r], group.comms(r), dir, options);
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = FsStore::Open(root_, "run-a");
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(ClaimRun(**store, 0, nullptr).ok());
  }
  std::unique_ptr<Store> OpenFs() {
    auto store = FsStore::Open(root_, "run-a");
    EXPECT_TRUE(store.ok());
    return store.ok() ? std::unique_ptr<Store>(*std::move(store)) : nullptr;
  }
  VersionRef Pointer() {
    auto store = OpenFs();
    auto p = store->ReadPointer();
    EXPECT_TRUE(p.ok() && p->has_value());
    return p.ok() && p->has_value() ? **p : VersionRef{};
  }
  testing::TempDir tmp_;
  fs::path root_ = tmp_ / "store";
};

TEST_F(MultiHostTest, HostsOfAMountedStoreCommitAndRankZeroPublishes) {
  // Four ranks on two hosts write one shared directory (the mount), each
  // host leader naming the shard its host wrote.
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  auto results = RunRanks(4, 2, [&] { return OpenFs(); }, *dir,
                          {{TestShardName(two, 0)}, {}, {TestShardName(two, 1)}, {}});
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->version, (VersionRef{"run-a", 1}));
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 1}));
  EXPECT_TRUE(testing::VerifyVersionDir(root_ / "updates" / "weight_v000001").ok());
}

TEST_F(MultiHostTest, RepublishingThePublishedVersionFromEveryHostIsANoOpThatSaysSo) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  const std::vector<std::vector<std::string>> files = {{TestShardName(two, 0)},
                                                       {TestShardName(two, 1)}};
  for (const auto& r : RunRanks(
           2, 1, [&] { return OpenFs(); }, *dir, files)) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_FALSE(r->already_published);
  }
  // Every rank retries (the job restarted after the pointer moved).
  for (const auto& r : RunRanks(
           2, 1, [&] { return OpenFs(); }, *dir, files)) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->already_published);
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 1}));
}

TEST_F(MultiHostTest, RepublishingThePublishedVersionWithOtherBytesIsRefusedOnEveryRank) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  const std::vector<std::vector<std::string>> files = {{TestShardName(two, 0)},
                                                       {TestShardName(two, 1)}};
  for (const auto& r : RunRanks(
           2, 1, [&] { return OpenFs(); }, *dir, files)) {
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  TestVersionOptions other = two;
  other.seed = 7;
  auto changed = testing::WriteTestVersion(tmp_ / "changed", 1, other);
  ASSERT_TRUE(changed.ok());
  for (const auto& r : RunRanks(
           2, 1, [&] { return OpenFs(); }, *changed, files)) {
    EXPECT_TRUE(absl::IsAlreadyExists(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "publish new weights as weight_v000002"))
        << r.status().message();
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 1}));
}

TEST_F(MultiHostTest, TheSharedDirectorysConfigFilesArePublishedWithTheVersion) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(WriteFileAtomically(*dir / "config.json", R"({"model_type": "llama"})").ok());
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir,
                          {{TestShardName(two, 0)}, {TestShardName(two, 1)}});
  for (const auto& r : results) ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*ReadFileToString(root_ / "updates" / "weight_v000001" / "config.json"),
            R"({"model_type": "llama"})");
}

TEST_F(MultiHostTest, TheStoresOwnVersionDirectoryCanBeTheSharedDirectory) {
  TestVersionOptions two{.shards = 2};
  fs::path dir = root_ / "updates" / "weight_v000001";
  ASSERT_TRUE(testing::WriteTestVersionAt(dir, 1, two).ok());
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, dir,
                          {{TestShardName(two, 0)}, {TestShardName(two, 1)}});
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 1}));
}

// A filesystem store whose first PublishFiles is followed by `after` (another
// publisher finishing in the meantime).
class RacedFsStore final : public Store {
 public:
  RacedFsStore(std::unique_ptr<Store> inner, std::function<void()> after)
      : inner_(std::move(inner)), after_(std::move(after)) {}
  std::string uri() const override { return inner_->uri(); }
  const std::string& run_id() const override { return inner_->run_id(); }
  absl::Status Refresh() override { return inner_->Refresh(); }
  absl::StatusOr<std::optional<VersionRef>> ReadPointer() override { return inner_->ReadPointer(); }
  absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                              const VersionRef& proposed) override {
    return inner_->AdvancePointer(expected, proposed);
  }
  absl::Status PublishFiles(int64_t version, const fs::path& dir) override {
    absl::Status s = inner_->PublishFiles(version, dir);
    if (after_) std::exchange(after_, nullptr)();
    return s;
  }
  absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override {
    return inner_->ReadManifest(version);
  }
  absl::StatusOr<fs::path> Materialize(int64_t version) override {
    return inner_->Materialize(version);
  }

 private:
  std::unique_ptr<Store> inner_;
  std::function<void()> after_;
};

TEST_F(MultiHostTest, ARetryRacingItsFirstAttemptSucceedsOnEveryRankAsAlreadyPublished) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  auto copy = testing::WriteTestVersion(tmp_ / "first-attempt", 1, two);
  ASSERT_TRUE(copy.ok());
  std::atomic<bool> raced{false};
  auto results = RunRanks(2, 1,
                          [&]() -> std::unique_ptr<Store> {
                            return std::make_unique<RacedFsStore>(OpenFs(), [&] {
                              // The first attempt, still running, publishes the same bytes
                              // while rank 0 commits.
                              auto first = PublishVersion(*OpenFs(), *copy, nullptr);
                              EXPECT_TRUE(first.ok()) << first.status();
                              raced = true;
                            });
                          },
                          *dir, {{TestShardName(two, 0)}, {TestShardName(two, 1)}});
  EXPECT_TRUE(raced);
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->already_published);
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 1}));
}

TEST_F(MultiHostTest, AShardNoHostCommittedIsRefusedAndThePointerStays) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  // Host 1 never wrote its shard: looking for its files, it finds only
  // host 0's.
  fs::remove(*dir / TestShardName(two, 1));
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir, {{TestShardName(two, 0)}, {}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), TestShardName(two, 1)))
        << r.status().message();
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 0}));
  EXPECT_FALSE(fs::exists(root_ / "updates" / "weight_v000001"));
}

TEST_F(MultiHostTest, AFileTheIndexDoesNotNameIsRefused) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  fs::copy_file(*dir / TestShardName(two, 1), *dir / "copy.safetensors");
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir,
                          {{TestShardName(two, 0), TestShardName(two, 1)}, {"copy.safetensors"}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "copy.safetensors"));
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 0}));
}

// Rank 0's comms that rewrites a file right after the upload all-gather:
// another writer changing a host's shard after it was committed.
class TamperingComms final : public TrainerComms {
 public:
  TamperingComms(TrainerComms& inner, fs::path victim)
      : inner_(inner), victim_(std::move(victim)) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  bool IsHostLeader() const override { return inner_.IsHostLeader(); }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view value) override {
    auto out = inner_.AllGather(value);
    if (++calls_ == 2) {
      EXPECT_TRUE(WriteFileAtomically(victim_, "changed").ok());
    }
    return out;
  }

 private:
  TrainerComms& inner_;
  fs::path victim_;
  int calls_ = 0;
};

TEST_F(MultiHostTest, AFileChangedAfterItsHostCommittedIsRefused) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  ThreadCommsGroup group(2, 1);
  TamperingComms rank0(group.comms(0), *dir / TestShardName(two, 1));
  auto s0 = OpenFs();
  auto s1 = OpenFs();
  absl::StatusOr<PublishOutcome> r0 = absl::UnknownError("not run");
  absl::StatusOr<PublishOutcome> r1 = absl::UnknownError("not run");
  std::thread t0(
      [&] { r0 = PublishFromHosts(*s0, rank0, *dir, {.files = {TestShardName(two, 0)}}); });
  std::thread t1([&] {
    r1 = PublishFromHosts(*s1, group.comms(1), *dir, {.files = {TestShardName(two, 1)}});
  });
  t0.join();
  t1.join();
  for (const auto* r : {&r0, &r1}) {
    EXPECT_TRUE(absl::IsDataLoss(r->status())) << r->status().message();
    EXPECT_EQ(GetErrorKind(r->status()), ErrorKind::kChecksumMismatch);
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 0}));
}

TEST_F(MultiHostTest, AnUnclaimedRunOrARewindStopsEveryRankBeforeUploading) {
  auto other = FsStore::Open(root_, "run-b");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(ClaimRun(**other, 0, nullptr).ok());  // the pointer now names run-b
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1);
  ASSERT_TRUE(dir.ok());
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir, {{}, {}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "the store holds run run-b"));
  }
  ASSERT_TRUE(ClaimRun(*OpenFs(), 5, nullptr).ok());  // run-a at boot version 5
  results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir, {{}, {}});
  for (const auto& r : results) {
    EXPECT_EQ(GetErrorKind(r.status()), ErrorKind::kPointerRewind) << r.status().message();
  }
}

TEST_F(MultiHostTest, ACorruptShardIsRefusedByItsHostAndThePointerStays) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  const fs::path shard = *dir / TestShardName(two, 1);
  fs::resize_file(shard, fs::file_size(shard) - 8);  // truncated
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir,
                          {{TestShardName(two, 0)}, {TestShardName(two, 1)}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), shard.string())) << r.status().message();
  }
  // Rank 0 says which host refused.
  EXPECT_TRUE(absl::StrContains(results[0].status().message(), "rank 1"));
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 0}));
  EXPECT_FALSE(fs::exists(root_ / "updates" / "weight_v000001"));
}

TEST_F(MultiHostTest, AFlippedByteInAFullVersionsShardIsRefused) {
  auto source = testing::WriteTestVersion(tmp_ / "source", 0);
  ASSERT_TRUE(source.ok());
  const fs::path dir = tmp_ / "shared" / "weight_v000001";
  fs::create_directories(dir.parent_path());
  FullVersionOptions fo;
  fo.version = 1;
  ASSERT_TRUE(WriteFullVersion(*source, dir, fo).ok());  // records checksums
  const fs::path shard = dir / TestShardName({}, 0);
  std::string bytes = *ReadFileToString(shard);
  bytes[bytes.size() - 3] ^= 1;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, dir,
                          {{TestShardName({}, 0)}, {TestShardName({}, 1)}});
  for (const auto& r : results) {
    EXPECT_EQ(GetErrorKind(r.status()), ErrorKind::kChecksumMismatch) << r.status().message();
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 0}));
}

TEST_F(MultiHostTest, AGapOrAMissingIndexStopsEveryRankBeforeUploading) {
  auto gap = testing::WriteTestVersion(tmp_ / "shared", 3);
  ASSERT_TRUE(gap.ok());
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, *gap, {{}, {}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "the next version must be weight_v000001"))
        << r.status().message();
  }
  auto dir = testing::WriteTestVersion(tmp_ / "other", 1);
  ASSERT_TRUE(dir.ok());
  fs::remove(*dir / "model.safetensors.index.json");
  results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir,
                     {{TestShardName({}, 0)}, {TestShardName({}, 1)}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "the index")) << r.status().message();
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 0}));
  EXPECT_FALSE(fs::exists(root_ / "updates" / "weight_v000001"));
}

TEST_F(MultiHostTest, AShardHoldingATensorTheIndexMapsElsewhereIsRefused) {
  TestVersionOptions two{.shards = 2};
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1, two);
  ASSERT_TRUE(dir.ok());
  // Rank 0's index says shard 2 holds a tensor that shard 1 holds.
  auto index = ReadIndex(*dir);
  ASSERT_TRUE(index.ok());
  index->weight_map["layers.0.w0"] = TestShardName(two, 1);
  ASSERT_TRUE(WriteIndex(*dir, *index).ok());
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, *dir,
                          {{TestShardName(two, 0)}, {TestShardName(two, 1)}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "\"layers.0.w0\"")) << r.status().message();
  }
  EXPECT_EQ(Pointer(), (VersionRef{"run-a", 0}));
}

TEST_F(MultiHostTest, ABadDirectoryNameOnAnyRankStopsAll) {
  auto dir = testing::WriteTestVersion(tmp_ / "shared", 1);
  ASSERT_TRUE(dir.ok());
  fs::path renamed = tmp_ / "shared" / "not_a_version";
  fs::rename(*dir, renamed);
  auto results = RunRanks(2, 1, [&] { return OpenFs(); }, renamed, {{}, {}});
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status().message();
  }
}

TEST(MultiHostSingleProcessTest, ASingleProcessTrainerPublishesThroughTheSameProtocol) {
  testing::TempDir tmp;
  auto store = MemStore::Open("multihost-single", "run-a", tmp / "cache");
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(ClaimRun(**store, 0, nullptr).ok());
  auto dir = testing::WriteTestVersion(tmp / "src", 1);
  ASSERT_TRUE(dir.ok());
  SingleProcessComms comms;
  auto published = PublishFromHosts(**store, comms, *dir);  // files found from the index
  ASSERT_TRUE(published.ok()) << published.status().message();
  auto pointer = (*store)->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 1}));
  auto materialized = (*store)->Materialize(1);
  ASSERT_TRUE(materialized.ok());
  EXPECT_TRUE(testing::VerifyVersionDir(*materialized).ok());
}

}  // namespace
}  // namespace stitch
