#include "stitch/format/index.h"

#include <stdlib.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stitch/core/version.h"
#include "stitch/format/safetensors.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using ::stitch::testing::TempDir;

void WriteText(const fs::path& path, std::string_view text) { std::ofstream(path) << text; }

CheckpointIndex DeltaIndex() {
  CheckpointIndex index;
  index.metadata = {{"version", "000008"},
                    {"base_version", "000007"},
                    {"delta_encoding", "xor"},
                    {"compression_format", "zstd"},
                    {"checksum_format", "xxh3-128"}};
  index.weight_map = {{"a", "delta-00001.safetensors"}, {"b", "delta-00001.safetensors"}};
  return index;
}

TEST(VersionMetadataString, PadsToSixDigits) {
  EXPECT_EQ(VersionMetadataString(7), "000007");
  EXPECT_EQ(VersionMetadataString(0), "000000");
  EXPECT_EQ(VersionMetadataString(123456), "123456");
  EXPECT_EQ(VersionMetadataString(1234567), "1234567");
}

TEST(CheckpointIndex, ParsesAndSerializesPreservingOtherMetadata) {
  constexpr std::string_view kText = R"({
    "metadata": {"version": "000007", "total_size": 1234, "note": "hi",
                 "nested": {"a": [1, 2.5, null], "b": true}},
    "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                   "embed.weight": "model-00001-of-00002.safetensors",
                   "norm.weight": "model-00002-of-00002.safetensors"}
  })";
  auto index = CheckpointIndex::Parse(kText);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->metadata,
            (std::map<std::string, std::string>{{"version", "000007"}, {"note", "hi"}}));
  EXPECT_EQ(index->other_metadata.at("total_size"), "1234");
  EXPECT_EQ(index->other_metadata.at("nested"), R"({"a":[1,2.5E0,null],"b":true})");
  EXPECT_EQ(index->weight_map.size(), 3u);
  EXPECT_EQ(index->weight_map.at("embed.weight"), "model-00001-of-00002.safetensors");

  const std::string json = index->ToJson();
  auto again = CheckpointIndex::Parse(json);
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << json;
  EXPECT_EQ(again->metadata, index->metadata);
  EXPECT_EQ(again->other_metadata, index->other_metadata);
  EXPECT_EQ(again->weight_map, index->weight_map);
  EXPECT_THAT(json, HasSubstr(R"("total_size":1234)"));
  EXPECT_EQ(again->ToJson(), json) << "serialization is deterministic";

  auto version = index->version();
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, 7);
  EXPECT_FALSE(index->is_delta());
}

TEST(CheckpointIndex, ToJsonKeepsHandWrittenNonJsonMetadataAsString) {
  CheckpointIndex index;
  index.other_metadata["raw"] = "not json {";
  index.weight_map["t"] = "a.safetensors";
  auto again = CheckpointIndex::Parse(index.ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->metadata.at("raw"), "not json {");
}

// metadata.version is read as the original Python Stitch reads it (int()):
// digits as a string, as int() takes them, or a JSON integer.
TEST(CheckpointIndex, VersionIsAnIntegerOrItsDigitsAsPythonsIntReadsThem) {
  CheckpointIndex index;
  auto none = index.version();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  for (const auto& [text, want] : std::vector<std::pair<std::string, int64_t>>{
           {"0000042", 42}, {" 7", 7}, {"+7", 7}, {"1_000", 1000}, {"999999999999", kMaxVersion}}) {
    index.metadata["version"] = text;
    auto v = index.version();
    ASSERT_TRUE(v.ok()) << text << ": " << v.status();
    EXPECT_EQ(**v, want) << text;
  }
  for (std::string bad : {"", "7a", "-1", "1__0", "7.0", "99999999999999999999", "9007199254740991",
                          "1000000000000"}) {
    index.metadata["version"] = bad;
    auto v = index.version();
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_THAT(Msg(v.status()), HasSubstr("is not a version number")) << bad;
  }

  for (const char* json : {R"({"metadata": {"version": 3}, "weight_map": {}})",
                           R"({"metadata": {"version": 3.0}, "weight_map": {}})"}) {
    auto parsed = CheckpointIndex::Parse(json);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto v = parsed->version();
    ASSERT_TRUE(v.ok()) << json << ": " << v.status();
    EXPECT_EQ(**v, 3) << json;
  }
  for (const char* json : {R"({"metadata": {"version": -3}, "weight_map": {}})",
                           R"({"metadata": {"version": 3.5}, "weight_map": {}})",
                           R"({"metadata": {"version": true}, "weight_map": {}})",
                           R"({"metadata": {"version": 1000000000000}, "weight_map": {}})"}) {
    auto parsed = CheckpointIndex::Parse(json);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto v = parsed->version();
    ASSERT_FALSE(v.ok()) << json;
    EXPECT_THAT(Msg(v.status()), HasSubstr("metadata.version")) << json;
  }
}

