#include "stitch/publish/publish.h"

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/delta/delta_verify.h"
#include "stitch/publish/wake.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;

absl::Status NotClaimedError(std::string_view where, std::string_view run_id,
                             const std::optional<VersionRef>& pointer) {
  if (!pointer) {
    return absl::FailedPreconditionError(
        absl::StrCat(AbslView(where), ": run ", AbslView(run_id),
                     " is not claimed (the pointer is unset); claim it first: `stitch claim` "
                     "(stitch.claim_run from Python)"));
  }
  // Another run holds the store: far more often a mistyped run id than a new
  // run. Claiming would switch every replica to it at its boot weights, so
  // that is not offered as the fix without saying so.
  return absl::FailedPreconditionError(absl::StrCat(
      AbslView(where), ": the store holds run ", pointer->run_id, " (its pointer names ",
      pointer->ToString(), "), not ", AbslView(run_id), "; give run id ", pointer->run_id,
      " to publish into it, or claim ", AbslView(run_id),
      " (`stitch claim`, stitch.claim_run from Python) only to start a new run: claiming "
      "starts it at its boot weights and moves every replica to it"));
}

absl::Status CheckFollows(std::string_view where, const VersionRef& pointer,
                          const VersionManifest& manifest) {
  const VersionRef proposed{pointer.run_id, manifest.version};
  // The store checks the same rule again at its compare-and-swap
  // (store/pointer_cas.h), where it holds against every writer and against a
  // pointer moved since this read; here it refuses before any byte moves.
  if (auto move = CheckPointerMove(where, pointer, proposed); !move.ok()) return move.status();
  if (manifest.version != pointer.version + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(AbslView(where), ": ", VersionDirName(manifest.version),
                     " would leave a gap: the pointer is at ", pointer.ToString(),
                     ", so the next version must be ", VersionDirName(pointer.version + 1),
                     " (replicas apply every version in order)"));
  }
  if (manifest.kind == VersionKind::kDelta && manifest.base_version != pointer.version) {
    return absl::FailedPreconditionError(absl::StrCat(
        AbslView(where), ": DELTA ", VersionDirName(manifest.version), " applies to version ",
        manifest.base_version ? absl::StrCat(*manifest.base_version) : std::string("<none>"),
        ", but the pointer is at ", pointer.ToString(), "; encode it against version ",
        pointer.version));
  }
  return absl::OkStatus();
}

absl::Status CheckDeltaBase(std::string_view where, Store& store, const VersionRef& pointer,
                            const VersionManifest& manifest) {
  if (manifest.kind != VersionKind::kDelta || manifest.base_weights_fingerprint.empty()) {
    return absl::OkStatus();
  }
  auto base = store.ReadManifest(pointer.version);
  // The run's boot version is not in the store, and versions written by
  // other tools record no fingerprint: then nothing here can tell, and the
  // replicas' own checks (each changed tensor against its recorded target
  // checksum) still refuse a wrong base.
  if (absl::IsNotFound(base.status())) return absl::OkStatus();
  if (!base.ok()) return Annotate(base.status(), where);
  if (base->weights_fingerprint.empty() ||
      base->weights_fingerprint == manifest.base_weights_fingerprint) {
    return absl::OkStatus();
  }
  return WithKind(
      absl::FailedPreconditionError(absl::StrCat(
          AbslView(where), ": DELTA ", VersionDirName(manifest.version),
          " was encoded against other weights than version ", pointer.version,
          " holds (the delta's base fingerprint is ", manifest.base_weights_fingerprint,
          ", the store records ", base->weights_fingerprint, " for ", pointer.ToString(),
          "); every replica would refuse it. Encode it against version ", pointer.version,
          "'s weights, or publish the new weights as a FULL version")),
      ErrorKind::kChecksumMismatch);
}

fs::path VersionDirOf(const fs::path& dir) {
  fs::path version_dir = dir.lexically_normal();
  if (!version_dir.has_filename()) version_dir = version_dir.parent_path();
  return version_dir;
}

absl::StatusOr<VersionRef> NamedVersion(const Store& store, const fs::path& dir,
                                        std::string_view where) {
  if (absl::Status s = ValidateRunId(store.run_id()); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(where), ": cannot publish: ", s.message()));
  }
  const std::string name = VersionDirOf(dir).filename().string();
  auto number = ParseVersionDirName(name);
  if (!number.ok() || VersionDirName(*number) != name) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(where), ": cannot publish ", dir.string(), ": \"", absl::CEscape(name),
        "\" is not a version identity; name the directory weight_vNNNNNN (six digits or more, "
        "zero padded)"));
  }
  return VersionRef{store.run_id(), *number};
}

