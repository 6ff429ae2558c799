// The S3 store: a run's versions and `latest` pointer under one prefix of an
// S3 (or S3-compatible) bucket, with the filesystem store's guarantees.
//
//   <prefix>/latest                                  the pointer (text)
//   <prefix>/updates/weight_vNNNNNN/<payload files>  one version
//   <prefix>/updates/weight_vNNNNNN/model.safetensors.index.json
//   <prefix>/anchors/updates/weight_vNNNNNN/...      an anchor of version N
//                                                    (store.h anchors())
//   <prefix>/updates/weight_vNNNNNN/.receipts/<host>.json
//                                                    multi-host upload receipts
//                                                    (never part of the payload)
//
// Durability: every object records its SHA-256 under
// `x-amz-meta-stitch-sha256` (the original Stitch's key) and under
// `x-amz-meta-sha256`, which earlier versions wrote and read (s3_client.h
// RecordedSha256), and,
// on single-part uploads, in `x-amz-checksum-sha256`, which S3 checks; every
// request body is signed with its SHA-256 (S3 rejects bytes that do not
// match), and PublishFiles HEADs every object and checks its size and
// recorded SHA-256 before returning. The index is uploaded last, so a
// version whose index exists has had all its payload uploaded.
//
// Pointer: AdvancePointer reads `latest` with its ETag and writes it back
// conditionally (`If-None-Match: *` when unset, `If-Match: <etag>` after);
// a 412 (or 409 ConditionalRequestConflict) is a kPointerConflict reporting
// the pointer found on a fresh read.
//
// A remote store (store/remote_store.h): it lists a version's files with
// their recorded size and SHA-256 and reads one; a replica materializes its
// versions through the fetch room's verified cache (fetch/cached_store.h),
// which OpenStore (fetch/open_store.h) puts in front of it.
//
// Error messages start with "store s3://bucket/prefix" and name the object.
//
// Thread-safety: safe to call from several threads and processes at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/format/index.h"
#include "stitch/store/remote_store.h"
#include "stitch/store/s3/s3_client.h"
#include "stitch/store/s3/s3_uri.h"

namespace stitch {

struct S3StoreOptions {
  S3ClientOptions client;
  // Transfers (uploads, parts, downloads, HEADs) in flight at once.
  int parallelism = 8;
  // Files of at least this many bytes are uploaded in parts.
  uint64_t multipart_threshold = uint64_t{64} << 20;
  // Part size; raised when a file would need more than 10,000 parts.
  // REQUIRES: at least 5 MiB (S3's minimum for all but the last part).
  uint64_t part_size = uint64_t{16} << 20;
  // Keys per ListObjectsV2 page (1..1000).
  int list_page_size = 1000;
  // How large a version's index may be: a larger one is refused (DataLoss)
  // before it is read. A replica narrows it to what its base checkpoint can
  // hold (IndexBoundsFor).
  IndexBounds index_bounds;
};

class S3Store final : public RemoteStore {
 public:
  // Opens the store at `uri` (see s3_uri.h) for `run_id` (validated; empty
  // for a read-only view that refuses PublishFiles and AdvancePointer).
  // Nothing is sent until the first call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<S3Store>> Open(
      std::string_view uri, std::string run_id,
      const S3Environment& env = S3Environment::FromProcess(), S3StoreOptions s3 = {});

  std::string uri() const override { return location_.uri; }
  const std::string& run_id() const override { return run_id_; }
  const S3Location& location() const { return location_; }

  // A no-op: S3 reads are strongly consistent after writes.
  [[nodiscard]] absl::Status Refresh() override;

