#include "stitch/publish/anchor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_verify.h"
#include "stitch/publish/publish.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/version_dir.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::stitch::testing::WriteTestVersion;
using ::testing::HasSubstr;

// A run published as FULL v1, then DELTAs: the weights of version v are
// WriteTestVersion's with seed v.
class AnchorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = FsStore::Open(tmp_ / "store", "run-a");
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
    ASSERT_TRUE(store_->AdvancePointer(std::nullopt, {"run-a", 0}).ok());
    const fs::path full = tmp_ / "full" / VersionDirName(1);
    fs::create_directories(full.parent_path());
    FullVersionOptions fo;
    fo.version = 1;
    fo.run_id = "run-a";
    ASSERT_TRUE(WriteFullVersion(Weights(1), full, fo).ok());
    ASSERT_TRUE(PublishVersion(*store_, full, nullptr).ok());
  }
  fs::path Weights(int64_t v) {
    auto dir = WriteTestVersion(tmp_ / "weights" / std::to_string(v), v,
                                {.elements = 4096, .seed = int(v)});
    EXPECT_TRUE(dir.ok());
    return *dir;
  }
  fs::path Delta(int64_t v) {
    const fs::path out = tmp_ / "deltas" / VersionDirName(v);
    fs::create_directories(out.parent_path());
    EncodeOptions o;
    o.version = v;
    o.run_id = "run-a";
    EXPECT_TRUE(EncodeDelta(Weights(v - 1), Weights(v), out, o).ok());
    return out;
  }
  void PublishDeltas(int64_t through) {
    for (int64_t v = 2; v <= through; ++v)
      ASSERT_TRUE(PublishVersion(*store_, Delta(v), nullptr).ok());
  }

  TempDir tmp_;
  std::unique_ptr<FsStore> store_;
};

TEST_F(AnchorTest, MeasuresTheChainBackToItsAnchor) {
  PublishDeltas(4);
  auto chain = MeasureChain(*store_, 4);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(chain->anchor, 1);
  EXPECT_TRUE(chain->anchor_in_store);
  EXPECT_EQ(chain->deltas, 3);
  EXPECT_GT(chain->anchor_bytes, 3u * 4096);
  EXPECT_GT(chain->delta_bytes, 0u);
  // The boot version is outside the store: the chain of v0 is its own anchor.
  auto boot = MeasureChain(*store_, 0);
  ASSERT_TRUE(boot.ok());
  EXPECT_EQ(boot->anchor, 0);
  EXPECT_FALSE(boot->anchor_in_store);
}

TEST_F(AnchorTest, TheBudgetCountsDeltasOrWeighsThemAgainstOneFull) {
  ChainSinceAnchor chain{
      .anchor = 1, .anchor_in_store = true, .deltas = 3, .delta_bytes = 90, .anchor_bytes = 100};
  EXPECT_FALSE(AnchorDue(chain, {}));
  EXPECT_TRUE(AnchorDue(chain, {.max_deltas = 3}));
  EXPECT_FALSE(AnchorDue(chain, {.max_deltas = 4}));
  EXPECT_FALSE(AnchorDue(chain, {.by_bytes = true}));
  chain.delta_bytes = 100;
  EXPECT_TRUE(AnchorDue(chain, {.by_bytes = true}));
  // An anchor of unknown size weighs against the size given, else nothing.
  chain.anchor_in_store = false;
  chain.anchor_bytes = 0;
  EXPECT_FALSE(AnchorDue(chain, {.by_bytes = true}));
  EXPECT_TRUE(AnchorDue(chain, {.by_bytes = true}, 80));
}

TEST_F(AnchorTest, WritesTheDeltasWeightsAsAFullWithTheSameFingerprint) {
  PublishDeltas(3);
  const fs::path delta = Delta(4);
  ASSERT_TRUE(WriteFileAtomically(delta / "config.json", R"({"model_type":"test"})").ok());
  auto full = WriteAnchorFor(*store_, delta, std::nullopt, tmp_ / "anchors");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(full->filename(), "weight_v000004");
  auto written = ReadVersionDir(*full, 4);
  ASSERT_TRUE(written.ok()) << written.status();
  auto want = ReadVersionDir(delta, 4);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(written->manifest.kind, VersionKind::kFull);
  ASSERT_FALSE(want->manifest.weights_fingerprint.empty());
  EXPECT_EQ(written->manifest.weights_fingerprint, want->manifest.weights_fingerprint);
  EXPECT_EQ(written->other_files, std::vector<std::string>{"config.json"});
  // Published, it is the new anchor: the chain behind it is empty.
  ASSERT_TRUE(PublishVersion(*store_, *full, nullptr).ok());
  auto chain = MeasureChain(*store_, 4);
  ASSERT_TRUE(chain.ok());
  EXPECT_EQ(chain->anchor, 4);
  EXPECT_EQ(chain->deltas, 0);
  // Every tensor matches the checksum the FULL records.
  auto verified = VerifyVersion(*full, std::nullopt, {});
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_TRUE(verified->checksums_verified);
}

TEST_F(AnchorTest, FromTheBaseCheckpointWhenTheStoreHoldsNoChain) {
  // A run whose chain starts at its boot version, outside the store: only
  // the base checkpoint can give the weights.
  auto other = FsStore::Open(tmp_ / "boot-store", "run-a");
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE((*other)->AdvancePointer(std::nullopt, {"run-a", 1}).ok());
  const fs::path delta = Delta(2);
  auto refused = WriteAnchorFor(**other, delta, std::nullopt, tmp_ / "a1");
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--base"));
  auto full = WriteAnchorFor(**other, delta, Weights(1), tmp_ / "a2");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(ReadVersionDir(*full, 2)->manifest.weights_fingerprint,
            ReadVersionDir(delta, 2)->manifest.weights_fingerprint);
}

TEST_F(AnchorTest, ADeltaOnOtherWeightsIsRefusedNotAnchored) {
  PublishDeltas(2);
  // Encoded against weights that are not version 2's.
  const fs::path out = tmp_ / "wrong" / VersionDirName(3);
  fs::create_directories(out.parent_path());
  EncodeOptions o;
  o.version = 3;
  o.run_id = "run-a";
  auto other_weights = WriteTestVersion(tmp_ / "other", 2, {.elements = 4096, .seed = 7});
  ASSERT_TRUE(other_weights.ok());
  ASSERT_TRUE(EncodeDelta(*other_weights, Weights(3), out, o).ok());
  auto full = WriteAnchorFor(*store_, out, std::nullopt, tmp_ / "anchors");
  EXPECT_FALSE(full.ok());
  EXPECT_EQ(GetErrorKind(full.status()), ErrorKind::kChecksumMismatch) << full.status();
}

}  // namespace
}  // namespace stitch
