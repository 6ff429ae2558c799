// The multi-host publisher over the S3 store, against a real S3 protocol
// server: simulated hosts are threads sharing a ThreadCommsGroup.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "stitch/core/errors.h"
#include "stitch/io/fileio.h"
#include "stitch/publish/claim.h"
#include "stitch/publish/multihost.h"
#include "stitch/publish/receipts.h"
#include "tests/s3_test_base.h"
#include "tests/support/version_dirs.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;

// Runs `world` ranks of PublishFromHosts, one thread each; rank r publishes
// `dirs[r]` through its own store.
std::vector<absl::StatusOr<PublishOutcome>> RunRanks(
    std::vector<std::unique_ptr<CachedStore>>& stores, const std::vector<fs::path>& dirs,
    ThreadCommsGroup& group, const std::function<TrainerComms&(int)>& comms_of) {
  const int world = static_cast<int>(dirs.size());
  std::vector<absl::StatusOr<PublishOutcome>> results(world, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back(
        [&, r] { results[r] = PublishFromHosts(*stores[r], comms_of(r), dirs[r]); });
  }
  for (auto& t : threads) t.join();
  (void)group;
  return results;
}

// Splits a two-shard version: host 0 keeps the index and shard 1, host 1
// gets shard 2 only (each host's local disk).
std::vector<fs::path> SplitAcrossHosts(const fs::path& root, int64_t version, int seed) {
  auto full = WriteTestVersion(root / "full", version, {.seed = seed});
  EXPECT_TRUE(full.ok());
  std::vector<fs::path> dirs = {root / "host0" / VersionDirName(version),
                                root / "host1" / VersionDirName(version)};
  for (const fs::path& d : dirs) fs::create_directories(d);
  fs::copy_file(*full / "model.safetensors.index.json", dirs[0] / "model.safetensors.index.json");
  fs::copy_file(*full / TestShardName({}, 0), dirs[0] / TestShardName({}, 0));
  fs::copy_file(*full / TestShardName({}, 1), dirs[1] / TestShardName({}, 1));
  return dirs;
}

// A rank's comms that runs `hook` once, right after its second all-gather
// (after every host uploaded, before rank 0 verifies).
class HookedComms final : public TrainerComms {
 public:
  HookedComms(TrainerComms& inner, std::function<void()> hook)
      : inner_(inner), hook_(std::move(hook)) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  bool IsHostLeader() const override { return inner_.IsHostLeader(); }
  absl::StatusOr<std::vector<std::string>> AllGather(std::string_view value) override {
    auto out = inner_.AllGather(value);
    if (++calls_ == 2) hook_();
    return out;
  }

 private:
  TrainerComms& inner_;
  std::function<void()> hook_;
  int calls_ = 0;
};

class S3MultiHostTest : public S3Test {
 protected:
  void SetUp() override {
    S3Test::SetUp();
    if (HasFatalFailure()) return;
    for (int r = 0; r < 2; ++r) stores_.push_back(Open("run-a"));
    ASSERT_TRUE(ClaimRun(*stores_[0], 0, nullptr).ok());
  }
  std::vector<std::unique_ptr<CachedStore>> stores_;
};