// A DELTA's base_version is read the same way, and a version number set on
// an index read with an integer one is the one written back.
TEST(CheckpointIndex, IntegerVersionsReachTheManifestAndAreReplacedWhenSet) {
  auto parsed = CheckpointIndex::Parse(
      R"({"metadata": {"version": 4, "base_version": 3, "delta_encoding": "xor",
          "compression_format": "zstd", "checksum_format": "xxh3-128"},
          "weight_map": {"a": "model.safetensors"}})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto manifest = parsed->ToManifest();
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->version, 4);
  EXPECT_EQ(manifest->base_version, 3);
  parsed->metadata["version"] = VersionMetadataString(9);
  auto again = CheckpointIndex::Parse(parsed->ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->metadata.at("version"), "000009");
  EXPECT_EQ(**again->version(), 9);
}

TEST(CheckpointIndex, FullManifestListsDistinctSortedFiles) {
  CheckpointIndex index;
  index.metadata["version"] = VersionMetadataString(3);
  index.weight_map = {
      {"c", "z.safetensors"}, {"a", "shards/b.safetensors"}, {"b", "z.safetensors"}};
  auto m = index.ToManifest();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, 3);
  EXPECT_EQ(m->kind, VersionKind::kFull);
  EXPECT_FALSE(m->base_version.has_value());
  EXPECT_THAT(m->files, ElementsAre("shards/b.safetensors", "z.safetensors"));
}

TEST(CheckpointIndex, DeltaManifest) {
  CheckpointIndex index = DeltaIndex();
  EXPECT_TRUE(index.is_delta());
  auto m = index.ToManifest();
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version, 8);
  EXPECT_EQ(m->kind, VersionKind::kDelta);
  EXPECT_EQ(m->base_version, 7);
  EXPECT_THAT(m->files, ElementsAre("delta-00001.safetensors"));

  index.weight_map.clear();
  auto empty = index.ToManifest();
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->is_empty_delta());
}

TEST(CheckpointIndex, ManifestErrorsNameTheProblem) {
  {
    CheckpointIndex index;
    EXPECT_THAT(Msg(index.ToManifest().status()), HasSubstr("metadata.version is missing"));
  }
  struct Case {
    std::string key;
    std::optional<std::string> value;  // nullopt: remove the key
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"delta_encoding", "bitdiff",
       "unsupported delta_encoding \"bitdiff\": Stitch reads only \"xor\""},
      {"compression_format", "lz4", "unsupported compression_format \"lz4\""},
      {"compression_format", std::nullopt, "DELTA metadata.compression_format is missing"},
      {"checksum_format", "sha256", "unsupported checksum_format \"sha256\""},
      {"checksum_format", std::nullopt, "checksum_format is missing (expected \"xxh3-128\")"},
      {"base_version", std::nullopt, "base_version is missing"},
      {"base_version", "seven", "metadata.base_version \"seven\" is not a version number"},
      {"version", "x", "metadata.version \"x\" is not a version number"},
  };
  for (const Case& c : cases) {
    CheckpointIndex index = DeltaIndex();
    if (c.value) {
      index.metadata[c.key] = *c.value;
    } else {
      index.metadata.erase(c.key);
    }
    auto m = index.ToManifest();
    ASSERT_FALSE(m.ok()) << c.key;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(Msg(m.status()), HasSubstr(c.reason)) << c.key;
  }
  // A non-string delta key is found, and reported as such.
  CheckpointIndex index = DeltaIndex();
  index.metadata.erase("delta_encoding");
  index.other_metadata["delta_encoding"] = "1";
  EXPECT_TRUE(index.is_delta());
  EXPECT_THAT(Msg(index.ToManifest().status()),
              HasSubstr("DELTA metadata.delta_encoding is not a string"));
}

