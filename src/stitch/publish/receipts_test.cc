#include "stitch/publish/receipts.h"

#include <gtest/gtest.h>

#include <map>

#include "absl/strings/match.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

const std::string kShaA(64, 'a');
const std::string kShaB(64, 'b');
const std::string kShaC(64, 'c');

VersionManifest Manifest(std::vector<std::string> files) {
  VersionManifest m;
  m.version = 7;
  m.files = std::move(files);
  return m;
}

// A store view that holds exactly `files`.
StatFilesFn Holding(std::map<std::string, FileReceipt> files) {
  return
      [files](const std::vector<std::string>& names) -> absl::StatusOr<std::vector<FileReceipt>> {
        std::vector<FileReceipt> out;
        for (const std::string& n : names) {
          auto it = files.find(n);
          if (it == files.end()) return absl::NotFoundError(n + " does not exist");
          out.push_back(it->second);
        }
        return out;
      };
}

TEST(ReceiptsTest, JsonRoundTrip) {
  UploadReceipt r{
      7, "rank-000001", {{"a.safetensors", 10, kShaA}, {"sub/b.safetensors", 0, kShaB}}};
  auto back = ReceiptFromJson(ReceiptToJson(r));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->version, 7);
  EXPECT_EQ(back->host, "rank-000001");
  EXPECT_EQ(back->files, r.files);
}

TEST(ReceiptsTest, TheTensorsAFileHoldsRoundTrip) {
  UploadReceipt r{7, "rank-000001", {{"a.safetensors", 10, kShaA, {"x", "y"}}}};
  const std::string json = ReceiptToJson(r);
  EXPECT_TRUE(absl::StrContains(json, R"("tensors":["x","y"])")) << json;
  auto back = ReceiptFromJson(json);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->files, r.files);
  EXPECT_TRUE(absl::IsInvalidArgument(
      ReceiptFromJson(
          R"({"version": 1, "host": "h", "files": [{"file": "x", "size": 1, "sha256": ")" + kShaA +
          R"(", "tensors": [1]}]})")
          .status()));
}

TEST(ReceiptsTest, EachFileMustHoldExactlyTheTensorsTheIndexMapsToIt) {
  const std::map<std::string, std::string> weight_map = {{"w0", "a"}, {"w1", "a"}, {"w2", "b"}};
  std::vector<FileReceipt> files = {{"a", 1, kShaA, {"w0", "w1"}}, {"b", 2, kShaB, {"w2"}}};
  EXPECT_TRUE(CheckReceiptTensors("store x", 7, weight_map, files).ok());

  files[0].tensors = {"w0"};  // the index maps w1 to a file that lacks it
  absl::Status missing = CheckReceiptTensors("store x", 7, weight_map, files);
  EXPECT_TRUE(absl::IsFailedPrecondition(missing)) << missing;
  EXPECT_TRUE(absl::StrContains(
      missing.message(), R"(the index maps tensor "w1" to "a", but that file does not hold it)"))
      << missing;

  files[0].tensors = {"w0", "w1", "w2"};  // a holds w2, which the index maps to b
  absl::Status stray = CheckReceiptTensors("store x", 7, weight_map, files);
  EXPECT_TRUE(absl::IsFailedPrecondition(stray)) << stray;
  EXPECT_TRUE(
      absl::StrContains(stray.message(), R"("a" holds tensor "w2", which the index maps to "b")"))
      << stray;
}

TEST(ReceiptsTest, RejectsMalformedReceipts) {
  for (
      const char* bad : {
          "",
          "[]",
          R"({"host": "h", "files": []})",
          R"({"version": -1, "host": "h", "files": []})",
          R"({"version": 1, "files": []})",
          R"({"version": 1, "host": "h"})",
          R"({"version": 1, "host": "h", "files": [{"file": "../x", "size": 1, "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]})",
          R"({"version": 1, "host": "h", "files": [{"file": "/abs", "size": 1, "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]})",
          R"({"version": 1, "host": "h", "files": [{"file": "x", "size": 1, "sha256": "AAAA"}]})",
          R"({"version": 1, "host": "h", "files": [{"file": "x", "size": -1, "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]})",
          R"({"version": 1, "host": "h", "files": [{"file": "x", "size": 1, "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}, {"file": "x", "size": 1, "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}]})",
      }) {
    auto r = ReceiptFromJson(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
  }
}

