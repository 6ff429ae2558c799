// What only the in-memory store promises: sharing by name within a process,
// materializing into a cache directory, and its test hooks.
#include "stitch/store/mem_store.h"

#include <atomic>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/core/errors.h"
#include "stitch/io/fileio.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::stitch::testing::WriteTestVersion;
using ::testing::HasSubstr;

std::unique_ptr<MemStore> OpenMem(const std::string& name, const std::string& run,
                                  fs::path cache = {}) {
  auto s = MemStore::Open(name, run, std::move(cache));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

TEST(MemStoreTest, StoresOfOneNameShareTheirState) {
  auto a = OpenMem("share-1", "run-a");
  auto b = OpenMem("share-1", "run-a");
  auto other = OpenMem("share-2", "run-a");
  ASSERT_TRUE(a->AdvancePointer(std::nullopt, VersionRef{"run-a", 0}).ok());
  EXPECT_EQ(*b->ReadPointer(), (VersionRef{"run-a", 0}));
  EXPECT_EQ(*other->ReadPointer(), std::nullopt);
  EXPECT_EQ(a->uri(), "mem://share-1");
}

TEST(MemStoreTest, EmptyNameAndBadRunIdAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(MemStore::Open("", "run-a").status()));
  auto bad = MemStore::Open("x", "bad/run");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("mem://x"));
}

TEST(MemStoreTest, MaterializeNeedsACacheDirectory) {
  TempDir tmp;
  auto store = OpenMem("no-cache", "run-a");
  auto src = WriteTestVersion(tmp.path(), 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store->PublishFiles(1, *src).ok());
  auto dir = store->Materialize(1);
  EXPECT_TRUE(absl::IsFailedPrecondition(dir.status())) << dir.status();
  EXPECT_THAT(std::string(dir.status().message()), HasSubstr("cache_dir"));
}

TEST(MemStoreTest, MaterializeWritesTheFilesAndRepairsAStaleCopy) {
  TempDir tmp;
  auto store = OpenMem("materialize", "run-a", tmp / "cache");
  auto src = WriteTestVersion(tmp / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store->PublishFiles(1, *src).ok());
  auto dir = store->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(testing::VerifyVersionDir(*dir).ok());
  const std::string shard = "model-00001-of-00002.safetensors";
  EXPECT_EQ(*ReadFileToString(*dir / shard), *ReadFileToString(*src / shard));

  ASSERT_TRUE(WriteFileAtomically(*dir / shard, "stale").ok());
  auto again = store->Materialize(1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *dir);
  EXPECT_EQ(*ReadFileToString(*dir / shard), *ReadFileToString(*src / shard));
}

TEST(MemStoreTest, StoredVersionsDoNotDependOnTheSourceDirectory) {
  TempDir tmp;
  auto store = OpenMem("copied", "run-a", tmp / "cache");
  auto src = WriteTestVersion(tmp / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store->PublishFiles(1, *src).ok());
  fs::remove_all(*src);
  auto dir = store->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(testing::VerifyVersionDir(*dir).ok());
}

TEST(MemStoreTest, DroppedPayloadFileIsDataLoss) {
  TempDir tmp;
  auto store = OpenMem("dropped", "run-a", tmp / "cache");
  auto src = WriteTestVersion(tmp / "src", 1);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(store->PublishFiles(1, *src).ok());
  store->DropFileForTesting(1, "model-00002-of-00002.safetensors");
  EXPECT_TRUE(store->ReadManifest(1).ok());
  EXPECT_TRUE(absl::IsDataLoss(store->Materialize(1).status()));
}

TEST(MemStoreTest, ManyThreadsPublishingAndAdvancing) {
  TempDir tmp;
  constexpr int kThreads = 8;
  std::vector<fs::path> sources;
  for (int i = 0; i < kThreads; ++i) {
    auto src = WriteTestVersion(tmp / "src" / std::to_string(i), i + 1);
    ASSERT_TRUE(src.ok());
    sources.push_back(*src);
  }
  auto store = OpenMem("threads", "run-a", tmp / "cache");
  ASSERT_TRUE(store->AdvancePointer(std::nullopt, VersionRef{"run-a", 0}).ok());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto mine = OpenMem("threads", "run-a", tmp / "cache");
      if (!mine->PublishFiles(i + 1, sources[static_cast<size_t>(i)]).ok()) ++failures;
      // Everyone pushes the pointer forward until it is at or past its version.
      for (;;) {
        auto p = mine->ReadPointer();
        if (!p.ok()) {
          ++failures;
          return;
        }
        if ((*p)->version >= i + 1) break;
        absl::Status s = mine->AdvancePointer(*p, VersionRef{"run-a", i + 1});
        if (!s.ok() && GetErrorKind(s) != ErrorKind::kPointerConflict) {
          ++failures;
          return;
        }
      }
      if (!mine->Materialize(i + 1).ok()) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(*store->ReadPointer(), (VersionRef{"run-a", kThreads}));
}

}  // namespace
}  // namespace stitch
