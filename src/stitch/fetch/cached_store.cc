#include "stitch/fetch/cached_store.h"

#include <unistd.h>

#include <random>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/fetch/version_cache.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

std::string RandomHex() {
  std::random_device entropy;
  return absl::StrFormat("%08x%08x%08x%08x", entropy(), entropy(), entropy(), entropy());
}

// The peer id of the version cache at `cache_dir`: read from
// .stitch-peer-id, which the first opener creates (written aside, then
// linked into place, so that every opener reads one id); a random id of
// this process when there is no cache or it cannot be written.
std::string CachePeerId(const fs::path& cache_dir) {
  if (cache_dir.empty()) return RandomHex();
  const fs::path path = cache_dir / ".stitch-peer-id";
  if (auto id = ReadFileToString(path); id.ok() && !id->empty()) return *id;
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  const fs::path temp = TempSiblingPath(path);
  if (WriteFileAtomically(temp, RandomHex()).ok()) {
    (void)::link(temp.c_str(), path.c_str());  // EEXIST: another opener was first
    fs::remove(temp, ec);
  }
  auto id = ReadFileToString(path);
  return id.ok() && !id->empty() ? *id : RandomHex();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CachedStore>> CachedStore::Open(std::unique_ptr<RemoteStore> remote,
                                                               const fs::path& cache_dir,
                                                               StorePeers peers,
                                                               std::unique_ptr<PeerSource> source,
                                                               int parallelism) {
  fs::path absolute;
  if (!cache_dir.empty()) {
    std::error_code ec;
    absolute = fs::absolute(cache_dir, ec).lexically_normal();
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("cache directory ", cache_dir.string(),
                                                     ": cannot make it absolute: ", ec.message()));
    }
  }
  std::string peer_id = CachePeerId(absolute);
  peers.self_id = peer_id;
  if (source == nullptr) source = std::make_unique<HttpPeerSource>(peers);
  return std::unique_ptr<CachedStore>(new CachedStore(std::move(remote), std::move(absolute),
                                                      std::move(peer_id), std::move(peers),
                                                      std::move(source), parallelism));
}

CachedStore::CachedStore(std::unique_ptr<RemoteStore> remote, fs::path cache_dir,
                         std::string peer_id, StorePeers peers, std::unique_ptr<PeerSource> source,
                         int parallelism)
    : remote_(std::move(remote)),
      cache_dir_(std::move(cache_dir)),
      peer_id_(std::move(peer_id)),
      where_(absl::StrCat("store ", remote_->uri())),
      source_(std::move(source)),
      parallelism_(parallelism),
      fetcher_(*remote_, std::move(peers), *source_, parallelism) {}

Store* CachedStore::anchors() {
  absl::MutexLock lock(&anchors_mu_);
  if (!anchors_opened_) {
    anchors_opened_ = true;
    if (std::unique_ptr<RemoteStore> remote = remote_->OpenAnchors(); remote != nullptr) {
      StorePeers none;
      none.self_id = peer_id_;
      auto source = std::make_unique<HttpPeerSource>(none);
      anchors_.reset(new CachedStore(std::move(remote), cache_dir_, peer_id_, std::move(none),
                                     std::move(source), parallelism_));
    }
  }
  return anchors_.get();
}

