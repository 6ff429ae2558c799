// The Store contract, run against every adapter (filesystem and in-memory):
// what one adapter promises, the other must too.
#include <sys/stat.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::stitch::testing::TestVersionOptions;
using ::stitch::testing::WriteTestVersion;
using ::testing::HasSubstr;

// How the contract reaches one adapter.
struct Adapter {
  std::string name;
  // Opens the store under test for `run_id`: the same state for every call
  // with the same `tmp` and `key`, a fresh one otherwise.
  std::function<std::unique_ptr<Store>(const TempDir& tmp, const std::string& key,
                                       const std::string& run_id)>
      open;
  // Overwrites the stored pointer text behind the store's back.
  std::function<void(const TempDir&, Store&, const std::string& text)> write_pointer_text;
};

void PrintTo(const Adapter& adapter, std::ostream* os) { *os << adapter.name; }

std::string UniqueKey() {
  static std::atomic<int> counter{0};
  return "contract-" + std::to_string(counter++);
}

std::vector<Adapter> Adapters() {
  return {
      Adapter{"Fs",
              [](const TempDir& tmp, const std::string&,
                 const std::string& run) -> std::unique_ptr<Store> {
                auto s = FsStore::Open(tmp / "store", run);
                EXPECT_TRUE(s.ok()) << s.status();
                return s.ok() ? std::unique_ptr<Store>(*std::move(s)) : nullptr;
              },
              [](const TempDir& tmp, Store&, const std::string& text) {
                fs::create_directories(tmp / "store");
                ASSERT_TRUE(WriteFileAtomically(tmp / "store" / "latest", text).ok());
              }},
      Adapter{"Mem",
              [](const TempDir& tmp, const std::string& key,
                 const std::string& run) -> std::unique_ptr<Store> {
                auto s = MemStore::Open(key, run, tmp / "cache");
                EXPECT_TRUE(s.ok()) << s.status();
                return s.ok() ? std::unique_ptr<Store>(*std::move(s)) : nullptr;
              },
              [](const TempDir&, Store& store, const std::string& text) {
                static_cast<MemStore&>(store).SetPointerTextForTesting(text);
              }},
  };
}

class StoreContractTest : public ::testing::TestWithParam<Adapter> {
 protected:
  void SetUp() override {
    store_ = Open("run-a");
    ASSERT_NE(store_, nullptr);
  }
  std::unique_ptr<Store> Open(const std::string& run) { return GetParam().open(tmp_, key_, run); }
  // Writes a version directory in a fresh place outside the store.
  fs::path Version(int64_t v, TestVersionOptions options = {}) {
    auto dir = WriteTestVersion(tmp_ / "src" / std::to_string(sources_++), v, options);
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *dir : fs::path();
  }
  std::optional<VersionRef> Pointer() {
    auto p = store_->ReadPointer();
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : std::nullopt;
  }
  // Claims run-a at version 0: what makes the store exist.
  void Claim() { ASSERT_TRUE(store_->AdvancePointer(std::nullopt, VersionRef{"run-a", 0}).ok()); }

  TempDir tmp_;
  const std::string key_ = UniqueKey();
  int sources_ = 0;
  std::unique_ptr<Store> store_;
};

VersionRef A(int64_t v) { return VersionRef{"run-a", v}; }
VersionRef B(int64_t v) { return VersionRef{"run-b", v}; }

TEST_P(StoreContractTest, PointerStartsUnset) { EXPECT_EQ(Pointer(), std::nullopt); }

TEST_P(StoreContractTest, AdvanceFromUnsetThenForward) {
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, A(0)).ok());
  EXPECT_EQ(Pointer(), A(0));
  ASSERT_TRUE(store_->AdvancePointer(A(0), A(3)).ok());
  EXPECT_EQ(Pointer(), A(3));
}

TEST_P(StoreContractTest, RewindIsRefusedAndLeavesThePointer) {
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, A(5)).ok());
  for (int64_t v : {5, 4, 0}) {
    absl::Status s = store_->AdvancePointer(A(5), A(v));
    EXPECT_EQ(GetErrorKind(s), ErrorKind::kPointerRewind) << s;
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(store_->uri()));
  }
  EXPECT_EQ(Pointer(), A(5));
}

