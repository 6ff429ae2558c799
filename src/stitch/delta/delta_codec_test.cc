// Encode, materialize and verify through directories, including every kind
// of bad input the issue lists.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>

#include <fstream>

#include "stitch/core/errors.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_test_util.h"
#include "stitch/delta/delta_verify.h"
#include "stitch/delta/delta_version.h"
#include "stitch/delta/weights_checksums.h"
#include "stitch/format/checksum.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

using testing::BytesOf;
using testing::EditIndex;
using testing::Nudge;
using testing::PayloadEntry;
using testing::RandomTensor;
using testing::ReadTensors;
using testing::RewritePayloads;
using testing::ScratchDir;
using testing::SnapshotTree;
using testing::TestCheckpoint;
using testing::WriteCheckpoint;
using testing::WriteVersionChain;

// A small model over three files: bf16 matrices, f32 norms, an i64 table,
// an empty tensor, odd sizes, and one tensor larger than a codec chunk.
TestCheckpoint Model(uint64_t seed = 1) {
  TestCheckpoint c;
  c["embed.weight"] =
      RandomTensor(DType::kBF16, {300, 257}, seed + 1, "model-00001-of-00003.safetensors");
  c["layers.0.attn.w"] =
      RandomTensor(DType::kBF16, {64, 33}, seed + 2, "model-00001-of-00003.safetensors");
  c["layers.0.norm"] =
      RandomTensor(DType::kF32, {33}, seed + 3, "model-00002-of-00003.safetensors");
  c["layers.1.attn.w"] =
      RandomTensor(DType::kBF16, {64, 33}, seed + 4, "model-00002-of-00003.safetensors");
  c["layers.1.norm"] =
      RandomTensor(DType::kF32, {33}, seed + 5, "model-00002-of-00003.safetensors");
  c["positions"] = RandomTensor(DType::kI64, {7}, seed + 6, "model-00003-of-00003.safetensors");
  c["empty"] = RandomTensor(DType::kF16, {0, 4}, seed + 7, "model-00003-of-00003.safetensors");
  c["lm_head"] = RandomTensor(DType::kBF16, {3, 11}, seed + 8, "model-00003-of-00003.safetensors");
  return c;
}

bool IsLayer0(const std::string& name) {
  return name.starts_with("layers.0") || name == "embed.weight";
}

class DeltaCodecTest : public ::testing::Test {
 protected:
  // v0 (anchor), v1 changes layer 0 and the embedding, v2 changes
  // everything, v3 changes nothing, v4 changes layer 0 again.
  void SetUp() override {
    versions_.push_back(Model());
    versions_.push_back(Nudge(versions_[0], 0.01, 11, IsLayer0));
    versions_.push_back(Nudge(versions_[1], 0.02, 12));
    versions_.push_back(versions_[2]);
    versions_.push_back(Nudge(versions_[3], 0.01, 14, IsLayer0));
    ASSERT_NO_FATAL_FAILURE(WriteVersionChain(
        versions_, "run-a", [this](size_t v) { return Ckpt(v); },
        [this](size_t v) { return Delta(v); }));
  }

  fs::path Ckpt(size_t v) const { return dir_ / absl::StrCat("ckpt", v); }
  fs::path Delta(size_t v) const { return dir_ / VersionDirName(static_cast<int64_t>(v)); }
  std::vector<fs::path> Deltas(size_t from, size_t to) const {
    std::vector<fs::path> out;
    for (size_t v = from; v <= to; ++v) out.push_back(Delta(v));
    return out;
  }
  absl::StatusOr<MaterializeResult> Apply(const std::vector<fs::path>& deltas, const fs::path& out,
                                          int threads = 2) {
    ApplyOptions o;
    o.threads = threads;
    return MaterializeCheckpoint(Ckpt(0), deltas, out, o);
  }

  ScratchDir dir_;
  std::vector<TestCheckpoint> versions_;
};