TEST(ReceiptsTest, MergesReceiptsFromSeveralHosts) {
  std::vector<UploadReceipt> receipts = {
      {7, "rank-000000", {{"a", 1, kShaA}}},
      {7, "rank-000001", {{"b", 2, kShaB}, {"a", 1, kShaA}}},  // the same file twice: fine
  };
  auto merged = VerifyReceipts("store x", 7, Manifest({"a", "b"}), receipts,
                               Holding({{"a", {"a", 1, kShaA}}, {"b", {"b", 2, kShaB}}}));
  ASSERT_TRUE(merged.ok()) << merged.status().message();
  ASSERT_EQ(merged->size(), 2u);
  EXPECT_EQ((*merged)[0].file, "a");
  EXPECT_EQ((*merged)[1].file, "b");
}

TEST(ReceiptsTest, ConflictingReceiptsForOneFileAreAnError) {
  std::vector<UploadReceipt> receipts = {{7, "rank-000000", {{"a", 1, kShaA}}},
                                         {7, "rank-000008", {{"a", 1, kShaB}}}};
  auto merged =
      VerifyReceipts("store x", 7, Manifest({"a"}), receipts, Holding({{"a", {"a", 1, kShaA}}}));
  EXPECT_TRUE(absl::IsFailedPrecondition(merged.status()));
  EXPECT_TRUE(absl::StrContains(merged.status().message(), "rank-000000"));
  EXPECT_TRUE(absl::StrContains(merged.status().message(), "rank-000008"));
}

TEST(ReceiptsTest, TheIndexMustBePresent) {
  std::vector<UploadReceipt> receipts = {{7, "rank-000000", {{"a", 1, kShaA}}}};
  auto merged = VerifyReceipts("store x", 7, std::nullopt, receipts, Holding({}));
  EXPECT_TRUE(absl::IsFailedPrecondition(merged.status()));
  EXPECT_TRUE(absl::StrContains(merged.status().message(), "model.safetensors.index.json"));
}

TEST(ReceiptsTest, EveryWeightMapFileMustBeCoveredAndNothingElse) {
  std::vector<UploadReceipt> receipts = {{7, "rank-000000", {{"a", 1, kShaA}}}};
  auto missing = VerifyReceipts("store x", 7, Manifest({"a", "b", "c"}), receipts,
                                Holding({{"a", {"a", 1, kShaA}}}));
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status()));
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "\"b\", \"c\""))
      << missing.status().message();
  receipts.push_back({7, "rank-000001", {{"stray", 3, kShaC}}});
  auto stray =
      VerifyReceipts("store x", 7, Manifest({"a"}), receipts, Holding({{"a", {"a", 1, kShaA}}}));
  EXPECT_TRUE(absl::IsFailedPrecondition(stray.status()));
  EXPECT_TRUE(absl::StrContains(stray.status().message(), "stray"));
  EXPECT_TRUE(absl::StrContains(stray.status().message(), "rank-000001"));
}

TEST(ReceiptsTest, StoreMustHoldWhatWasReceipted) {
  std::vector<UploadReceipt> receipts = {{7, "rank-000000", {{"a", 1, kShaA}}}};
  auto changed =
      VerifyReceipts("store x", 7, Manifest({"a"}), receipts, Holding({{"a", {"a", 1, kShaB}}}));
  EXPECT_TRUE(absl::IsDataLoss(changed.status()));
  EXPECT_EQ(GetErrorKind(changed.status()), ErrorKind::kChecksumMismatch);
  auto resized =
      VerifyReceipts("store x", 7, Manifest({"a"}), receipts, Holding({{"a", {"a", 2, kShaA}}}));
  EXPECT_TRUE(absl::IsDataLoss(resized.status()));
  auto gone = VerifyReceipts("store x", 7, Manifest({"a"}), receipts, Holding({}));
  EXPECT_TRUE(absl::IsNotFound(gone.status()));
  std::vector<UploadReceipt> other_version = {{8, "rank-000000", {{"a", 1, kShaA}}}};
  auto wrong = VerifyReceipts("store x", 7, Manifest({"a"}), other_version,
                              Holding({{"a", {"a", 1, kShaA}}}));
  EXPECT_TRUE(absl::IsInvalidArgument(wrong.status()));
}

}  // namespace
}  // namespace stitch
