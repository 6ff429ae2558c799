// The in-memory store: the Store contract with no disk behind the pointer and
// the versions, for tests of the layers above (sidecar, gateway, publisher).
//
// Every MemStore opened with the same name in one process shares one state
// (pointer and versions), as processes share one filesystem root; the state
// lives until the process exits. PublishFiles reads the version directory's
// files into memory; Materialize writes them out under the cache directory.
// Semantics and messages follow FsStore: immutable versions, a pointer that
// only moves forward inside a run, compare-and-swap conflicts, refusal of
// other runs' versions.
//
// Thread-safety: safe to call from several threads at once.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/store/store.h"

namespace stitch {

class MemStore final : public Store {
 public:
  // Opens the store named `name` (non-empty) for `run_id` (validated; empty
  // for a read-only view). `cache_dir` is where Materialize writes versions
  // (under `<cache_dir>/mem/<escaped name>/`); without one Materialize fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MemStore>> Open(
      std::string name, std::string run_id, std::filesystem::path cache_dir = {});

  ~MemStore() override;

  std::string uri() const override;  // "mem://<name>"
  const std::string& run_id() const override { return run_id_; }

  [[nodiscard]] absl::Status Refresh() override;
  [[nodiscard]] absl::StatusOr<std::optional<VersionRef>> ReadPointer() override;
  [[nodiscard]] absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                                            const VersionRef& proposed) override;
  [[nodiscard]] absl::Status PublishFiles(int64_t version,
                                          const std::filesystem::path& dir) override;
  [[nodiscard]] absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override;
  [[nodiscard]] absl::StatusOr<std::filesystem::path> Materialize(int64_t version) override;
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> ListVersions() override;
  [[nodiscard]] absl::Status DeleteVersion(int64_t version) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListRecords(
      std::string_view kind) override;
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> ReadRecord(
      std::string_view kind, std::string_view name) override;
  [[nodiscard]] absl::Status WriteRecord(std::string_view kind, std::string_view name,
                                         std::string_view text) override;
  [[nodiscard]] absl::Status DeleteRecord(std::string_view kind, std::string_view name) override;

  // The store named `<name>/anchors`, opened on first use.
  Store* anchors() override;

  // Test hook: replaces the pointer's stored text, bypassing every rule, as a
  // foreign or broken writer would (nullopt: unset). ReadPointer then parses
  // it exactly as FsStore parses its `latest` file.
  void SetPointerTextForTesting(std::optional<std::string> text);

  // Test hook: removes a published version's payload file (its index stays),
  // to exercise readers that must notice missing bytes. No-op when absent.
  void DropFileForTesting(int64_t version, const std::string& file);

 private:
  struct State;
  // The state shared by every store named `name`, created on first use.
  static State& SharedState(const std::string& name);
  MemStore(std::string name, std::string run_id, std::filesystem::path cache_dir, State* state);

  const std::string name_;
  const std::string run_id_;
  const std::filesystem::path cache_dir_;
  const std::string where_;
  State* const state_;  // owned by the process-wide registry; never freed
  // Set for an anchors store: the store whose pointer guards its deletions.
  MemStore* parent_ = nullptr;
  absl::Mutex anchors_mu_;
  std::unique_ptr<MemStore> anchors_ ABSL_GUARDED_BY(anchors_mu_);
};

}  // namespace stitch