absl::StatusOr<fs::path> CachedStore::Materialize(int64_t version) {
  if (cache_dir_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where_,
        ": no cache directory to materialize into; pass --cache-dir (StoreOptions.cache_dir)"));
  }
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  auto described = remote_->DescribeVersion(version);
  if (!described.ok()) return described.status();
  std::vector<std::string> names;
  for (const StoredFile& f : described->files) names.push_back(f.name);

  const CachePaths paths = CachePaths::For(cache_dir_, remote_->CacheSubdir(), version);
  if (absl::Status s = CheckCacheFileNames(paths.target, names, where_); !s.ok()) return s;
  auto lock = LockCacheVersion(paths);
  if (!lock.ok()) return Annotate(lock.status(), where_);

  CacheRecord record = ReadCacheRecord(paths.record);
  const std::vector<size_t> missing = StaleCacheFiles(paths.target, described->files, record);
  if (absl::Status s = fetcher_.Fetch(version, paths.target, described->files, missing, record);
      !s.ok()) {
    // Keep what did arrive: the next attempt fetches only the rest.
    (void)WriteCacheRecord(paths.record, record);
    return Annotate(s, where_);
  }
  const fs::path index_path = paths.target / kIndexFileName;
  // Compared in pieces: the index is not held twice.
  absl::StatusOr<bool> on_disk = FileHolds(index_path, described->index_text);
  if (!on_disk.ok() || !*on_disk) {
    if (absl::Status s = WriteFileAtomically(index_path, described->index_text); !s.ok()) {
      return Annotate(s, where_);
    }
  }
  if (!missing.empty()) {
    if (absl::Status s = WriteCacheRecord(paths.record, record); !s.ok()) {
      return Annotate(s, where_);
    }
    for (const fs::path& dir : {paths.target, paths.parent}) {
      if (absl::Status s = FsyncPath(dir); !s.ok()) return Annotate(s, where_);
    }
  }
  return paths.target;
}

absl::StatusOr<Store::VerifiedFile> CachedStore::OpenVerifiedFile(int64_t version,
                                                                  std::string_view name) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(std::string(s.message()));
  }
  const std::string file(name);
  if (absl::Status s = ValidatePayloadFileName(file); !s.ok() || file == kIndexFileName) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CEscape(file), "\" is not a file a version's index names"));
  }
  const auto not_held = [&] {
    return absl::NotFoundError(absl::StrCat(VersionDirName(version), "/", file,
                                            " is not in this replica's verified cache"));
  };
  if (cache_dir_.empty()) return not_held();
  const CachePaths paths = CachePaths::For(cache_dir_, remote_->CacheSubdir(), version);
  if (!CheckCacheFileNames(paths.target, {file}, where_).ok()) return not_held();
  auto opened = OpenCachedFile(paths, file);
  if (!opened.ok()) return not_held();
  return opened;
}

absl::StatusOr<int> CachedStore::PruneLocalCopies(int64_t below) {
  auto dropped = PruneCache(below);
  if (!dropped.ok()) return dropped.status();
  Store* anchors = this->anchors();
  if (anchors == nullptr) return dropped;
  auto anchors_dropped = anchors->PruneLocalCopies(below);
  if (!anchors_dropped.ok()) return anchors_dropped.status();
  return *dropped + *anchors_dropped;
}

absl::StatusOr<int> CachedStore::PruneCache(int64_t below) {
  if (cache_dir_.empty()) return 0;
  const fs::path parent = cache_dir_ / remote_->CacheSubdir();
  std::error_code ec;
  if (!fs::is_directory(parent, ec)) return 0;
  std::vector<int64_t> cached;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    auto version = ParseVersionDirName(it->path().filename().string());
    if (version.ok() && *version < below) cached.push_back(*version);
  }
  if (cached.empty()) return 0;
  auto listed = remote_->ListVersions();
  if (!listed.ok()) return listed.status();
  const std::set<int64_t> held(listed->begin(), listed->end());
  int dropped = 0;
  for (int64_t version : cached) {
    if (held.contains(version)) continue;
    const CachePaths paths = CachePaths::For(cache_dir_, remote_->CacheSubdir(), version);
    auto lock = LockCacheVersion(paths);
    if (!lock.ok()) return Annotate(lock.status(), where_);
    std::error_code rm;
    fs::remove(paths.record, rm);
    fs::remove_all(paths.target, rm);
    if (rm) {
      return absl::InternalError(
          absl::StrCat(where_, ": remove ", paths.target.string(), ": ", rm.message()));
    }
    ++dropped;
  }
  return dropped;
}

}  // namespace stitch
