#include "stitch/core/state.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(SyncState, NamesRoundTrip) {
  for (SyncState st : {SyncState::kIdle, SyncState::kFetching, SyncState::kStaging,
                       SyncState::kCommitting, SyncState::kError}) {
    auto back = ParseSyncState(SyncStateName(st));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, st);
  }
}

}  // namespace
}  // namespace stitch
