// Publishing one version of a claimed run.
#pragma once

#include <filesystem>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/pool/pool.h"
#include "stitch/store/store.h"

namespace stitch {

// Publishes the version directory `dir` as `<store.run_id()>/<dir name>`:
//   1. the directory's name is its identity, canonical `weight_vNNNNNN`
//      (InvalidArgument otherwise), and its index and every weight_map file
//      exist (NotFound otherwise): checked before anything is written;
//   2. reads the pointer: it must name this run (FailedPrecondition "run X is
//      not claimed" otherwise), and the new version must be above it
//      (kPointerRewind otherwise);
//   3. makes the files complete and durable in the store (Store::PublishFiles;
//      versions are immutable, identical bytes are a retry);
//   4. moves the pointer with a compare-and-swap against the value read in
//      step 2: a pointer that changed during the upload is a kPointerConflict
//      error and the pointer keeps the other writer's value;
//   5. wakes `pool` (best effort) when it is not null.
// A failure at any step leaves the pointer where it was. Returns the
// published identity.
[[nodiscard]] absl::StatusOr<VersionRef> PublishVersion(Store& store,
                                                        const std::filesystem::path& dir,
                                                        Pool* pool);

}  // namespace stitch
