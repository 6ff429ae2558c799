// `stitch publish` refuses what replicas could not apply, before the pointer
// moves: corrupt payloads, DELTAs on the wrong base, gaps, huge indexes,
// links and special files (issue 16). Also: only `claim` creates a store,
// and `delta encode` never guesses the version of its base. Each case is its
// own test, and each checks that the pointer stayed where it was.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/version.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"
#include "stitch/io/fileio.h"
#include "stitch/store/fs_store.h"
#include "tests/support/cli_expect.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"
#include "tests/support/version_dirs.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::IsOneFailureLine;
using ::stitch::testing::ProcessResult;
using ::stitch::testing::RunStitch;
using ::stitch::testing::TempDir;
using ::stitch::testing::TestShardName;
using ::stitch::testing::TestVersionOptions;
using ::stitch::testing::WriteTestVersion;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// A safetensors file written byte by byte: the 8-byte header length
// (`declared_length`, else the header's), the header, the data.
void WriteRawSafetensors(const fs::path& path, const std::string& header, size_t data_bytes,
                         std::optional<uint64_t> declared_length = std::nullopt) {
  uint64_t n = declared_length.value_or(header.size());
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header;
  bytes += std::string(data_bytes, '\x01');
  ASSERT_TRUE(WriteFileAtomically(path, bytes).ok());
}

// A FULL version `version` under `parent` holding one payload file,
// "model.safetensors", with the given raw header and data size.
fs::path RawVersion(const fs::path& parent, int64_t version, const std::string& header,
                    size_t data_bytes, std::optional<uint64_t> declared_length = std::nullopt) {
  fs::path dir = parent / VersionDirName(version);
  fs::create_directories(dir);
  WriteRawSafetensors(dir / "model.safetensors", header, data_bytes, declared_length);
  CheckpointIndex index;
  index.metadata["version"] = VersionMetadataString(version);
  index.weight_map["w"] = "model.safetensors";
  EXPECT_TRUE(WriteIndex(dir, index).ok());
  return dir;
}

class PublishCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
    ProcessResult claim = RunStitch({"claim", "--store", Store(), "--run-id", "run-a"});
    ASSERT_EQ(claim.exit_code, 0) << claim.err;
  }

  std::string Store() const { return (tmp_ / "store").string(); }
  ProcessResult Publish(const fs::path& dir, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"publish",  "--store", Store(),
                                     "--run-id", "run-a",   dir.string()};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunStitch(args);
  }
  std::string Pointer() {
    ProcessResult p = RunStitch({"pointer", "--store", Store()});
    EXPECT_EQ(p.exit_code, 0) << p.err;
    return p.out;
  }
  // Expects `r` to be a refused publish naming `what`, with the pointer left
  // at `pointer` and no version directory written for the refused one.
  void ExpectRefused(const ProcessResult& r, const std::string& what,
                     const std::string& pointer = "run-a/weight_v000000\n") {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, IsOneFailureLine());
    EXPECT_THAT(r.err, HasSubstr(what));
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_EQ(Pointer(), pointer);
  }
  // A checkpoint directory (test tensors) recording `version`, under src/.
  fs::path Checkpoint(int64_t version, int seed) {
    auto dir = WriteTestVersion(tmp_ / "src" / std::to_string(sources_++), version,
                                TestVersionOptions{.seed = seed});
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *dir : fs::path();
  }
  // `stitch delta encode` from `base` to `target` as version `version`.
  fs::path Encode(const fs::path& base, const fs::path& target, int64_t version) {
    fs::path out = tmp_ / "out" / std::to_string(sources_++) / VersionDirName(version);
    fs::create_directories(out.parent_path());
    ProcessResult r =
        RunStitch({"delta", "encode", "--base", base.string(), "--target", target.string(), "--out",
                   out.string(), "--version", std::to_string(version), "--run-id", "run-a"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
  }
  // `stitch delta full`: a FULL version recording its checksums.
  fs::path Full(const fs::path& checkpoint, int64_t version) {
    fs::path out = tmp_ / "out" / std::to_string(sources_++) / VersionDirName(version);
    fs::create_directories(out.parent_path());
    ProcessResult r =
        RunStitch({"delta", "full", "--checkpoint", checkpoint.string(), "--out", out.string(),
                   "--version", std::to_string(version), "--run-id", "run-a"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return out;
  }
  // The first entry of a payload file's header.
  static TensorInfo FirstTensor(const fs::path& file) {
    auto header = ReadSafetensorsHeader(file);
    EXPECT_TRUE(header.ok()) << header.status();
    return header.ok() ? header->tensors.front() : TensorInfo{};
  }
  static uint64_t DataStart(const fs::path& file) {
    return ReadSafetensorsHeader(file)->data_start;
  }
  static void FlipByte(const fs::path& file, uint64_t offset) {
    std::string bytes = *ReadFileToString(file);
    ASSERT_LT(offset, bytes.size());
    bytes[offset] = static_cast<char>(bytes[offset] ^ 0x5a);
    ASSERT_TRUE(WriteFileAtomically(file, bytes).ok());
  }

  TempDir tmp_;
  int sources_ = 0;
};

// ---- Structure and bounds of every payload file ----

TEST_F(PublishCliTest, ATruncatedPayloadIsRefused) {
  fs::path dir = Checkpoint(1, 1);
  fs::path shard = dir / TestShardName({}, 1);
  fs::resize_file(shard, fs::file_size(shard) - 10);
  ProcessResult r = Publish(dir);
  ExpectRefused(r, shard.string());
  EXPECT_THAT(r.err, StartsWith("stitch: publish: "));
  EXPECT_THAT(r.err, HasSubstr("reach beyond the data section"));
}

TEST_F(PublishCliTest, AHeaderPastTheEndOfTheFileIsRefused) {
  fs::path dir =
      RawVersion(tmp_ / "src", 1, R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4,
                 /*declared_length=*/100000);
  ExpectRefused(Publish(dir), "bad header length (beyond the end of the file");
}

TEST_F(PublishCliTest, OutOfBoundsOffsetsAreRefused) {
  fs::path dir = RawVersion(tmp_ / "src", 1,
                            R"({"w":{"dtype":"U8","shape":[9000],"data_offsets":[0,9000]}})", 8192);
  ProcessResult r = Publish(dir);
  ExpectRefused(r, (dir / "model.safetensors").string());
  EXPECT_THAT(r.err, HasSubstr("tensor \"w\": data_offsets [0, 9000] reach beyond the data "
                               "section (8192 bytes)"));
}

TEST_F(PublishCliTest, OverlappingOffsetsAreRefused) {
  fs::path dir = tmp_ / "src" / VersionDirName(1);
  fs::create_directories(dir);
  WriteRawSafetensors(dir / "model.safetensors",
                      R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})",
                      12);
  CheckpointIndex index;
  index.metadata["version"] = "000001";
  index.weight_map = {{"a", "model.safetensors"}, {"b", "model.safetensors"}};
  ASSERT_TRUE(WriteIndex(dir, index).ok());
  ExpectRefused(Publish(dir), "overlap tensor \"a\"");
}

TEST_F(PublishCliTest, AShapeThatDisagreesWithItsBytesIsRefused) {
  fs::path dir =
      RawVersion(tmp_ / "src", 1, R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16);
  ExpectRefused(Publish(dir), "tensor \"w\": shape [3] of F32");
}

// ---- DELTAs: frames, checksums, base ----

TEST_F(PublishCliTest, AnUndecodableFrameIsRefused) {
  fs::path delta = Encode(Checkpoint(0, 1), Checkpoint(1, 2), 1);
  fs::path payload = delta / "delta-00001-of-00001.safetensors";
  const TensorInfo t = FirstTensor(payload);
  ASSERT_GT(t.nbytes(), 40u);
  // The frame header stays readable; the blocks after it do not.
  for (uint64_t i = 24; i < t.nbytes(); ++i) FlipByte(payload, DataStart(payload) + t.begin + i);
  ProcessResult r = Publish(delta);
  ExpectRefused(r, absl::StrCat("tensor \"", t.name, "\""));
  EXPECT_THAT(r.err, HasSubstr(payload.string()));
}

TEST_F(PublishCliTest, AWrongChecksumIsRefusedWithBase) {
  fs::path base = Checkpoint(0, 1);
  fs::path delta = Encode(base, Checkpoint(1, 2), 1);
  fs::path payload = delta / "delta-00001-of-00001.safetensors";
  const TensorInfo t = FirstTensor(payload);
  auto header = ReadSafetensorsHeader(payload);
  ASSERT_TRUE(header.ok());
  std::string recorded = header->metadata.at(t.name);
  std::string bytes = *ReadFileToString(payload);
  size_t at = bytes.find(recorded);
  ASSERT_NE(at, std::string::npos);
  bytes[at] = recorded[0] == '0' ? '1' : '0';  // same length: the header still parses
  ASSERT_TRUE(WriteFileAtomically(payload, bytes).ok());

  ProcessResult r = Publish(delta, {"--base", base.string()});
  ExpectRefused(r, absl::StrCat("tensor \"", t.name, "\""));
  EXPECT_THAT(r.err, HasSubstr("checksum"));
}

TEST_F(PublishCliTest, AGoodDeltaWithBaseIsVerifiedAndPublished) {
  fs::path base = Checkpoint(0, 1);
  ProcessResult r = Publish(Encode(base, Checkpoint(1, 2), 1), {"--base", base.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Pointer(), "run-a/weight_v000001\n");
}

// A run of weeks from the command line: DELTAs published with an anchor
// budget of 3 and retention keeping the last 2. Every fourth version is
// written as a FULL anchor of the DELTA's weights, the store keeps only the
// pointer's chain and the last versions, a held version survives gc with
// its chain, and `status` lists the hold until it is released.
TEST_F(PublishCliTest, AnchorBudgetRetentionAndHoldsFromTheCommandLine) {
  fs::path base = Checkpoint(0, 1);
  ASSERT_EQ(Publish(Full(base, 1)).exit_code, 0);
  fs::path previous = Checkpoint(1, 1);
  for (int64_t v = 2; v <= 9; ++v) {
    fs::path next = Checkpoint(v, int(v));
    ProcessResult r = Publish(Encode(previous, next, v),
                              {"--anchor-every", "3", "--keep-last", "2", "--keep-every", "0"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // 1 is FULL; 2, 3, 4 are DELTAs; 5 is the anchor; 6, 7, 8; 9 anchors.
    const bool anchored = v == 5 || v == 9;
    EXPECT_EQ(absl::StrContains(r.out, "as a FULL anchor (3 DELTAs"), anchored) << v << r.out;
    previous = next;
    if (v == 6) {
      ProcessResult hold = RunStitch(
          {"hold", "--store", Store(), "--version", "6", "--ttl", "3600", "--holder", "eval-6"});
      ASSERT_EQ(hold.exit_code, 0) << hold.err;
      EXPECT_THAT(hold.out, HasSubstr("held weight_v000006"));
    }
  }
  EXPECT_EQ(Pointer(), "run-a/weight_v000009\n");
  auto store = FsStore::Open(Store(), "run-a");
  ASSERT_TRUE(store.ok());
  // Kept: 9 (pointer, an anchor), 8 (last 2) with its chain 5..7, and 6
  // (held) whose chain is inside that.
  EXPECT_EQ(*(*store)->ListVersions(), (std::vector<int64_t>{5, 6, 7, 8, 9}));
  EXPECT_EQ((*store)->ReadManifest(9)->kind, VersionKind::kFull);
  EXPECT_EQ((*store)->ReadManifest(8)->kind, VersionKind::kDelta);

  ProcessResult status = RunStitch({"status", "--store", Store()});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("store pointer run-a/weight_v000009"));
  EXPECT_THAT(status.out, HasSubstr("eval-6"));
  ProcessResult dry = RunStitch({"gc", "--store", Store(), "--keep-last", "1", "--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_THAT(dry.out, HasSubstr("kept    weight_v000006: held by eval-6"));
  EXPECT_THAT(dry.out, HasSubstr("would delete weight_v000007"));
  EXPECT_THAT(dry.out, HasSubstr("would delete weight_v000008"));

  ProcessResult release = RunStitch({"release", "--store", Store(), "--holder", "eval-6"});
  ASSERT_EQ(release.exit_code, 0) << release.err;
  ProcessResult gc = RunStitch({"gc", "--store", Store(), "--keep-last", "1"});
  ASSERT_EQ(gc.exit_code, 0) << gc.err;
  EXPECT_THAT(gc.out, HasSubstr("1 kept, 4 deleted"));
  EXPECT_EQ(*(*store)->ListVersions(), (std::vector<int64_t>{9}));
  EXPECT_THAT(RunStitch({"status", "--store", Store()}).out, HasSubstr("no holds"));

  // What cannot be done is one clear line.
  ProcessResult gone =
      RunStitch({"hold", "--store", Store(), "--version", "7", "--ttl", "60", "--holder", "late"});
  EXPECT_EQ(gone.exit_code, 1);
  EXPECT_THAT(gone.err, IsOneFailureLine());
  EXPECT_THAT(gone.err, HasSubstr("not published"));
  ProcessResult bad = RunStitch({"gc", "--store", Store(), "--keep-last", "0"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--keep-last must be at least 1"));
}

TEST_F(PublishCliTest, ADeltaOnAnotherBaseIsRefused) {
  ASSERT_EQ(Publish(Checkpoint(1, 1)).exit_code, 0);
  // A DELTA to version 2 whose index says it applies to version 0.
  fs::path delta = Encode(Checkpoint(1, 1), Checkpoint(2, 2), 2);
  auto index = ReadIndex(delta);
  ASSERT_TRUE(index.ok());
  index->metadata["base_version"] = "000000";
  ASSERT_TRUE(WriteIndex(delta, *index).ok());
  ExpectRefused(Publish(delta),
                "DELTA weight_v000002 applies to version 0, but the pointer is at "
                "run-a/weight_v000001; encode it against version 1",
                "run-a/weight_v000001\n");
}

// ---- The version must be the pointer's + 1 ----

TEST_F(PublishCliTest, AGapIsRefusedNamingTheExpectedVersion) {
  ExpectRefused(Publish(Checkpoint(3, 1)),
                "weight_v000003 would leave a gap: the pointer is at run-a/weight_v000000, so "
                "the next version must be weight_v000001");
  // A DELTA too, even one whose base is right for its own number.
  fs::path two = Checkpoint(2, 1);
  ExpectRefused(Publish(Encode(two, Checkpoint(3, 2), 3)),
                "the next version must be weight_v000001");
}

// ---- The index ----

TEST_F(PublishCliTest, AHugeIndexIsRefused) {
  fs::path dir = Checkpoint(1, 1);
  // Every real checkpoint's tensors, then a million more names.
  std::string json = R"({"metadata":{"version":"000001"},"weight_map":{)";
  for (int64_t i = 0; i < int64_t{kMaxIndexTensors} + 1; ++i) {
    absl::StrAppend(&json, i == 0 ? "" : ",", "\"t", i, "\":\"", TestShardName({}, 0), "\"");
  }
  json += "}}";
  ASSERT_TRUE(WriteFileAtomically(dir / "model.safetensors.index.json", json).ok());
  ExpectRefused(Publish(dir), "weight_map lists 1000001 tensors, above the limit of 1000000");
}

// ---- Links and special files ----

TEST_F(PublishCliTest, ASymlinkedPayloadIsRefused) {
  fs::path dir = Checkpoint(1, 1);
  fs::path shard = dir / TestShardName({}, 0);
  fs::remove(shard);
  fs::create_symlink("/etc/passwd", shard);
  ExpectRefused(Publish(dir),
                absl::StrCat("\"", TestShardName({}, 0), "\" is a symbolic link to /etc/passwd"));
  EXPECT_FALSE(fs::exists(tmp_ / "store" / "updates" / "weight_v000001"));
}

TEST_F(PublishCliTest, APayloadThroughASymlinkedFolderIsRefused) {
  auto dir = WriteTestVersion(tmp_ / "src", 1, TestVersionOptions{.file_prefix = "shards/"});
  ASSERT_TRUE(dir.ok());
  fs::rename(*dir / "shards", tmp_ / "elsewhere");
  fs::create_directory_symlink(tmp_ / "elsewhere", *dir / "shards");
  ExpectRefused(Publish(*dir), "\"shards\" is a symbolic link");
}

TEST_F(PublishCliTest, ASpecialFileIsRefused) {
  fs::path dir = Checkpoint(1, 1);
  fs::path shard = dir / TestShardName({}, 1);
  fs::remove(shard);
  ASSERT_EQ(::mkfifo(shard.c_str(), 0644), 0);
  ExpectRefused(Publish(dir), absl::StrCat("\"", TestShardName({}, 1), "\" is a FIFO"));
}

// ---- FULL versions carry checksums ----

TEST_F(PublishCliTest, AFlippedByteInAFullVersionIsRefused) {
  fs::path full = Full(Checkpoint(0, 1), 1);
  fs::path shard = full / TestShardName({}, 0);
  const TensorInfo t = FirstTensor(shard);
  FlipByte(shard, DataStart(shard) + t.begin + 3);

  ProcessResult verify = RunStitch({"delta", "verify", full.string()});
  EXPECT_EQ(verify.exit_code, 1) << verify.out;
  EXPECT_THAT(verify.err, HasSubstr(absl::StrCat("tensor \"", t.name, "\" hashes to")));

  ProcessResult r = Publish(full);
  ExpectRefused(r, absl::StrCat(shard.string(), ": tensor \"", t.name, "\" hashes to"));
}

TEST_F(PublishCliTest, AFullVersionRecordsAndVerifiesItsChecksums) {
  fs::path full = Full(Checkpoint(0, 1), 1);
  auto index = ReadIndex(full);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->metadata["checksum_format"], "xxh3-128");
  ProcessResult verify = RunStitch({"delta", "verify", full.string()});
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("every tensor matches its recorded checksum"));
  EXPECT_EQ(Publish(full).exit_code, 0);
  EXPECT_EQ(Pointer(), "run-a/weight_v000001\n");
}

// ---- delta encode never assumes its base's version ----

TEST_F(PublishCliTest, EncodingFromABaseThatRecordsNoVersionNeedsBaseVersion) {
  auto base = WriteTestVersion(tmp_ / "boot", 0, TestVersionOptions{.record_version = false});
  ASSERT_TRUE(base.ok());
  fs::path target = Checkpoint(4, 2);
  fs::path out = tmp_ / "enc" / VersionDirName(4);
  fs::create_directories(out.parent_path());
  ProcessResult r = RunStitch({"delta", "encode", "--base", base->string(), "--target",
                               target.string(), "--out", out.string(), "--version", "4"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, IsOneFailureLine());
  EXPECT_THAT(r.err, HasSubstr("records no version"));
  EXPECT_THAT(r.err, HasSubstr("--base-version"));
  EXPECT_FALSE(fs::exists(out));

  r = RunStitch({"delta", "encode", "--base", base->string(), "--target", target.string(), "--out",
                 out.string(), "--version", "4", "--base-version", "3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("applies to version 3, as --base-version says"));

  // A base that records its version is read, and says so.
  fs::path out2 = tmp_ / "enc2" / VersionDirName(1);
  fs::create_directories(out2.parent_path());
  r = RunStitch({"delta", "encode", "--base", Checkpoint(0, 1).string(), "--target",
                 Checkpoint(1, 2).string(), "--out", out2.string(), "--version", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("applies to version 0, as the base's index records"));
}

// ---- Only claim creates a store ----

class MissingStoreCliTest : public ::testing::Test {
 protected:
  TempDir tmp_;
  const std::string typo_ = (tmp_ / "stor").string();
};

TEST_F(MissingStoreCliTest, EveryCommandButClaimRefusesAMissingStoreAndNamesClaim) {
  auto version = WriteTestVersion(tmp_ / "src", 1);
  ASSERT_TRUE(version.ok());
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"pointer", "--store", typo_},
           {"publish", "--store", typo_, "--run-id", "run-a", version->string()},
           {"status", "--pool", "static:http://127.0.0.1:1", "--store", typo_},
           {"sidecar", "--store", typo_, "--run-id", "run-a", "--engine-url", "http://127.0.0.1:1",
            "--base-checkpoint", version->string(), "--update-mode", "cpu"},
       }) {
    ProcessResult r = RunStitch(args);
    EXPECT_EQ(r.exit_code, 1) << args[0] << ": " << r.err;
    EXPECT_THAT(r.err, IsOneFailureLine()) << args[0];
    EXPECT_THAT(r.err, HasSubstr("claim")) << args[0];
    EXPECT_FALSE(fs::exists(typo_)) << args[0] << " created the store";
  }
  ProcessResult claim = RunStitch({"claim", "--store", typo_, "--run-id", "run-a"});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  EXPECT_TRUE(fs::is_regular_file(fs::path(typo_) / "latest"));
  EXPECT_EQ(RunStitch({"pointer", "--store", typo_}).out, "run-a/weight_v000000\n");
}

}  // namespace
}  // namespace stitch
