// Weight patches (weight_patch.h): applied element by element the way an
// engine applies them, a patch takes the weights it starts from to exactly
// the target's bytes, and every bad input is refused without a file.
#include "stitch/delta/weight_patch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <boost/json/parse.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_test_util.h"
#include "stitch/format/safetensors.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
namespace json = boost::json;

using testing::BytesOf;
using testing::Nudge;
using testing::RandomTensor;
using testing::ScratchDir;
using testing::TestCheckpoint;
using testing::WriteCheckpoint;
using testing::WriteVersionChain;

TestCheckpoint Model() {
  TestCheckpoint c;
  c["model.embed_tokens.weight"] = RandomTensor(DType::kBF16, {300, 64}, 1, "a.safetensors");
  c["model.layers.0.self_attn.q_proj.weight"] =
      RandomTensor(DType::kBF16, {64, 64}, 2, "a.safetensors");
  c["model.layers.0.input_layernorm.weight"] = RandomTensor(DType::kF32, {64}, 3, "b.safetensors");
  c["model.positions"] = RandomTensor(DType::kI64, {9}, 4, "b.safetensors");
  c["model.flags"] = RandomTensor(DType::kU8, {5}, 5, "b.safetensors");
  return c;
}

bool IsAttention(const std::string& name) { return name.find("self_attn") != std::string::npos; }

class WeightPatchTest : public ::testing::Test {
 protected:
  // v0; v1 nudges attention only; v2 nudges everything; v3 attention again.
  void SetUp() override {
    versions_.push_back(Model());
    versions_.push_back(Nudge(versions_[0], 0.01, 11, IsAttention));
    versions_.push_back(Nudge(versions_[1], 0.01, 12));
    versions_.push_back(Nudge(versions_[2], 0.02, 13, IsAttention));
    ASSERT_NO_FATAL_FAILURE(WriteVersionChain(
        versions_, "run", [this](size_t v) { return Ckpt(v); },
        [this](size_t v) { return Delta(v); }));
  }

  fs::path Ckpt(size_t v) const { return dir_ / absl::StrCat("ckpt", v); }
  fs::path Delta(size_t v) const { return dir_ / VersionDirName(static_cast<int64_t>(v)); }
  std::vector<fs::path> Deltas(size_t from, size_t to) const {
    std::vector<fs::path> out;
    for (size_t v = from + 1; v <= to; ++v) out.push_back(Delta(v));
    return out;
  }
  // A directory materialized at `v`.
  fs::path Materialized(size_t v) {
    const fs::path out = dir_ / absl::StrCat("local", v);
    ApplyOptions o;
    o.anchor_version = 0;
    EXPECT_TRUE(MaterializeCheckpoint(Ckpt(0), Deltas(0, v), out, o).ok());
    return out;
  }
  WeightPatchOptions Options(int64_t from, int64_t to) const {
    WeightPatchOptions o;
    o.from = {"run", from};
    o.to = {"run", to};
    return o;
  }

  ScratchDir dir_;
  std::vector<TestCheckpoint> versions_;
};

// Applies `patch` to `weights` as an engine does: the elements at ::idx
// must be ::new ^ ::xor, and become ::new.
void ApplyPatch(const SafetensorsFile& patch, const json::object& meta,
                std::map<std::string, std::vector<std::byte>>& weights) {
  for (const auto& [name, info] : meta.at("tensors").as_object()) {
    const std::string tensor(name);
    ASSERT_TRUE(weights.contains(tensor)) << tensor;
    const TensorInfo* idx = patch.Find(absl::StrCat(tensor, "::idx"));
    const TensorInfo* x = patch.Find(absl::StrCat(tensor, "::xor"));
    const TensorInfo* n = patch.Find(absl::StrCat(tensor, "::new"));
    ASSERT_TRUE(idx != nullptr && x != nullptr && n != nullptr) << tensor;
    const size_t width = DTypeSize(x->dtype);
    const size_t k = patch.Data(*idx).size() / sizeof(int64_t);
    ASSERT_EQ(patch.Data(*x).size(), k * width);
    std::vector<std::byte>& bytes = weights[tensor];
    int64_t previous = -1;
    for (size_t i = 0; i < k; ++i) {
      int64_t at;
      std::memcpy(&at, patch.Data(*idx).data() + i * sizeof at, sizeof at);
      ASSERT_GT(at, previous) << tensor << ": positions ascend";
      previous = at;
      std::byte* element = bytes.data() + static_cast<size_t>(at) * width;
      for (size_t b = 0; b < width; ++b) {
        ASSERT_EQ(element[b], patch.Data(*n)[i * width + b] ^ patch.Data(*x)[i * width + b])
            << tensor << " element " << at << " is not the old version's";
        element[b] = patch.Data(*n)[i * width + b];
      }
    }
  }
}

