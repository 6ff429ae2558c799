// Publishing one version of a claimed run.
#pragma once

#include <filesystem>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"
#include "stitch/core/version.h"
#include "stitch/pool/pool.h"
#include "stitch/store/store.h"

namespace stitch {

struct PublishOptions {
  // The complete checkpoint of the version the pointer names (the one a
  // DELTA applies to): with it, every changed tensor of a DELTA is decoded
  // against it and checked against its recorded checksum before anything is
  // written. Unused for a FULL version, which is checked against its own
  // recorded checksums.
  std::optional<std::filesystem::path> base_checkpoint;
  int threads = 0;  // for the verification; 0: one per core
};

// What a publish did.
struct PublishOutcome {
  VersionRef version;  // the published identity
  // True when the pointer already named this version and the store already
  // held exactly these files: a retry of a publish that had completed.
  // Nothing was written and the pointer did not move.
  bool already_published = false;
};

// Publishes the version directory `dir` as `<store.run_id()>/<dir name>`:
//   1. the directory's name is its identity, canonical `weight_vNNNNNN`
//      (InvalidArgument otherwise), and its index, every weight_map file and
//      every other file (store/version_dir.h: config, tokenizer) exist as
//      plain files, no links or special files (NotFound / InvalidArgument
//      otherwise): checked before anything is written;
//   2. reads the pointer: it must name this run (FailedPrecondition "run X is
//      not claimed" otherwise). When it names this very version, the publish
//      is a retry of one that completed: the store must hold exactly these
//      files with these bytes (Store::PublishFiles; AlreadyExists naming the
//      first difference otherwise, saying to publish new weights as the next
//      version), the pointer stays, `pool` is woken and the outcome says
//      already_published; a version the store holds no files for (the run's
//      boot version) is a kPointerRewind. Otherwise the version must follow
//      the pointer (CheckFollows: kPointerRewind, or FailedPrecondition for a
//      gap or a DELTA on another base), and a DELTA must have been encoded
//      against the weights the pointer's version holds (CheckDeltaBase);
//   3. verifies the payload (delta/delta_verify.h VerifyVersion): every
//      file's structure and bounds, a DELTA's frames decoded whole to their
//      recorded sizes (with options.base_checkpoint, its checksums too), a
//      FULL version's recorded checksums. InvalidArgument or DataLoss (kind
//      kChecksumMismatch for a checksum) naming the file and tensor;
//   4. makes the files complete and durable in the store (Store::PublishFiles).
//      Files a crashed earlier attempt left there (the pointer never named
//      them) are kept when they are these bytes, so the retry completes that
//      publish; different bytes are AlreadyExists naming the first
//      difference and saying how to recover;
//   5. moves the pointer with a compare-and-swap against the value read in
//      step 2: a pointer that changed meanwhile is a kPointerConflict error
//      and the pointer keeps the other writer's value, unless the other
//      writer moved it to this very version: the store holds these bytes
//      (step 4), so that publish was this one, raced by its own retry, and
//      the outcome says already_published;
//   6. wakes `pool` (best effort) when it is not null.
// A failure at any step leaves the pointer where it was.
[[nodiscard]] absl::StatusOr<PublishOutcome> PublishVersion(Store& store,
                                                            const std::filesystem::path& dir,
                                                            Pool* pool,
                                                            const PublishOptions& options = {});

// The outcome of publishing `ref`'s bytes again when the pointer already
// names `ref`: OK when the store holds `ref` (the caller then compares the
// bytes, Store::PublishFiles); a kPointerRewind naming the next version when
// the store holds no files for it (the run's boot version, which lives
// outside the store); other errors of Store::ReadManifest pass through.
[[nodiscard]] absl::Status CheckRepublish(std::string_view where, Store& store,
                                          const VersionRef& ref);

// True when `status` is a lost compare-and-swap whose winner moved the
// pointer to `ref` itself.
bool LostToTheSameVersion(const absl::Status& status, const VersionRef& ref);

// `status` (an AlreadyExists from Store::PublishFiles) with what to do about
// it, given that the pointer names `pointer` and the publish was of `ref`.
absl::Status ExplainImmutable(const absl::Status& status, const VersionRef& pointer,
                              const VersionRef& ref);

// Whether the version `manifest` describes may follow `pointer` (the
// store's pointer, naming the same run): a replica must never meet a gap or
// a DELTA it cannot apply. Errors, each naming the versions involved, with
// messages starting with `where`:
//   kPointerRewind      the version is not above the pointer's;
//   FailedPrecondition  it is not exactly the pointer's version + 1 (FULL or
//                       DELTA alike: a gap), or it is a DELTA whose
//                       base_version is not the pointer's version (encoded
//                       against the wrong base).
[[nodiscard]] absl::Status CheckFollows(std::string_view where, const VersionRef& pointer,
                                        const VersionManifest& manifest);

// The version directory `dir` names (normalized, a trailing slash dropped).
std::filesystem::path VersionDirOf(const std::filesystem::path& dir);

// The version identity a publish of `dir` into `store` would make: the
// store's run and the number the directory's name gives. InvalidArgument,
// starting with `where`, for a store whose run id is invalid or a name that
// is not a canonical weight_vNNNNNN.
[[nodiscard]] absl::StatusOr<VersionRef> NamedVersion(const Store& store,
                                                      const std::filesystem::path& dir,
                                                      std::string_view where);

// Whether a DELTA was encoded against the weights the store's version
// `pointer` holds, told from the fingerprints the two indexes record
// (format/index.h), without reading any payload: FailedPrecondition (kind
// kChecksumMismatch) naming both fingerprints when they differ. OK for a
// FULL version, and when either records none or the store does not hold the
// pointer's version (the run's boot version): then the replicas' checksums
// of each changed tensor are what refuse a wrong base.
[[nodiscard]] absl::Status CheckDeltaBase(std::string_view where, Store& store,
                                          const VersionRef& pointer,
                                          const VersionManifest& manifest);

// The FailedPrecondition for publishing `run_id` into a store whose pointer
// is `pointer`: unset (the run must be claimed first), or naming another run
// (the store holds that run: give its id, or claim `run_id`, which starts a
// new run and moves every replica to it).
absl::Status NotClaimedError(std::string_view where, std::string_view run_id,
                             const std::optional<VersionRef>& pointer);

}  // namespace stitch
