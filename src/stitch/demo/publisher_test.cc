#include "stitch/demo/publisher.h"

#include <gtest/gtest.h>

#include "stitch/demo/policy_gradient.h"
#include "stitch/publish/claim.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/test_models.h"
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
  const ModelConfig config = testing::TinyConfig();
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
    auto record = publisher.Publish(version, testing::Views(previous), (*trainer)->Tensors());
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
