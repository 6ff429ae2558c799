// What only the filesystem store promises: its layout on disk, adoption,
// staging directories, and how it reads what other writers left behind.
#include "stitch/store/fs_store.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::stitch::testing::TestVersionOptions;
using ::stitch::testing::WriteTestVersion;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::set<std::string> Entries(const fs::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

class FsStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = FsStore::Open(root_, "run-a");
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = *std::move(s);
  }
  // Claims run-a at version 0, which creates the store.
  void Claim() { ASSERT_TRUE(store_->AdvancePointer(std::nullopt, VersionRef{"run-a", 0}).ok()); }
  // The root alone, for tests that write the pointer file behind the store.
  void MakeRoot() { fs::create_directories(root_); }

  TempDir tmp_;
  fs::path root_ = tmp_ / "runs" / "a";
  std::unique_ptr<FsStore> store_;
};

TEST_F(FsStoreTest, OpeningCreatesNothingAndTheFirstPointerCreatesTheStore) {
  EXPECT_FALSE(fs::exists(tmp_ / "runs"));
  EXPECT_EQ(store_->root(), root_);
  EXPECT_EQ(store_->uri(), "file://" + root_.string());
  EXPECT_EQ(*store_->ReadPointer(), std::nullopt);
  EXPECT_FALSE(fs::exists(tmp_ / "runs"));
  Claim();
  EXPECT_TRUE(fs::is_directory(root_ / "updates"));
  EXPECT_EQ(*ReadFileToString(root_ / "latest"), "run-a/weight_v000000");
}

TEST_F(FsStoreTest, OnlyAMoveFromUnsetCreatesAMissingStore) {
  // A compare-and-swap from a pointer the missing store never had is a
  // conflict, and leaves no directory behind.
  absl::Status s = store_->AdvancePointer(VersionRef{"run-a", 0}, VersionRef{"run-a", 1});
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kPointerConflict) << s;
  EXPECT_FALSE(fs::exists(tmp_ / "runs"));
  // So does a view, which never writes.
  auto view = FsStore::Open(root_, "");
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(absl::IsInvalidArgument((*view)->AdvancePointer(std::nullopt, {"run-a", 0})));
  EXPECT_FALSE(fs::exists(tmp_ / "runs"));
}

TEST_F(FsStoreTest, PublishingIntoAMissingStoreCreatesNothing) {
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  absl::Status s = store_->PublishFiles(1, *src);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("the store does not exist"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("`stitch claim`"));
  EXPECT_FALSE(fs::exists(tmp_ / "runs"));
}

TEST_F(FsStoreTest, AStoreWithoutUpdatesGetsItWhenPublishing) {
  // Claimed, then its updates/ removed (or claimed by a stitch that made it
  // only when publishing).
  Claim();
  fs::remove(root_ / "updates");
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store_->PublishFiles(1, *src).ok());
  EXPECT_TRUE(store_->ReadManifest(1).ok());
}

TEST_F(FsStoreTest, RelativeRootIsMadeAbsolute) {
  fs::path saved = fs::current_path();
  fs::current_path(tmp_.path());
  auto s = FsStore::Open("rel/store/", "run-a");
  fs::current_path(saved);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->root(), tmp_ / "rel" / "store");
  EXPECT_FALSE(fs::exists(tmp_ / "rel"));
}

TEST_F(FsStoreTest, UriPercentEncodesWhatAPathMayHold) {
  auto s = FsStore::Open(tmp_ / "with space", "run-a");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->uri(), "file://" + tmp_.path().string() + "/with%20space");
}

TEST_F(FsStoreTest, ViewWithoutRunIdCreatesNothing) {
  auto s = FsStore::Open(tmp_ / "missing", "");
  ASSERT_TRUE(s.ok()) << s.status();
  auto p = (*s)->ReadPointer();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(*p, std::nullopt);
  EXPECT_FALSE(fs::exists(tmp_ / "missing"));
}

TEST_F(FsStoreTest, InvalidRunIdIsRefusedNamingTheStore) {
  auto s = FsStore::Open(root_, "bad run");
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_THAT(std::string(s.status().message()), StartsWith("store file://"));
}

TEST_F(FsStoreTest, PointerIsAFileHoldingTheIdentity) {
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, VersionRef{"run-a", 3}).ok());
  EXPECT_EQ(*ReadFileToString(root_ / "latest"), "run-a/weight_v000003");
  // No temporary file is left beside it.
  EXPECT_EQ(Entries(root_), (std::set<std::string>{"latest", ".latest.lock", "updates"}));
}

