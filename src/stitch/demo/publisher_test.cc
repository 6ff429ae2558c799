#include "stitch/demo/publisher.h"

#include <gtest/gtest.h>

#include "stitch/demo/policy_gradient.h"
#include "stitch/publish/claim.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/tokenizer.h"
#include "stitch/store/fs_store.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

TEST(StepPublisher, PublishesDeltasWithAFullAnchorEveryKVersions) {
  testing::TempDir tmp;
  auto store = FsStore::Open(tmp.path() / "store", "r1");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE(ClaimRun(**store, 0, nullptr).ok());
  ModelConfig config;
  config.hidden_size = 16;
  config.intermediate_size = 32;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 2;
  config.num_key_value_heads = 2;
  config.max_position_embeddings = 64;
  auto trainer = LmHeadTrainer::Create(config, RandomCheckpointTensors(config, 1), {});
  ASSERT_TRUE(trainer.ok());
  Rollout r;
  r.prompt = {kBosToken, 'x'};
  r.completion = {'a', 'b'};
  r.advantage = 1;
  StepPublisher publisher(**store, tmp.path() / "out", 2);
  std::vector<HostTensor> previous = RandomCheckpointTensors(config, 1);
  for (int64_t version = 1; version <= 3; ++version) {
    r.behaviour_logprobs = *(*trainer)->PolicyLogProbs(r);
    ASSERT_TRUE((*trainer)->Step(std::span<const Rollout>(&r, 1)).ok());
    std::vector<TensorView> base;
    for (const HostTensor& t : previous) base.push_back(t.view());
    auto record = publisher.Publish(version, base, (*trainer)->Tensors());
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_EQ(record->kind, version == 2 ? PublishedKind::kFull : PublishedKind::kDelta);
    EXPECT_GT(record->payload_bytes, 0u);
    previous.clear();
    for (const TensorView& t : (*trainer)->Tensors()) {
      HostTensor copy;
      copy.name = std::string(t.name);
      copy.dtype = t.dtype;
      copy.shape.assign(t.shape.begin(), t.shape.end());
      copy.data.assign(t.data.begin(), t.data.end());
      previous.push_back(std::move(copy));
    }
  }
  auto pointer = (*store)->ReadPointer();
  ASSERT_TRUE(pointer.ok() && pointer->has_value());
  EXPECT_EQ((*pointer)->version, 3);
}

}  // namespace
}  // namespace stitch