TEST_P(StoreContractTest, StaleExpectationIsAConflictWithAllThreeValues) {
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, A(1)).ok());
  ASSERT_TRUE(store_->AdvancePointer(A(1), A(2)).ok());
  absl::Status s = store_->AdvancePointer(A(1), A(3));
  ASSERT_EQ(GetErrorKind(s), ErrorKind::kPointerConflict) << s;
  EXPECT_TRUE(absl::IsAborted(s));
  auto details = GetConflictDetails(s);
  ASSERT_TRUE(details.has_value());
  EXPECT_EQ(details->expected, "run-a/weight_v000001");
  EXPECT_EQ(details->actual, "run-a/weight_v000002");
  EXPECT_EQ(details->proposed, "run-a/weight_v000003");
  EXPECT_EQ(Pointer(), A(2));
}

TEST_P(StoreContractTest, ExpectingUnsetWhenSetIsAConflict) {
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, A(1)).ok());
  absl::Status s = store_->AdvancePointer(std::nullopt, A(2));
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kPointerConflict) << s;
  EXPECT_EQ(Pointer(), A(1));
}

TEST_P(StoreContractTest, ProposingAnotherRunIsRefused) {
  absl::Status s = store_->AdvancePointer(std::nullopt, B(1));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("run-b"));
  EXPECT_EQ(Pointer(), std::nullopt);
}

TEST_P(StoreContractTest, MovingFromAnotherRunIsAResetEvenToALowerVersion) {
  auto other = Open("run-b");
  ASSERT_TRUE(other->AdvancePointer(std::nullopt, B(9)).ok());
  ASSERT_TRUE(store_->AdvancePointer(B(9), A(0)).ok());
  EXPECT_EQ(Pointer(), A(0));
}

TEST_P(StoreContractTest, GarbagePointerIsAnErrorNeverUnset) {
  GetParam().write_pointer_text(tmp_, *store_, "weight_vx");
  auto p = store_->ReadPointer();
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("weight_vx"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(store_->uri()));
  // Nor may a compare-and-swap treat it as unset.
  EXPECT_FALSE(store_->AdvancePointer(std::nullopt, A(0)).ok());
}

TEST_P(StoreContractTest, WhitespaceOnlyPointerIsUnset) {
  GetParam().write_pointer_text(tmp_, *store_, " \n\t");
  EXPECT_EQ(Pointer(), std::nullopt);
  EXPECT_TRUE(store_->AdvancePointer(std::nullopt, A(0)).ok());
}

TEST_P(StoreContractTest, PointerTextWithNewlineParses) {
  GetParam().write_pointer_text(tmp_, *store_, "run-a/weight_v000004\n");
  EXPECT_EQ(Pointer(), A(4));
}

TEST_P(StoreContractTest, PublishThenReadManifestAndMaterialize) {
  Claim();
  fs::path src = Version(1);
  ASSERT_TRUE(store_->PublishFiles(1, src).ok());
  auto m = store_->ReadManifest(1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, 1);
  EXPECT_EQ(m->kind, VersionKind::kFull);
  EXPECT_THAT(m->files, ::testing::ElementsAre("model-00001-of-00002.safetensors",
                                               "model-00002-of-00002.safetensors"));
  auto dir = store_->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(testing::VerifyVersionDir(*dir).ok());
  for (const std::string& f : m->files) {
    EXPECT_EQ(*ReadFileToString(*dir / f), *ReadFileToString(src / f)) << f;
  }
}

TEST_P(StoreContractTest, PublishingDoesNotMoveThePointer) {
  Claim();
  ASSERT_TRUE(store_->PublishFiles(1, Version(1)).ok());
  EXPECT_EQ(Pointer(), A(0));
}

