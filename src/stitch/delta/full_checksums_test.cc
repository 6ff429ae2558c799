// FULL versions carry per-tensor checksums (issue 16): what the writers
// record, the one function that reads them back, and every reader that
// checks them (verify, materialize from a FULL anchor, the in-memory
// image). Also: the encoder never assumes its base's version, the index is
// bounded, and a payload file can be checked on its own.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/checkpoint_image.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_test_util.h"
#include "stitch/delta/delta_verify.h"
#include "stitch/format/checksum.h"
#include "stitch/format/tensor_checksums.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

using testing::BytesOf;
using testing::Nudge;
using testing::RandomTensor;
using testing::ReadTensors;
using testing::ScratchDir;
using testing::TestCheckpoint;
using testing::WriteCheckpoint;

// Two files; an empty tensor; one tensor larger than a codec chunk.
TestCheckpoint Model(uint64_t seed = 1) {
  TestCheckpoint c;
  c["embed"] = RandomTensor(DType::kBF16, {300, 257}, seed + 1, "model-00001-of-00002.safetensors");
  c["norm"] = RandomTensor(DType::kF32, {33}, seed + 2, "model-00001-of-00002.safetensors");
  c["head"] = RandomTensor(DType::kBF16, {3, 11}, seed + 3, "model-00002-of-00002.safetensors");
  c["empty"] = RandomTensor(DType::kF16, {0, 4}, seed + 4, "model-00002-of-00002.safetensors");
  return c;
}

// Flips one byte of tensor `name`'s data in the checkpoint directory `dir`.
void FlipTensorByte(const fs::path& dir, const std::string& name, uint64_t at = 0) {
  absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(dir);
  ASSERT_TRUE(r.ok()) << r.status();
  const CheckpointTensor* t = r->Find(name);
  ASSERT_NE(t, nullptr);
  const fs::path path = r->files()[t->file].path;
  std::string bytes = *ReadFileToString(path);
  bytes[t->offset + at] = static_cast<char>(bytes[t->offset + at] ^ 0x20);
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
}

class FullChecksumsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v0_ = Model();
    v1_ = Nudge(v0_, 0.01, 7, [](const std::string& n) { return n == "norm"; });
    WriteCheckpoint(dir_ / "ckpt0", v0_, {{"version", "000000"}});
    WriteCheckpoint(dir_ / "ckpt1", v1_, {{"version", "000001"}});
    fs::create_directories(dir_ / "full");
    fs::create_directories(dir_ / "delta");
    FullVersionOptions fo;
    fo.version = 0;
    fo.run_id = "run-a";
    ASSERT_TRUE(WriteFullVersion(dir_ / "ckpt0", Full(), fo).ok());
    EncodeOptions eo;
    eo.version = 1;
    eo.run_id = "run-a";
    ASSERT_TRUE(EncodeDelta(dir_ / "ckpt0", dir_ / "ckpt1", Delta(), eo).ok());
  }
  fs::path Full() const { return dir_ / "full" / VersionDirName(0); }
  fs::path Delta() const { return dir_ / "delta" / VersionDirName(1); }

  ScratchDir dir_;
  TestCheckpoint v0_, v1_;
};

TEST_F(FullChecksumsTest, AFullVersionRecordsEveryTensorsChecksumInItsFile) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(Full());
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->metadata.at("checksum_format"), "xxh3-128");
  for (const auto& [tensor, file] : index->weight_map) {
    absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(Full() / file);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->metadata.at(tensor), Xxh3Checksum(v0_.at(tensor).bytes).ToHex()) << tensor;
  }
  // The bytes themselves are the source's.
  EXPECT_EQ(ReadTensors(Full()), BytesOf(v0_));

  // The same from tensors in memory.
  std::vector<TensorView> views;
  for (const auto& [name, t] : v1_) views.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  FullVersionOptions fo;
  fo.version = 1;
  fo.max_shard_bytes = 1000;
  ASSERT_TRUE(WriteFullVersion(views, dir_ / "mem", fo).ok());
  auto sums = ReadRecordedChecksums(dir_ / "mem");
  ASSERT_TRUE(sums.ok()) << sums.status();
  ASSERT_TRUE(sums->has_value());
  ASSERT_EQ((*sums)->size(), v1_.size());
  for (const auto& [name, t] : v1_) EXPECT_EQ((*sums)->at(name), Xxh3Checksum(t.bytes)) << name;
}

