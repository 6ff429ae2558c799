// The local cache S3Store::Materialize fills (s3_store.h): where each
// version goes, what the cache already holds, and one verified, durable
// download into it. Internal to the store library.
//
// Layout, under <cache_dir>/s3/<bucket>/<prefix>/:
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
// threads and processes; within it DownloadToCache may run for several
// files at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/io/fileio.h"
#include "stitch/store/s3_client.h"
#include "stitch/store/s3_store.h"
#include "stitch/store/s3_uri.h"

namespace stitch {

// The record's entry for one file.
struct S3CachedFile {
  uint64_t size = 0;
  std::string sha256;  // hex, as the store recorded it
  int64_t mtime_ns = 0;
};

// The record of one version: file name (relative to the version directory)
// to entry.
struct S3CacheRecord {
  std::map<std::string, S3CachedFile> files;
};

// Where one version of one store lives in the cache.
struct S3VersionCachePaths {
  std::filesystem::path parent;  // <cache_dir>/s3/<bucket>/<prefix>
  std::filesystem::path target;  // parent/weight_vNNNNNN
  std::filesystem::path lock;    // parent/.weight_vNNNNNN.lock
  std::filesystem::path record;  // parent/.weight_vNNNNNN.files.json

  // REQUIRES: `cache_dir` absolute; `version` valid (ValidateVersionNumber).
  static S3VersionCachePaths For(const std::filesystem::path& cache_dir, const S3Location& location,
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
[[nodiscard]] absl::StatusOr<UniqueFd> LockCacheVersion(const S3VersionCachePaths& paths);

// The record at `path`; empty when it is absent or damaged (that only
// costs downloads).
S3CacheRecord ReadS3CacheRecord(const std::filesystem::path& path);

// Replaces the record at `path` atomically.
[[nodiscard]] absl::Status WriteS3CacheRecord(const std::filesystem::path& path,
                                              const S3CacheRecord& record);

// The indexes into `stored` of the files `target` does not hold current
// (see the file comment), in order.
std::vector<size_t> StaleCacheFiles(const std::filesystem::path& target,
                                    const std::vector<StoredFile>& stored,
                                    const S3CacheRecord& record);

// How long one transfer of a `size`-byte file from a peer may take in all
// when the peer is asked to wait up to `wait_ms` for it: the connect
// timeout, the allowance, the wait, and the size at the floor rate
// (StorePeers). Saturates rather than overflows.
std::chrono::milliseconds PeerTransferDeadline(const StorePeers& peers, uint64_t size,
                                               int64_t wait_ms);

// Downloads `key` into `final_path` (creating its directory): into a
// temporary sibling, hashed as it arrives, fsynced, checked against both
// the SHA-256 the response records and `want`, then renamed into place and
// the directory fsynced. Returns the file's record entry. DataLoss
// (ErrorKind::kChecksumMismatch) when the bytes are not `want`'s (the
// transfer is cut as soon as more than want.size bytes arrive); the
// client's errors otherwise. The temporary file never outlives a failure.
// The same from the peer at `peer_url` (its kPeerFileRoute, waiting up to
// `wait_ms` for the peer to hold it), checked against `want` only (the
// store's record; a peer's word counts for nothing). A peer can never make
// this write more than want.size bytes: a response declaring another
// Content-Length is refused before its body, and one that sends more is
// cut at want.size. NotFound when the peer does not hold the file;
// FailedPrecondition when the peer is this replica (peers.self_id);
// DataLoss (kChecksumMismatch) when its bytes, or its Content-Length, are
// not `want`'s; Unavailable when it did not answer, stalled or missed its
// deadline (PeerTransferDeadline). The temporary file never outlives a
// failure.
[[nodiscard]] absl::StatusOr<S3CachedFile> FetchFromPeerToCache(
    const StorePeers& peers, const std::string& peer_url, int64_t version, const StoredFile& want,
    const std::filesystem::path& final_path, int64_t wait_ms = 0);

[[nodiscard]] absl::StatusOr<S3CachedFile> DownloadToCache(S3Client& client,
                                                           const S3Location& location,
                                                           const std::string& key,
                                                           const StoredFile& want,
                                                           const std::filesystem::path& final_path);

}  // namespace stitch