TEST_P(StoreContractTest, AStoreExistsOnceClaimed) {
  auto missing = ReadClaimedPointer(*store_);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status())) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("store " + store_->uri() + " does not exist"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("`stitch claim`"));
  Claim();
  auto claimed = ReadClaimedPointer(*store_);
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_EQ(*claimed, A(0));
  // Another handle, and a read-only view, see the same store.
  EXPECT_EQ(*ReadClaimedPointer(*Open("run-b")), A(0));
  EXPECT_EQ(*ReadClaimedPointer(*Open("")), A(0));
}

TEST_P(StoreContractTest, RepublishingIdenticalBytesIsARetry) {
  Claim();
  ASSERT_TRUE(store_->PublishFiles(1, Version(1)).ok());
  // A second, byte-identical copy elsewhere.
  EXPECT_TRUE(store_->PublishFiles(1, Version(1)).ok());
}

TEST_P(StoreContractTest, RepublishingDifferentBytesIsRefused) {
  Claim();
  fs::path first = Version(1, {.seed = 1});
  ASSERT_TRUE(store_->PublishFiles(1, first).ok());
  absl::Status s = store_->PublishFiles(1, Version(1, {.seed = 2}));
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("immutable"));
  auto dir = store_->Materialize(1);
  ASSERT_TRUE(dir.ok());
  EXPECT_EQ(*ReadFileToString(*dir / "model-00001-of-00002.safetensors"),
            *ReadFileToString(first / "model-00001-of-00002.safetensors"));
}

TEST_P(StoreContractTest, RepublishingADifferentFileSetIsRefused) {
  Claim();
  ASSERT_TRUE(store_->PublishFiles(1, Version(1, {.shards = 2})).ok());
  absl::Status s = store_->PublishFiles(1, Version(1, {.shards = 3, .seed = 1}));
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
}

TEST_P(StoreContractTest, MissingShardIsRefusedAndNothingIsPublished) {
  Claim();
  fs::path src = Version(1);
  fs::remove(src / "model-00002-of-00002.safetensors");
  absl::Status s = store_->PublishFiles(1, src);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(1).status()));
}

TEST_P(StoreContractTest, LinksAndSpecialFilesAreRefusedAndNothingIsPublished) {
  Claim();
  fs::path src = Version(1);
  const std::string shard = "model-00001-of-00002.safetensors";
  fs::remove(src / shard);
  fs::create_symlink("/etc/passwd", src / shard);
  absl::Status s = store_->PublishFiles(1, src);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"" + shard + "\" is a symbolic link"));

  fs::remove(src / shard);
  ASSERT_EQ(::mkfifo((src / shard).c_str(), 0644), 0);
  s = store_->PublishFiles(1, src);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("is a FIFO"));

  // The index is copied too: it may not be a link either.
  fs::path other = Version(2);
  fs::rename(other / "model.safetensors.index.json", tmp_ / "index.json");
  fs::create_symlink(tmp_ / "index.json", other / "model.safetensors.index.json");
  s = store_->PublishFiles(2, other);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(1).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(2).status()));
}

TEST_P(StoreContractTest, IndexVersionMustMatch) {
  Claim();
  fs::path src = Version(1);
  absl::Status s = store_->PublishFiles(2, src);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("metadata.version 1"));
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(2).status()));
}

TEST_P(StoreContractTest, IndexWithoutVersionIsStoredWithIt) {
  Claim();
  ASSERT_TRUE(store_->PublishFiles(7, Version(7, {.record_version = false})).ok());
  auto m = store_->ReadManifest(7);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, 7);
}