TEST_F(FsStoreTest, LegacyAndBarePointersAreRead) {
  MakeRoot();
  ASSERT_TRUE(WriteFileAtomically(root_ / "latest", "7\n").ok());
  EXPECT_EQ(*store_->ReadPointer(), (VersionRef{"", 7}));
  ASSERT_TRUE(WriteFileAtomically(root_ / "latest", "weight_v000008").ok());
  EXPECT_EQ(*store_->ReadPointer(), (VersionRef{"", 8}));
}

TEST_F(FsStoreTest, GarbagePointerMessageNamesStoreAndText) {
  MakeRoot();
  ASSERT_TRUE(WriteFileAtomically(root_ / "latest", "weight_vx").ok());
  auto p = store_->ReadPointer();
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()),
              StartsWith("store " + store_->uri() + ": pointer"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("\"weight_vx\""));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("not treated as unset"));
}

TEST_F(FsStoreTest, PublishCopiesTheWholeVersionDirectoryButItsHiddenEntries) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(WriteFileAtomically(*src / "config.json", "{}").ok());
  ASSERT_TRUE(WriteFileAtomically(*src / ".gitattributes", "*.safetensors lfs").ok());
  fs::create_directories(*src / ".cache" / "huggingface");
  ASSERT_TRUE(WriteFileAtomically(*src / ".cache" / "huggingface" / "x.lock", "").ok());
  ASSERT_TRUE(store_->PublishFiles(1, *src).ok());
  EXPECT_EQ(Entries(root_ / "updates"), (std::set<std::string>{"weight_v000001"}));
  EXPECT_EQ(Entries(root_ / "updates" / "weight_v000001"),
            (std::set<std::string>{"model.safetensors.index.json", "config.json",
                                   "model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(*ReadFileToString(root_ / "updates/weight_v000001/model.safetensors.index.json"),
            *ReadFileToString(*src / "model.safetensors.index.json"));
}

TEST_F(FsStoreTest, MissingShardLeavesNothingUnderUpdates) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  fs::remove(*src / "model-00001-of-00002.safetensors");
  EXPECT_TRUE(absl::IsNotFound(store_->PublishFiles(1, *src)));
  EXPECT_TRUE(Entries(root_ / "updates").empty());
}

TEST_F(FsStoreTest, AdoptsADirectoryAlreadyAtItsFinalPath) {
  Claim();
  auto dir = WriteTestVersion(root_ / "updates", 2, {.record_version = false});
  ASSERT_TRUE(dir.ok());
  std::string shard = *ReadFileToString(*dir / "model-00001-of-00002.safetensors");
  ASSERT_TRUE(store_->PublishFiles(2, *dir).ok());
  EXPECT_EQ(Entries(root_ / "updates"), (std::set<std::string>{"weight_v000002"}));
  EXPECT_EQ(*ReadFileToString(*dir / "model-00001-of-00002.safetensors"), shard);
  // The index gained metadata.version, so the version reads back.
  auto m = store_->ReadManifest(2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, 2);
  // Adopting again is a no-op.
  EXPECT_TRUE(store_->PublishFiles(2, root_ / "updates" / "weight_v000002").ok());
}

TEST_F(FsStoreTest, LeftoverStagingDirectoriesAreNeverVersions) {
  Claim();
  // A publisher that crashed mid-copy leaves a dot-named staging directory.
  auto crashed =
      testing::WriteTestVersionAt(root_ / "updates" / ".weight_v000003.tmp-1-00000000deadbeef", 3);
  ASSERT_TRUE(crashed.ok());
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(3).status()));
  auto src = WriteTestVersion(tmp_ / "src", 3, {.seed = 9});
  ASSERT_TRUE(src.ok());
  EXPECT_TRUE(store_->PublishFiles(3, *src).ok());
  EXPECT_TRUE(store_->ReadManifest(3).ok());
  // It had no lock (an older stitch's): the publish cleared it.
  EXPECT_EQ(Entries(root_ / "updates"), (std::set<std::string>{"weight_v000003"}));
}

// Forks a process that publishes `src` as `version` into the store at
// `root` and stops just before its staging directory is renamed into place,
// holding everything a live publisher holds. Returns its pid once it got
// there; it runs until killed.
pid_t StartStuckPublisher(const fs::path& root, const fs::path& src, int64_t version) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    auto store = FsStore::Open(root, "run-a");
    if (!store.ok()) std::_Exit(1);
    (*store)->SetBeforeRenameForTesting([fd = ready[1]] {
      char c = 'r';
      if (::write(fd, &c, 1) != 1) std::_Exit(1);
      for (;;) ::pause();
    });
    (void)(*store)->PublishFiles(version, src);
    std::_Exit(1);
  }
  ::close(ready[1]);
  char c;
  const bool reached = pid > 0 && ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  return reached ? pid : -1;
}

std::set<std::string> StagingEntries(const fs::path& updates) {
  std::set<std::string> out;
  for (const std::string& name : Entries(updates)) {
    if (name.starts_with(".")) out.insert(name);
  }
  return out;
}

