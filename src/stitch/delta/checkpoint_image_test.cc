#include "stitch/delta/checkpoint_image.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "stitch/core/errors.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_test_util.h"
#include "stitch/format/checksum.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

using testing::BytesOf;
using testing::EditIndex;
using testing::Nudge;
using testing::PayloadEntry;
using testing::RandomTensor;
using testing::RewritePayloads;
using testing::ScratchDir;
using testing::TestCheckpoint;
using testing::WriteCheckpoint;
using testing::WriteVersionChain;

std::map<std::string, std::vector<std::byte>> BytesOf(const CheckpointImage& image) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, t] : image.tensors())
    out[name] = {t.data.span().begin(), t.data.span().end()};
  return out;
}

class CheckpointImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestCheckpoint c;
    // Several chunks long, so a failure can land in the middle of a tensor.
    c["big"] = RandomTensor(DType::kBF16, {5 * static_cast<int64_t>(kChunkBytes) / 2 + 17}, 1);
    c["mid"] = RandomTensor(DType::kF32, {4096, 3}, 2, "b.safetensors");
    c["small"] = RandomTensor(DType::kBF16, {9}, 3, "b.safetensors");
    c["still"] = RandomTensor(DType::kI32, {100}, 4, "b.safetensors");
    versions_.push_back(c);
    for (uint64_t v = 1; v <= 4; ++v) {
      versions_.push_back(
          Nudge(versions_.back(), 0.01, 10 + v, [](const std::string& n) { return n != "still"; }));
    }
    ASSERT_NO_FATAL_FAILURE(WriteVersionChain(
        versions_, "r", [this](size_t v) { return Ckpt(v); },
        [this](size_t v) { return Delta(v); }));
  }

  fs::path Ckpt(size_t v) const { return dir_ / absl::StrCat("ckpt", v); }
  fs::path Delta(size_t v) const { return dir_ / absl::StrCat("delta", v); }
  std::vector<fs::path> Deltas(size_t from, size_t to) const {
    std::vector<fs::path> out;
    for (size_t v = from; v <= to; ++v) out.push_back(Delta(v));
    return out;
  }
  CheckpointImage LoadV0() {
    absl::StatusOr<CheckpointImage> image = CheckpointImage::Load(Ckpt(0), {"r", std::nullopt, 2});
    EXPECT_TRUE(image.ok()) << image.status();
    return *std::move(image);
  }

  ScratchDir dir_;
  std::vector<TestCheckpoint> versions_;
};

TEST_F(CheckpointImageTest, LoadsAlignedBuffersAndTheVersion) {
  CheckpointImage image = LoadV0();
  ASSERT_TRUE(image.version().has_value());
  EXPECT_EQ(image.version()->ToString(), "r/weight_v000000");
  EXPECT_EQ(BytesOf(image), BytesOf(versions_[0]));
  for (const auto& [name, t] : image.tensors()) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data.data()) % 64, 0u) << name;
    EXPECT_EQ(t.dtype, versions_[0].at(name).dtype);
    EXPECT_EQ(t.shape, versions_[0].at(name).shape);
  }
}

TEST_F(CheckpointImageTest, AppliesChainsAndSkipsWhatItAlreadyHolds) {
  CheckpointImage image = LoadV0();
  ApplyOptions o;
  o.threads = 2;
  absl::StatusOr<ImageApplyResult> r = image.ApplyDeltas(Deltas(1, 2), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version.ToString(), "r/weight_v000002");
  EXPECT_EQ(r->deltas_applied, 2u);
  EXPECT_EQ(r->tensors_changed, 3u);
  EXPECT_EQ(BytesOf(image), BytesOf(versions_[2]));

  // Deltas 1 and 2 are already in the image.
  r = image.ApplyDeltas(Deltas(1, 4), o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deltas_applied, 2u);
  EXPECT_EQ(image.version()->version, 4);
  EXPECT_EQ(BytesOf(image), BytesOf(versions_[4]));

  // Going back needs an anchor.
  absl::Status s = image.ApplyDeltas(Deltas(1, 2), o).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(BytesOf(image), BytesOf(versions_[4]));
}

TEST_F(CheckpointImageTest, SwapExchangesContentsForDoubleBuffering) {
  CheckpointImage live = LoadV0();
  CheckpointImage staged = LoadV0();
  ASSERT_TRUE(staged.ApplyDeltas(Deltas(1, 1), {}).ok());
  live.Swap(staged);
  EXPECT_EQ(live.version()->version, 1);
  EXPECT_EQ(staged.version()->version, 0);
  // The staging image catches up over two deltas at once.
  ASSERT_TRUE(staged.ApplyDeltas(Deltas(1, 2), {}).ok());
  EXPECT_EQ(BytesOf(staged), BytesOf(versions_[2]));
  EXPECT_EQ(BytesOf(live), BytesOf(versions_[1]));
}

