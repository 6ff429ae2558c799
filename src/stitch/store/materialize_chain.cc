#include "stitch/store/materialize_chain.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"

namespace stitch {

absl::StatusOr<std::vector<int64_t>> ListAnchors(Store& store) {
  Store* anchors = store.anchors();
  if (anchors == nullptr) return std::vector<int64_t>();
  return anchors->ListVersions();
}

absl::StatusOr<std::vector<ChainLink>> MaterializeChain(Store& store, int64_t target,
                                                        std::optional<int64_t> have) {
  const std::string where = absl::StrCat("store ", store.uri());
  if (have && target < *have) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": cannot go back from ", VersionDirName(*have), " to ", VersionDirName(target)));
  }
  auto anchored = ListAnchors(store);
  if (!anchored.ok()) return anchored.status();
  const std::set<int64_t> anchors(anchored->begin(), anchored->end());
  std::vector<ChainLink> chain;
  for (int64_t version = target; !have || version > *have;) {
    if (anchors.contains(version)) {
      auto anchor = store.anchors()->ReadManifest(version);
      if (anchor.ok()) {
        // It stands for the published version: the same version, FULL,
        // with the weights fingerprint the version records (if it records
        // one: compact checked the anchor's against it).
        auto published = store.ReadManifest(version);
        if (!published.ok()) return published.status();
        if (anchor->kind != VersionKind::kFull || anchor->version != version ||
            (!published->weights_fingerprint.empty() &&
             anchor->weights_fingerprint != published->weights_fingerprint)) {
          return absl::DataLossError(absl::StrCat(where, ": the anchor of ",
                                                  VersionDirName(version),
                                                  " is not a FULL copy of that version"));
        }
        chain.push_back(ChainLink{version, *anchor, {}, true});
        break;
      }
      // Deleted since it was listed: the chain goes on without it.
      if (!absl::IsNotFound(anchor.status())) return anchor.status();
    }
    auto manifest = store.ReadManifest(version);
    if (!manifest.ok()) {
      if (absl::IsNotFound(manifest.status()) && version != target) {
        return absl::NotFoundError(absl::StrCat(
            where, ": ", VersionDirName(target), " needs ", VersionDirName(version),
            " (its delta chain), which is not published",
            have ? absl::StrCat("; the caller holds ", VersionDirName(*have)) : std::string()));
      }
      return manifest.status();
    }
    chain.push_back(ChainLink{version, *manifest, {}});
    if (manifest->kind == VersionKind::kFull) break;
    if (manifest->base_version != version - 1) {
      return absl::DataLossError(absl::StrCat(
          where, ": DELTA version ", VersionDirName(version), " has base_version ",
          manifest->base_version ? absl::StrCat(*manifest->base_version) : std::string("<none>"),
          " instead of ", version - 1));
    }
    if (version == 0) {
      return absl::NotFoundError(absl::StrCat(where, ": the delta chain of ",
                                              VersionDirName(target),
                                              " reaches version 0 without a FULL anchor"));
    }
    --version;
  }
  std::reverse(chain.begin(), chain.end());
  for (ChainLink& link : chain) {
    auto dir =
        link.anchor ? store.anchors()->Materialize(link.version) : store.Materialize(link.version);
    if (!dir.ok()) return dir.status();
    link.dir = *std::move(dir);
  }
  return chain;
}

}  // namespace stitch
