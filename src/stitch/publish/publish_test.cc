#include "stitch/publish/publish.h"

#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/publish/claim.h"
#include "stitch/publish/testing_fakes.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::CountingPool;
using ::stitch::testing::InterferingStore;
using ::stitch::testing::TempDir;
using ::stitch::testing::TestVersionOptions;
using ::stitch::testing::WriteTestVersion;
using ::testing::HasSubstr;

VersionRef A(int64_t v) { return VersionRef{"run-a", v}; }

class PublishTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = FsStore::Open(tmp_ / "store", "run-a");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  void Claim(int64_t boot = 0) { ASSERT_TRUE(ClaimRun(*store_, boot, nullptr).ok()); }
  fs::path Version(int64_t v, TestVersionOptions options = {}) {
    auto dir = WriteTestVersion(tmp_ / "src" / std::to_string(sources_++), v, options);
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *dir : fs::path();
  }
  std::optional<VersionRef> Pointer() { return *store_->ReadPointer(); }
  std::set<std::string> Updates() {
    std::set<std::string> out;
    std::error_code ec;  // a store that was never claimed has no updates/
    for (const auto& e : fs::directory_iterator(tmp_ / "store" / "updates", ec)) {
      out.insert(e.path().filename().string());
    }
    return out;
  }

  TempDir tmp_;
  int sources_ = 0;
  std::unique_ptr<FsStore> store_;
};

TEST_F(PublishTest, PublishesAndMovesThePointer) {
  Claim();
  CountingPool pool;
  auto ref = PublishVersion(*store_, Version(1), &pool);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->version, A(1));
  EXPECT_FALSE(ref->already_published);
  EXPECT_EQ(Pointer(), A(1));
  EXPECT_TRUE(testing::VerifyVersionDir(*store_->Materialize(1)).ok());
  EXPECT_EQ(pool.wakes, 1);
  ASSERT_TRUE(PublishVersion(*store_, Version(2), &pool).ok());
  EXPECT_EQ(Pointer(), A(2));
  EXPECT_EQ(pool.wakes, 2);
}

// The original Python Stitch reads metadata.version with int(), so an index
// that records it as a JSON integer is a version like any other.
TEST_F(PublishTest, AnIndexWhoseVersionIsAJsonIntegerIsPublished) {
  Claim();
  fs::path dir = Version(1);
  auto index = ReadIndex(dir);
  ASSERT_TRUE(index.ok()) << index.status();
  index->metadata.erase("version");
  index->other_metadata["version"] = "1";
  ASSERT_TRUE(WriteIndex(dir, *index).ok());
  ASSERT_THAT(ReadFileToString(dir / "model.safetensors.index.json").value_or(""),
              HasSubstr(R"("version":1)"));
  auto ref = PublishVersion(*store_, dir, nullptr);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(Pointer(), A(1));
}

TEST_F(PublishTest, TrailingSlashOnTheDirectoryIsFine) {
  Claim();
  fs::path dir = Version(1);
  auto ref = PublishVersion(*store_, dir.string() + "/", nullptr);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->version, A(1));
  EXPECT_FALSE(ref->already_published);
}

TEST_F(PublishTest, AnUnclaimedRunIsRefusedBeforeAnythingIsWritten) {
  CountingPool pool;
  auto ref = PublishVersion(*store_, Version(1), &pool);
  ASSERT_FALSE(ref.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(ref.status()));
  EXPECT_THAT(
      std::string(ref.status().message()),
      HasSubstr("run run-a is not claimed (the pointer is unset); claim it first: `stitch claim` "
                "(stitch.claim_run from Python)"));
  EXPECT_FALSE(fs::exists(tmp_ / "store"));  // publishing never creates a store
  EXPECT_EQ(Pointer(), std::nullopt);
  EXPECT_TRUE(Updates().empty());
  EXPECT_EQ(pool.wakes, 0);
}

// A mistyped run id is refused naming the run the store holds; claiming is
// offered only with its cost (a new run, every replica moved to it).
TEST_F(PublishTest, AnotherRunsPointerIsRefusedNamingThatRunAndWhatClaimingCosts) {
  auto other = FsStore::Open(tmp_ / "store", "run-b");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(ClaimRun(**other, 0, nullptr).ok());
  auto ref = PublishVersion(*store_, Version(1), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(ref.status())) << ref.status();
  const std::string message(ref.status().message());
  EXPECT_THAT(message, HasSubstr("the store holds run run-b (its pointer names "
                                 "run-b/weight_v000000), not run-a; give run id run-b"));
  EXPECT_THAT(message, HasSubstr("starts it at its boot weights and moves every replica to it"));
  EXPECT_THAT(message, ::testing::Not(HasSubstr("claim it first")));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_EQ(Pointer(), (VersionRef{"run-b", 0}));
}

