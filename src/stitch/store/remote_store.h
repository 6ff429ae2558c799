// A store whose versions live away from the replica (S3): what the fetch
// room (fetch/) needs from it to materialize a version into a verified
// local cache. A remote store lists a version's files with the size and
// SHA-256 it recorded for each, and reads one; the fetch room decides where
// each file comes from (a peer or the store), checks every byte against
// the store's record, and keeps the cache.
//
// Thread-safety: as Store.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/io/byte_sink.h"
#include "stitch/store/store.h"

namespace stitch {

// One file of a version as a host uploaded it or as the store holds it.
struct StoredFile {
  std::string name;  // relative to the version directory
  uint64_t size = 0;
  std::string sha256;  // hex

  friend bool operator==(const StoredFile&, const StoredFile&) = default;
};

// What a replica must hold of one version: its index, verified, and every
// other file with what the store records for it.
struct RemoteVersion {
  std::string index_text;
  VersionManifest manifest;
  // The payload the index names, then the version's other files (config,
  // tokenizer), the index itself excluded. Names are the index's, validated
  // as version file names.
  std::vector<StoredFile> files;
};

class RemoteStore : public Store {
 public:
  // NotFound "not published" when the version has no index; DataLoss when
  // it is incomplete (a file the index names is missing) or a file records
  // no SHA-256.
  [[nodiscard]] virtual absl::StatusOr<RemoteVersion> DescribeVersion(int64_t version) = 0;

  // Reads `want` of `version` into `sink` (Restart()ed before each
  // attempt). DataLoss (ErrorKind::kChecksumMismatch) when the bytes the
  // store holds now are not the ones it recorded; the transport's errors
  // otherwise. The sink checks the bytes against `want` as they arrive.
  [[nodiscard]] virtual absl::Status ReadFile(int64_t version, const StoredFile& want,
                                              ByteSink& sink) = 0;

  // A relative path naming this store alone under a cache directory
  // ("s3/<bucket>/<prefix>").
  virtual std::filesystem::path CacheSubdir() const = 0;

  // A remote store holds no local copy: it is materialized through a
  // version cache (fetch/cached_store.h), which OpenStore puts in front of
  // it. Alone, FailedPrecondition saying so.
  [[nodiscard]] absl::StatusOr<std::filesystem::path> Materialize(int64_t version) override;

  RemoteStore* remote() override { return this; }

  // A new remote store of this store's anchors (Store::anchors()), whose
  // deletions obey this store's pointer; this store must outlive it. Null
  // for a store that keeps none (the default).
  virtual std::unique_ptr<RemoteStore> OpenAnchors() { return nullptr; }
};

}  // namespace stitch
