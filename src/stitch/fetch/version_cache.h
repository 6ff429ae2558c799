// The verified version cache a remote store (store/remote_store.h) is
// materialized into (cached_store.h): where each version goes, what the
// cache already holds, and one verified, durable transfer into it.
//
// Layout, under <cache_dir>/<the store's CacheSubdir, s3/<bucket>/<prefix>>/:
//
//   weight_vNNNNNN/              the version's files, as the store holds them
//   .weight_vNNNNNN.lock         flocked while the version is being filled
//   .weight_vNNNNNN.files.json   the record: per file downloaded, the size
//                                and SHA-256 the store recorded and the
//                                local file's mtime once written
//
// A file whose record entry matches the store's size and SHA-256, and
// whose local size and mtime match the record, is current: it is never
// downloaded or hashed again. Anything else (no entry, a damaged record, a
// file touched since) is downloaded anew.
//
// Thread-safety: the functions hold no state of their own. Callers filling
// one version hold its lock (LockCacheVersion), which excludes other
// threads and processes; within it ReceiveIntoCache may run for several
// files at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/io/byte_sink.h"
#include "stitch/io/fileio.h"
#include "stitch/io/sha256.h"
#include "stitch/store/remote_store.h"

namespace stitch {

// The record's entry for one file.
struct CachedFile {
  uint64_t size = 0;
  std::string sha256;  // hex, as the store recorded it
  int64_t mtime_ns = 0;
};

// The record of one version: file name (relative to the version directory)
// to entry.
struct CacheRecord {
  std::map<std::string, CachedFile> files;
};

// Where one version of one store lives in the cache.
struct CachePaths {
  std::filesystem::path parent;  // <cache_dir>/<subdir>
  std::filesystem::path target;  // parent/weight_vNNNNNN
  std::filesystem::path lock;    // parent/.weight_vNNNNNN.lock
  std::filesystem::path record;  // parent/.weight_vNNNNNN.files.json

  // REQUIRES: `cache_dir` absolute; `subdir` relative (RemoteStore::
  // CacheSubdir); `version` valid (ValidateVersionNumber).
  static CachePaths For(const std::filesystem::path& cache_dir, const std::filesystem::path& subdir,
                        int64_t version);
};

// DataLoss, starting with `where`, naming the first of `files` that is not
// a valid payload file name or would resolve outside `target`.
[[nodiscard]] absl::Status CheckCacheFileNames(const std::filesystem::path& target,
                                               const std::vector<std::string>& files,
                                               std::string_view where);

// Creates `paths.target` (and its parents) and takes the version's flock,
// held until the returned descriptor is closed (one per open file
// description, so it excludes other threads of this process too).
[[nodiscard]] absl::StatusOr<UniqueFd> LockCacheVersion(const CachePaths& paths);

// The record at `path`; empty when it is absent or damaged (that only
// costs downloads).
CacheRecord ReadCacheRecord(const std::filesystem::path& path);

// Replaces the record at `path` atomically.
[[nodiscard]] absl::Status WriteCacheRecord(const std::filesystem::path& path,
                                            const CacheRecord& record);

// The indexes into `stored` of the files `target` does not hold current
// (see the file comment), in order.
std::vector<size_t> StaleCacheFiles(const std::filesystem::path& target,
                                    const std::vector<StoredFile>& stored,
                                    const CacheRecord& record);

// A transfer into a temporary file, hashed as it arrives, that never grows
// past `limit` bytes (the size the store records): whoever sends more, the
// cache holds at most the file's size (DataLoss, kChecksumMismatch).
class CacheFileSink final : public ByteSink {
 public:
  CacheFileSink(std::filesystem::path path, uint64_t limit);
  [[nodiscard]] absl::Status Restart() override;
  [[nodiscard]] absl::Status Write(std::string_view bytes) override;
  // fsyncs and closes the file; returns what was written.
  [[nodiscard]] absl::StatusOr<FileDigest> Finish();

 private:
  const std::filesystem::path path_;
  const uint64_t limit_;
  UniqueFd fd_;
  Sha256 hasher_;
  uint64_t size_ = 0;
};

// Receives `want` into `final_path` (creating its directory): `receive`
// writes the bytes into a CacheFileSink on a temporary sibling (already
// Restart()ed; its errors, which name their source, pass through); they
// are then checked against `want` (DataLoss, kChecksumMismatch, naming
// `source`, when they differ), fsynced, renamed into place and the
// directory fsynced. Returns the file's record entry. The temporary file
// never outlives a failure.
[[nodiscard]] absl::StatusOr<CachedFile> ReceiveIntoCache(
    const std::filesystem::path& final_path, const StoredFile& want, std::string_view source,
    const std::function<absl::Status(CacheFileSink& sink)>& receive);

// The cached file `name` of the version at `paths`, opened, when the
// record vouches for it (the store's size and SHA-256, checked when it
// arrived) and nobody touched it since; NotFound otherwise.
[[nodiscard]] absl::StatusOr<Store::VerifiedFile> OpenCachedFile(const CachePaths& paths,
                                                                 const std::string& name);

}  // namespace stitch