absl::Status CheckRepublish(std::string_view where, Store& store, const VersionRef& ref) {
  auto published = store.ReadManifest(ref.version);
  if (published.ok()) return absl::OkStatus();
  if (!absl::IsNotFound(published.status())) return published.status();
  return WithKind(
      absl::FailedPreconditionError(absl::StrCat(
          AbslView(where), ": the pointer names ", ref.ToString(),
          ", the run's boot version, whose weights the engines boot from and the store does not "
          "hold; publish the next version, ",
          VersionDirName(ref.version + 1))),
      ErrorKind::kPointerRewind);
}

bool LostToTheSameVersion(const absl::Status& status, const VersionRef& ref) {
  auto conflict = GetConflictDetails(status);
  return conflict.has_value() && conflict->actual == ref.ToString();
}

absl::Status ExplainImmutable(const absl::Status& status, const VersionRef& pointer,
                              const VersionRef& ref) {
  if (!absl::IsAlreadyExists(status)) return status;
  std::string advice;
  if (pointer == ref) {
    advice =
        absl::StrCat(ref.DirName(), " is published (the pointer names it): publish new weights as ",
                     VersionDirName(ref.version + 1));
  } else {
    advice = absl::StrCat(
        "the pointer (", pointer.ToString(),
        ") never named it, so nothing served it: an earlier "
        "publish stopped before moving the pointer; publish that attempt's files again to "
        "complete it, or remove updates/",
        ref.DirName(), " from the store and publish again");
  }
  absl::Status out(status.code(), absl::StrCat(status.message(), "; ", advice));
  status.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::StatusOr<PublishOutcome> PublishVersion(Store& store, const fs::path& dir, Pool* pool,
                                              const PublishOptions& options) {
  const std::string where = absl::StrCat("store ", store.uri());
  const fs::path version_dir = VersionDirOf(dir);
  auto named = NamedVersion(store, dir, where);
  if (!named.ok()) return named.status();
  const VersionRef ref = *named;

  // Everything the store will need must be there before anything is written.
  // Store::PublishFiles reads the directory again (its listing and index,
  // not the payload): every caller of the store gets its checks, and this
  // first read fails an incomplete directory before the store is asked
  // anything.
  auto contents = ReadVersionDir(version_dir, ref.version);
  if (!contents.ok()) return Annotate(contents.status(), where);

  if (absl::Status s = store.Refresh(); !s.ok()) return s;
  auto pointer = store.ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (!*pointer || (*pointer)->run_id != ref.run_id) {
    return NotClaimedError(where, ref.run_id, *pointer);
  }
  if (**pointer == ref) {
    // A retry of a publish that completed (its answer lost, its process
    // killed after the pointer moved): the same bytes complete it again,
    // without verifying what was verified when it was published.
    if (absl::Status s = CheckRepublish(where, store, ref); !s.ok()) return s;
    if (absl::Status s = store.PublishFiles(ref.version, version_dir); !s.ok()) {
      return ExplainImmutable(s, **pointer, ref);
    }
    WakeAfterMove(pool, ref);
    return PublishOutcome{ref, true};
  }
  if (absl::Status s = CheckFollows(where, **pointer, contents->manifest); !s.ok()) return s;
  if (absl::Status s = CheckDeltaBase(where, store, **pointer, contents->manifest); !s.ok()) {
    return s;
  }

  // Every replica would refuse a payload that fails here, and go on refusing
  // the versions after it: nothing that fails may reach the pointer.
  VerifyOptions verify;
  verify.threads = options.threads;
  std::optional<fs::path> base;
  if (contents->manifest.kind == VersionKind::kDelta) base = options.base_checkpoint;
  if (auto verified = VerifyVersion(version_dir, base, verify); !verified.ok()) {
    return Annotate(verified.status(), "publish");
  }

  if (absl::Status s = store.PublishFiles(ref.version, version_dir); !s.ok()) {
    return ExplainImmutable(s, **pointer, ref);
  }
  absl::Status moved = store.AdvancePointer(*pointer, ref);
  // Another publisher of these very bytes (this publish's own retry, or the
  // attempt it retries) moved the pointer first: the version it named is
  // the one PublishFiles left in the store, ours.
  if (!moved.ok() && !LostToTheSameVersion(moved, ref)) return moved;
  WakeAfterMove(pool, ref);
  return PublishOutcome{ref, !moved.ok()};
}

}  // namespace stitch
