#include "stitch/refengine/init_model.h"

#include <cmath>
#include <string>
#include <vector>

#include <set>
#include <string_view>

#include <boost/json/parse.hpp>

#include "gtest/gtest.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/refengine/hf_tokenizer.h"
#include "stitch/refengine/test_models.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

const char* const kFiles[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};

ModelConfig Small() {
  ModelConfig c;
  c.hidden_size = 32;
  c.intermediate_size = 88;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 64;
  return c;
}

absl::Status Init(const fs::path& dir, const ModelConfig& c, uint64_t seed,
                  ExistingDir existing = ExistingDir::kRefuse) {
  const std::vector<HostTensor> tensors = RandomCheckpointTensors(c, seed);
  return WriteCheckpoint(dir, c, testing::Views(tensors), existing);
}

std::string Read(const fs::path& p) {
  auto s = ReadFileToString(p);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::string();
}

TEST(InitModel, SameSeedGivesIdenticalBytesAndAnotherSeedDoesNot) {
  stitch::testing::TempDir tmp;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    ModelConfig c = Small();
    c.weight_dtype = dtype;
    const std::string tag(DTypeName(dtype));
    ASSERT_TRUE(Init(tmp / ("a" + tag), c, 7).ok());
    ASSERT_TRUE(Init(tmp / ("b" + tag), c, 7).ok());
    ASSERT_TRUE(Init(tmp / ("c" + tag), c, 8).ok());
    for (const char* f : kFiles) {
      EXPECT_EQ(Read(tmp / ("a" + tag) / f), Read(tmp / ("b" + tag) / f)) << f;
    }
    EXPECT_NE(Read(tmp / ("a" + tag) / "model.safetensors"),
              Read(tmp / ("c" + tag) / "model.safetensors"));
    EXPECT_EQ(Read(tmp / ("a" + tag) / "config.json"), Read(tmp / ("c" + tag) / "config.json"));
  }
}

TEST(InitModel, ValuesAreNormalishWithUnitNorms) {
  const ModelConfig c = Small();
  const std::vector<HostTensor> tensors = RandomCheckpointTensors(c, 3);
  ASSERT_EQ(tensors.size(), ExpectedTensors(c).size());
  auto w = ModelWeights::FromTensors(c, testing::Views(tensors));
  ASSERT_TRUE(w.ok()) << w.status();
  for (float v : (*w)->final_norm()) EXPECT_EQ(v, 1.0f);
  for (float v : (*w)->layers()[1].post_norm) EXPECT_EQ(v, 1.0f);
  const std::vector<float>& m = (*w)->layers()[0].gate_up;
  double sum = 0, sq = 0;
  for (float v : m) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / m.size();
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / m.size() - mean * mean), kInitStd, 0.002);
  // Each tensor has its own stream: q and k of one layer differ.
  EXPECT_NE((*w)->layers()[0].qkv[0], (*w)->layers()[0].qkv[32 * 32]);
}

TEST(InitModel, WritesALoadableHuggingFaceCheckpoint) {
  stitch::testing::TempDir tmp;
  const ModelConfig c = Small();
  ASSERT_TRUE(Init(tmp / "nested" / "model", c, 1).ok());
  auto config = ReadModelConfig(tmp / "nested" / "model");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*config, c);
  auto index = ReadIndex(tmp / "nested" / "model");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_FALSE(index->metadata.contains("version"));
  EXPECT_EQ(index->weight_map.size(), ExpectedTensors(c).size());
  for (const auto& [name, file] : index->weight_map) EXPECT_EQ(file, "model.safetensors") << name;
  auto w = LoadCheckpoint(tmp / "nested" / "model");
  ASSERT_TRUE(w.ok()) << w.status();
  // Nothing but the checkpoint is left behind (no temporary directory).
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(tmp / "nested")) entries += e.exists();
  EXPECT_EQ(entries, 1u);
}

// Real engines and transformers load the checkpoint too: its tokenizer is
// the byte vocabulary (tests/engines/ checks it with transformers).
TEST(InitModel, WritesHuggingFaceTokenizerFilesOfTheByteVocabulary) {
  stitch::testing::TempDir tmp;
  ModelConfig c = Small();
  c.vocab_size = 260;
  ASSERT_TRUE(Init(tmp / "model", c, 1).ok());
  for (std::string_view name : kHfTokenizerFiles) {
    auto text = ReadFileToString(tmp / "model" / name);
    ASSERT_TRUE(text.ok()) << name << ": " << text.status();
    EXPECT_NO_THROW(boost::json::parse(*text)) << name;
  }
  const boost::json::value doc =
      boost::json::parse(*ReadFileToString(tmp / "model" / "tokenizer.json"));
  const boost::json::object& vocab = doc.at("model").at("vocab").as_object();
  ASSERT_EQ(vocab.size(), 256u);
  std::set<int64_t> ids;
  for (const auto& [chars, id] : vocab) {
    ids.insert(id.as_int64());
    // One character each (GPT-2's byte map), never a space or a control.
    EXPECT_EQ(std::string(chars).size(), id.as_int64() >= '!' && id.as_int64() <= '~' ? 1u : 2u)
        << id;
  }
  EXPECT_EQ(ids.size(), 256u);
  const boost::json::array& added = doc.at("added_tokens").as_array();
  ASSERT_EQ(added.size(), 4u);  // BOS, EOS and the two unused ids
  EXPECT_EQ(added[0].at("id").as_int64(), 256);
  EXPECT_EQ(added[0].at("content").as_string(), "<|stitch_bos|>");
  EXPECT_EQ(added[3].at("id").as_int64(), 259);
  const auto config =
      boost::json::parse(*ReadFileToString(tmp / "model" / "tokenizer_config.json"));
  EXPECT_EQ(config.at("bos_token").as_string(), "<|stitch_bos|>");
  EXPECT_TRUE(config.at("chat_template").as_string().starts_with("{{- bos_token -}}"));
}

TEST(InitModel, RefusesANonEmptyDirectoryUnlessOverwriting) {
  stitch::testing::TempDir tmp;
  const ModelConfig c = Small();
  fs::create_directories(tmp / "empty");
  ASSERT_TRUE(Init(tmp / "empty", c, 1).ok());  // an empty directory is fine

  const absl::Status again = Init(tmp / "empty", c, 2);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(std::string(again.message()).find("--force"), std::string::npos);
  const std::string before = Read(tmp / "empty" / "model.safetensors");

  ASSERT_TRUE(WriteFileAtomically(tmp / "empty" / "notes.txt", "mine").ok());
  ASSERT_TRUE(Init(tmp / "empty", c, 2, ExistingDir::kOverwrite).ok());
  EXPECT_NE(Read(tmp / "empty" / "model.safetensors"), before);
  EXPECT_EQ(Read(tmp / "empty" / "notes.txt"), "mine");
  EXPECT_TRUE(LoadCheckpoint(tmp / "empty").ok());

  ASSERT_TRUE(WriteFileAtomically(tmp / "file", "x").ok());
  EXPECT_FALSE(Init(tmp / "file", c, 1).ok());
}

TEST(InitModel, WriteCheckpointValidatesTheTensors) {
  stitch::testing::TempDir tmp;
  const ModelConfig c = Small();
  std::vector<HostTensor> tensors = RandomCheckpointTensors(c, 1);
  tensors.pop_back();
  const absl::Status s =
      WriteCheckpoint(tmp / "x", c, testing::Views(tensors), ExistingDir::kRefuse);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("lm_head.weight is missing"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(tmp / "x"));
}

}  // namespace
}  // namespace stitch
