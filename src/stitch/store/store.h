// The Store port: where a run's versions and its `latest` pointer live.
//
// A store is rooted at a directory (filesystem) or a prefix (S3) and scoped
// to one run: operations on versions of another run are refused. The pointer
// may name another run (that is how a run change reaches replicas); reading it
// returns whatever it names.
//
// Layout under the root:
//   latest                                   text: the version identity
//   updates/weight_vNNNNNN/model.safetensors.index.json
//   updates/weight_vNNNNNN/<payload files>
//   updates/weight_vNNNNNN/<other files: config.json, tokenizer files, ...>
//   anchors/updates/weight_vNNNNNN/          a FULL anchor of version N (anchors())
//
// Invariant: version bytes are complete and durable before the pointer can
// name them. PublishFiles makes them so; AdvancePointer moves the pointer
// with a compare-and-swap.
//
// Existence: a store exists once it has been claimed, that is once its
// pointer exists:
//   filesystem  the file `<root>/latest` exists (a root directory without
//               it, or no root at all, is a store that does not exist);
//   S3          the object `<prefix>/latest` exists (S3 has no directories:
//               other objects under the prefix do not make a store);
//   in-memory   its pointer was set in this process.
// Opening a store creates nothing and does not require it to exist (a
// trainer opens a missing store to claim it). Only the first pointer write,
// AdvancePointer from an unset pointer, creates a store: the filesystem
// store makes its root and `updates/` directories then. Claiming a run is
// the only operation that writes a pointer that was unset (publishing
// refuses an unclaimed run); every other command refuses a store that does
// not exist (ReadClaimedPointer below) instead of serving or creating an
// empty one under a mistyped name. PublishFiles never creates a store either:
// the filesystem store refuses a missing root.
//
// Thread-safety: implementations are safe to call from several threads. All
// calls block (disk or network): never call them on an event-loop thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/manifest.h"
#include "stitch/core/version.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"

namespace stitch {

// Files and bytes a store downloaded to materialize versions: from the
// store itself, and from peers (fetch/peers.h).
struct StoreTraffic {
  uint64_t files_downloaded = 0;
  uint64_t bytes_downloaded = 0;
  uint64_t peer_files = 0;
  uint64_t peer_bytes = 0;
  // Files a peer sent that were not the store's bytes (then taken from
  // the store).
  uint64_t peer_rejected = 0;
};

class RemoteStore;  // remote_store.h

class Store {
 public:
  virtual ~Store() = default;

  // The store's URI, for messages ("file:///runs/a", "s3://b/p", "mem://x").
  virtual std::string uri() const = 0;
  // The run this store is scoped to.
  virtual const std::string& run_id() const = 0;

  // Makes other hosts' writes visible (a no-op where they always are).
  [[nodiscard]] virtual absl::Status Refresh() = 0;

  // The version the pointer names, or nullopt when it was never set. A
  // pointer that exists but cannot be parsed is an error, never "unset".
  [[nodiscard]] virtual absl::StatusOr<std::optional<VersionRef>> ReadPointer() = 0;

  // Compare-and-swap: sets the pointer to `proposed` only if it still holds
  // `expected` (nullopt: unset). On a mismatch returns a kPointerConflict
  // error (core/errors.h) carrying the three values (checked first, so a
  // pointer that changed under the caller always reads as a conflict); a
  // move that CheckPointerMove refuses returns its kPointerRewind error. Two
  // callers racing from the same `expected` never both succeed. `proposed`
  // must name this store's run (InvalidArgument otherwise); the pointer may
  // currently name another run, which is how a claim resets it.
  [[nodiscard]] virtual absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                                                    const VersionRef& proposed) = 0;

  // Makes every file of `dir` (a version directory: the index, the payload
  // files and the other files an engine loads with them, such as config.json
  // and the tokenizer's; version_dir.h ReadVersionDir) complete and durable
  // as version `version` of this store's run. Does not move the pointer.
  // Versions are immutable: publishing different bytes (or another set of
  // files) over an existing version fails with AlreadyExists naming the
  // first difference; republishing identical bytes succeeds and writes
  // nothing new (a retry after a crash). REQUIRES: every weight_map file of
  // the index exists.
  [[nodiscard]] virtual absl::Status PublishFiles(int64_t version,
                                                  const std::filesystem::path& dir) = 0;

  // Reads and validates a published version's index. NotFound when the
  // version does not exist.
  [[nodiscard]] virtual absl::StatusOr<VersionManifest> ReadManifest(int64_t version) = 0;

  // A local directory holding the published files of `version` (the store's
  // own directory for a filesystem store; a verified cache for remote ones).
  [[nodiscard]] virtual absl::StatusOr<std::filesystem::path> Materialize(int64_t version) = 0;