TEST_F(WeightPatchTest, APatchOverAChainTakesTheOldWeightsToTheTargetsBytesExactly) {
  const fs::path local = Materialized(3);
  const fs::path out = dir_ / "patch.safetensors";
  absl::StatusOr<WeightPatchStats> stats =
      WriteWeightPatch(Deltas(1, 3), local, out, Options(1, 3));
  ASSERT_TRUE(stats.ok()) << stats.status();

  absl::StatusOr<SafetensorsFile> patch = SafetensorsFile::Open(out);
  ASSERT_TRUE(patch.ok()) << patch.status();
  const json::object meta =
      json::parse(patch->metadata().at(std::string(kWeightPatchMetadataKey))).as_object();
  EXPECT_EQ(meta.at("format").as_string(), kWeightPatchFormat);
  EXPECT_EQ(meta.at("from").as_string(), "run/weight_v000001");
  EXPECT_EQ(meta.at("to").as_string(), "run/weight_v000003");
  EXPECT_EQ(meta.at("shapes").as_object().size(), versions_[0].size());
  EXPECT_EQ(meta.at("shapes").at("model.embed_tokens.weight").as_array(), (json::array{300, 64}));

  // Only the elements that differ between v1 and v3, and all of them.
  uint64_t differing = 0, total = 0;
  for (const auto& [name, t] : versions_[3]) {
    const size_t width = DTypeSize(t.dtype);
    const std::vector<std::byte>& before = versions_[1].at(name).bytes;
    for (size_t off = 0; off < t.bytes.size(); off += width) {
      differing += std::memcmp(before.data() + off, t.bytes.data() + off, width) != 0;
    }
    total += t.bytes.size() / width;
  }
  EXPECT_EQ(stats->values_changed, differing);
  EXPECT_EQ(stats->values_total, total);
  EXPECT_EQ(meta.at("values_changed").as_int64(), static_cast<int64_t>(differing));
  EXPECT_EQ(stats->tensors, versions_[0].size());

  std::map<std::string, std::vector<std::byte>> weights = BytesOf(versions_[1]);
  ASSERT_NO_FATAL_FAILURE(ApplyPatch(*patch, meta, weights));
  EXPECT_EQ(weights, BytesOf(versions_[3]));
  for (const auto& [name, info] : meta.at("tensors").as_object()) {
    const std::vector<std::byte>& bytes = weights.at(std::string(name));
    EXPECT_EQ(info.at("checksum").as_string(), Xxh3Checksum(bytes).ToHex()) << name;
  }
}

TEST_F(WeightPatchTest, OneDeltaPatchesOnlyTheTensorsItChanges) {
  const fs::path out = dir_ / "patch.safetensors";
  absl::StatusOr<WeightPatchStats> stats =
      WriteWeightPatch(Deltas(0, 1), Materialized(1), out, Options(0, 1));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->tensors, 1u);
  absl::StatusOr<SafetensorsFile> patch = SafetensorsFile::Open(out);
  ASSERT_TRUE(patch.ok());
  const json::object meta =
      json::parse(patch->metadata().at(std::string(kWeightPatchMetadataKey))).as_object();
  std::map<std::string, std::vector<std::byte>> weights = BytesOf(versions_[0]);
  ASSERT_NO_FATAL_FAILURE(ApplyPatch(*patch, meta, weights));
  EXPECT_EQ(weights, BytesOf(versions_[1]));
}

TEST_F(WeightPatchTest, WhatAWriterThatCrashedLeftIsRemoved) {
  const fs::path out = dir_ / "patch.safetensors";
  const fs::path torn = TempSiblingPath(out);
  ASSERT_TRUE(WriteFileAtomically(torn, "half a patch").ok());
  ASSERT_TRUE(WriteWeightPatch(Deltas(0, 1), Materialized(1), out, Options(0, 1)).ok());
  EXPECT_FALSE(fs::exists(torn));
  EXPECT_TRUE(fs::exists(out));
  std::vector<std::string> left;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_.path())) {
    if (e.path().filename().string().starts_with(".patch")) left.push_back(e.path().string());
  }
  EXPECT_TRUE(left.empty()) << left.front();
}

TEST_F(WeightPatchTest, ADensePatchIsRefusedAndNothingIsWritten) {
  const fs::path out = dir_ / "patch.safetensors";
  WeightPatchOptions o = Options(1, 3);
  o.max_density = 0.001;
  absl::StatusOr<WeightPatchStats> stats = WriteWeightPatch(Deltas(1, 3), Materialized(3), out, o);
  ASSERT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition) << stats.status();
  EXPECT_NE(stats.status().message().find("reload the whole checkpoint"), absl::string_view::npos);
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(WeightPatchTest, ATargetThatIsNotTheDeltasIsDataLoss) {
  const fs::path out = dir_ / "patch.safetensors";
  // Materialized at v2, claimed to be v3's.
  absl::StatusOr<WeightPatchStats> stats =
      WriteWeightPatch(Deltas(1, 3), Materialized(2), out, Options(1, 3));
  ASSERT_EQ(stats.status().code(), absl::StatusCode::kDataLoss) << stats.status();
  EXPECT_EQ(GetErrorKind(stats.status()), ErrorKind::kChecksumMismatch);
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(WeightPatchTest, AChainThatDoesNotRunFromTheEnginesVersionIsRefused) {
  const fs::path out = dir_ / "patch.safetensors";
  const fs::path local = Materialized(3);
  EXPECT_EQ(WriteWeightPatch(Deltas(1, 3), local, out, Options(0, 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteWeightPatch(Deltas(1, 3), local, out, Options(1, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<fs::path> gap = {Delta(1), Delta(3)};
  EXPECT_EQ(WriteWeightPatch(gap, local, out, Options(0, 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace stitch