TEST_F(DeltaCodecTest, EncodedDeltaHoldsOnlyChangedTensorsWithTargetChecksums) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(Delta(1));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->metadata.at("version"), "000001");
  EXPECT_EQ(index->metadata.at("base_version"), "000000");
  EXPECT_EQ(index->metadata.at("delta_encoding"), "xor");
  EXPECT_EQ(index->metadata.at("compression_format"), "zstd");
  EXPECT_EQ(index->metadata.at("checksum_format"), "xxh3-128");
  EXPECT_EQ(index->metadata.at("run_id"), "run-a");
  std::vector<std::string> changed;
  for (const auto& [tensor, file] : index->weight_map) {
    changed.push_back(tensor);
    EXPECT_EQ(file, "delta-00001-of-00001.safetensors");
  }
  EXPECT_EQ(changed,
            (std::vector<std::string>{"embed.weight", "layers.0.attn.w", "layers.0.norm"}));

  absl::StatusOr<SafetensorsFile> payload =
      SafetensorsFile::Open(Delta(1) / "delta-00001-of-00001.safetensors");
  ASSERT_TRUE(payload.ok()) << payload.status();
  for (const TensorInfo& t : payload->tensors()) {
    EXPECT_EQ(t.dtype, DType::kU8);
    ASSERT_EQ(t.shape.size(), 1u);
    EXPECT_EQ(payload->metadata().at(t.name), Xxh3Checksum(versions_[1].at(t.name).bytes).ToHex());
  }
}

// What a sidecar expects an engine to report after loading v4: the anchor's
// tensors hashed, then each delta's recorded target checksums, give the
// same fingerprint as the hashes of v4's own bytes.
TEST_F(DeltaCodecTest, FoldingDeltaChecksumsGivesTheTargetsFingerprint) {
  absl::StatusOr<TensorChecksums> folded = HashCheckpointTensors(Ckpt(0));
  ASSERT_TRUE(folded.ok()) << folded.status();
  for (size_t v = 1; v <= 4; ++v) {
    absl::Status s = FoldDeltaChecksums(Delta(v), *folded);
    ASSERT_TRUE(s.ok()) << s;
  }
  absl::StatusOr<TensorChecksums> target = HashCheckpointTensors(Ckpt(4));
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(*folded, *target);
  for (const auto& [name, tensor] : versions_[4]) {
    EXPECT_EQ(target->at(name), Xxh3Checksum(tensor.bytes)) << name;
  }
  EXPECT_EQ(WeightsFingerprint(*folded), WeightsFingerprint(*target));

  // Stopping one delta short gives v3's weights, which differ.
  absl::StatusOr<TensorChecksums> short_chain = HashCheckpointTensors(Ckpt(0));
  ASSERT_TRUE(short_chain.ok());
  for (size_t v = 1; v <= 3; ++v) ASSERT_TRUE(FoldDeltaChecksums(Delta(v), *short_chain).ok());
  EXPECT_NE(WeightsFingerprint(*short_chain), WeightsFingerprint(*target));
}

// An anchor's checksums: a FULL version's recorded ones (read from its
// headers, without a pass over the weights), a checkpoint's hashed bytes
// when it records none.
TEST_F(DeltaCodecTest, AnchorChecksumsAreTheRecordedOnesElseTheHashedBytes) {
  FullVersionOptions fo;
  fo.version = 2;
  fo.run_id = "run-a";
  ASSERT_TRUE(WriteFullVersion(Ckpt(2), dir_ / "full2", fo).ok());
  absl::StatusOr<TensorChecksums> hashed = HashCheckpointTensors(Ckpt(2));
  ASSERT_TRUE(hashed.ok()) << hashed.status();
  absl::StatusOr<TensorChecksums> recorded = AnchorChecksums(dir_ / "full2");
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_EQ(*recorded, *hashed);
  absl::StatusOr<TensorChecksums> plain = AnchorChecksums(Ckpt(2));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(*plain, *hashed);
  // Bytes changed under the recorded checksums: the record is what it
  // reads (the checks against the bytes belong to verification).
  for (const auto& entry : fs::directory_iterator(dir_ / "full2")) {
    if (entry.path().extension() != ".safetensors") continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char last = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(last ^ 1));  // the last byte of the last tensor's data
  }
  absl::StatusOr<TensorChecksums> unread = AnchorChecksums(dir_ / "full2");
  ASSERT_TRUE(unread.ok()) << unread.status();
  EXPECT_EQ(*unread, *hashed);
  absl::StatusOr<TensorChecksums> rehashed = HashCheckpointTensors(dir_ / "full2");
  ASSERT_TRUE(rehashed.ok());
  EXPECT_NE(*rehashed, *hashed);
}

