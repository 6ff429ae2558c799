// The filesystem store: a run's versions and `latest` pointer under one
// directory (local disk or a shared filesystem with POSIX rename and flock).
//
//   <root>/latest                      the pointer: a version identity
//   <root>/.latest.lock                flock'ed around every compare-and-swap
//   <root>/.staging.lock               flock'ed (shared) while a staging
//                                      directory is created, (exclusive)
//                                      while abandoned ones are looked for
//   <root>/updates/weight_vNNNNNN/     one published version (index + payload)
//   <root>/updates/.weight_v*.tmp-*    a publisher's staging directory; names
//                                      starting with '.' are never versions
//   <root>/holds/<holder>              a hold (retention.h), one per holder
//   <root>/anchors/updates/weight_vNNNNNN/
//                                      an anchor of version N (store.h
//                                      anchors()), laid out as a version
//   <root>/updates/.weight_v*.tmp-*.lock
//                                      flock'ed by that publisher for as long
//                                      as its staging directory exists
//
// Durability: PublishFiles stages the files in a temporary sibling directory,
// fsyncs every file and directory, then renames it into place and fsyncs
// updates/. A publisher killed mid-copy leaves its staging directory behind;
// every later copying PublishFiles first removes the staging directories
// whose lock no live publisher holds (RemoveAbandonedStaging), never one
// that a concurrent publisher is still writing.
//
// AdvancePointer replaces `latest` atomically (temp file, fsync, rename,
// fsync root) while holding an exclusive flock on `.latest.lock` over the
// read-compare-write, so two processes (or threads) racing from the same
// predecessor never both win. The first one, from an unset pointer, creates
// the root and `updates/`: opening creates nothing (store.h, "Existence").
//
// Error messages start with "store file:///<root>".
//
// Thread-safety: safe to call from several threads and processes at once.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/io/fileio.h"
#include "stitch/store/store.h"
#include "stitch/store/version_dir.h"

namespace stitch {

class FsStore final : public Store {
 public:
  // Opens the store rooted at `root` (made absolute against the current
  // directory) for `run_id`. Creates nothing: a missing root reads as an
  // unset pointer, and the first AdvancePointer (a claim) creates `root` and
  // `root/updates`. `run_id` must pass ValidateRunId, or be empty for a
  // read-only view that refuses PublishFiles and AdvancePointer. Indexes
  // larger than `index_bounds` are refused before they are read.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FsStore>> Open(
      const std::filesystem::path& root, std::string run_id, IndexBounds index_bounds = {});

  std::string uri() const override { return uri_; }
  const std::string& run_id() const override { return run_id_; }
  const std::filesystem::path& root() const { return root_; }
  // `<root>/updates/weight_vNNNNNN`, whether or not it exists.
  std::filesystem::path VersionDir(int64_t version) const;

  // A no-op: a local (or POSIX-coherent shared) filesystem is always current.
  [[nodiscard]] absl::Status Refresh() override;

  [[nodiscard]] absl::StatusOr<std::optional<VersionRef>> ReadPointer() override;