  // What Materialize fetched from a remote store so far (files found
  // complete in the cache are not counted); zero for a store read in place.
  // Thread-safe.
  virtual StoreTraffic traffic() const { return {}; }

  // A file of `version` this store has verified against the size and
  // SHA-256 the store records, opened for reading, with its size; what a
  // sidecar serves its peers. NotFound when it holds none (the default: a
  // store read in place has nothing to offer peers that they could not
  // read themselves); InvalidArgument for a name that is not a version's
  // file.
  struct VerifiedFile {
    UniqueFd fd;
    uint64_t size = 0;
  };
  [[nodiscard]] virtual absl::StatusOr<VerifiedFile> OpenVerifiedFile(int64_t version,
                                                                      std::string_view name);

  // This replica's identity among its peers (api/routes.h kPeerIdHeader): one per
  // version cache, so that replicas sharing a cache (one host) are one peer
  // and a host mate's request is answered as the replica's own. "" for a
  // store with nothing to offer peers.
  virtual std::string peer_id() const { return {}; }

  // --- Retention (store/retention.h) --------------------------------------
  //
  // The versions this store holds anything of, ascending: published ones,
  // and those with files but no index (still uploading, or left by a
  // publisher or a gc that died; ReadManifest tells them apart). Staging
  // directories are not versions. The default (a store that cannot list) is
  // FailedPrecondition.
  [[nodiscard]] virtual absl::StatusOr<std::vector<int64_t>> ListVersions();

  // Deletes a published version so that a reader either has all of its
  // bytes already or sees it as not published: the version stops reading
  // as published first (its directory renamed away in one step; its index
  // deleted before its other files), then its files go. A version already
  // gone is OK (another gc got there first). Refuses, FailedPrecondition,
  // the version the pointer names at the time of the call. Deciding which
  // versions nothing needs is the caller's business (PlanRetention).
  [[nodiscard]] virtual absl::Status DeleteVersion(int64_t version);

  // Drops this store's local copies (a remote store's version cache) of
  // versions below `below` that the store no longer holds (retention
  // deleted them): nothing can need them again. Returns how many it
  // dropped; 0 for a store read in place (the default).
  [[nodiscard]] virtual absl::StatusOr<int> PruneLocalCopies(int64_t below);

  // Small named records kept beside the versions (holds: retention.h).
  // `kind` and `name` are [A-Za-z0-9._-], not starting with '.'. Writing
  // replaces a record atomically; deleting a missing record is OK; reading
  // one gives nullopt when it is missing. Listing gives names, sorted.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ListRecords(std::string_view kind);
  [[nodiscard]] virtual absl::StatusOr<std::optional<std::string>> ReadRecord(
      std::string_view kind, std::string_view name);
  [[nodiscard]] virtual absl::Status WriteRecord(std::string_view kind, std::string_view name,
                                                 std::string_view text);
  [[nodiscard]] virtual absl::Status DeleteRecord(std::string_view kind, std::string_view name);

  // --- Anchors written after the fact (publish/anchor.h, `stitch compact`)
  //
  // The store of this store's anchors: FULL copies of DELTA versions,
  // written after those were published, that a chain may start from instead
  // of walking further back (MaterializeChain, retention). It is a store of
  // the same kind under `<root>/anchors` (its version N: the anchor of
  // version N), with no pointer of its own: deleting one of its versions
  // obeys this store's pointer (CheckDeletable). Null for a store that keeps
  // none (the default), and for an anchors store itself.
  virtual Store* anchors() { return nullptr; }

  // The remote store (remote_store.h) that holds this store's versions, or
  // null for a store read in place. A version cache (fetch/) answers with
  // the store it caches.
  virtual RemoteStore* remote() { return nullptr; }
};

// What the pointer of an existing store names (see "Existence" above). A
// store that does not exist is FailedPrecondition, one line naming the store
// and saying to check its URI or to claim a run in it (`stitch claim`);
// errors reading the pointer pass through.
[[nodiscard]] absl::StatusOr<VersionRef> ReadClaimedPointer(Store& store);

// OK when a store whose pointer reads `pointer` may delete `version` of
// the run `run_id` (the store's own; empty for a view of whatever run the
// pointer names): the pointer is set, names that run, and is past
// `version`. Versions at or above the pointer (the pointer's own, and those
// still being published) are FailedPrecondition, naming `where`.
[[nodiscard]] absl::Status CheckDeletable(std::string_view where, std::string_view run_id,
                                          const std::optional<VersionRef>& pointer,
                                          int64_t version);

// OK when `word` may name a record's kind or name (Store::ListRecords);
// InvalidArgument naming `what` otherwise.
[[nodiscard]] absl::Status ValidateRecordWord(std::string_view what, std::string_view word);

}  // namespace stitch