TEST_F(DeltaCodecTest, FoldingADeltaOfAnotherModelIsRefusedAndChangesNothing) {
  TensorChecksums other{{"embed.weight", Checksum128{1, 2}}};
  const TensorChecksums before = other;
  absl::Status s = FoldDeltaChecksums(Delta(1), other);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("layers.0.attn.w"), std::string_view::npos) << s;
  EXPECT_EQ(other, before);
}

TEST_F(DeltaCodecTest, UnchangedModelGivesAnEmptyDelta) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(Delta(3));
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_TRUE(index->weight_map.empty());
  EXPECT_EQ(index->metadata.at("version"), "000003");
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(Delta(3))) {
    ++files;
    EXPECT_EQ(e.path().filename(), kIndexFileName);
  }
  EXPECT_EQ(files, 1u);
  absl::StatusOr<VerifyReport> v = VerifyVersion(Delta(3), Ckpt(2), {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->tensors, 0u);
}

TEST_F(DeltaCodecTest, MaterializeReproducesEveryVersionBitForBit) {
  for (size_t target = 0; target < versions_.size(); ++target) {
    const fs::path out = dir_ / absl::StrCat("out", target);
    absl::StatusOr<MaterializeResult> r =
        Apply(Deltas(1, target), out, 1 + static_cast<int>(target % 3));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->version.version, static_cast<int64_t>(target));
    EXPECT_EQ(r->version.run_id, target == 0 ? "" : "run-a");
    EXPECT_TRUE(r->reseeded);
    EXPECT_EQ(ReadTensors(out), BytesOf(versions_[target])) << "version " << target;
    absl::StatusOr<std::optional<VersionRef>> held = ReadHeldVersion(out);
    ASSERT_TRUE(held.ok() && held->has_value());
    EXPECT_EQ((*held)->version, static_cast<int64_t>(target));
    absl::StatusOr<CheckpointIndex> index = ReadIndex(out);
    ASSERT_TRUE(index.ok());
    EXPECT_EQ(index->metadata.at("version"), VersionMetadataString(static_cast<int64_t>(target)));
    EXPECT_FALSE(index->is_delta());
  }
}