TEST_F(FullChecksumsTest, ReadRecordedChecksumsFollowsItsContract) {
  auto full = ReadRecordedChecksums(Full());
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(full->has_value());
  EXPECT_EQ((*full)->size(), v0_.size());
  for (const auto& [name, t] : v0_) EXPECT_EQ((*full)->at(name), Xxh3Checksum(t.bytes)) << name;

  // A checkpoint that records none: nullopt.
  auto none = ReadRecordedChecksums(dir_ / "ckpt0");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());
  // So does what the codec materializes.
  ASSERT_TRUE(
      MaterializeCheckpoint(Full(), std::vector<fs::path>{Delta()}, dir_ / "applied", {}).ok());
  auto applied = ReadRecordedChecksums(dir_ / "applied");
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_FALSE(applied->has_value());

  // A DELTA records only the checksums of what it changes.
  EXPECT_TRUE(absl::IsInvalidArgument(ReadRecordedChecksums(Delta()).status()));

  // A FULL version that says it records checksums must record all of them.
  fs::path partial = dir_ / "partial";
  WriteCheckpoint(partial, v0_, {{"version", "000000"}, {"checksum_format", "xxh3-128"}});
  absl::Status s = ReadRecordedChecksums(partial).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("has no xxh3-128 checksum"), absl::string_view::npos) << s;
  fs::path other = dir_ / "other";
  WriteCheckpoint(other, v0_, {{"version", "000000"}, {"checksum_format", "sha1"}});
  s = ReadRecordedChecksums(other).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("unsupported checksum_format \"sha1\""), absl::string_view::npos);
}

TEST_F(FullChecksumsTest, VerifyChecksAFullVersionsBytes) {
  absl::StatusOr<VerifyReport> ok = VerifyVersion(Full(), std::nullopt, {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->checksums_verified);
  absl::StatusOr<VerifyReport> old = VerifyVersion(dir_ / "ckpt0", std::nullopt, {});
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_FALSE(old->checksums_verified);  // records none: still a valid checkpoint

  FlipTensorByte(Full(), "embed", 1000);
  absl::Status s = VerifyVersion(Full(), std::nullopt, {}).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch);
  EXPECT_NE(s.message().find("tensor \"embed\" hashes to"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("model-00001-of-00002.safetensors"), absl::string_view::npos) << s;
}

TEST_F(FullChecksumsTest, MaterializingFromACorruptFullAnchorFailsAndLeavesTheDestination) {
  const fs::path out = dir_ / "out";
  ASSERT_TRUE(MaterializeCheckpoint(Full(), {}, out, {}).ok());
  // "embed" is not changed by the delta: only the anchor's checksum can
  // catch it.
  FlipTensorByte(Full(), "embed", 77);
  ApplyOptions o;
  o.threads = 2;
  for (const std::vector<fs::path>& deltas : {std::vector<fs::path>{}, {Delta()}}) {
    absl::Status s = MaterializeCheckpoint(Full(), deltas, dir_ / "fresh", o).status();
    EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch) << s;
    EXPECT_FALSE(fs::exists(dir_ / "fresh"));
  }
  // Over a destination that holds v0 from the same anchor, the apply reuses
  // what it holds (written and checked before) and needs no anchor bytes.
  ASSERT_TRUE(MaterializeCheckpoint(Full(), std::vector<fs::path>{Delta()}, out, o).ok());
  EXPECT_EQ(ReadTensors(out), BytesOf(v1_));
}

TEST_F(FullChecksumsTest, LoadingACorruptFullVersionIntoMemoryFails) {
  absl::StatusOr<CheckpointImage> good = CheckpointImage::Load(Full(), {});
  ASSERT_TRUE(good.ok()) << good.status();
  FlipTensorByte(Full(), "head", 3);
  absl::Status s = CheckpointImage::Load(Full(), {}).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch);
  EXPECT_NE(s.message().find("tensor \"head\""), absl::string_view::npos) << s;
  // A boot checkpoint that records none still loads.
  EXPECT_TRUE(CheckpointImage::Load(dir_ / "ckpt0", {}).ok());
}

TEST_F(FullChecksumsTest, AFullVersionOfACorruptFullVersionIsRefused) {
  FlipTensorByte(Full(), "norm", 2);
  FullVersionOptions fo;
  fo.version = 3;
  absl::Status s = WriteFullVersion(Full(), dir_ / "copy", fo).status();
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch) << s;
  EXPECT_FALSE(fs::exists(dir_ / "copy"));
}

TEST_F(FullChecksumsTest, APayloadFileIsCheckedOnItsOwn) {
  const std::string shard = "model-00001-of-00002.safetensors";
  PayloadFileKind full{VersionKind::kFull, 0, true};
  auto names = VerifyPayloadFile(Full(), shard, full, {});
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"embed", "norm"}));
  PayloadFileKind delta{VersionKind::kDelta, 1, false};
  names = VerifyPayloadFile(Delta(), "delta-00001-of-00001.safetensors", delta, {});
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_EQ(*names, (std::vector<std::string>{"norm"}));
  // A FULL file read as a DELTA's is refused (entries are not frames).
  EXPECT_FALSE(VerifyPayloadFile(Full(), shard, delta, {}).ok());
  FlipTensorByte(Full(), "norm", 0);
  EXPECT_EQ(GetErrorKind(VerifyPayloadFile(Full(), shard, full, {}).status()),
            ErrorKind::kChecksumMismatch);
}

Checksum128 FingerprintOf(const TestCheckpoint& c) {
  TensorChecksums sums;
  for (const auto& [name, t] : c) sums[name] = Xxh3Checksum(t.bytes);
  return WeightsFingerprint(sums);
}