TEST_F(S3MultiHostTest, UploadsFromTwoHostsFormOneVerifiedVersion) {
  std::vector<fs::path> dirs = SplitAcrossHosts(tmp(), 1, 1);
  ThreadCommsGroup group(2, 1);
  auto results =
      RunRanks(stores_, dirs, group, [&](int r) -> TrainerComms& { return group.comms(r); });
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->version, (VersionRef{"run-a", 1}));
  }
  auto pointer = stores_[0]->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 1}));

  // Each host uploaded its own shard once and left a receipt.
  EXPECT_EQ(S3(*stores_[0]).payload_files_uploaded(), 1);
  EXPECT_EQ(S3(*stores_[1]).payload_files_uploaded(), 1);
  for (int r = 0; r < 2; ++r) {
    auto text = S3(*stores_[0]).GetReceipt(1, HostReceiptName(r));
    ASSERT_TRUE(text.ok()) << text.status().message();
    auto receipt = ReceiptFromJson(*text);
    ASSERT_TRUE(receipt.ok()) << receipt.status().message();
    ASSERT_EQ(receipt->files.size(), 1u);
    EXPECT_EQ(receipt->files[0].file, TestShardName({}, r));
  }
  auto listed = S3(*stores_[0]).ListVersionFiles(1);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 3u);

  auto dir = stores_[1]->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_TRUE(VerifyVersionDir(*dir).ok());
  auto full = ReadFileToString(tmp() / "full" / "weight_v000001" / TestShardName({}, 1));
  auto got = ReadFileToString(*dir / TestShardName({}, 1));
  ASSERT_TRUE(full.ok() && got.ok());
  EXPECT_EQ(*full, *got);

  // The next version, over the same hosts, moves the pointer forward again.
  std::vector<fs::path> next = SplitAcrossHosts(tmp() / "v2", 2, 2);
  ThreadCommsGroup group2(2, 1);
  auto again =
      RunRanks(stores_, next, group2, [&](int r) -> TrainerComms& { return group2.comms(r); });
  for (const auto& r : again) {
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  pointer = stores_[0]->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 2}));
}

TEST_F(S3MultiHostTest, RankZerosConfigAndTokenizerFilesArePublishedWithTheIndex) {
  std::vector<fs::path> dirs = SplitAcrossHosts(tmp(), 1, 1);
  ASSERT_TRUE(WriteFileAtomically(dirs[0] / "config.json", R"({"model_type": "llama"})").ok());
  ASSERT_TRUE(WriteFileAtomically(dirs[0] / "tokenizer.json", R"({"model": {}})").ok());
  ThreadCommsGroup group(2, 1);
  for (const auto& r :
       RunRanks(stores_, dirs, group, [&](int r) -> TrainerComms& { return group.comms(r); })) {
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  auto listed = S3(*stores_[0]).ListVersionFiles(1);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  EXPECT_EQ(*listed,
            (std::vector<std::string>{"config.json", TestShardName({}, 0), TestShardName({}, 1),
                                      "model.safetensors.index.json", "tokenizer.json"}));
  auto dir = stores_[1]->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_EQ(*ReadFileToString(*dir / "config.json"), R"({"model_type": "llama"})");
  EXPECT_EQ(*ReadFileToString(*dir / "tokenizer.json"), R"({"model": {}})");
}

TEST_F(S3MultiHostTest, ARetryFromEveryHostAfterThePointerMovedIsANoOpThatSaysSo) {
  std::vector<fs::path> dirs = SplitAcrossHosts(tmp(), 1, 1);
  ThreadCommsGroup group(2, 1);
  for (const auto& r :
       RunRanks(stores_, dirs, group, [&](int r) -> TrainerComms& { return group.comms(r); })) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_FALSE(r->already_published);
  }
  const int64_t uploads =
      S3(*stores_[0]).payload_files_uploaded() + S3(*stores_[1]).payload_files_uploaded();
  ThreadCommsGroup retry(2, 1);
  for (const auto& r :
       RunRanks(stores_, dirs, retry, [&](int r) -> TrainerComms& { return retry.comms(r); })) {
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->already_published);
  }
  EXPECT_EQ(S3(*stores_[0]).payload_files_uploaded() + S3(*stores_[1]).payload_files_uploaded(),
            uploads);
  auto pointer = stores_[0]->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 1}));
}

