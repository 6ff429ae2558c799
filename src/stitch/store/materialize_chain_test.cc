#include "stitch/store/materialize_chain.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/store/mem_store.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

// A version directory whose index is FULL (base < 0) or a DELTA on `base`,
// with one payload file.
fs::path WriteVersion(const fs::path& parent, int64_t version, int64_t base) {
  fs::path dir = parent / VersionDirName(version);
  fs::create_directories(dir);
  CheckpointIndex index;
  index.metadata["version"] = VersionMetadataString(version);
  if (base >= 0) {
    index.metadata["delta_encoding"] = "xor";
    index.metadata["compression_format"] = "zstd";
    index.metadata["checksum_format"] = "xxh3-128";
    index.metadata["base_version"] = VersionMetadataString(base);
  }
  index.weight_map["w"] = "part.safetensors";
  EXPECT_TRUE(WriteFileAtomically(dir / "part.safetensors", absl::StrCat("v", version)).ok());
  EXPECT_TRUE(WriteIndex(dir, index).ok());
  return dir;
}

class MaterializeChainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    auto store = MemStore::Open(absl::StrCat("chain-", info->name()), "run-a", tmp_ / "cache");
    ASSERT_TRUE(store.ok());
    store_ = *std::move(store);
  }
  void Publish(int64_t version, int64_t base) {
    ASSERT_TRUE(store_->PublishFiles(version, WriteVersion(tmp_ / "src", version, base)).ok());
  }
  testing::TempDir tmp_;
  std::unique_ptr<MemStore> store_;
};

TEST_F(MaterializeChainTest, WalksBackToTheNearestFullVersion) {
  Publish(1, -1);
  Publish(2, 1);
  Publish(3, -1);
  Publish(4, 3);
  Publish(5, 4);
  auto chain = MaterializeChain(*store_, 5, std::nullopt);
  ASSERT_TRUE(chain.ok()) << chain.status().message();
  ASSERT_EQ(chain->size(), 3u);
  EXPECT_EQ((*chain)[0].version, 3);
  EXPECT_EQ((*chain)[0].manifest.kind, VersionKind::kFull);
  EXPECT_EQ((*chain)[2].version, 5);
  auto bytes = ReadFileToString((*chain)[2].dir / "part.safetensors");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, "v5");
}

TEST_F(MaterializeChainTest, StopsAtWhatTheCallerHolds) {
  Publish(1, 0);  // a delta on the boot checkpoint, version 0
  Publish(2, 1);
  Publish(3, 2);
  auto from_boot = MaterializeChain(*store_, 3, 0);
  ASSERT_TRUE(from_boot.ok()) << from_boot.status().message();
  ASSERT_EQ(from_boot->size(), 3u);
  EXPECT_EQ(from_boot->front().version, 1);
  auto from_two = MaterializeChain(*store_, 3, 2);
  ASSERT_TRUE(from_two.ok());
  ASSERT_EQ(from_two->size(), 1u);
  EXPECT_EQ(from_two->front().version, 3);
  auto nothing = MaterializeChain(*store_, 3, 3);
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->empty());
  EXPECT_TRUE(absl::IsInvalidArgument(MaterializeChain(*store_, 2, 3).status()));
  // Without a held version the chain needs version 0, which no store holds.
  auto unanchored = MaterializeChain(*store_, 3, std::nullopt);
  EXPECT_TRUE(absl::IsNotFound(unanchored.status())) << unanchored.status().message();
  EXPECT_TRUE(absl::StrContains(unanchored.status().message(), "weight_v000000"));
}

TEST_F(MaterializeChainTest, RefusesABrokenChain) {
  Publish(1, -1);
  Publish(3, 1);  // claims a base two versions back
  auto broken = MaterializeChain(*store_, 3, std::nullopt);
  EXPECT_TRUE(absl::IsDataLoss(broken.status())) << broken.status().message();
  auto missing = MaterializeChain(*store_, 7, std::nullopt);
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
}