TEST_P(StoreContractTest, PayloadInSubdirectory) {
  Claim();
  ASSERT_TRUE(store_->PublishFiles(1, Version(1, {.file_prefix = "shards/"})).ok());
  auto dir = store_->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(fs::is_regular_file(*dir / "shards" / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(testing::VerifyVersionDir(*dir).ok());
}

// What an engine reloading a version directory reads besides the weights.
void WriteOtherFiles(const fs::path& dir,
                     const std::string& config = R"({"model_type": "llama"})") {
  ASSERT_TRUE(WriteFileAtomically(dir / "config.json", config).ok());
  ASSERT_TRUE(WriteFileAtomically(dir / "generation_config.json", R"({"do_sample": true})").ok());
  ASSERT_TRUE(WriteFileAtomically(dir / "tokenizer.json", R"({"model": {}})").ok());
  ASSERT_TRUE(WriteFileAtomically(dir / "tokenizer_config.json", "{}").ok());
  fs::create_directories(dir / "extra");
  ASSERT_TRUE(WriteFileAtomically(dir / "extra" / "chat_template.jinja", "{{ x }}").ok());
}

TEST_P(StoreContractTest, APublishedVersionCarriesItsConfigAndTokenizerFiles) {
  Claim();
  fs::path src = Version(1);
  WriteOtherFiles(src);
  ASSERT_TRUE(store_->PublishFiles(1, src).ok());
  auto dir = store_->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "extra/chat_template.jinja"}) {
    EXPECT_EQ(*ReadFileToString(*dir / f), *ReadFileToString(src / f)) << f;
  }
  // They are not weights: the manifest names the payload only.
  EXPECT_THAT(store_->ReadManifest(1)->files,
              ::testing::ElementsAre("model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"));
}

TEST_P(StoreContractTest, HiddenFilesAreNotPartOfAVersion) {
  Claim();
  fs::path src = Version(1);
  ASSERT_TRUE(WriteFileAtomically(src / ".gitattributes", "*.safetensors lfs").ok());
  fs::create_directories(src / ".cache" / "huggingface");
  fs::create_symlink("/etc/passwd", src / ".cache" / "huggingface" / "link");
  ASSERT_TRUE(store_->PublishFiles(1, src).ok());
  auto dir = store_->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_FALSE(fs::exists(*dir / ".gitattributes"));
  EXPECT_FALSE(fs::exists(*dir / ".cache"));
  // The same weights without them are the same version.
  EXPECT_TRUE(store_->PublishFiles(1, Version(1)).ok());
}

TEST_P(StoreContractTest, RepublishingWithAnotherConfigIsRefusedNamingIt) {
  Claim();
  fs::path first = Version(1);
  WriteOtherFiles(first);
  ASSERT_TRUE(store_->PublishFiles(1, first).ok());
  fs::path same = Version(1);
  WriteOtherFiles(same);
  EXPECT_TRUE(store_->PublishFiles(1, same).ok());
  fs::path other = Version(1);
  WriteOtherFiles(other, R"({"model_type": "qwen3"})");
  absl::Status s = store_->PublishFiles(1, other);
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("config.json"));
  s = store_->PublishFiles(1, Version(1));  // without them
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("config.json"));
}

TEST_P(StoreContractTest, ALinkOrSpecialFileAmongTheOtherFilesIsRefused) {
  Claim();
  fs::path src = Version(1);
  fs::create_symlink("/etc/passwd", src / "tokenizer.json");
  absl::Status s = store_->PublishFiles(1, src);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"tokenizer.json\" is a symbolic link"));
  fs::remove(src / "tokenizer.json");
  ASSERT_EQ(::mkfifo((src / "vocab.txt").c_str(), 0644), 0);
  s = store_->PublishFiles(1, src);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"vocab.txt\" is a FIFO"));
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(1).status()));
}

TEST_P(StoreContractTest, UnknownVersionIsNotFound) {
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(3).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->Materialize(3).status()));
}

TEST_P(StoreContractTest, ViewWithoutRunIdReadsButNeverWrites) {
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, A(0)).ok());
  ASSERT_TRUE(store_->PublishFiles(1, Version(1)).ok());
  auto view = Open("");
  ASSERT_NE(view, nullptr);
  EXPECT_EQ(*view->ReadPointer(), A(0));
  EXPECT_TRUE(view->ReadManifest(1).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(view->AdvancePointer(A(0), A(1))));
  EXPECT_TRUE(absl::IsInvalidArgument(view->PublishFiles(2, Version(2))));
  EXPECT_EQ(Pointer(), A(0));
}

