#include "stitch/gateway/session_table.h"

#include <string>

#include <gtest/gtest.h>

namespace stitch {
namespace {

using Table = SessionTable<int>;

std::string Key(int i, size_t size) {
  std::string key = std::to_string(i);
  key.resize(size, 'k');
  return key;
}

TEST(SessionTableTest, FindsWhatWasPutAndUpdatesInPlace) {
  Table table(size_t{1} << 20);
  EXPECT_EQ(table.Find("a"), nullptr);
  table.Put("a", 1);
  table.Put("b", 2);
  table.Put("a", 3);
  ASSERT_NE(table.Find("a"), nullptr);
  EXPECT_EQ(*table.Find("a"), 3);
  EXPECT_EQ(*table.Find("b"), 2);
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(table.bytes(), 2 * (1 + Table::kEntryOverhead));
}

// Distinct long ids (60 KB each, as a client may send) never hold more than
// the budget, however many arrive.
TEST(SessionTableTest, ManyDistinctLongKeysStayWithinTheBudget) {
  constexpr size_t kBudget = size_t{1} << 20;
  constexpr size_t kKeySize = 60 << 10;
  Table table(kBudget);
  for (int i = 0; i < 2000; ++i) {
    table.Put(Key(i, kKeySize), i);
    ASSERT_LE(table.bytes(), kBudget);
  }
  const size_t fit = kBudget / (kKeySize + Table::kEntryOverhead);
  EXPECT_EQ(table.size(), fit);
  EXPECT_EQ(table.evictions(), 2000 - fit);
  // The newest are the ones kept.
  EXPECT_NE(table.Find(Key(1999, kKeySize)), nullptr);
  EXPECT_EQ(table.Find(Key(0, kKeySize)), nullptr);
}

TEST(SessionTableTest, TheLeastRecentlyUsedGoFirst) {
  const size_t entry = 1 + Table::kEntryOverhead;
  Table table(3 * entry);
  table.Put("a", 1);
  table.Put("b", 2);
  table.Put("c", 3);
  table.Put("a", 1);  // a use: "b" is now the oldest
  table.Put("d", 4);
  EXPECT_EQ(table.Find("b"), nullptr);
  EXPECT_NE(table.Find("a"), nullptr);
  EXPECT_NE(table.Find("c"), nullptr);
  EXPECT_NE(table.Find("d"), nullptr);
  EXPECT_EQ(table.evictions(), 1u);
  EXPECT_EQ(table.bytes(), 3 * entry);
}

TEST(SessionTableTest, AKeyThatAloneWouldNotFitIsNotKept) {
  Table table(1024);
  table.Put("small", 1);
  table.Put(std::string(2048, 'x'), 2);
  EXPECT_EQ(table.Find(std::string(2048, 'x')), nullptr);
  EXPECT_NE(table.Find("small"), nullptr) << "nothing was evicted for it";
  EXPECT_EQ(table.size(), 1u);
}

}  // namespace
}  // namespace stitch
