#include "stitch/refengine/sampler.h"

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace stitch {
namespace {

// Logits whose softmax is exactly `probs` (up to float rounding).
std::vector<float> LogitsFor(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p) + 3.0));
  return l;
}

std::map<int32_t, int> Histogram(std::span<const float> logits, const SamplingParams& params,
                                 int draws) {
  std::map<int32_t, int> h;
  for (int i = 0; i < draws; ++i) ++h[SampleToken(logits, params, static_cast<uint64_t>(i)).id];
  return h;
}

TEST(SampleToken, GreedyTakesTheArgmaxAndTheLowestIdOnTies) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  SamplingParams greedy{.temperature = 0.0f};
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(SampleToken(logits, greedy, i).id, 1);
  // Truncation settings do not change a greedy choice.
  greedy.top_k = 3;
  greedy.top_p = 0.1f;
  EXPECT_EQ(SampleToken(logits, greedy, 0).id, 1);
}

TEST(SampleToken, LogprobIsTheFullLogSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {1.0f, 3.0f, 0.0f, -2.0f};
  auto logsumexp = [&](double t) {
    double s = 0;
    for (float l : logits) s += std::exp(l / t);
    return std::log(s);
  };
  // Greedy: the temperature-1 distribution.
  const SampledToken g = SampleToken(logits, {.temperature = 0.0f}, 0);
  EXPECT_NEAR(g.logprob, 3.0 - logsumexp(1.0), 1e-12);
  // Temperature 0.5, truncated to one candidate: the logprob is still that of
  // the untruncated tempered distribution, not log(1).
  const SampledToken t = SampleToken(logits, {.temperature = 0.5f, .top_k = 1}, 0);
  EXPECT_EQ(t.id, 1);
  EXPECT_NEAR(t.logprob, 3.0 / 0.5 - logsumexp(0.5), 1e-12);
  EXPECT_LT(t.logprob, -1e-4);

  const std::vector<double> all = LogSoftmax(logits, 2.0f);
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(all[i], logits[i] / 2.0 - logsumexp(2.0), 1e-12);
  }
  EXPECT_EQ(LogSoftmax(logits, 0.0f), LogSoftmax(logits, 1.0f));
}

TEST(SampleToken, SameSeedAndIndexGiveTheSameToken) {
  std::vector<float> logits;
  for (int i = 0; i < 258; ++i) logits.push_back(static_cast<float>(std::sin(i * 0.7)));
  const SamplingParams a{.temperature = 1.0f, .seed = 42};
  const SamplingParams b{.temperature = 1.0f, .seed = 43};
  std::vector<int32_t> first, again, other;
  for (uint64_t i = 0; i < 64; ++i) {
    first.push_back(SampleToken(logits, a, i).id);
    again.push_back(SampleToken(logits, a, i).id);
    other.push_back(SampleToken(logits, b, i).id);
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 20u);
}

TEST(SampleToken, FrequenciesFollowTheDistribution) {
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.25, 0.2};
  const std::vector<float> logits = LogitsFor(probs);
  const int draws = 40000;
  const auto h = Histogram(logits, {.temperature = 1.0f, .seed = 7}, draws);
  for (size_t i = 0; i < probs.size(); ++i) {
    EXPECT_NEAR(
        h.count(static_cast<int32_t>(i)) ? h.at(static_cast<int32_t>(i)) / double(draws) : 0.0,
        probs[i], 0.01)
        << "token " << i;
  }
  // Temperature 0.5 squares and renormalises the probabilities.
  const auto hot = Histogram(logits, {.temperature = 0.5f, .seed = 7}, draws);
  double z = 0;
  for (double p : probs) z += p * p;
  EXPECT_NEAR(hot.at(1) / double(draws), 0.16 / z, 0.01);
}

TEST(SampleToken, TopKKeepsOnlyTheKMostLikely) {
  const std::vector<double> probs = {0.05, 0.3, 0.1, 0.25, 0.2, 0.1};
  const auto h = Histogram(LogitsFor(probs), {.temperature = 1.0f, .top_k = 3, .seed = 1}, 20000);
  EXPECT_EQ(h.size(), 3u);
  for (int32_t id : {1, 3, 4}) ASSERT_TRUE(h.count(id)) << id;
  // Renormalised over the kept three: 0.3 / 0.75.
  EXPECT_NEAR(h.at(1) / 20000.0, 0.4, 0.015);
  // Ties at the cut go to the lower id: ids 2 and 5 tie at 0.1.
  const auto h4 = Histogram(LogitsFor(probs), {.temperature = 1.0f, .top_k = 4, .seed = 1}, 20000);
  EXPECT_TRUE(h4.count(2));
  EXPECT_FALSE(h4.count(5));
}

TEST(SampleToken, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<double> probs = {0.15, 0.5, 0.05, 0.3};
  auto support = [&](float top_p) {
    std::set<int32_t> ids;
    for (const auto& [id, n] :
         Histogram(LogitsFor(probs), {.temperature = 1.0f, .top_p = top_p, .seed = 3}, 5000)) {
      ids.insert(id);
    }
    return ids;
  };
  EXPECT_EQ(support(0.3f), (std::set<int32_t>{1}));
  EXPECT_EQ(support(0.75f), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(support(0.85f), (std::set<int32_t>{1, 3, 0}));
  EXPECT_EQ(support(1.0f), (std::set<int32_t>{0, 1, 2, 3}));
  // Both at once: the intersection.
  std::set<int32_t> both;
  for (const auto& [id, n] : Histogram(
           LogitsFor(probs), {.temperature = 1.0f, .top_k = 2, .top_p = 0.95f, .seed = 3}, 5000)) {
    both.insert(id);
  }
  EXPECT_EQ(both, (std::set<int32_t>{1, 3}));
}

TEST(SampleToken, CorruptLogitsStillGiveAValidId) {
  const std::vector<float> logits = {NAN, 1.0f, NAN, INFINITY, -INFINITY};
  for (SamplingParams p : {SamplingParams{.temperature = 0.0f}, SamplingParams{.temperature = 1.0f},
                           SamplingParams{.temperature = 1.0f, .top_k = 2}}) {
    const int32_t id = SampleToken(logits, p, 0).id;
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 5);
  }
}

TEST(UniformDraw, IsInTheUnitIntervalAndSpreadOut) {
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = UniformDraw(99, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
  EXPECT_NE(UniformDraw(1, 0), UniformDraw(2, 0));
  EXPECT_NE(UniformDraw(1, 0), UniformDraw(1, 1));
}

TEST(SamplingParams, ValidateNamesTheField) {
  EXPECT_TRUE(SamplingParams{}.Validate().ok());
  EXPECT_TRUE((SamplingParams{.temperature = 0.0f, .top_k = 0}.Validate().ok()));
  auto message = [](SamplingParams p) { return std::string(p.Validate().message()); };
  EXPECT_NE(message({.temperature = -0.1f}).find("temperature"), std::string::npos);
  EXPECT_NE(message({.temperature = NAN}).find("temperature"), std::string::npos);
  EXPECT_NE(message({.top_p = 0.0f}).find("top_p"), std::string::npos);
  EXPECT_NE(message({.top_p = 1.5f}).find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace stitch