ino_t Inode(const fs::path& p) {
  struct stat st;
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

TEST_F(DeltaCodecTest, LaterApplyOnlyAppliesNewDeltasAndLinksUnchangedFiles) {
  const fs::path out = dir_ / "out";
  absl::StatusOr<MaterializeResult> r = Apply(Deltas(1, 1), out);
  ASSERT_TRUE(r.ok()) << r.status();
  const ino_t file3 = Inode(out / "model-00003-of-00003.safetensors");

  // v4 only changes files 1 and 2 relative to v3; from v1, file 3 changes in v2.
  r = Apply(Deltas(1, 2), out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->reseeded);
  EXPECT_EQ(r->applied_on, 1);
  EXPECT_EQ(r->deltas_applied, 1u);
  EXPECT_EQ(ReadTensors(out), BytesOf(versions_[2]));
  EXPECT_NE(Inode(out / "model-00003-of-00003.safetensors"), file3);

  const ino_t file3_v2 = Inode(out / "model-00003-of-00003.safetensors");
  r = Apply(Deltas(1, 4), out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->reseeded);
  EXPECT_EQ(r->applied_on, 2);
  EXPECT_EQ(r->deltas_applied, 2u);
  EXPECT_EQ(r->files_linked, 1u);
  EXPECT_EQ(r->files_written, 2u);
  EXPECT_EQ(Inode(out / "model-00003-of-00003.safetensors"), file3_v2);
  EXPECT_EQ(ReadTensors(out), BytesOf(versions_[4]));

  // Already there: nothing to do.
  r = Apply(Deltas(1, 4), out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->deltas_applied, 0u);
  EXPECT_FALSE(r->reseeded);

  // No generation directories are left behind.
  for (const auto& e : fs::directory_iterator(dir_.path())) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST_F(DeltaCodecTest, OlderTargetOrAnotherRunReseedsFromTheAnchor) {
  const fs::path out = dir_ / "out";
  ASSERT_TRUE(Apply(Deltas(1, 4), out).ok());
  absl::StatusOr<MaterializeResult> r = Apply(Deltas(1, 2), out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->reseeded);
  EXPECT_EQ(r->applied_on, 0);
  EXPECT_EQ(ReadTensors(out), BytesOf(versions_[2]));

  // The destination holds run-a v2; an anchor of run-b at v2 must not reuse it.
  const fs::path anchor_b = dir_ / "anchor-b";
  FullVersionOptions fo;
  fo.version = 2;
  fo.run_id = "run-b";
  ASSERT_TRUE(WriteFullVersion(Ckpt(1), anchor_b, fo).ok());
  ApplyOptions o;
  r = MaterializeCheckpoint(anchor_b, {}, out, o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->reseeded);
  EXPECT_EQ(r->version.ToString(), "run-b/weight_v000002");
  EXPECT_EQ(ReadTensors(out), BytesOf(versions_[1]));
}

TEST_F(DeltaCodecTest, FullVersionAnchorsALaterChain) {
  const fs::path full = dir_ / "full2";
  FullVersionOptions fo;
  fo.version = 2;
  fo.run_id = "run-a";
  absl::StatusOr<FullVersionResult> f = WriteFullVersion(Ckpt(2), full, fo);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->files.size(), 3u);
  absl::StatusOr<VerifyReport> v = VerifyVersion(full, std::nullopt, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->kind, VersionKind::kFull);
  EXPECT_EQ(v->version, 2);

  const fs::path out = dir_ / "out";
  absl::StatusOr<MaterializeResult> r = MaterializeCheckpoint(full, Deltas(3, 4), out, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadTensors(out), BytesOf(versions_[4]));

  // The in-memory FULL writer, sharded.
  std::vector<TensorView> views;
  for (const auto& [name, t] : versions_[4])
    views.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  fo.version = 4;
  fo.max_shard_bytes = 5'000;
  f = WriteFullVersion(views, dir_ / "full4", fo);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_GE(f->files.size(), 3u);
  EXPECT_EQ(f->files.front(), absl::StrCat("model-00001-of-0000", f->files.size(), ".safetensors"));
  EXPECT_EQ(ReadTensors(dir_ / "full4"), BytesOf(versions_[4]));
}

TEST_F(DeltaCodecTest, CompanionFilesAreCopied) {
  std::ofstream(Ckpt(0) / "config.json") << R"({"hidden": 33})";
  const fs::path out = dir_ / "out";
  ASSERT_TRUE(Apply(Deltas(1, 1), out).ok());
  absl::StatusOr<std::string> config = ReadFileToString(out / "config.json");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(*config, R"({"hidden": 33})");
}

TEST_F(DeltaCodecTest, EncodingFromMemoryEqualsEncodingFromDirectoriesAndIsDeterministic) {
  std::vector<TensorView> base, target;
  for (const auto& [name, t] : versions_[1])
    base.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  for (const auto& [name, t] : versions_[2])
    target.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  EncodeOptions o;
  o.version = 2;
  o.base_version = 1;
  o.run_id = "run-a";
  o.threads = 3;
  absl::StatusOr<EncodeResult> r = EncodeDelta(base, target, dir_ / "mem2", o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->changed_tensors, 7u);  // all but the empty one
  EXPECT_EQ(SnapshotTree(dir_ / "mem2"), SnapshotTree(Delta(2)));
}

std::vector<TensorView> ViewsOf(const TestCheckpoint& c) {
  std::vector<TensorView> views;
  for (const auto& [name, t] : c) views.push_back(TensorView{name, t.dtype, t.shape, t.bytes});
  return views;
}

TEST_F(DeltaCodecTest, AdvancingTheBaseWritesTheSameDeltaAndLeavesTheTargetInTheBase) {
  TestCheckpoint snapshot = versions_[1];  // the caller's own copy of version 1
  EncodeOptions o;
  o.version = 2;
  o.base_version = 1;
  o.run_id = "run-a";
  o.threads = 3;
  absl::StatusOr<EncodeResult> r =
      EncodeDeltaAdvancingBase(ViewsOf(snapshot), ViewsOf(versions_[2]), dir_ / "adv2", o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(SnapshotTree(dir_ / "adv2"), SnapshotTree(Delta(2)));
  for (const auto& [name, t] : versions_[2]) EXPECT_EQ(snapshot.at(name).bytes, t.bytes) << name;
}

TEST_F(DeltaCodecTest, AdvancingRefusesBadInputBeforeTouchingTheBase) {
  const TestCheckpoint original = versions_[1];
  TestCheckpoint snapshot = versions_[1];
  EncodeOptions o;
  o.version = 2;
  o.base_version = 1;
  o.run_id = "run-a";
  // A base tensor that is a target's own memory.
  std::vector<TensorView> base = ViewsOf(snapshot), target = ViewsOf(versions_[2]);
  for (TensorView& b : base) {
    if (b.name == "layers.1.norm") b.data = versions_[2].at("layers.1.norm").bytes;
  }
  absl::StatusOr<EncodeResult> r = EncodeDeltaAdvancingBase(base, target, dir_ / "adv2", o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("\"layers.1.norm\""), std::string::npos) << r.status();
  EXPECT_FALSE(BaseWasAdvanced(r.status()));
  // Two base tensors sharing memory: "positions" inside "embed.weight".
  base = ViewsOf(snapshot);
  const std::span<const std::byte> embed = snapshot.at("embed.weight").bytes;
  for (TensorView& b : base) {
    if (b.name == "positions") b.data = embed.subspan(7, b.data.size());
  }
  r = EncodeDeltaAdvancingBase(base, target, dir_ / "adv2", o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  // An output directory that is not empty.
  fs::create_directories(dir_ / "adv2" / "something");
  r = EncodeDeltaAdvancingBase(ViewsOf(snapshot), target, dir_ / "adv2", o);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(BaseWasAdvanced(r.status())) << r.status();
  for (const auto& [name, t] : original) EXPECT_EQ(snapshot.at(name).bytes, t.bytes) << name;
}

TEST_F(DeltaCodecTest, AWriteFailureWhileAdvancingSaysTheBaseWasAdvanced) {
  TestCheckpoint snapshot = versions_[1];
  EncodeOptions o;
  o.version = 2;
  o.base_version = 1;
  o.run_id = "run-a";
  // Files of this process may not grow past 1 KiB (the frames are larger):
  // the first write of a frame fails with EFBIG instead of a signal.
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = saved;
  small.rlim_cur = 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  absl::StatusOr<EncodeResult> r =
      EncodeDeltaAdvancingBase(ViewsOf(snapshot), ViewsOf(versions_[2]), dir_ / "adv2", o);
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(BaseWasAdvanced(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("partly advanced"), std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(dir_ / "adv2"));
  // The same failure without advancing says nothing of the kind.
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::signal(SIGXFSZ, SIG_IGN);
  r = EncodeDelta(ViewsOf(versions_[1]), ViewsOf(versions_[2]), dir_ / "adv2", o);
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(BaseWasAdvanced(r.status())) << r.status();
}

TEST_F(DeltaCodecTest, PayloadIsShardedBySize) {
  EncodeOptions o;
  o.version = 2;
  o.max_shard_bytes = 1'500;
  absl::StatusOr<EncodeResult> r = EncodeDelta(Ckpt(1), Ckpt(2), dir_ / "sharded", o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_GE(r->files.size(), 2u);
  absl::StatusOr<DeltaVersion> d = DeltaVersion::Open(dir_ / "sharded");
  ASSERT_TRUE(d.ok()) << d.status();
  for (const CheckpointFile& f : d->files()) {
    uint64_t data = 0;
    for (const TensorInfo& t : f.header.tensors) data += t.nbytes();
    EXPECT_TRUE(data <= o.max_shard_bytes || f.header.tensors.size() == 1) << f.name;
    EXPECT_TRUE(f.name.starts_with("delta-0000")) << f.name;
  }
  const fs::path out = dir_ / "out";
  absl::StatusOr<MaterializeResult> m =
      MaterializeCheckpoint(Ckpt(1), std::vector<fs::path>{dir_ / "sharded"}, out, {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(ReadTensors(out), BytesOf(versions_[2]));
}

TEST_F(DeltaCodecTest, LongChainsOfOneTensorFoldCorrectly) {
  // 2 * kMaxFramesPerPass + 1 versions, each changing the same tensors.
  std::vector<TestCheckpoint> chain{versions_[0]};
  std::vector<fs::path> deltas;
  WriteCheckpoint(dir_ / "c0", chain[0], {{"version", "000000"}});
  for (size_t v = 1; v <= 2 * kMaxFramesPerPass + 1; ++v) {
    chain.push_back(Nudge(chain.back(), 0.005, 100 + v, IsLayer0));
    WriteCheckpoint(dir_ / absl::StrCat("c", v), chain.back());
    EncodeOptions o;
    o.version = static_cast<int64_t>(v);
    o.base_version = o.version - 1;  // c1, c2, ... record no version
    deltas.push_back(dir_ / absl::StrCat("d", v));
    ASSERT_TRUE(
        EncodeDelta(dir_ / absl::StrCat("c", v - 1), dir_ / absl::StrCat("c", v), deltas.back(), o)
            .ok());
  }
  absl::StatusOr<MaterializeResult> r =
      MaterializeCheckpoint(dir_ / "c0", deltas, dir_ / "out", {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ReadTensors(dir_ / "out"), BytesOf(chain.back()));
}

TEST_F(DeltaCodecTest, VerifyChecksFramesAloneAndChecksumsAgainstABase) {
  absl::StatusOr<VerifyReport> v = VerifyVersion(Delta(2), std::nullopt, {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->kind, VersionKind::kDelta);
  EXPECT_EQ(v->version, 2);
  EXPECT_EQ(v->base_version, 1);
  EXPECT_FALSE(v->checksums_verified);
  v = VerifyVersion(Delta(2), Ckpt(1), {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->checksums_verified);
  EXPECT_EQ(v->tensors, 7u);

  // The wrong base: the recorded version disagrees.
  absl::Status s = VerifyVersion(Delta(2), Ckpt(0), {}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  // A base with other bytes and no version: checksums catch it.
  WriteCheckpoint(dir_ / "other", versions_[0]);
  s = VerifyVersion(Delta(2), dir_ / "other", {}).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch);
  // A FULL version has no base to check against.
  EXPECT_TRUE(absl::IsInvalidArgument(VerifyVersion(Ckpt(1), Ckpt(0), {}).status()));
}

// Bad input: each case must fail with a one-line error naming the tensor or
// file, and leave the destination holding its previous complete version.
class BadInputTest : public DeltaCodecTest {
 protected:
  void SetUp() override {
    DeltaCodecTest::SetUp();
    out_ = dir_ / "out";
    absl::StatusOr<MaterializeResult> r = Apply(Deltas(1, 1), out_);
    ASSERT_TRUE(r.ok()) << r.status();
    before_ = SnapshotTree(out_);
  }

  // Applies the chain 1..to to out_ and checks the failure.
  void ExpectRefused(size_t to, absl::StatusCode code, std::string_view mention,
                     std::vector<fs::path> deltas = {}) {
    if (deltas.empty()) deltas = Deltas(1, to);
    for (int threads : {1, 2}) {
      absl::Status s = Apply(deltas, out_, threads).status();
      EXPECT_EQ(s.code(), code) << s;
      EXPECT_NE(s.message().find(AbslView(mention)), absl::string_view::npos) << s;
      EXPECT_EQ(s.message().find('\n'), std::string_view::npos) << s;
      EXPECT_EQ(SnapshotTree(out_), before_) << "the destination changed";
      EXPECT_EQ(ReadTensors(out_), BytesOf(versions_[1]));
    }
    // The same chain through verify (with the base) and the other
    // destination must fail too; nothing was left behind.
    for (const auto& e : fs::directory_iterator(dir_.path())) {
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
    }
  }

  fs::path out_;
  std::map<std::string, std::string> before_;
};

TEST_F(BadInputTest, TruncatedFrame) {
  RewritePayloads(Delta(2), [](PayloadEntry& e) {
    if (e.tensor == "layers.1.attn.w") e.frame.resize(e.frame.size() - 3);
  });
  ExpectRefused(2, absl::StatusCode::kDataLoss, "layers.1.attn.w");
  absl::Status s = VerifyVersion(Delta(2), std::nullopt, {}).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("delta-00001-of-00001.safetensors"), std::string_view::npos) << s;
}

TEST_F(BadInputTest, CorruptFrame) {
  RewritePayloads(Delta(2), [](PayloadEntry& e) {
    if (e.tensor == "embed.weight") {
      for (size_t i = 12; i < e.frame.size(); i += 7) e.frame[i] ^= std::byte{0xff};
    }
  });
  ExpectRefused(2, absl::StatusCode::kDataLoss, "embed.weight");
}

TEST_F(BadInputTest, CorruptFrameHeaderIsCaughtBeforeAnythingIsDecoded) {
  RewritePayloads(Delta(2), [](PayloadEntry& e) {
    if (e.tensor == "positions") e.frame[0] = std::byte{0};
  });
  ExpectRefused(2, absl::StatusCode::kDataLoss, "positions");
}

TEST_F(BadInputTest, WrongChecksum) {
  RewritePayloads(Delta(2), [](PayloadEntry& e) {
    if (e.tensor == "lm_head") e.checksum = Xxh3Checksum({}).ToHex();
  });
  ExpectRefused(2, absl::StatusCode::kDataLoss, "lm_head");
  absl::Status s = Apply(Deltas(1, 2), out_).status();
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch) << s;
  s = VerifyVersion(Delta(2), Ckpt(1), {}).status();
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch) << s;
}

TEST_F(BadInputTest, MalformedChecksumText) {
  RewritePayloads(Delta(2), [](PayloadEntry& e) {
    if (e.tensor == "lm_head") e.checksum = "not-hex";
  });
  ExpectRefused(2, absl::StatusCode::kInvalidArgument, "lm_head");
}

TEST_F(BadInputTest, MissingPayloadFile) {
  fs::remove(Delta(2) / "delta-00001-of-00001.safetensors");
  ExpectRefused(2, absl::StatusCode::kNotFound, "delta-00001-of-00001.safetensors");
}

TEST_F(BadInputTest, MissingDeltaDirectory) {
  fs::remove_all(Delta(2));
  ExpectRefused(2, absl::StatusCode::kNotFound, VersionDirName(2));
}

TEST_F(BadInputTest, LineageGap) {
  ExpectRefused(4, absl::StatusCode::kInvalidArgument, "gap", {Delta(1), Delta(2), Delta(4)});
  // A chain that does not start at the anchor.
  ExpectRefused(4, absl::StatusCode::kInvalidArgument, "gap", {Delta(2), Delta(3)});
}

TEST_F(BadInputTest, WrongBaseVersion) {
  EditIndex(Delta(2), [](CheckpointIndex& i) { i.metadata["base_version"] = "000000"; });
  ExpectRefused(2, absl::StatusCode::kInvalidArgument, "base_version");
}

TEST_F(BadInputTest, VersionGivenTwice) {
  ExpectRefused(2, absl::StatusCode::kInvalidArgument, "twice", {Delta(1), Delta(2), Delta(2)});
}

TEST_F(BadInputTest, OtherRun) {
  EditIndex(Delta(2), [](CheckpointIndex& i) { i.metadata["run_id"] = "run-b"; });
  ExpectRefused(2, absl::StatusCode::kFailedPrecondition, "run-b");
}

TEST_F(BadInputTest, UnsafeFileName) {
  EditIndex(Delta(2), [](CheckpointIndex& i) {
    for (auto& [tensor, file] : i.weight_map) file = "../escape.safetensors";
  });
  ExpectRefused(2, absl::StatusCode::kInvalidArgument, "../escape.safetensors");
}

TEST_F(BadInputTest, DeltaForATensorTheAnchorLacks) {
  RewritePayloads(Delta(2), [](PayloadEntry& e) {
    if (e.tensor == "lm_head") e.tensor = "ghost";
  });
  EditIndex(Delta(2), [](CheckpointIndex& i) {
    i.weight_map["ghost"] = i.weight_map.at("lm_head");
    i.weight_map.erase("lm_head");
  });
  ExpectRefused(2, absl::StatusCode::kInvalidArgument, "ghost");
}

TEST_F(BadInputTest, FrameOfTheWrongSize) {
  // Swap the frames of two tensors of different sizes: their headers give
  // it away before anything is decoded.
  std::vector<std::byte> norm, head;
  RewritePayloads(Delta(2), [&](PayloadEntry& e) {
    if (e.tensor == "layers.1.norm") norm = e.frame;
    if (e.tensor == "lm_head") head = e.frame;
  });
  RewritePayloads(Delta(2), [&](PayloadEntry& e) {
    if (e.tensor == "layers.1.norm") e.frame = head;
  });
  ExpectRefused(2, absl::StatusCode::kDataLoss, "layers.1.norm");
}

TEST_F(BadInputTest, DestinationThatIsNotOurs) {
  const fs::path foreign = dir_ / "foreign";
  fs::create_directories(foreign);
  std::ofstream(foreign / "notes.txt") << "mine";
  absl::Status s = Apply(Deltas(1, 2), foreign).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_EQ(SnapshotTree(foreign), (std::map<std::string, std::string>{{"notes.txt", "mine"}}));
}

TEST_F(DeltaCodecTest, EncodeRefusesMismatchedCheckpoints) {
  auto refused = [&](TestCheckpoint target, std::string_view mention) {
    const fs::path t = dir_ / "bad-target", out = dir_ / "bad-out";
    fs::remove_all(t);
    WriteCheckpoint(t, target);
    EncodeOptions o;
    o.version = 1;
    absl::Status s = EncodeDelta(Ckpt(0), t, out, o).status();
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(AbslView(mention)), absl::string_view::npos) << s;
    EXPECT_FALSE(fs::exists(out));
  };
  TestCheckpoint c = versions_[0];
  c["lm_head"].shape = {11, 3};
  refused(c, "lm_head");
  c = versions_[0];
  c["layers.0.norm"].dtype = DType::kI32;
  refused(c, "layers.0.norm");
  c = versions_[0];
  c.erase("positions");
  refused(c, "positions");
  c = versions_[0];
  c["extra"] = RandomTensor(DType::kU8, {3}, 1);
  refused(c, "extra");

  // Versions: a delta applies to the version just before it.
  EncodeOptions o;
  o.version = 5;
  absl::Status s = EncodeDelta(Ckpt(0), Ckpt(1), dir_ / "v5", o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  o.version = 1;
  s = EncodeDelta(Ckpt(0), Ckpt(1), Delta(1), o).status();  // exists already
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
}

}  // namespace
}  // namespace stitch