TEST(CheckpointIndex, RejectsUnsafePayloadNamesEverywhere) {
  TempDir dir;
  for (std::string bad : {"/abs", "../x", "a/../../b", "a\\b", "", "a//b", "./a"}) {
    std::string escaped;
    for (char c : bad) {
      if (c == '\\') escaped += '\\';
      escaped += c;
    }
    auto parsed = CheckpointIndex::Parse(
        absl::StrCat(R"({"metadata":{"version":"000001"},"weight_map":{"t":")", escaped, R"("}})"));
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_THAT(Msg(parsed.status()), HasSubstr("unsafe file name")) << bad;
    EXPECT_THAT(Msg(parsed.status()), HasSubstr("weight_map[\"t\"]")) << bad;

    CheckpointIndex index;
    index.metadata["version"] = "000001";
    index.weight_map["t"] = bad;
    EXPECT_THAT(Msg(index.ToManifest().status()), HasSubstr("unsafe file name")) << bad;
    EXPECT_THAT(Msg(WriteIndex(dir.path(), index)), HasSubstr("unsafe file name")) << bad;
    EXPECT_FALSE(fs::exists(dir.path() / kIndexFileName)) << bad;
  }
}

TEST(CheckpointIndex, RejectsMalformedDocuments) {
  struct Case {
    std::string text;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"{", "not valid JSON"},
      {"[]", "is a JSON array, expected an object"},
      {R"({"metadata":{}})", "has no weight_map"},
      {R"({"weight_map":[]})", "weight_map is a array"},
      {R"({"weight_map":{"t":1}})", "weight_map[\"t\"] is a number, expected a file name"},
      {R"({"metadata":"v","weight_map":{}})", "metadata is a string"},
      {R"({"weight_map":{"t":"a.safetensors","t":"b.safetensors"}})", "duplicate key \"t\""},
      {R"({"metadata":{"version":"1","version":"2"},"weight_map":{}})",
       "duplicate key \"version\""},
  };
  for (const Case& c : cases) {
    auto parsed = CheckpointIndex::Parse(c.text);
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(Msg(parsed.status()), HasSubstr(c.reason)) << c.text;
  }
}

TEST(ReadIndex, ReadsWrittenIndexDurably) {
  TempDir dir;
  CheckpointIndex index = DeltaIndex();
  index.other_metadata["total_size"] = "42";
  ASSERT_TRUE(WriteIndex(dir.path(), index).ok());
  auto read = ReadIndex(dir.path());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata, index.metadata);
  EXPECT_EQ(read->other_metadata, index.other_metadata);
  EXPECT_EQ(read->weight_map, index.weight_map);

  // Rewriting replaces the file and leaves no temporary behind.
  index.weight_map = {{"only", "one.safetensors"}};
  ASSERT_TRUE(WriteIndex(dir.path(), index).ok());
  EXPECT_EQ(ReadIndex(dir.path())->weight_map, index.weight_map);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) names.push_back(e.path().filename());
  EXPECT_THAT(names, ElementsAre(std::string(kIndexFileName)));
}

TEST(ReadIndex, SynthesizesAnIndexForASingleFile) {
  TempDir dir;
  const std::vector<std::byte> bytes(8);
  ASSERT_TRUE(WriteSafetensors(dir.path() / "model.safetensors",
                               {{"b", DType::kF32, {2}, bytes}, {"a", DType::kU8, {0}, {}}})
                  .ok());
  auto index = ReadIndex(dir.path());
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_THAT(index->metadata, IsEmpty());
  EXPECT_THAT(index->other_metadata, IsEmpty());
  EXPECT_EQ(index->weight_map, (std::map<std::string, std::string>{{"a", "model.safetensors"},
                                                                   {"b", "model.safetensors"}}));
  EXPECT_FALSE(index->version()->has_value());

  // An index, when present, wins over the single file.
  WriteText(dir.path() / kIndexFileName, R"({"weight_map":{"x":"model.safetensors"}})");
  EXPECT_EQ(ReadIndex(dir.path())->weight_map.size(), 1u);
}

