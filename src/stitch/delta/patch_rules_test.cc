#include "stitch/delta/patch_rules.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace stitch {
namespace {

const VersionRef kTarget{"run-a", 5};

TEST(PatchRules, TheChecksBeforeTheChainComeInOrder) {
  const VersionRef serving{"run-a", 4};
  EXPECT_EQ(PatchBlockerBefore(false, serving, kTarget, false), PatchBlocker::kOff);
  EXPECT_EQ(PatchBlockerBefore(true, std::nullopt, kTarget, false), PatchBlocker::kUnknownBase);
  EXPECT_EQ(PatchBlockerBefore(true, VersionRef{"run-b", 4}, kTarget, false),
            PatchBlocker::kOtherRun);
  EXPECT_EQ(PatchBlockerBefore(true, kTarget, kTarget, false), PatchBlocker::kNotAfter);
  EXPECT_EQ(PatchBlockerBefore(true, serving, kTarget, true), PatchBlocker::kPatchFailed);
  EXPECT_EQ(PatchBlockerBefore(true, serving, kTarget, false), PatchBlocker::kNone);
}

TEST(PatchRules, TheChainMustBeEveryDeltaSinceTheServedVersion) {
  const VersionRef serving{"run-a", 2};
  const auto delta = VersionKind::kDelta;
  const auto full = VersionKind::kFull;
  // The anchor and the DELTAs up to the served version do not count.
  EXPECT_EQ(PatchBlockerOfChain({{1, full}, {2, delta}, {3, delta}, {4, delta}, {5, delta}},
                                serving, kTarget),
            PatchBlocker::kNone);
  EXPECT_EQ(PatchBlockerOfChain({{1, full}, {2, delta}, {3, delta}, {4, full}, {5, delta}}, serving,
                                kTarget),
            PatchBlocker::kFullVersion);
  // A chain that starts after the served version misses DELTAs.
  EXPECT_EQ(PatchBlockerOfChain({{4, delta}, {5, delta}}, serving, kTarget),
            PatchBlocker::kChainGap);
}

TEST(PatchRules, EveryBlockerHasItsOwnName) {
  std::set<std::string> names;
  const PatchBlocker all[] = {
      PatchBlocker::kOff,         PatchBlocker::kUnknownBase,   PatchBlocker::kOtherRun,
      PatchBlocker::kNotAfter,    PatchBlocker::kPatchFailed,   PatchBlocker::kFullVersion,
      PatchBlocker::kChainGap,    PatchBlocker::kDense,         PatchBlocker::kPatchError,
      PatchBlocker::kEngineLabel, PatchBlocker::kEngineRefused, PatchBlocker::kNoPatchStaged};
  for (PatchBlocker b : all) {
    const std::string name(PatchBlockerName(b));
    EXPECT_FALSE(name.empty());
    EXPECT_TRUE(names.insert(name).second) << name;
  }
  EXPECT_EQ(PatchBlockerName(PatchBlocker::kNone), "");
  EXPECT_EQ(PatchBlockerName(PatchBlocker::kChainGap), "chain-gap");
}

}  // namespace
}  // namespace stitch