  [[nodiscard]] absl::StatusOr<std::optional<VersionRef>> ReadPointer() override;
  [[nodiscard]] absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                                            const VersionRef& proposed) override;

  // Uploads the index, the weight_map's payload files and the other files of
  // `dir` (version_dir.h ReadVersionDir; index last), then verifies every
  // object. An existing version with identical files (compared by size and
  // recorded SHA-256: nothing is downloaded) is a successful retry (missing
  // objects are uploaded); any difference is an AlreadyExists error naming
  // the first one.
  [[nodiscard]] absl::Status PublishFiles(int64_t version,
                                          const std::filesystem::path& dir) override;

  // NotFound when the version's index does not exist; DataLoss when it does
  // not match its recorded SHA-256 or does not describe this version.
  [[nodiscard]] absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override;

  // The index (verified, within the bounds), then the payload it names and
  // the version's other files (listed), each HEADed for its size and
  // recorded SHA-256.
  [[nodiscard]] absl::StatusOr<RemoteVersion> DescribeVersion(int64_t version) override;
  // A GET into `sink`; DataLoss when the object records another SHA-256
  // than `want` (it changed after it was published).
  [[nodiscard]] absl::Status ReadFile(int64_t version, const StoredFile& want,
                                      ByteSink& sink) override;
  // "s3/<bucket>/<prefix>".
  std::filesystem::path CacheSubdir() const override;

  // ---- Retention (store.h; s3_store_retention.cc) ----

  // Lists `updates/`: every version with an object under it.
  [[nodiscard]] absl::StatusOr<std::vector<int64_t>> ListVersions() override;
  // Deletes the index first (from then on the version reads as not
  // published, and a replica downloading it fails cleanly), then every
  // other object of the version, receipts included. A gc that died part
  // way leaves objects without an index, which the next one deletes.
  [[nodiscard]] absl::Status DeleteVersion(int64_t version) override;
  // Records are the objects `<prefix>/<kind>/<name>`, written with their
  // SHA-256 and read verified.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListRecords(
      std::string_view kind) override;
  [[nodiscard]] absl::StatusOr<std::optional<std::string>> ReadRecord(
      std::string_view kind, std::string_view name) override;
  [[nodiscard]] absl::Status WriteRecord(std::string_view kind, std::string_view name,
                                         std::string_view text) override;
  [[nodiscard]] absl::Status DeleteRecord(std::string_view kind, std::string_view name) override;

  // The S3 store at `<prefix>/anchors`, sharing this one's client.
  Store* anchors() override;
  std::unique_ptr<RemoteStore> OpenAnchors() override;

  // ---- Pieces of the multi-host protocol (publish/multihost.h) ----

  // Uploads `files` (payload names relative to `dir`, each a plain file:
  // version_dir.h CheckPlainFile) as part of `version` without its index,
  // with PublishFiles' immutability and verification.
  // Returns the files as the store now holds them.
  [[nodiscard]] absl::StatusOr<std::vector<StoredFile>> UploadVersionFiles(
      int64_t version, const std::filesystem::path& dir, const std::vector<std::string>& files);

  // Uploads `index_json` as the version's index (after checking that it
  // describes `version`), the step that makes the version readable.
  // Immutable like the payload; verified by HEAD.
  [[nodiscard]] absl::Status PublishIndex(int64_t version, std::string_view index_json);

  // What the store holds for each of `files` of `version` (one HEAD each):
  // NotFound naming the first missing one; DataLoss for an object without a
  // recorded SHA-256.
  [[nodiscard]] absl::StatusOr<std::vector<StoredFile>> StatVersionFiles(
      int64_t version, const std::vector<std::string>& files);

  // The names of every object of `version`, sorted, but those with a
  // component starting with '.' (its receipts among them): not part of the
  // version (version_dir.h).
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListVersionFiles(int64_t version);

  // Writes (replacing) and reads `updates/weight_vN/.receipts/<host>.json`.
  // `host` is 1..64 characters of [A-Za-z0-9._-], not starting with '.'.
  [[nodiscard]] absl::Status PutReceipt(int64_t version, std::string_view host,
                                        std::string_view json);
  [[nodiscard]] absl::StatusOr<std::string> GetReceipt(int64_t version, std::string_view host);

  // The full key of `name` in `version` ("prefix/updates/weight_v000001/a").
  std::string VersionKey(int64_t version, std::string_view name) const;

  // Counters, for tests and logs.
  int64_t payload_files_uploaded() const { return uploaded_.load(); }
  S3Client& client() { return *client_; }

  // Test hook: runs `hook` inside AdvancePointer after the pointer was read
  // and checked, just before the conditional write, so that tests can
  // interleave another writer deterministically. Set it before use.
  void SetBeforePointerWriteForTesting(std::function<void()> hook) {
    before_pointer_write_ = std::move(hook);
  }

 private:
  struct Upload;
  // Where multi-host receipts live inside a version directory.
  static constexpr std::string_view kReceiptsDir = ".receipts";
  S3Store(S3Location location, std::string run_id, std::shared_ptr<S3Client> client,
          S3StoreOptions options);

  // The pointer's text, parsed, and the ETag it was read with ("" when unset).
  struct PointerRead {
    std::optional<VersionRef> pointer;
    std::string etag;
  };
  [[nodiscard]] absl::StatusOr<PointerRead> ReadPointerWithEtag();

  // Every key under `prefix` (full keys), in the service's order.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListKeys(const std::string& prefix);
  // DELETE of one key; a key already gone is OK.
  [[nodiscard]] absl::Status DeleteKey(const std::string& key);
  // PUT of a small object with its SHA-256 recorded as GetVerified checks it.
  [[nodiscard]] absl::Status PutSmall(const std::string& key, std::string_view body,
                                      std::string_view operation);
  // The full key of a record, after validating both words.
  [[nodiscard]] absl::StatusOr<std::string> RecordKey(std::string_view kind,
                                                      std::string_view name) const;
  // HEAD: nullopt when the object does not exist.
  [[nodiscard]] absl::StatusOr<std::optional<S3ObjectInfo>> Head(const std::string& key);
  // Uploads whatever of `uploads` the store lacks (refusing different bytes
  // under the same name), then verifies all of them.
  [[nodiscard]] absl::Status UploadAll(std::vector<Upload>& uploads);
  // Fills in the size and SHA-256 of `upload`'s file, and the parts' for a
  // multipart one, in one pass.
  [[nodiscard]] absl::Status HashUpload(Upload& upload) const;
  [[nodiscard]] absl::Status PutSingle(Upload& upload);
  [[nodiscard]] absl::Status PutMultipart(Upload& upload);
  // The ETag of each part of `upload`, uploaded in parallel.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> UploadParts(const Upload& upload,
                                                                     const std::string& upload_id);
  // Best effort.
  void AbortMultipart(const Upload& upload, const std::string& upload_id);
  // OK when the existing object holds `upload`'s bytes, AlreadyExists
  // otherwise.
  [[nodiscard]] absl::Status CompareExisting(const Upload& upload, const S3ObjectInfo& info);
  // After an upload lost a race (412): CompareExisting with what is there
  // now; Aborted when nothing is.
  [[nodiscard]] absl::Status CompareAfterLostRace(const Upload& upload);
  [[nodiscard]] absl::Status VerifyUploaded(const std::vector<Upload>& uploads);
  // GET of a small object with its SHA-256 checked against its metadata;
  // one larger than `max_bytes` (0: the client's limit) is OutOfRange.
  [[nodiscard]] absl::StatusOr<std::string> GetVerified(const std::string& key,
                                                        std::string_view what,
                                                        uint64_t max_bytes = 0);
  // The index of `version`, verified; NotFound "not published" when absent.
  [[nodiscard]] absl::StatusOr<std::string> ReadIndexText(int64_t version);
  [[nodiscard]] absl::Status RequireRunId(std::string_view action) const;

  const S3Location location_;
  const std::string run_id_;
  const std::shared_ptr<S3Client> client_;
  const S3StoreOptions options_;
  const std::string where_;  // "store s3://bucket/prefix"
  std::atomic<int64_t> uploaded_{0};
  // Set for an anchors store: the store whose pointer guards its deletions.
  S3Store* parent_ = nullptr;
  absl::Mutex anchors_mu_;
  std::unique_ptr<RemoteStore> anchors_ ABSL_GUARDED_BY(anchors_mu_);

  std::function<void()> before_pointer_write_;
};

}  // namespace stitch