TEST_F(S3MultiHostTest, ARetryWithOtherBytesOnOneHostIsRefusedNamingItsFile) {
  std::vector<fs::path> dirs = SplitAcrossHosts(tmp(), 1, 1);
  ThreadCommsGroup group(2, 1);
  for (const auto& r :
       RunRanks(stores_, dirs, group, [&](int r) -> TrainerComms& { return group.comms(r); })) {
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  // Host 1 holds other bytes for its shard this time.
  std::vector<fs::path> other = SplitAcrossHosts(tmp() / "other", 1, 5);
  std::vector<fs::path> mixed = {dirs[0], other[1]};
  ThreadCommsGroup retry(2, 1);
  for (const auto& r :
       RunRanks(stores_, mixed, retry, [&](int r) -> TrainerComms& { return retry.comms(r); })) {
    EXPECT_TRUE(absl::IsAlreadyExists(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), TestShardName({}, 1)))
        << r.status().message();
  }
  auto pointer = stores_[0]->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 1}));
}

TEST_F(S3MultiHostTest, VersionMissingAReferencedShardIsRefused) {
  std::vector<fs::path> dirs = SplitAcrossHosts(tmp(), 1, 1);
  fs::remove(dirs[1] / TestShardName({}, 1));  // host 1 lost its shard
  ThreadCommsGroup group(2, 1);
  auto results =
      RunRanks(stores_, dirs, group, [&](int r) -> TrainerComms& { return group.comms(r); });
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status().message();
    EXPECT_TRUE(absl::StrContains(r.status().message(), TestShardName({}, 1)))
        << r.status().message();
  }
  auto pointer = stores_[0]->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 0}));
  // The version never became readable: its index was not uploaded.
  EXPECT_TRUE(absl::IsNotFound(stores_[0]->ReadManifest(1).status()));
}

TEST_F(S3MultiHostTest, ObjectChangedBetweenUploadAndVerifyIsRefused) {
  std::vector<fs::path> dirs = SplitAcrossHosts(tmp(), 1, 1);
  ThreadCommsGroup group(2, 1);
  HookedComms rank0(group.comms(0), [&] {
    // Host 1's shard replaced after its receipt was written.
    S3Request r;
    r.method = "PUT";
    r.key = S3(*stores_[0]).VersionKey(1, TestShardName({}, 1));
    r.body = "replaced";
    r.headers = {{S3Response::MetaHeader("sha256"), std::string(64, 'a')}};
    auto response = S3(*stores_[0]).client().Send(r);
    ASSERT_TRUE(response.ok() && response->ok());
  });
  auto results = RunRanks(stores_, dirs, group, [&](int r) -> TrainerComms& {
    return r == 0 ? static_cast<TrainerComms&>(rank0) : group.comms(r);
  });
  for (const auto& r : results) {
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status().message();
    EXPECT_EQ(GetErrorKind(r.status()), ErrorKind::kChecksumMismatch);
  }
  auto pointer = stores_[0]->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 0}));
}

TEST_F(S3MultiHostTest, RewindIsRefusedBeforeAnyUpload) {
  std::vector<fs::path> dirs = SplitAcrossHosts(tmp(), 1, 1);
  ThreadCommsGroup group(2, 1);
  for (const auto& r :
       RunRanks(stores_, dirs, group, [&](int r) -> TrainerComms& { return group.comms(r); })) {
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  ThreadCommsGroup second(2, 1);
  for (const auto& r : RunRanks(stores_, SplitAcrossHosts(tmp() / "v2", 2, 2), second,
                                [&](int r) -> TrainerComms& { return second.comms(r); })) {
    ASSERT_TRUE(r.ok()) << r.status().message();
  }
  // Version 1 again, with other bytes: a rewind, refused at step 1 on every
  // rank (had anything been uploaded, the immutable version would have
  // refused it as AlreadyExists instead).
  std::vector<fs::path> other = SplitAcrossHosts(tmp() / "again", 1, 5);
  int64_t before = S3(*stores_[1]).payload_files_uploaded();
  ThreadCommsGroup again(2, 1);
  for (const auto& r :
       RunRanks(stores_, other, again, [&](int r) -> TrainerComms& { return again.comms(r); })) {
    EXPECT_EQ(GetErrorKind(r.status()), ErrorKind::kPointerRewind) << r.status().message();
  }
  EXPECT_EQ(S3(*stores_[1]).payload_files_uploaded(), before);
}

}  // namespace
}  // namespace stitch::testing