  // From an unset pointer, creates the store first (`root` and
  // `root/updates`, fsync'ed): the claim that makes it exist.
  [[nodiscard]] absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                                            const VersionRef& proposed) override;

  // Copies the index, the weight_map's payload files and the other files of
  // `dir` (version_dir.h ReadVersionDir: names starting with '.' are not
  // part of a version) into `<root>/updates/weight_vNNNNNN`, or adopts `dir`
  // in place when it already is that directory (fsyncing it, and writing
  // metadata.version into its index when missing). An existing version with
  // identical files (same names, same bytes, compared by reading both) is a
  // successful retry; any difference is an AlreadyExists error naming the
  // first one: versions are immutable. FailedPrecondition when the root does
  // not exist (PublishFiles never creates a store).
  [[nodiscard]] absl::Status PublishFiles(int64_t version,
                                          const std::filesystem::path& dir) override;

  // NotFound when `updates/weight_vNNNNNN` or its index is missing.
  [[nodiscard]] absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override;

  // The version's own directory, after checking every payload file exists.
  [[nodiscard]] absl::StatusOr<std::filesystem::path> Materialize(int64_t version) override;

  // Every `updates/weight_vNNNNNN` directory.
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> ListVersions() override;

  // Renames the version's directory into a staging directory of its own
  // (locked, as a publisher's: RemoveAbandonedStaging finishes the job if
  // this process dies), in one rename, then removes it. A reader that
  // already opened a file keeps reading its bytes; one that opens a file
  // afterwards gets NotFound.
  [[nodiscard]] absl::Status DeleteVersion(int64_t version) override;

  // Records live in `<root>/<kind>/<name>`, written with WriteFileAtomically.
  // Writing one needs the store to exist.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListRecords(
      std::string_view kind) override;
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> ReadRecord(
      std::string_view kind, std::string_view name) override;
  [[nodiscard]] absl::Status WriteRecord(std::string_view kind, std::string_view name,
                                         std::string_view text) override;
  [[nodiscard]] absl::Status DeleteRecord(std::string_view kind, std::string_view name) override;

  // The filesystem store rooted at `<root>/anchors`, opened on first use;
  // publishing to it creates its root when this store exists.
  Store* anchors() override;

  // Removes the staging directories under `updates/` that no live publisher
  // holds: those whose lock file's flock it can take (its writer died), and
  // those without a lock file (left by a stitch that did not lock them).
  // Returns how many it removed. Safe to call while other processes
  // publish: a directory whose writer is alive is never touched.
  [[nodiscard]] absl::StatusOr<int> RemoveAbandonedStaging();

  // Test hook: runs `hook` inside PublishFiles once the staging directory is
  // complete, just before it is renamed into place (a test can stop or kill
  // the publisher there). Set it before use.
  void SetBeforeRenameForTesting(std::function<void()> hook) { before_rename_ = std::move(hook); }

 private:
  enum class LinkCheck { kIndex, kWholeVersion };
  // DataLoss naming the first symbolic link (or special file) among
  // `updates`, the version's directory and its index, or with
  // kWholeVersion anywhere in that directory.
  [[nodiscard]] absl::Status CheckNoLinks(int64_t version, LinkCheck scope) const;
  FsStore(std::filesystem::path root, std::string run_id, IndexBounds index_bounds);

  // `<root>/<kind>/<name>` after validating both words.
  [[nodiscard]] absl::StatusOr<std::filesystem::path> RecordPath(std::string_view kind,
                                                                 std::string_view name) const;
  // "store file:///<root>", the prefix of every message.
  const std::string& where() const { return where_; }
  // Creates `root` and `root/updates` (and missing parents), durably.
  [[nodiscard]] absl::Status CreateRoot();
  // OK when the root exists; creates `updates/` in it when missing.
  // FailedPrecondition for a missing root: publishing never creates a store.
  [[nodiscard]] absl::Status RequireUpdatesDir();
  // A staging directory and its lock, held while this lives; destroying it
  // removes whatever is left of the directory, then the lock file.
  struct StagingDir {
    std::filesystem::path path;
    std::filesystem::path lock_path;
    UniqueFd lock;
    StagingDir() = default;
    StagingDir(StagingDir&& o) noexcept
        : path(std::exchange(o.path, {})),
          lock_path(std::exchange(o.lock_path, {})),
          lock(std::move(o.lock)) {}
    StagingDir& operator=(StagingDir&&) = delete;
    ~StagingDir();
  };
  [[nodiscard]] absl::StatusOr<StagingDir> CreateStagingDir(const std::filesystem::path& final_dir);
  [[nodiscard]] absl::Status CopyIn(const VersionDirContents& contents,
                                    const std::filesystem::path& final_dir);
  [[nodiscard]] absl::Status Adopt(const VersionDirContents& contents,
                                   const std::filesystem::path& final_dir);
  // OK when `final_dir` holds exactly the files of `contents`, byte for byte;
  // AlreadyExists naming the first difference otherwise.
  [[nodiscard]] absl::Status CompareExisting(const VersionDirContents& contents,
                                             const std::filesystem::path& final_dir);

  const std::filesystem::path root_;
  const std::string run_id_;
  const std::string uri_;
  const std::string where_;
  const IndexBounds index_bounds_;
  std::function<void()> before_rename_;
  // Set for an anchors store: the store whose anchors it keeps.
  FsStore* parent_ = nullptr;
  absl::Mutex anchors_mu_;
  std::unique_ptr<FsStore> anchors_ ABSL_GUARDED_BY(anchors_mu_);
};

// "file:///abs/path" for an absolute path, percent-encoding what a URI path
// cannot hold.
std::string FileUriForPath(const std::filesystem::path& absolute_path);

}  // namespace stitch
