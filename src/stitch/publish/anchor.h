// Bounded joins: the anchor budget. A replica joining late loads the newest
// anchor (a FULL version) and applies every DELTA after it; a run that
// never writes a FULL makes a joiner at version 1,000 apply 1,000 DELTAs.
// The budget makes the publisher write a FULL once the DELTAs since the
// last one number `max_deltas`, or weigh as much as one FULL version: a
// joiner then applies at most that much.
//
// The same rule is the Python encoder's (python/src/stitch/encoder.py,
// DeltaEncoder's anchor_every and anchor_bytes).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/store/store.h"

namespace stitch {

struct AnchorBudget {
  int64_t max_deltas = 0;  // 0: no count budget
  bool by_bytes = false;   // DELTA bytes since the anchor >= one FULL
  bool enabled() const { return max_deltas > 0 || by_bytes; }
};

// The chain behind a version, back to its anchor.
struct ChainSinceAnchor {
  // The anchor: the FULL version the chain starts from, or, when the chain
  // reaches the run's boot version (outside the store), that version.
  int64_t anchor = 0;
  bool anchor_in_store = false;
  int64_t deltas = 0;         // DELTAs after the anchor, up to the version
  uint64_t delta_bytes = 0;   // their payload bytes
  uint64_t anchor_bytes = 0;  // the anchor's payload bytes; 0 when not in the store
};

// The sizes of `files` in `dir`, added up.
[[nodiscard]] absl::StatusOr<uint64_t> FilesBytes(const std::filesystem::path& dir,
                                                  const std::vector<std::string>& files);

// Walks back from `version` (published in `store`) to a FULL version, an
// anchor written after the fact (Store::anchors()) or the boot version
// outside the store. Payload sizes come
// from the store's records (a remote store: no download) or its files.
[[nodiscard]] absl::StatusOr<ChainSinceAnchor> MeasureChain(Store& store, int64_t version);

// Whether the budget makes the version after `chain`'s a FULL one. A bytes
// budget whose anchor has no known size (the boot checkpoint outside the
// store) weighs against `full_bytes` when given, and is not due otherwise.
bool AnchorDue(const ChainSinceAnchor& chain, const AnchorBudget& budget,
               std::optional<uint64_t> full_bytes = std::nullopt);

// Writes `delta_dir` (a DELTA on the pointer's version of `store`) as a FULL
// version of the same weights, `<out_parent>/weight_vNNNNNN`, with the
// DELTA's other files (config, tokenizer). The weights come from
// `base_checkpoint` (the complete checkpoint of the pointer's version) when
// given, else from the store's chain (materialized, then folded). The FULL
// records the same weights fingerprint as the DELTA; DataLoss (checksum
// mismatch) when it would not. FailedPrecondition when neither a base nor
// a chain from an anchor in the store is at hand.
[[nodiscard]] absl::StatusOr<std::filesystem::path> WriteAnchorFor(
    Store& store, const std::filesystem::path& delta_dir,
    const std::optional<std::filesystem::path>& base_checkpoint,
    const std::filesystem::path& out_parent, int threads = 0);

// A run's boot checkpoint: the anchor of the first DELTAs, outside the store.
struct BootCheckpoint {
  std::filesystem::path dir;
  int64_t version = 0;
};

// `stitch compact`: writes `version` (a DELTA published in `store`) as a
// FULL version of the same weights, `<out_parent>/weight_vNNNNNN`, from its
// chain (back to a FULL version, an anchor, or `boot`), for the store's
// anchors (Store::anchors()). AlreadyExists when the version is FULL or
// has an anchor; FailedPrecondition when the chain reaches the boot
// checkpoint and none was given; DataLoss as WriteAnchorFor.
[[nodiscard]] absl::StatusOr<std::filesystem::path> WriteAnchorOf(
    Store& store, int64_t version, const std::optional<BootCheckpoint>& boot,
    const std::filesystem::path& out_parent, int threads = 0);

}  // namespace stitch