// What a publisher compares to refuse a delta made from other weights
// (publish.h CheckDeltaBase): each index records the fingerprint of its
// complete weights, a DELTA also that of its base.
TEST_F(FullChecksumsTest, IndexesRecordTheFingerprintsOfTheirWeightsAndOfADeltasBase) {
  absl::StatusOr<CheckpointIndex> full = ReadIndex(Full());
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<VersionManifest> fm = full->ToManifest();
  ASSERT_TRUE(fm.ok()) << fm.status();
  EXPECT_EQ(fm->weights_fingerprint, FingerprintOf(v0_).ToHex());
  EXPECT_EQ(fm->base_weights_fingerprint, "");

  absl::StatusOr<CheckpointIndex> delta = ReadIndex(Delta());
  ASSERT_TRUE(delta.ok()) << delta.status();
  absl::StatusOr<VersionManifest> dm = delta->ToManifest();
  ASSERT_TRUE(dm.ok()) << dm.status();
  EXPECT_EQ(dm->base_weights_fingerprint, FingerprintOf(v0_).ToHex());
  EXPECT_EQ(dm->weights_fingerprint, FingerprintOf(v1_).ToHex());
  EXPECT_NE(dm->weights_fingerprint, dm->base_weights_fingerprint);

  // A FULL version made from a DELTA's materialized weights, or from a
  // version that recorded another fingerprint, records its own.
  ASSERT_TRUE(MaterializeCheckpoint(Full(), std::vector<fs::path>{Delta()}, dir_ / "mat", {}).ok());
  absl::StatusOr<CheckpointIndex> mat = ReadIndex(dir_ / "mat");
  ASSERT_TRUE(mat.ok()) << mat.status();
  EXPECT_FALSE(mat->metadata.contains(std::string(kWeightsFingerprintKey)));
  fs::create_directories(dir_ / "again");
  FullVersionOptions fo;
  fo.version = 1;
  ASSERT_TRUE(WriteFullVersion(dir_ / "mat", dir_ / "again" / VersionDirName(1), fo).ok());
  absl::StatusOr<CheckpointIndex> again = ReadIndex(dir_ / "again" / VersionDirName(1));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->metadata.at(std::string(kWeightsFingerprintKey)), FingerprintOf(v1_).ToHex());
  EXPECT_FALSE(again->metadata.contains(std::string(kBaseFingerprintKey)));

  // A recorded fingerprint that is not one is a malformed index.
  CheckpointIndex bad = *full;
  bad.metadata[std::string(kWeightsFingerprintKey)] = "not-hex";
  absl::Status s = bad.ToManifest().status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("metadata.weights_fingerprint \"not-hex\" is not 32 hex digits"),
            absl::string_view::npos)
      << s;
}

TEST_F(FullChecksumsTest, TheEncoderNeverAssumesItsBasesVersion) {
  WriteCheckpoint(dir_ / "boot", v0_);  // records no version
  EncodeOptions o;
  o.version = 4;
  absl::Status s = EncodeDelta(dir_ / "boot", dir_ / "ckpt1", dir_ / "d4", o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("records no version"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("--base-version"), absl::string_view::npos) << s;
  EXPECT_FALSE(fs::exists(dir_ / "d4"));
  o.base_version = 3;
  EXPECT_TRUE(EncodeDelta(dir_ / "boot", dir_ / "ckpt1", dir_ / "d4", o).ok());

  // In memory: the caller must say.
  std::vector<TensorView> base, target;
  for (const auto& [name, t] : v0_) base.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  for (const auto& [name, t] : v1_) target.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  EncodeOptions m;
  m.version = 1;
  s = EncodeDelta(base, target, dir_ / "m1", m).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("base's version is unknown"), absl::string_view::npos) << s;
  m.base_version = 0;
  EXPECT_TRUE(EncodeDelta(base, target, dir_ / "m1", m).ok());
}

TEST(IndexBoundTest, MixtureOfExpertsSizedIndexesAreReadAndHugeOnesRefused) {
  auto index_of = [](int64_t tensors) {
    std::string json = R"({"metadata":{"version":"000001"},"weight_map":{)";
    for (int64_t i = 0; i < tensors; ++i) {
      absl::StrAppend(&json, i == 0 ? "" : ",", "\"model.layers.", i / 1000, ".mlp.experts.",
                      i % 1000, ".down_proj.weight\":\"model-", i % 163, ".safetensors\"");
    }
    return json + "}}";
  };
  // Kimi K2 sized: about 140,000 tensors.
  auto moe = CheckpointIndex::Parse(index_of(140'000));
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->weight_map.size(), 140'000u);
  auto huge = CheckpointIndex::Parse(index_of(int64_t{kMaxIndexTensors} + 1));
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(huge.status()));
  EXPECT_NE(huge.status().message().find("weight_map lists 1000001 tensors, above the limit"),
            absl::string_view::npos)
      << huge.status();
}

}  // namespace
}  // namespace stitch
