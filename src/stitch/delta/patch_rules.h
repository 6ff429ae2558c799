// When a commit can be an in-place patch, and why not: the rules every
// engine that patches shares (the reference engine's cpu staging, the vLLM
// adapter), written once. A commit that cannot patch reloads whole
// weights; the reason's name is what the engine reports (`commit_reason`)
// and the /metrics `reason` label.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "stitch/core/manifest.h"
#include "stitch/core/version.h"

namespace stitch {

enum class PatchBlocker {
  kNone,           // "": it patches
  kOff,            // "off": patches are disabled
  kUnknownBase,    // "unknown-base": what the engine serves is not known
  kOtherRun,       // "other-run": the engine serves another run
  kNotAfter,       // "not-after": the target is not after what it serves
  kPatchFailed,    // "patch-failed": a patch to this target was undone
  kFullVersion,    // "full-version": a FULL version (or the boot checkpoint) lies between
  kChainGap,       // "chain-gap": the chain lacks a DELTA since what it serves
  kDense,          // "dense": more values change than the maximum density
  kPatchError,     // "patch-error": building the patch failed
  kEngineLabel,    // "engine-label": the engine's label is not the weights the patch starts from
  kEngineRefused,  // "engine-refused": the engine did not take the patch
  kNoPatchStaged,  // "no-patch-staged": nothing was staged for this target
};

// The name above ("" for kNone).
std::string_view PatchBlockerName(PatchBlocker blocker);

// The checks before any chain is read: whether patches are on, what the
// engine serves (nullopt: unknown), and whether a patch to `target` failed
// before.
PatchBlocker PatchBlockerBefore(bool enabled, const std::optional<VersionRef>& serving,
                                const VersionRef& target, bool failed_before);

// One version of the chain to the target, oldest first.
struct PatchChainLink {
  int64_t version = 0;
  VersionKind kind = VersionKind::kFull;
};

// The chain's check: every version after `serving` up to `target` must be
// a DELTA, and all of them must be there. REQUIRES: PatchBlockerBefore
// gave kNone.
PatchBlocker PatchBlockerOfChain(const std::vector<PatchChainLink>& chain,
                                 const VersionRef& serving, const VersionRef& target);

}  // namespace stitch
