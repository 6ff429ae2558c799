// Materializing what applying a version needs: the version and the DELTA
// chain behind it, back to an anchor or to what the caller already holds.
// Works over any Store; remote stores download each file at most once
// (their Materialize skips what the cache already holds).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"
#include "stitch/store/store.h"

namespace stitch {

struct ChainLink {
  int64_t version = 0;
  VersionManifest manifest;
  std::filesystem::path dir;  // Store::Materialize's directory
  bool anchor = false;        // from the store's anchors (then FULL)
};

// The versions `store` holds anchors of (Store::anchors()), ascending; none
// for a store that keeps no anchors or whose anchors store does not exist.
[[nodiscard]] absl::StatusOr<std::vector<int64_t>> ListAnchors(Store& store);

// Walks back from `target` through each DELTA's base version until a FULL
// version, an anchor written after the fact (Store::anchors(): that link
// is the anchor, materialized from the anchors store), or `have` (a
// version the caller already holds: its boot checkpoint or the version it
// applied; nullopt when it holds none), then materializes the versions
// after that point, oldest first: the last link is `target`, or its anchor.
// A FULL target gives one link; target == have gives none.
// Errors: InvalidArgument when target < have; NotFound naming the version
// the chain needs but the store lacks; DataLoss for a DELTA whose base is
// not the version just below it; the store's own errors.
[[nodiscard]] absl::StatusOr<std::vector<ChainLink>> MaterializeChain(Store& store, int64_t target,
                                                                      std::optional<int64_t> have);

}  // namespace stitch
