// The S3 store shares a prefix with the original Python Stitch: objects
// record their SHA-256 under the original's metadata key, what the original
// uploads is read, and a version published from a directory carries that
// directory's config and tokenizer files. Against a real S3 protocol server
// (moto).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/io/sha256.h"
#include "stitch/publish/claim.h"
#include "stitch/publish/publish.h"
#include "stitch/store/s3/s3_store.h"
#include "tests/s3_test_base.h"
#include "tests/support/version_dirs.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;

// PUTs `bytes` under `key` with the given user metadata, as another writer
// (the original Stitch, or an earlier version of this one) would.
void Put(Store& store, const std::string& key, const std::string& bytes,
         std::vector<std::pair<std::string, std::string>> metadata) {
  S3Request r;
  r.method = "PUT";
  r.key = key;
  r.body = bytes;
  for (auto& [name, value] : metadata) r.headers.emplace_back(S3Response::MetaHeader(name), value);
  auto response = S3(store).client().Send(r);
  ASSERT_TRUE(response.ok()) << response.status().message();
  ASSERT_TRUE(response->ok()) << response->status << " " << response->body;
}

S3Response HeadObject(Store& store, const std::string& key) {
  S3Request r;
  r.method = "HEAD";
  r.key = key;
  auto response = S3(store).client().Send(r);
  EXPECT_TRUE(response.ok() && response->ok()) << key;
  return response.ok() ? *response : S3Response{};
}

std::string Read(const fs::path& p) {
  auto s = ReadFileToString(p);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : std::string();
}

// A version directory as a trainer framework writes it: weights, index,
// config and tokenizer files.
fs::path FrameworkVersion(const fs::path& parent, int64_t version, int seed = 1) {
  auto dir = WriteTestVersion(parent, version, {.seed = seed});
  EXPECT_TRUE(dir.ok());
  EXPECT_TRUE(WriteFileAtomically(*dir / "config.json", R"({"model_type": "llama"})").ok());
  EXPECT_TRUE(WriteFileAtomically(*dir / "tokenizer.json", R"({"model": {}})").ok());
  EXPECT_TRUE(WriteFileAtomically(*dir / "generation_config.json", "{}").ok());
  return dir.ok() ? *dir : fs::path();
}

const std::vector<std::string> kFrameworkFiles = {
    "config.json",        "generation_config.json", TestShardName({}, 0),
    TestShardName({}, 1), "tokenizer.json",         "model.safetensors.index.json"};

TEST_F(S3Test, EveryObjectRecordsItsSha256UnderTheOriginalsMetadataKey) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  fs::path v1 = FrameworkVersion(tmp() / "src", 1);
  ASSERT_TRUE(store->PublishFiles(1, v1).ok());
  ASSERT_TRUE(S3(*store).PutReceipt(1, "rank-000000", "{}").ok());
  for (const std::string& name : kFrameworkFiles) {
    S3Response head = HeadObject(*store, S3(*store).VersionKey(1, name));
    auto digest = HashFile(v1 / name);
    ASSERT_TRUE(digest.ok());
    // What the original's upload check reads back: x-amz-meta-stitch-sha256.
    EXPECT_EQ(head.Header("x-amz-meta-stitch-sha256"), digest->sha256) << name;
    // And the earlier key, for readers not yet upgraded.
    EXPECT_EQ(head.Metadata(kLegacySha256MetadataKey), digest->sha256) << name;
  }
  S3Response receipt = HeadObject(*store, S3(*store).VersionKey(1, ".receipts/rank-000000.json"));
  EXPECT_EQ(receipt.Metadata(kSha256MetadataKey), Sha256Hex("{}"));
}

TEST_F(S3Test, ObjectsRecordingOnlyTheEarlierKeyAreStillRead) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  fs::path v1 = FrameworkVersion(tmp() / "src", 1);
  // Every object as an earlier version of this store wrote it.
  for (const std::string& name : kFrameworkFiles) {
    const std::string bytes = Read(v1 / name);
    Put(*store, S3(*store).VersionKey(1, name), bytes,
        {{std::string(kLegacySha256MetadataKey), Sha256Hex(bytes)}});
  }
  auto manifest = store->ReadManifest(1);
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  auto dir = store->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_TRUE(VerifyVersionDir(*dir).ok());
  EXPECT_EQ(Read(*dir / "config.json"), Read(v1 / "config.json"));
  // The same bytes again are a retry that uploads nothing.
  const int64_t uploads = S3(*store).payload_files_uploaded();
  EXPECT_TRUE(store->PublishFiles(1, v1).ok());
  EXPECT_EQ(S3(*store).payload_files_uploaded(), uploads);
}