TEST_P(StoreContractTest, ConcurrentAdvancesFromOnePredecessorHaveOneWinner) {
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, A(1)).ok());
  constexpr int kThreads = 8;
  std::atomic<int> winners{0};
  std::atomic<int> conflicts{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      auto store = Open("run-a");
      while (!go.load()) std::this_thread::yield();
      absl::Status s = store->AdvancePointer(A(1), A(2 + i));
      if (s.ok()) ++winners;
      if (GetErrorKind(s) == ErrorKind::kPointerConflict) ++conflicts;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners.load(), 1);
  EXPECT_EQ(conflicts.load(), kThreads - 1);
}

// --- Retention (store.h) ------------------------------------------------

// Publishes versions 1..n over a claim at 0 and moves the pointer to n.
void PublishUpTo(Store& store, int64_t n, const std::function<fs::path(int64_t)>& version) {
  for (int64_t v = 1; v <= n; ++v) {
    ASSERT_TRUE(store.PublishFiles(v, version(v)).ok()) << v;
    ASSERT_TRUE(store.AdvancePointer(A(v - 1), A(v)).ok()) << v;
  }
}

TEST_P(StoreContractTest, ListsAndDeletesVersionsBelowThePointerOnly) {
  Claim();
  PublishUpTo(*store_, 3, [&](int64_t v) { return Version(v); });
  ASSERT_TRUE(store_->PublishFiles(4, Version(4)).ok());  // published, pointer not moved yet
  EXPECT_THAT(*store_->ListVersions(), ::testing::ElementsAre(1, 2, 3, 4));

  for (int64_t v : {3, 4, 9}) {
    absl::Status s = store_->DeleteVersion(v);
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << v << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("never deleted"));
  }
  ASSERT_TRUE(store_->DeleteVersion(2).ok());
  EXPECT_TRUE(absl::IsNotFound(store_->ReadManifest(2).status()));
  EXPECT_TRUE(absl::IsNotFound(store_->Materialize(2).status()));
  // Deleting what is gone is what a second gc does: fine.
  EXPECT_TRUE(store_->DeleteVersion(2).ok());
  EXPECT_THAT(*store_->ListVersions(), ::testing::ElementsAre(1, 3, 4));
  // The rest is untouched.
  auto dir = store_->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_TRUE(testing::VerifyVersionDir(*dir).ok());
}

TEST_P(StoreContractTest, DeletingRefusesAStoreWhosePointerNamesAnotherRun) {
  Claim();
  PublishUpTo(*store_, 2, [&](int64_t v) { return Version(v); });
  auto other = Open("run-b");
  ASSERT_TRUE(other->AdvancePointer(A(2), B(5)).ok());
  absl::Status s = store_->DeleteVersion(1);
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("run-b"));
  EXPECT_TRUE(store_->ReadManifest(1).ok());
}

TEST_P(StoreContractTest, RecordsRoundTripAndRefuseBadNames) {
  EXPECT_TRUE(absl::IsFailedPrecondition(store_->WriteRecord("holds", "eval", "{}")));
  Claim();
  ASSERT_TRUE(store_->WriteRecord("holds", "eval", "one").ok());
  ASSERT_TRUE(store_->WriteRecord("holds", "eval", "two").ok());  // replaces
  ASSERT_TRUE(store_->WriteRecord("holds", "a-b.c_d", "three").ok());
  EXPECT_THAT(*store_->ListRecords("holds"), ::testing::ElementsAre("a-b.c_d", "eval"));
  EXPECT_EQ(*store_->ReadRecord("holds", "eval"), std::optional<std::string>("two"));
  EXPECT_EQ(*store_->ReadRecord("holds", "none"), std::nullopt);
  EXPECT_TRUE(store_->ListRecords("gc")->empty());
  ASSERT_TRUE(store_->DeleteRecord("holds", "eval").ok());
  EXPECT_TRUE(store_->DeleteRecord("holds", "eval").ok());
  EXPECT_THAT(*store_->ListRecords("holds"), ::testing::ElementsAre("a-b.c_d"));
  for (const char* bad : {"", ".hidden", "a/b", "../x", "sp ace"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(store_->WriteRecord("holds", bad, "x"))) << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(store_->ReadRecord(bad, "x").status())) << bad;
  }
}

INSTANTIATE_TEST_SUITE_P(Adapters, StoreContractTest, ::testing::ValuesIn(Adapters()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace stitch