TEST_F(PublishTest, RewindIsRefusedBeforeTheUpload) {
  Claim(5);
  for (int64_t v : {5, 3}) {
    auto ref = PublishVersion(*store_, Version(v), nullptr);
    ASSERT_FALSE(ref.ok()) << v;
    EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kPointerRewind) << ref.status();
  }
  EXPECT_TRUE(Updates().empty());
  EXPECT_EQ(Pointer(), A(5));
}

TEST_F(PublishTest, TheDirectoryNameMustBeItsCanonicalIdentity) {
  Claim();
  for (std::string name : {"weight_v1", "weight_v0000001", "v000001", "checkpoint", "weight_v"}) {
    fs::path dir = tmp_ / "named" / name;
    ASSERT_TRUE(testing::WriteTestVersionAt(dir, 1).ok());
    auto ref = PublishVersion(*store_, dir, nullptr);
    ASSERT_FALSE(ref.ok()) << name;
    EXPECT_TRUE(absl::IsInvalidArgument(ref.status())) << ref.status();
    EXPECT_THAT(std::string(ref.status().message()), HasSubstr("weight_vNNNNNN"));
  }
  EXPECT_TRUE(Updates().empty());
  EXPECT_EQ(Pointer(), A(0));
}

TEST_F(PublishTest, AMissingShardFailsBeforeThePointerMoves) {
  Claim();
  CountingPool pool;
  fs::path dir = Version(1);
  fs::remove(dir / "model-00002-of-00002.safetensors");
  InterferingStore watched(*store_);
  auto ref = PublishVersion(watched, dir, &pool);
  ASSERT_FALSE(ref.ok());
  EXPECT_TRUE(absl::IsNotFound(ref.status())) << ref.status();
  EXPECT_THAT(std::string(ref.status().message()), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(std::string(ref.status().message()), HasSubstr(store_->uri()));
  EXPECT_EQ(watched.publish_files_calls, 0);  // refused before the upload began
  EXPECT_EQ(Pointer(), A(0));
  EXPECT_TRUE(Updates().empty());  // not even a staging directory
  EXPECT_EQ(pool.wakes, 0);
}

TEST_F(PublishTest, APointerChangedDuringTheUploadIsAConflict) {
  Claim();
  InterferingStore racing(*store_);
  // Another publisher of the same run gets version 5 in while we upload 1.
  racing.after_publish_files = [&] { ASSERT_TRUE(store_->AdvancePointer(A(0), A(5)).ok()); };
  CountingPool pool;
  auto ref = PublishVersion(racing, Version(1), &pool);
  ASSERT_FALSE(ref.ok());
  EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kPointerConflict) << ref.status();
  auto details = GetConflictDetails(ref.status());
  ASSERT_TRUE(details.has_value());
  EXPECT_EQ(details->expected, "run-a/weight_v000000");
  EXPECT_EQ(details->actual, "run-a/weight_v000005");
  EXPECT_EQ(details->proposed, "run-a/weight_v000001");
  EXPECT_EQ(Pointer(), A(5));
  EXPECT_EQ(pool.wakes, 0);
}

TEST_F(PublishTest, ARunChangeDuringTheUploadIsAConflict) {
  Claim();
  auto other = FsStore::Open(tmp_ / "store", "run-b");
  ASSERT_TRUE(other.ok());
  InterferingStore racing(*store_);
  racing.after_publish_files = [&] { ASSERT_TRUE(ClaimRun(**other, 0, nullptr).ok()); };
  auto ref = PublishVersion(racing, Version(1), nullptr);
  EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kPointerConflict) << ref.status();
  EXPECT_EQ(Pointer(), (VersionRef{"run-b", 0}));
}

TEST_F(PublishTest, RetryAfterACrashBetweenUploadAndPointerMoveCompletesThePublish) {
  Claim();
  fs::path dir = Version(1);
  // The crashed attempt made the files durable but never moved the pointer.
  ASSERT_TRUE(store_->PublishFiles(1, dir).ok());
  CountingPool pool;
  auto ref = PublishVersion(*store_, Version(1), &pool);  // identical bytes
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_FALSE(ref->already_published);
  EXPECT_EQ(Pointer(), A(1));
  EXPECT_EQ(pool.wakes, 1);
}

