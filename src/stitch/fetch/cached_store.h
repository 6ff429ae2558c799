// A remote store (store/remote_store.h) behind a verified local cache: the
// Store a replica uses for an S3 URI (open_store.h makes one).
//
// Materialize fills `<cache_dir>/<the store's CacheSubdir>/weight_vNNNNNN`
// with the version's files (index, payload, other files: config,
// tokenizer): only those missing there or differing (by size and recorded
// SHA-256, version_cache.h), each taken from a peer or the store
// (fetcher.h), hashed as it arrives and written durably (temporary file,
// fsync, rename) before it can be used. Everything else (the pointer,
// publishing, manifests) is the remote store's.
//
// Thread-safety: safe to call from several threads and processes at once
// (a version being filled is locked: version_cache.h).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/fetch/fetcher.h"
#include "stitch/fetch/peer_client.h"
#include "stitch/fetch/peers.h"
#include "stitch/store/remote_store.h"
#include "stitch/store/store.h"

namespace stitch {

class CachedStore final : public Store {
 public:
  // `cache_dir` (made absolute here) is where versions are materialized;
  // empty: Materialize fails saying so. The cache's peer id is read from
  // `<cache_dir>/.stitch-peer-id`, which the first opener creates, so that
  // replicas sharing a cache are one peer. `source` asks peers; null: over
  // HTTP (HttpPeerSource). `parallelism`: files in flight at once.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CachedStore>> Open(
      std::unique_ptr<RemoteStore> remote, const std::filesystem::path& cache_dir,
      StorePeers peers = {}, std::unique_ptr<PeerSource> source = nullptr, int parallelism = 8);

  std::string uri() const override { return remote_->uri(); }
  const std::string& run_id() const override { return remote_->run_id(); }
  [[nodiscard]] absl::Status Refresh() override { return remote_->Refresh(); }
  [[nodiscard]] absl::StatusOr<std::optional<VersionRef>> ReadPointer() override {
    return remote_->ReadPointer();
  }
  [[nodiscard]] absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                                            const VersionRef& proposed) override {
    return remote_->AdvancePointer(expected, proposed);
  }
  [[nodiscard]] absl::Status PublishFiles(int64_t version,
                                          const std::filesystem::path& dir) override {
    return remote_->PublishFiles(version, dir);
  }
  [[nodiscard]] absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override {
    return remote_->ReadManifest(version);
  }

  [[nodiscard]] absl::StatusOr<std::filesystem::path> Materialize(int64_t version) override;
  // Removes `<cache>/<subdir>/weight_vN` (and its record) for every N below
  // `below` that the remote store no longer lists, each under its version
  // lock (the lock files stay), and the same of its anchors.
  [[nodiscard]] absl::StatusOr<int> PruneLocalCopies(int64_t below) override;
  // Retention acts on the remote store.
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> ListVersions() override {
    return remote_->ListVersions();
  }
  [[nodiscard]] absl::Status DeleteVersion(int64_t version) override {
    return remote_->DeleteVersion(version);
  }
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListRecords(
      std::string_view kind) override {
    return remote_->ListRecords(kind);
  }
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> ReadRecord(
      std::string_view kind, std::string_view name) override {
    return remote_->ReadRecord(kind, name);
  }
  [[nodiscard]] absl::Status WriteRecord(std::string_view kind, std::string_view name,
                                         std::string_view text) override {
    return remote_->WriteRecord(kind, name, text);
  }
  [[nodiscard]] absl::Status DeleteRecord(std::string_view kind, std::string_view name) override {
    return remote_->DeleteRecord(kind, name);
  }
  StoreTraffic traffic() const override { return fetcher_.traffic(); }
  // A file of the cache whose record vouches for it and that nobody
  // touched since: what the sidecar serves its peers.
  [[nodiscard]] absl::StatusOr<VerifiedFile> OpenVerifiedFile(int64_t version,
                                                              std::string_view name) override;
  std::string peer_id() const override { return peer_id_; }
  RemoteStore* remote() override { return remote_.get(); }
  // The remote store's anchors behind the same cache directory (their own
  // subdirectory), asking no peers: peers serve versions, not anchors.
  Store* anchors() override;

 private:
  CachedStore(std::unique_ptr<RemoteStore> remote, std::filesystem::path cache_dir,
              std::string peer_id, StorePeers peers, std::unique_ptr<PeerSource> source,
              int parallelism);
  // PruneLocalCopies of this cache's own versions.
  [[nodiscard]] absl::StatusOr<int> PruneCache(int64_t below);

  const std::unique_ptr<RemoteStore> remote_;
  const std::filesystem::path cache_dir_;
  const std::string peer_id_;
  const std::string where_;  // "store <uri>"
  const std::unique_ptr<PeerSource> source_;
  const int parallelism_;
  VersionFetcher fetcher_;
  absl::Mutex anchors_mu_;
  // Null until first asked for; stays null for a remote store without anchors.
  std::unique_ptr<CachedStore> anchors_ ABSL_GUARDED_BY(anchors_mu_);
  bool anchors_opened_ ABSL_GUARDED_BY(anchors_mu_) = false;
};

}  // namespace stitch