TEST_F(FsStoreTest, AKilledPublishersStagingIsRemovedAndALiveOnesIsKept) {
  Claim();
  auto big = WriteTestVersion(tmp_ / "src", 5, {.elements = 1 << 14});
  ASSERT_TRUE(big.ok());
  pid_t publisher = StartStuckPublisher(root_, *big, 5);
  ASSERT_GT(publisher, 0);
  // Alive, mid-publish: its staging directory and lock are there, and no
  // cleaner touches them, however often it runs.
  std::set<std::string> staging = StagingEntries(root_ / "updates");
  ASSERT_EQ(staging.size(), 2u) << ::testing::PrintToString(staging);
  auto other = FsStore::Open(root_, "run-a");
  ASSERT_TRUE(other.ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*(*other)->RemoveAbandonedStaging(), 0);
  auto src = WriteTestVersion(tmp_ / "src2", 6);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE((*other)->PublishFiles(6, *src).ok());  // a publish cleans too
  EXPECT_EQ(StagingEntries(root_ / "updates"), staging);

  // Killed: nobody holds the lock any more, so the next cleaner removes both.
  ASSERT_EQ(::kill(publisher, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(publisher, &status, 0), publisher);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(*(*other)->RemoveAbandonedStaging(), 1);
  EXPECT_THAT(StagingEntries(root_ / "updates"), ::testing::IsEmpty());
  // The version the killed publisher never finished publishes normally.
  ASSERT_TRUE(store_->PublishFiles(5, *big).ok());
  EXPECT_EQ(Entries(root_ / "updates"),
            (std::set<std::string>{"weight_v000005", "weight_v000006"}));
}

TEST_F(FsStoreTest, APublishThatFailsLeavesNoStagingBehind) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  store_->SetBeforeRenameForTesting([&] {
    // Someone else published other bytes under the same version meanwhile.
    auto other = WriteTestVersion(tmp_ / "other", 1, {.seed = 7});
    ASSERT_TRUE(other.ok());
    auto second = FsStore::Open(root_, "run-a");
    ASSERT_TRUE(second.ok());
    ASSERT_TRUE((*second)->PublishFiles(1, *other).ok());
  });
  EXPECT_TRUE(absl::IsAlreadyExists(store_->PublishFiles(1, *src)));
  EXPECT_EQ(Entries(root_ / "updates"), (std::set<std::string>{"weight_v000001"}));
}

TEST_F(FsStoreTest, ChangedByteInAPublishedShardIsRefused) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store_->PublishFiles(1, *src).ok());
  // Same names and sizes, one byte different at the end.
  fs::path shard = *src / "model-00002-of-00002.safetensors";
  std::string bytes = *ReadFileToString(shard);
  bytes.back() ^= 1;
  ASSERT_TRUE(WriteFileAtomically(shard, bytes).ok());
  absl::Status s = store_->PublishFiles(1, *src);
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("immutable"));
}

TEST_F(FsStoreTest, ExtraFileInAPublishedVersionMakesItDifferent) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store_->PublishFiles(1, *src).ok());
  ASSERT_TRUE(WriteFileAtomically(root_ / "updates/weight_v000001/extra.bin", "x").ok());
  absl::Status s = store_->PublishFiles(1, *src);
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("extra.bin"));
}

TEST_F(FsStoreTest, HiddenEntriesInAPublishedVersionAreNotPartOfIt) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store_->PublishFiles(1, *src).ok());
  fs::create_directories(root_ / "updates/weight_v000001/.cache");
  ASSERT_TRUE(WriteFileAtomically(root_ / "updates/weight_v000001/.cache/lock", "x").ok());
  EXPECT_TRUE(store_->PublishFiles(1, *src).ok());
}

TEST_F(FsStoreTest, CorruptStoredIndexIsDataLoss) {
  Claim();
  ASSERT_TRUE(fs::create_directories(root_ / "updates" / "weight_v000004"));
  ASSERT_TRUE(
      WriteFileAtomically(root_ / "updates/weight_v000004/model.safetensors.index.json", "[1]")
          .ok());
  auto m = store_->ReadManifest(4);
  EXPECT_TRUE(absl::IsDataLoss(m.status())) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("weight_v000004"));
}

