#include "stitch/refengine/prefix_cache.h"

#include <vector>

#include "gtest/gtest.h"
#include "stitch/refengine/test_models.h"

namespace stitch {
namespace {

using testing::GqaConfig;

// A cache holding `n` positions (their values do not matter here).
KvCache CacheOf(const ModelConfig& c, int64_t n) {
  KvCache full(c);
  KvCache source(c);
  // Positions come only from a forward pass or another cache: fill one by
  // copying from a cache the model filled.
  auto weights = testing::RandomWeights(c, 1);
  std::vector<int32_t> tokens(static_cast<size_t>(n), 7);
  ForwardInput in{&source, tokens};
  EXPECT_TRUE(Forward(*weights, std::span<const ForwardInput>(&in, 1)).ok());
  full.CopyPrefix(source, n);
  return full;
}

TEST(PrefixCache, TheLongestSharedPrefixOfTheSameKeyHits) {
  const ModelConfig c = GqaConfig();
  PrefixCache cache(size_t{64} << 20);
  const std::vector<int32_t> a{1, 2, 3, 4, 5};
  cache.Insert("k", a, CacheOf(c, 5));
  cache.Insert("k", std::vector<int32_t>{1, 2, 9}, CacheOf(c, 3));
  PrefixCache::Hit hit = cache.Lookup("k", std::vector<int32_t>{1, 2, 3, 4, 8, 8});
  ASSERT_NE(hit.cache, nullptr);
  EXPECT_EQ(hit.length, 4);
  EXPECT_EQ(hit.cache->length(), 5);
  EXPECT_EQ(cache.Lookup("other", a).cache, nullptr);
  EXPECT_EQ(cache.Lookup("k", std::vector<int32_t>{9}).cache, nullptr);
}

TEST(PrefixCache, AnExtendingEntryReplacesTheOneItCovers) {
  const ModelConfig c = GqaConfig();
  PrefixCache cache(size_t{64} << 20);
  cache.Insert("k", std::vector<int32_t>{1, 2, 3}, CacheOf(c, 3));
  cache.Insert("k", std::vector<int32_t>{1, 2, 3, 4, 5}, CacheOf(c, 5));
  EXPECT_EQ(cache.entries(), 1u);
  EXPECT_EQ(cache.Lookup("k", std::vector<int32_t>{1, 2, 3, 4, 5, 6}).length, 5);
}

TEST(PrefixCache, TheLeastRecentlyUsedGoFirstBeyondTheBudget) {
  const ModelConfig c = GqaConfig();
  const size_t one = CacheOf(c, 4).memory_bytes();
  PrefixCache cache(2 * one + 2 * (4 * sizeof(int32_t) + 1));
  cache.Insert("k", std::vector<int32_t>{1, 1, 1, 1}, CacheOf(c, 4));
  cache.Insert("k", std::vector<int32_t>{2, 2, 2, 2}, CacheOf(c, 4));
  EXPECT_NE(cache.Lookup("k", std::vector<int32_t>{1, 1}).cache, nullptr);  // 1 is now recent
  cache.Insert("k", std::vector<int32_t>{3, 3, 3, 3}, CacheOf(c, 4));
  EXPECT_EQ(cache.entries(), 2u);
  EXPECT_EQ(cache.Lookup("k", std::vector<int32_t>{2, 2}).cache, nullptr);
  EXPECT_NE(cache.Lookup("k", std::vector<int32_t>{1, 1}).cache, nullptr);
  cache.Clear();
  EXPECT_EQ(cache.entries(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
}

}  // namespace
}  // namespace stitch