TEST_F(PublishTest, DifferentBytesForAVersionThePointerNeverNamedAreRefusedSayingHowToRecover) {
  Claim();
  ASSERT_TRUE(store_->PublishFiles(1, Version(1, {.seed = 1})).ok());
  auto ref = PublishVersion(*store_, Version(1, {.seed = 2}), nullptr);
  ASSERT_FALSE(ref.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(ref.status())) << ref.status();
  const std::string message(ref.status().message());
  EXPECT_THAT(message, HasSubstr("its \"model-00001-of-00002.safetensors\" differs"));
  EXPECT_THAT(message, HasSubstr("the pointer (run-a/weight_v000000) never named it"));
  EXPECT_THAT(message, HasSubstr("remove updates/weight_v000001"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_EQ(Pointer(), A(0));
}

TEST_F(PublishTest, RepublishingThePublishedVersionWithTheSameBytesIsANoOpThatSaysSo) {
  Claim();
  ASSERT_TRUE(PublishVersion(*store_, Version(1), nullptr).ok());
  const auto stored = fs::last_write_time(tmp_ / "store/updates/weight_v000001");
  // A retry after the pointer moved (the first answer was lost), from a
  // byte-identical copy elsewhere.
  InterferingStore watched(*store_);
  CountingPool pool;
  auto ref = PublishVersion(watched, Version(1), &pool);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->version, A(1));
  EXPECT_TRUE(ref->already_published);
  EXPECT_EQ(Pointer(), A(1));
  EXPECT_EQ(watched.advance_pointer_calls, 0);
  EXPECT_EQ(fs::last_write_time(tmp_ / "store/updates/weight_v000001"), stored);
  EXPECT_EQ(pool.wakes, 1);  // the lost attempt's wake, in case it was lost too
  // And the run goes on from there.
  auto next = PublishVersion(*store_, Version(2), nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->already_published);
}

TEST_F(PublishTest, ARetryRacingItsFirstAttemptSucceedsAndSaysItWasAlreadyPublished) {
  Claim();
  InterferingStore racing(*store_);
  // The first attempt, still running, moves the pointer while the retry
  // uploads the same bytes.
  racing.after_publish_files = [&] {
    auto first = PublishVersion(*store_, Version(1), nullptr);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_FALSE(first->already_published);
  };
  auto retry = PublishVersion(racing, Version(1), nullptr);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->already_published);
  EXPECT_EQ(Pointer(), A(1));
}

TEST_F(PublishTest, RepublishingThePublishedVersionFromTheStoresOwnDirectoryIsANoOp) {
  Claim();
  // A trainer that writes straight into the store's directory (as with a
  // mounted volume) and publishes from there, twice.
  auto dir = testing::WriteTestVersion(tmp_ / "store" / "updates", 1);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(PublishVersion(*store_, *dir, nullptr).ok());
  auto again = PublishVersion(*store_, *dir, nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->already_published);
  EXPECT_EQ(Pointer(), A(1));
}

TEST_F(PublishTest, RepublishingThePublishedVersionWithOtherBytesIsRefusedNamingTheFile) {
  Claim();
  fs::path first = Version(1, {.seed = 1});
  ASSERT_TRUE(PublishVersion(*store_, first, nullptr).ok());
  CountingPool pool;
  auto ref = PublishVersion(*store_, Version(1, {.seed = 2}), &pool);
  ASSERT_FALSE(ref.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(ref.status())) << ref.status();
  const std::string message(ref.status().message());
  EXPECT_THAT(message, HasSubstr("version weight_v000001 already exists and its "
                                 "\"model-00001-of-00002.safetensors\" differs"));
  EXPECT_THAT(message, HasSubstr("weight_v000001 is published (the pointer names it): publish "
                                 "new weights as weight_v000002"));
  EXPECT_EQ(Pointer(), A(1));
  EXPECT_EQ(pool.wakes, 0);
  EXPECT_EQ(
      *ReadFileToString(tmp_ / "store/updates/weight_v000001" / "model-00001-of-00002.safetensors"),
      *ReadFileToString(first / "model-00001-of-00002.safetensors"));
  // Another set of files is a difference too.
  ref = PublishVersion(*store_, Version(1, {.shards = 3, .seed = 1}), nullptr);
  EXPECT_TRUE(absl::IsAlreadyExists(ref.status())) << ref.status();
}

TEST_F(PublishTest, PublishingTheBootVersionTheStoreDoesNotHoldIsARewind) {
  Claim(3);
  auto ref = PublishVersion(*store_, Version(3), nullptr);
  ASSERT_FALSE(ref.ok());
  EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kPointerRewind) << ref.status();
  EXPECT_THAT(std::string(ref.status().message()),
              HasSubstr("the pointer names run-a/weight_v000003, the run's boot version"));
  EXPECT_THAT(std::string(ref.status().message()), HasSubstr("publish the next version, "
                                                             "weight_v000004"));
  EXPECT_TRUE(Updates().empty());
  EXPECT_EQ(Pointer(), A(3));
}