// A store opened with the bounds of a base checkpoint refuses an index
// listing more tensors than a version of it can hold, and one larger than
// its byte bound before reading it; the defaults accept the first.
TEST_F(FsStoreTest, AnIndexBeyondWhatTheBaseCheckpointCanHoldIsDataLoss) {
  Claim();
  CheckpointIndex base;
  base.weight_map = {{"embed.weight", "model.safetensors"}, {"norm.weight", "model.safetensors"}};
  auto bounded = FsStore::Open(root_, "run-a", IndexBoundsFor(base));
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  const fs::path dir = root_ / "updates" / "weight_v000004";
  ASSERT_TRUE(fs::create_directories(dir));
  CheckpointIndex many;
  many.metadata["version"] = "000004";
  for (int i = 0; i < 1000; ++i) {
    many.weight_map[absl::StrCat("layer.", i, ".weight")] = "model.safetensors";
  }
  ASSERT_TRUE(WriteFileAtomically(dir / "model.safetensors.index.json", many.ToJson()).ok());
  EXPECT_TRUE(store_->ReadManifest(4).ok());
  auto refused = (*bounded)->ReadManifest(4);
  EXPECT_TRUE(absl::IsDataLoss(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("weight_v000004 has a bad index: checkpoint index: weight_map lists 1000 "
                        "tensors, above the limit of 20"));

  // 64 MiB of index for a model of two tensors: refused by its size.
  ASSERT_TRUE(WriteFileAtomically(dir / "model.safetensors.index.json",
                                  std::string(size_t{64} << 20, ' ') + many.ToJson())
                  .ok());
  auto large = (*bounded)->ReadManifest(4);
  EXPECT_TRUE(absl::IsDataLoss(large.status())) << large.status();
  EXPECT_THAT(std::string(large.status().message()), HasSubstr("bytes, above the limit of"));
  EXPECT_THAT(std::string(large.status().message()), HasSubstr("lists 2 tensors"));
}

TEST_F(FsStoreTest, StoredIndexOfAnotherVersionIsDataLoss) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 5);
  ASSERT_TRUE(src.ok());
  fs::rename(*src, root_ / "updates" / "weight_v000006");
  EXPECT_TRUE(absl::IsDataLoss(store_->ReadManifest(6).status()));
}

TEST_F(FsStoreTest, MaterializeNoticesAMissingPayloadFile) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store_->PublishFiles(1, *src).ok());
  auto dir = store_->Materialize(1);
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(*dir, root_ / "updates" / "weight_v000001");
  fs::remove(*dir / "model-00001-of-00002.safetensors");
  auto again = store_->Materialize(1);
  EXPECT_TRUE(absl::IsDataLoss(again.status())) << again.status();
}

TEST_F(FsStoreTest, TwoHandlesSeeEachOthersWrites) {
  auto other = FsStore::Open(root_, "run-a");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->AdvancePointer(std::nullopt, VersionRef{"run-a", 0}).ok());
  EXPECT_EQ(*store_->ReadPointer(), (VersionRef{"run-a", 0}));
  absl::Status s = store_->AdvancePointer(std::nullopt, VersionRef{"run-a", 1});
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kPointerConflict) << s;
}

// Someone with write access to the store (never `publish`, which refuses
// links) puts links into a published version: the replica's reads refuse
// them rather than read another file of its host.
TEST_F(FsStoreTest, LinksInAPublishedVersionAreRefusedWhenRead) {
  Claim();
  auto src = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_TRUE(store_->PublishFiles(1, *src).ok());
  ASSERT_TRUE(store_->Materialize(1).ok());
  const fs::path dir = store_->VersionDir(1);
  const std::string shard = stitch::testing::TestShardName({}, 0);
  fs::remove(dir / shard);
  fs::create_symlink("/etc/passwd", dir / shard);
  auto materialized = store_->Materialize(1);
  EXPECT_TRUE(absl::IsDataLoss(materialized.status())) << materialized.status();
  EXPECT_THAT(std::string(materialized.status().message()),
              HasSubstr(shard + " is a symbolic link"));
  EXPECT_THAT(std::string(materialized.status().message()), Not(HasSubstr("root")));

  // A version directory that is a link to a directory outside the store.
  auto outside = WriteTestVersion(tmp_ / "outside", 2);
  ASSERT_TRUE(outside.ok()) << outside.status();
  fs::create_symlink(*outside, store_->VersionDir(2));
  auto manifest = store_->ReadManifest(2);
  EXPECT_TRUE(absl::IsDataLoss(manifest.status())) << manifest.status();
  EXPECT_THAT(std::string(manifest.status().message()), HasSubstr("is a symbolic link"));
  EXPECT_FALSE(store_->Materialize(2).ok());
  // The index itself.
  auto third = WriteTestVersion(tmp_ / "third", 3);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE(store_->PublishFiles(3, *third).ok());
  fs::remove(store_->VersionDir(3) / "model.safetensors.index.json");
  fs::create_symlink(*third / "model.safetensors.index.json",
                     store_->VersionDir(3) / "model.safetensors.index.json");
  EXPECT_TRUE(absl::IsDataLoss(store_->ReadManifest(3).status()));
}

}  // namespace
}  // namespace stitch