TEST_F(CheckpointImageTest, EncodesFromItsOwnViews) {
  CheckpointImage a = LoadV0();
  absl::StatusOr<CheckpointImage> b = CheckpointImage::Load(Ckpt(3), {"r", std::nullopt, 1});
  ASSERT_TRUE(b.ok());
  EncodeOptions o;
  o.version = 1;  // v0 -> v3 in one delta, published as version 1 of a new lineage
  o.base_version = 0;
  std::vector<TensorView> av = a.Views(), bv = b->Views();
  ASSERT_TRUE(EncodeDelta(av, bv, dir_ / "jump", o).ok());
  ASSERT_TRUE(a.ApplyDeltas(std::vector<fs::path>{dir_ / "jump"}, {}).ok());
  EXPECT_EQ(BytesOf(a), BytesOf(versions_[3]));
}

// Any failure leaves the image exactly as it was, including failures that
// happen after other tensors (or part of the same tensor) were changed.
class ImageFailureTest : public CheckpointImageTest, public ::testing::WithParamInterface<int> {};

TEST_P(ImageFailureTest, FailedApplyLeavesTheImageUnchanged) {
  const int threads = GetParam();
  struct Case {
    std::string name;
    std::function<void(PayloadEntry&)> edit;
    absl::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"truncated big frame",
       [](PayloadEntry& e) {
         if (e.tensor == "big") e.frame.resize(e.frame.size() * 3 / 4);
       },
       absl::StatusCode::kDataLoss},
      {"wrong checksum of small",
       [](PayloadEntry& e) {
         if (e.tensor == "small") e.checksum = Xxh3Checksum({}).ToHex();
       },
       absl::StatusCode::kDataLoss},
      {"wrong checksum of big",
       [](PayloadEntry& e) {
         if (e.tensor == "big") e.checksum = Xxh3Checksum({}).ToHex();
       },
       absl::StatusCode::kDataLoss},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    // Fresh deltas 3 and 4; the case breaks delta 4 only, so delta 3 folds
    // fine for the same tensors before the failure.
    for (size_t v : {3, 4}) {
      fs::remove_all(Delta(v));
      EncodeOptions o;
      o.version = static_cast<int64_t>(v);
      o.run_id = "r";
      ASSERT_TRUE(EncodeDelta(Ckpt(v - 1), Ckpt(v), Delta(v), o).ok());
    }
    RewritePayloads(Delta(4), c.edit);
    CheckpointImage image = LoadV0();
    ApplyOptions o;
    o.threads = threads;
    ASSERT_TRUE(image.ApplyDeltas(Deltas(1, 2), o).ok());
    absl::Status s = image.ApplyDeltas(Deltas(1, 4), o).status();
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(image.version()->version, 2);
    EXPECT_EQ(BytesOf(image), BytesOf(versions_[2]));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ImageFailureTest, ::testing::Values(1, 2, 4));

TEST_F(CheckpointImageTest, RefusesBrokenLineagesAndOtherRuns) {
  CheckpointImage image = LoadV0();
  absl::Status s = image.ApplyDeltas(Deltas(2, 3), {}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("gap"), std::string_view::npos) << s;

  ApplyOptions other;
  other.run_id = "q";
  s = image.ApplyDeltas(Deltas(1, 1), other).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;

  EditIndex(Delta(1), [](CheckpointIndex& i) { i.metadata["run_id"] = "q"; });
  s = image.ApplyDeltas(Deltas(1, 1), {}).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(BytesOf(image), BytesOf(versions_[0]));

  CheckpointImage empty;
  EXPECT_TRUE(absl::IsFailedPrecondition(empty.ApplyDeltas(Deltas(1, 1), {}).status()));
}

TEST_F(CheckpointImageTest, FromTensorsCopiesAndValidates) {
  std::vector<TensorView> views;
  for (const auto& [name, t] : versions_[1])
    views.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  absl::StatusOr<CheckpointImage> image = CheckpointImage::FromTensors(views, VersionRef{"r", 1});
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(BytesOf(*image), BytesOf(versions_[1]));
  ASSERT_TRUE(image->ApplyDeltas(Deltas(2, 2), {}).ok());
  EXPECT_EQ(BytesOf(*image), BytesOf(versions_[2]));

  views[0].shape = {1};
  EXPECT_TRUE(
      absl::IsInvalidArgument(CheckpointImage::FromTensors(views, VersionRef{"r", 1}).status()));
}

}  // namespace
}  // namespace stitch