TEST_F(MaterializeChainTest, StartsFromAnAnchorWrittenAfterTheFact) {
  for (int64_t v = 1; v <= 5; ++v) Publish(v, v - 1);  // DELTAs from the boot version 0
  Store* anchors = store_->anchors();
  ASSERT_NE(anchors, nullptr);
  EXPECT_EQ(anchors->anchors(), nullptr);
  const fs::path anchor_src = WriteVersion(tmp_ / "anchor", 3, -1);
  ASSERT_TRUE(WriteFileAtomically(anchor_src / "part.safetensors", "anchor of v3").ok());
  ASSERT_TRUE(anchors->PublishFiles(3, anchor_src).ok());
  auto listed = ListAnchors(*store_);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, std::vector<int64_t>{3});

  auto chain = MaterializeChain(*store_, 5, std::nullopt);
  ASSERT_TRUE(chain.ok()) << chain.status().message();
  ASSERT_EQ(chain->size(), 3u);
  EXPECT_EQ((*chain)[0].version, 3);
  EXPECT_TRUE((*chain)[0].anchor);
  EXPECT_EQ((*chain)[0].manifest.kind, VersionKind::kFull);
  EXPECT_FALSE((*chain)[1].anchor);
  auto bytes = ReadFileToString((*chain)[0].dir / "part.safetensors");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, "anchor of v3");
  // The anchored version itself is its anchor; what the caller holds past
  // the anchor needs no anchor.
  auto itself = MaterializeChain(*store_, 3, std::nullopt);
  ASSERT_TRUE(itself.ok());
  ASSERT_EQ(itself->size(), 1u);
  EXPECT_TRUE(itself->front().anchor);
  auto past = MaterializeChain(*store_, 5, 3);
  ASSERT_TRUE(past.ok());
  ASSERT_EQ(past->size(), 2u);
  EXPECT_EQ(past->front().version, 4);

  // Deleting an anchor obeys the store's pointer; once gone, the chain
  // walks back as before (here to the boot version, which no store holds).
  EXPECT_TRUE(absl::IsFailedPrecondition(anchors->DeleteVersion(3)));
  ASSERT_TRUE(store_->AdvancePointer(std::nullopt, VersionRef{"run-a", 5}).ok());
  ASSERT_TRUE(anchors->DeleteVersion(3).ok());
  EXPECT_TRUE(absl::IsNotFound(MaterializeChain(*store_, 5, std::nullopt).status()));
  auto from_boot = MaterializeChain(*store_, 5, 0);
  ASSERT_TRUE(from_boot.ok());
  EXPECT_EQ(from_boot->size(), 5u);
}

TEST_F(MaterializeChainTest, RefusesAnAnchorThatIsNotAFullCopyOfItsVersion) {
  for (int64_t v = 1; v <= 3; ++v) Publish(v, v - 1);
  ASSERT_TRUE(store_->anchors()->PublishFiles(2, WriteVersion(tmp_ / "anchor", 2, 1)).ok());
  auto chain = MaterializeChain(*store_, 3, std::nullopt);
  EXPECT_TRUE(absl::IsDataLoss(chain.status())) << chain.status().message();
}

TEST_F(MaterializeChainTest, RefusesAnAnchorOfOtherWeightsThanItsVersionRecords) {
  auto with_fingerprint = [&](const fs::path& dir, const std::string& fingerprint) {
    auto index = ReadIndex(dir);
    ASSERT_TRUE(index.ok());
    index->metadata[std::string(kWeightsFingerprintKey)] = fingerprint;
    ASSERT_TRUE(WriteIndex(dir, *index).ok());
  };
  Publish(1, 0);
  const fs::path two = WriteVersion(tmp_ / "src", 2, 1);
  with_fingerprint(two, std::string(32, 'a'));
  ASSERT_TRUE(store_->PublishFiles(2, two).ok());
  Publish(3, 2);
  const fs::path anchor = WriteVersion(tmp_ / "anchor", 2, -1);
  with_fingerprint(anchor, std::string(32, 'b'));
  ASSERT_TRUE(store_->anchors()->PublishFiles(2, anchor).ok());
  auto chain = MaterializeChain(*store_, 3, std::nullopt);
  EXPECT_TRUE(absl::IsDataLoss(chain.status())) << chain.status().message();
}

}  // namespace
}  // namespace stitch