TEST(ReadIndex, ErrorsNameTheDirectoryOrFile) {
  TempDir dir;
  auto none = ReadIndex(dir.path());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(none.status()), HasSubstr(dir.path().string()));
  EXPECT_THAT(Msg(none.status()),
              HasSubstr("has neither model.safetensors.index.json nor model.safetensors"));

  auto missing = ReadIndex(dir.path() / "nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("nope does not exist"));

  WriteText(dir.path() / kIndexFileName, R"({"weight_map":{"t":"../escape.safetensors"}})");
  auto unsafe = ReadIndex(dir.path());
  EXPECT_EQ(unsafe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(unsafe.status()), HasSubstr((dir.path() / kIndexFileName).string()));
  EXPECT_THAT(Msg(unsafe.status()), HasSubstr("climbs out of the version directory"));

  fs::remove(dir.path() / kIndexFileName);
  WriteText(dir.path() / "model.safetensors", "garbage!");
  auto bad_single = ReadIndex(dir.path());
  EXPECT_THAT(Msg(bad_single.status()), HasSubstr("model.safetensors"));
  EXPECT_THAT(Msg(bad_single.status()), HasSubstr("not a safetensors file"));
}

// A version of a checkpoint lists that checkpoint's tensors: the bounds for
// it follow the base (twice its tensors and 16 more, and the bytes such an
// index can take), never above the defaults.
TEST(IndexBounds, FollowTheBaseCheckpoint) {
  CheckpointIndex base;
  base.weight_map = {{"embed.weight", "model.safetensors"}, {"norm.weight", "model.safetensors"}};
  const IndexBounds bounds = IndexBoundsFor(base);
  EXPECT_EQ(bounds.max_tensors, 20u);
  EXPECT_LT(bounds.max_bytes, uint64_t{2} << 20);
  EXPECT_THAT(bounds.why, HasSubstr("lists 2 tensors"));

  auto index_of = [](int tensors) {
    CheckpointIndex index;
    index.metadata["version"] = "000003";
    for (int i = 0; i < tensors; ++i) {
      index.weight_map[absl::StrCat("layer.", i, ".weight")] = "model.safetensors";
    }
    return index.ToJson();
  };
  EXPECT_TRUE(CheckpointIndex::Parse(index_of(20), bounds).ok());
  auto many = CheckpointIndex::Parse(index_of(21), bounds);
  ASSERT_FALSE(many.ok());
  EXPECT_THAT(Msg(many.status()), HasSubstr("weight_map lists 21 tensors, above the limit of 20"));
  EXPECT_THAT(Msg(many.status()), HasSubstr("base checkpoint"));
  // The defaults take it.
  EXPECT_TRUE(CheckpointIndex::Parse(index_of(21)).ok());
  const std::string padded = absl::StrCat(
      R"({"metadata":{"pad":")", std::string(bounds.max_bytes, 'p'), R"("},"weight_map":{}})");
  auto large = CheckpointIndex::Parse(padded, bounds);
  ASSERT_FALSE(large.ok());
  EXPECT_THAT(Msg(large.status()), HasSubstr("bytes, above the limit of"));

  // A base with a million tensors is held to the defaults.
  CheckpointIndex huge;
  for (int i = 0; i < 600'000; ++i) huge.weight_map[absl::StrCat("t", i)] = "model.safetensors";
  EXPECT_EQ(IndexBoundsFor(huge).max_tensors, kMaxIndexTensors);
  EXPECT_EQ(IndexBoundsFor(huge).max_bytes, kMaxIndexBytes);
}

}  // namespace
}  // namespace stitch