TEST_F(S3Test, AVersionTheOriginalUploadedIsReadAndItsRetryIsANoOp) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(ClaimRun(*store, 0, nullptr).ok());
  fs::path v1 = FrameworkVersion(tmp() / "src", 1);
  // The original uploads every file of the directory with its SHA-256 under
  // `stitch-sha256`, then moves `latest` with a conditional write.
  for (const std::string& name : kFrameworkFiles) {
    const std::string bytes = Read(v1 / name);
    Put(*store, S3(*store).VersionKey(1, name), bytes,
        {{std::string(kSha256MetadataKey), Sha256Hex(bytes)}});
  }
  ASSERT_TRUE(store->AdvancePointer(VersionRef{"run-a", 0}, VersionRef{"run-a", 1}).ok());

  auto dir = store->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_TRUE(VerifyVersionDir(*dir).ok());
  for (const std::string& name : kFrameworkFiles) EXPECT_EQ(Read(*dir / name), Read(v1 / name));

  // Our trainer retrying the same version: nothing to do.
  auto again = PublishVersion(*store, v1, nullptr);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_TRUE(again->already_published);
  EXPECT_EQ(S3(*store).payload_files_uploaded(), 0);
}

TEST_F(S3Test, TwoDisagreeingSha256KeysMakeAnObjectUntrusted) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  fs::path v1 = FrameworkVersion(tmp() / "src", 1);
  ASSERT_TRUE(store->PublishFiles(1, v1).ok());
  const std::string index = Read(v1 / kIndexFileName);
  Put(*store, S3(*store).VersionKey(1, kIndexFileName), index,
      {{std::string(kSha256MetadataKey), Sha256Hex(index)},
       {std::string(kLegacySha256MetadataKey), Sha256Hex("something else")}});
  auto manifest = store->ReadManifest(1);
  EXPECT_TRUE(absl::IsDataLoss(manifest.status())) << manifest.status().message();
  EXPECT_TRUE(absl::StrContains(manifest.status().message(), "two different SHA-256s"))
      << manifest.status().message();
}

TEST_F(S3Test, RepublishingAPublishedVersionIsANoOpWithItsBytesAndRefusedWithOthers) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(ClaimRun(*store, 0, nullptr).ok());
  fs::path v1 = FrameworkVersion(tmp() / "src", 1);
  auto first = PublishVersion(*store, v1, nullptr);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_FALSE(first->already_published);

  // A retry from a byte-identical copy: compared by recorded SHA-256 only.
  const int64_t uploads = S3(*store).payload_files_uploaded();
  auto retry = PublishVersion(*store, FrameworkVersion(tmp() / "copy", 1), nullptr);
  ASSERT_TRUE(retry.ok()) << retry.status().message();
  EXPECT_TRUE(retry->already_published);
  EXPECT_EQ(S3(*store).payload_files_uploaded(), uploads);
  EXPECT_EQ(store->traffic().files_downloaded, 0u);

  auto other = PublishVersion(*store, FrameworkVersion(tmp() / "other", 1, 9), nullptr);
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(other.status())) << other.status().message();
  EXPECT_TRUE(absl::StrContains(other.status().message(), TestShardName({}, 0)))
      << other.status().message();
  EXPECT_TRUE(absl::StrContains(other.status().message(), "publish new weights as weight_v000002"))
      << other.status().message();
  auto pointer = store->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 1}));

  // The published directory holds what an engine reloading it needs.
  auto dir = store->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_EQ(Read(*dir / "config.json"), R"({"model_type": "llama"})");
  EXPECT_EQ(Read(*dir / "tokenizer.json"), R"({"model": {}})");
  EXPECT_EQ(Read(*dir / "generation_config.json"), "{}");
}

TEST_F(S3Test, ARetryAfterACrashBeforeThePointerMovedCompletesThePublish) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(ClaimRun(*store, 0, nullptr).ok());
  fs::path v1 = FrameworkVersion(tmp() / "src", 1);
  ASSERT_TRUE(store->PublishFiles(1, v1).ok());  // the crashed attempt's upload
  auto retry = PublishVersion(*store, v1, nullptr);
  ASSERT_TRUE(retry.ok()) << retry.status().message();
  EXPECT_FALSE(retry->already_published);
  auto pointer = store->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, (VersionRef{"run-a", 1}));
}

}  // namespace
}  // namespace stitch::testing
