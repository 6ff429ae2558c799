#include "stitch/delta/patch_rules.h"

namespace stitch {

std::string_view PatchBlockerName(PatchBlocker blocker) {
  switch (blocker) {
    case PatchBlocker::kNone:
      return "";
    case PatchBlocker::kOff:
      return "off";
    case PatchBlocker::kUnknownBase:
      return "unknown-base";
    case PatchBlocker::kOtherRun:
      return "other-run";
    case PatchBlocker::kNotAfter:
      return "not-after";
    case PatchBlocker::kPatchFailed:
      return "patch-failed";
    case PatchBlocker::kFullVersion:
      return "full-version";
    case PatchBlocker::kChainGap:
      return "chain-gap";
    case PatchBlocker::kDense:
      return "dense";
    case PatchBlocker::kPatchError:
      return "patch-error";
    case PatchBlocker::kEngineLabel:
      return "engine-label";
    case PatchBlocker::kEngineRefused:
      return "engine-refused";
    case PatchBlocker::kNoPatchStaged:
      return "no-patch-staged";
  }
  return "unknown";
}

PatchBlocker PatchBlockerBefore(bool enabled, const std::optional<VersionRef>& serving,
                                const VersionRef& target, bool failed_before) {
  if (!enabled) return PatchBlocker::kOff;
  if (!serving.has_value()) return PatchBlocker::kUnknownBase;
  if (serving->run_id != target.run_id) return PatchBlocker::kOtherRun;
  if (serving->version >= target.version) return PatchBlocker::kNotAfter;
  if (failed_before) return PatchBlocker::kPatchFailed;
  return PatchBlocker::kNone;
}

PatchBlocker PatchBlockerOfChain(const std::vector<PatchChainLink>& chain,
                                 const VersionRef& serving, const VersionRef& target) {
  int64_t deltas = 0;
  for (const PatchChainLink& link : chain) {
    if (link.version <= serving.version) continue;
    if (link.kind == VersionKind::kFull) return PatchBlocker::kFullVersion;
    ++deltas;
  }
  return deltas == target.version - serving.version ? PatchBlocker::kNone : PatchBlocker::kChainGap;
}

}  // namespace stitch
