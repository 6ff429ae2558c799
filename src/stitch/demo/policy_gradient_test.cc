#include "stitch/demo/policy_gradient.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "stitch/refengine/init_model.h"
#include "stitch/refengine/test_models.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {
namespace {

std::unique_ptr<LmHeadTrainer> MakeTrainer(double learning_rate, double entropy_bonus = 0,
                                           double entropy_floor = 0) {
  ModelConfig config = testing::TinyConfig();
  TrainerOptions options;
  options.learning_rate = learning_rate;
  options.entropy_bonus = entropy_bonus;
  options.entropy_floor = entropy_floor;
  auto trainer = LmHeadTrainer::Create(config, RandomCheckpointTensors(config, 7), options);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  return *std::move(trainer);
}

// A fixed batch: groups of completions of one prompt, rewarded by the task,
// with behaviour log-probabilities from the trainer's own policy (ratio 1).
std::vector<Rollout> FixedBatch(LmHeadTrainer& trainer, const ByteSet& targets) {
  std::mt19937 rng(3);
  std::vector<Rollout> batch;
  std::vector<double> rewards;
  for (int i = 0; i < 8; ++i) {
    Rollout r;
    r.prompt = {kBosToken, 'a', 'b'};
    for (int t = 0; t < 6; ++t) r.completion.push_back(static_cast<int32_t>('a' + rng() % 8));
    r.behaviour_logprobs.assign(r.completion.size(), 0.0);
    rewards.push_back(ByteSetReward(r.completion, targets));
    batch.push_back(std::move(r));
  }
  std::vector<double> advantages = GroupRelativeAdvantages(rewards, 4);
  for (size_t i = 0; i < batch.size(); ++i) batch[i].advantage = advantages[i];
  // Behaviour = the trainer's own policy: every ratio starts at 1.
  for (Rollout& r : batch) {
    auto logp = trainer.PolicyLogProbs(r);
    EXPECT_TRUE(logp.ok()) << logp.status();
    r.behaviour_logprobs = *logp;
  }
  return batch;
}

TEST(DemoTask, RewardIsTheFractionOfTargetBytes) {
  ByteSet targets = MakeByteSet("abc");
  std::vector<int32_t> completion = {'a', 'x', 'c', kEosToken};
  EXPECT_DOUBLE_EQ(ByteSetReward(completion, targets), 0.5);
  EXPECT_DOUBLE_EQ(ByteSetReward({}, targets), 0.0);
}

TEST(DemoTask, AdvantagesAreCentredPerGroup) {
  std::vector<double> rewards = {1, 0, 0.5, 0.5};
  std::vector<double> a = GroupRelativeAdvantages(rewards, 2);
  EXPECT_NEAR(a[0] + a[1], 0, 1e-9);
  EXPECT_GT(a[0], 0.9);
  EXPECT_NEAR(a[2], 0, 1e-9);
  EXPECT_NEAR(a[3], 0, 1e-9);
}

TEST(DemoTask, StaleSamplesAreDroppedAndCrossingSamplesDiscounted) {
  EXPECT_EQ(StalenessWeight(5, 5, 6, 1), 1.0);
  EXPECT_EQ(StalenessWeight(4, 4, 6, 1), 0.0);
  EXPECT_EQ(StalenessWeight(5, 6, 6, 1), 0.5);
}

class LmHeadTrainerGradient : public ::testing::TestWithParam<double> {};

// Without the entropy bonus, and with it (a floor no policy reaches, so
// that it acts everywhere).
INSTANTIATE_TEST_SUITE_P(EntropyBonus, LmHeadTrainerGradient, ::testing::Values(0.0, 0.5));

TEST_P(LmHeadTrainerGradient, GradientMatchesFiniteDifferences) {
  auto trainer = MakeTrainer(0.5, GetParam(), 100.0);
  ByteSet targets = MakeByteSet("aceg");
  std::vector<Rollout> batch = FixedBatch(*trainer, targets);
  std::vector<double> gradient;
  ASSERT_TRUE(trainer->Objective(batch, &gradient).ok());
  const int64_t hidden = trainer->config().hidden_size;
  int checked = 0;
  for (int64_t v : {int64_t{'a'}, int64_t{'b'}, int64_t{'g'}, int64_t{300 % 258}}) {
    for (int64_t k : {int64_t{0}, int64_t{5}, hidden - 1}) {
      float& w = trainer->lm_head()[static_cast<size_t>(v * hidden + k)];
      const float saved = w;
      const float step = 1e-2F;
      w = saved + step;
      double plus = *trainer->Objective(batch, nullptr);
      w = saved - step;
      double minus = *trainer->Objective(batch, nullptr);
      w = saved;
      double numeric = (plus - minus) / (2.0 * step);
      double exact = gradient[static_cast<size_t>(v * hidden + k)];
      EXPECT_NEAR(exact, numeric, 1e-3 * std::max(1.0, std::abs(numeric)))
          << "token " << v << " column " << k;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 12);
}

TEST(LmHeadTrainer, TrainingOnAFixedBatchRaisesTheTargetMass) {
  auto trainer = MakeTrainer(2.0);
  ByteSet targets = MakeByteSet("aceg");
  std::vector<Rollout> batch = FixedBatch(*trainer, targets);
  // The share of the sampled alphabet's mass that is on the targets: any
  // update moves mass onto the sampled bytes, only learning moves it onto
  // the rewarded ones.
  ByteSet alphabet = MakeByteSet("abcdefgh");
  auto share = [&] {
    return *trainer->TargetMass(batch, targets) / *trainer->TargetMass(batch, alphabet);
  };
  double before = share();
  // On-policy steps: the behaviour log-probabilities follow the policy, so
  // the clip never freezes the update at the start of a step.
  for (int i = 0; i < 20; ++i) {
    for (Rollout& r : batch) r.behaviour_logprobs = *trainer->PolicyLogProbs(r);
    ASSERT_TRUE(trainer->Step(batch).ok());
  }
  double after = share();
  EXPECT_GT(after, before + 0.1) << "before " << before << " after " << after;
  // The exported checkpoint carries the new head.
  bool found = false;
  for (const TensorView& t : trainer->Tensors()) found |= t.name == "lm_head.weight";
  EXPECT_TRUE(found);
}

// Rewarded for one byte only, a policy collapses onto it; the entropy floor
// keeps it spread.
TEST(LmHeadTrainer, TheEntropyFloorKeepsThePolicyFromCollapsingOntoOneByte) {
  const ByteSet only_a = MakeByteSet("a");
  auto mass_on_a = [&](double bonus) {
    auto trainer = MakeTrainer(1.0, bonus, 3.0);
    // One group: a completion of 'a's (reward 1) and three of other bytes.
    std::vector<Rollout> batch;
    std::vector<double> rewards;
    for (char c : {'a', 'b', 'c', 'd'}) {
      Rollout r;
      r.prompt = {kBosToken, 'x'};
      r.completion.assign(6, c);
      rewards.push_back(ByteSetReward(r.completion, only_a));
      batch.push_back(std::move(r));
    }
    std::vector<double> advantages = GroupRelativeAdvantages(rewards, 4);
    for (size_t i = 0; i < batch.size(); ++i) batch[i].advantage = advantages[i];
    for (int i = 0; i < 300; ++i) {
      for (Rollout& r : batch) r.behaviour_logprobs = *trainer->PolicyLogProbs(r);
      EXPECT_TRUE(trainer->Step(batch).ok());
    }
    return *trainer->TargetMass(std::span<const Rollout>(batch.data(), 1), only_a);
  };
  const double collapsed = mass_on_a(0.0);
  const double spread = mass_on_a(1.0);
  EXPECT_GT(collapsed, 0.99);
  EXPECT_LT(spread, 0.9) << "without the bonus " << collapsed;
}

TEST(LmHeadTrainer, RefusesLogProbabilitiesThatDoNotMatchTheCompletion) {
  auto trainer = MakeTrainer(0.5);
  Rollout r;
  r.prompt = {kBosToken};
  r.completion = {'a', 'b'};
  r.behaviour_logprobs = {-1.0};
  EXPECT_FALSE(trainer->Objective(std::span<const Rollout>(&r, 1), nullptr).ok());
}

}  // namespace
}  // namespace stitch