TEST_F(PublishTest, AVersionBelowThePublishedOneIsStillARewind) {
  Claim();
  ASSERT_TRUE(PublishVersion(*store_, Version(1), nullptr).ok());
  ASSERT_TRUE(PublishVersion(*store_, Version(2), nullptr).ok());
  auto ref = PublishVersion(*store_, Version(1), nullptr);  // the same bytes as v1
  EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kPointerRewind) << ref.status();
  EXPECT_EQ(Pointer(), A(2));
}

TEST_F(PublishTest, AGarbagePointerStopsThePublish) {
  Claim();
  ASSERT_TRUE(WriteFileAtomically(tmp_ / "store" / "latest", "run-a/weight_vX").ok());
  auto ref = PublishVersion(*store_, Version(1), nullptr);
  ASSERT_FALSE(ref.ok());
  EXPECT_THAT(std::string(ref.status().message()), HasSubstr("weight_vX"));
  EXPECT_TRUE(Updates().empty());
}

TEST_F(PublishTest, OnlyThePointersNextVersionMayFollowIt) {
  Claim();
  ASSERT_TRUE(PublishVersion(*store_, Version(1), nullptr).ok());
  auto gap = PublishVersion(*store_, Version(3), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(gap.status())) << gap.status();
  EXPECT_THAT(std::string(gap.status().message()),
              HasSubstr("weight_v000003 would leave a gap: the pointer is at run-a/weight_v000001, "
                        "so the next version must be weight_v000002"));
  EXPECT_EQ(Pointer(), A(1));
  EXPECT_EQ(Updates(), (std::set<std::string>{"weight_v000001"}));
}

TEST_F(PublishTest, ADeltaOnAnotherBaseThanThePointerIsRefused) {
  Claim();
  ASSERT_TRUE(PublishVersion(*store_, Version(1), nullptr).ok());
  fs::path delta = tmp_ / "delta" / "weight_v000002";
  fs::create_directories(delta.parent_path());
  EncodeOptions o;
  o.version = 2;
  ASSERT_TRUE(EncodeDelta(Version(1, {.seed = 1}), Version(2, {.seed = 2}), delta, o).ok());
  auto index = ReadIndex(delta);
  ASSERT_TRUE(index.ok());
  index->metadata["base_version"] = "000000";
  ASSERT_TRUE(WriteIndex(delta, *index).ok());
  auto ref = PublishVersion(*store_, delta, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(ref.status())) << ref.status();
  EXPECT_THAT(std::string(ref.status().message()),
              HasSubstr("DELTA weight_v000002 applies to version 0, but the pointer is at "
                        "run-a/weight_v000001"));
  EXPECT_EQ(Pointer(), A(1));
}

// Published through an API with no base checkpoint (the original's
// publish_version has none), a delta made from other weights is still
// refused: the fingerprints the two indexes record disagree.
TEST_F(PublishTest, ADeltaEncodedAgainstOtherWeightsThanThePointersVersionIsRefused) {
  Claim();
  fs::path full = tmp_ / "full" / "weight_v000001";
  fs::create_directories(full.parent_path());
  FullVersionOptions fo;
  fo.version = 1;
  ASSERT_TRUE(WriteFullVersion(Version(1, {.seed = 1}), full, fo).ok());
  ASSERT_TRUE(PublishVersion(*store_, full, nullptr).ok());
  auto encode = [&](const fs::path& base, int64_t version, int seed) {
    fs::path out = tmp_ / absl::StrCat("delta-", sources_) / VersionDirName(version);
    fs::create_directories(out.parent_path());
    EncodeOptions o;
    o.version = version;
    EXPECT_TRUE(EncodeDelta(base, Version(version, {.seed = seed}), out, o).ok());
    return out;
  };

  const fs::path wrong = encode(Version(1, {.seed = 7}), 2, 2);
  InterferingStore watched(*store_);
  auto ref = PublishVersion(watched, wrong, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(ref.status())) << ref.status();
  EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kChecksumMismatch);
  EXPECT_THAT(std::string(ref.status().message()),
              HasSubstr("DELTA weight_v000002 was encoded against other weights than version 1 "
                        "holds"));
  EXPECT_THAT(std::string(ref.status().message()), HasSubstr("publish the new weights as a FULL"));
  EXPECT_EQ(watched.publish_files_calls, 0);
  EXPECT_EQ(Pointer(), A(1));

  // Against the right weights it goes through, and the DELTA's own
  // fingerprint lets the next delta be checked the same way.
  const fs::path v2 = Version(2, {.seed = 2});
  fs::path right = tmp_ / "right" / "weight_v000002";
  fs::create_directories(right.parent_path());
  EncodeOptions o;
  o.version = 2;
  ASSERT_TRUE(EncodeDelta(full, v2, right, o).ok());
  ASSERT_TRUE(PublishVersion(*store_, right, nullptr).ok());
  EXPECT_EQ(Pointer(), A(2));
  EXPECT_FALSE(PublishVersion(*store_, encode(Version(2, {.seed = 8}), 3, 3), nullptr).ok());
  EXPECT_EQ(Pointer(), A(2));
  ASSERT_TRUE(PublishVersion(*store_, encode(v2, 3, 3), nullptr).ok());
  EXPECT_EQ(Pointer(), A(3));
}

// A version written by another tool records no fingerprint: nothing at
// publish can tell its weights, and the replicas' checksums decide.
TEST_F(PublishTest, ADeltaOverAVersionThatRecordsNoFingerprintIsNotJudgedAtPublish) {
  Claim();
  ASSERT_TRUE(PublishVersion(*store_, Version(1, {.seed = 1}), nullptr).ok());
  auto recorded = store_->ReadManifest(1);
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(recorded->weights_fingerprint, "");
  fs::path delta = tmp_ / "delta" / "weight_v000002";
  fs::create_directories(delta.parent_path());
  EncodeOptions o;
  o.version = 2;
  ASSERT_TRUE(EncodeDelta(Version(1, {.seed = 7}), Version(2, {.seed = 2}), delta, o).ok());
  EXPECT_TRUE(PublishVersion(*store_, delta, nullptr).ok());
  EXPECT_EQ(Pointer(), A(2));
}

TEST_F(PublishTest, APayloadThatFailsVerificationNeverReachesTheStore) {
  Claim();
  fs::path full = tmp_ / "full" / "weight_v000001";
  fs::create_directories(full.parent_path());
  FullVersionOptions fo;
  fo.version = 1;
  ASSERT_TRUE(WriteFullVersion(Version(0), full, fo).ok());
  const fs::path shard = full / "model-00002-of-00002.safetensors";
  std::string bytes = *ReadFileToString(shard);
  bytes[bytes.size() - 1] ^= 1;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  InterferingStore watched(*store_);
  auto ref = PublishVersion(watched, full, nullptr);
  EXPECT_TRUE(absl::IsDataLoss(ref.status())) << ref.status();
  EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kChecksumMismatch);
  EXPECT_THAT(std::string(ref.status().message()), HasSubstr("publish: " + shard.string()));
  EXPECT_EQ(watched.publish_files_calls, 0);
  EXPECT_EQ(Pointer(), A(0));
  EXPECT_TRUE(Updates().empty());
}

TEST_F(PublishTest, WithTheBaseCheckpointADeltasChecksumsAreVerified) {
  Claim();
  fs::path base = Version(0, {.seed = 1});
  fs::path delta = tmp_ / "delta" / "weight_v000001";
  fs::create_directories(delta.parent_path());
  EncodeOptions o;
  o.version = 1;
  ASSERT_TRUE(EncodeDelta(base, Version(1, {.seed = 2}), delta, o).ok());
  // The delta decodes fine, but was not made from this base.
  PublishOptions wrong_base;
  wrong_base.base_checkpoint = testing::WriteTestVersion(tmp_ / "other", 0, {.seed = 3}).value();
  auto ref = PublishVersion(*store_, delta, nullptr, wrong_base);
  EXPECT_EQ(GetErrorKind(ref.status()), ErrorKind::kChecksumMismatch) << ref.status();
  EXPECT_EQ(Pointer(), A(0));
  PublishOptions right_base;
  right_base.base_checkpoint = base;
  ref = PublishVersion(*store_, delta, nullptr, right_base);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(Pointer(), A(1));
}

TEST_F(PublishTest, WorksAgainstTheInMemoryStoreToo) {
  auto mem = MemStore::Open("publish-test-mem", "run-a", tmp_ / "cache");
  ASSERT_TRUE(mem.ok());
  ASSERT_TRUE(ClaimRun(**mem, 0, nullptr).ok());
  auto ref = PublishVersion(**mem, Version(1), nullptr);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(*(*mem)->ReadPointer(), A(1));
  EXPECT_TRUE(testing::VerifyVersionDir(*(*mem)->Materialize(1)).ok());
}

}  // namespace
}  // namespace stitch
