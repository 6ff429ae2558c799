#include "stitch/fetch/version_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cerrno>
#include <span>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace json = boost::json;
namespace {

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// OK when the bytes received are `want`'s, else DataLoss naming `source`.
absl::Status CheckReceived(const FileDigest& got, const StoredFile& want, std::string_view source) {
  if (got.sha256 == want.sha256 && got.size == want.size) return absl::OkStatus();
  return WithKind(absl::DataLossError(absl::StrCat(
                      AbslView(source), ": received ", got.size, " bytes hashing to ", got.sha256,
                      " but the store records ", want.size, " bytes with sha256 ", want.sha256)),
                  ErrorKind::kChecksumMismatch);
}

// Renames the verified `temp` to `final_path` and makes it durable: the
// file's record entry.
absl::StatusOr<CachedFile> Install(const fs::path& temp, const fs::path& final_path,
                                   const StoredFile& want) {
  if (::rename(temp.c_str(), final_path.c_str()) != 0)
    return ErrnoStatus(errno, "rename", final_path);
  if (absl::Status s = FsyncPath(final_path.parent_path()); !s.ok()) return s;
  struct stat st;
  if (::stat(final_path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", final_path);
  return CachedFile{want.size, want.sha256, MtimeNs(st)};
}

}  // namespace

CachePaths CachePaths::For(const fs::path& cache_dir, const fs::path& subdir, int64_t version) {
  CachePaths paths;
  paths.parent = cache_dir / subdir;
  const std::string dir_name = VersionDirName(version);
  paths.target = paths.parent / dir_name;
  paths.lock = paths.parent / absl::StrCat(".", dir_name, ".lock");
  paths.record = paths.parent / absl::StrCat(".", dir_name, ".files.json");
  return paths;
}

absl::Status CheckCacheFileNames(const fs::path& target, const std::vector<std::string>& files,
                                 std::string_view where) {
  // Whatever the index (already validated when parsed) says.
  for (const std::string& name : files) {
    fs::path rel = (target / name).lexically_normal().lexically_relative(target);
    if (absl::Status s = ValidatePayloadFileName(name);
        !s.ok() || rel.empty() || *rel.begin() == "..") {
      return absl::DataLossError(
          absl::StrCat(AbslView(where), ": version ", target.filename().string(), " names file \"",
                       absl::CEscape(name), "\", which would escape the cache directory"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> LockCacheVersion(const CachePaths& paths) {
  std::error_code ec;
  fs::create_directories(paths.target, ec);
  if (ec) return ErrnoStatus(ec.value(), "create", paths.target);
  UniqueFd fd(::open(paths.lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return ErrnoStatus(errno, "open", paths.lock);
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoStatus(errno, "lock", paths.lock);
  }
  return fd;
}

CacheRecord ReadCacheRecord(const fs::path& path) {
  CacheRecord out;
  auto text = ReadFileToString(path);
  if (!text.ok()) return out;
  json::error_code ec;
  json::value v = json::parse(*text, ec);
  if (ec || !v.is_object()) return out;
  const json::object* files = v.as_object().if_contains("files") != nullptr
                                  ? v.as_object().at("files").if_object()
                                  : nullptr;
  if (files == nullptr) return out;
  for (const auto& [name, entry] : *files) {
    const json::object* e = entry.if_object();
    if (e == nullptr) continue;
    const json::value* size = e->if_contains("size");
    const json::value* sha = e->if_contains("sha256");
    const json::value* mtime = e->if_contains("mtime_ns");
    if (size == nullptr || !size->is_int64() || sha == nullptr || !sha->is_string() ||
        mtime == nullptr || !mtime->is_int64()) {
      continue;
    }
    out.files[std::string(name)] = CachedFile{static_cast<uint64_t>(size->as_int64()),
                                              std::string(sha->as_string()), mtime->as_int64()};
  }
  return out;
}

absl::Status WriteCacheRecord(const fs::path& path, const CacheRecord& record) {
  json::object files;
  for (const auto& [name, f] : record.files) {
    files[name] = json::object{
        {"size", static_cast<int64_t>(f.size)}, {"sha256", f.sha256}, {"mtime_ns", f.mtime_ns}};
  }
  return WriteFileAtomically(path, json::serialize(json::object{{"files", std::move(files)}}));
}

std::vector<size_t> StaleCacheFiles(const fs::path& target, const std::vector<StoredFile>& stored,
                                    const CacheRecord& record) {
  std::vector<size_t> stale;
  for (size_t i = 0; i < stored.size(); ++i) {
    const StoredFile& want = stored[i];
    auto it = record.files.find(want.name);
    struct stat st;
    bool fresh = it != record.files.end() && it->second.size == want.size &&
                 it->second.sha256 == want.sha256 &&
                 ::stat((target / want.name).c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
                 static_cast<uint64_t>(st.st_size) == want.size &&
                 MtimeNs(st) == it->second.mtime_ns;
    if (!fresh) stale.push_back(i);
  }
  return stale;
}

CacheFileSink::CacheFileSink(fs::path path, uint64_t limit)
    : path_(std::move(path)), limit_(limit) {}

absl::Status CacheFileSink::Restart() {
  fd_ = UniqueFd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd_) return ErrnoStatus(errno, "create", path_);
  hasher_ = Sha256();
  size_ = 0;
  return absl::OkStatus();
}

absl::Status CacheFileSink::Write(std::string_view bytes) {
  if (bytes.size() > limit_ - size_) {
    return WithKind(absl::DataLossError(
                        absl::StrCat("sent more than the ", limit_, " bytes the store records")),
                    ErrorKind::kChecksumMismatch);
  }
  if (absl::Status s = WriteAll(fd_.get(), std::as_bytes(std::span(bytes)), path_); !s.ok()) {
    return s;
  }
  hasher_.Update(bytes);
  size_ += bytes.size();
  return absl::OkStatus();
}

absl::StatusOr<FileDigest> CacheFileSink::Finish() {
  if (::fsync(fd_.get()) != 0) return ErrnoStatus(errno, "fsync", path_);
  fd_ = UniqueFd();
  return FileDigest{size_, hasher_.FinishHex()};
}

absl::StatusOr<CachedFile> ReceiveIntoCache(
    const fs::path& final_path, const StoredFile& want, std::string_view source,
    const std::function<absl::Status(CacheFileSink&)>& receive) {
  std::error_code dir_ec;
  fs::create_directories(final_path.parent_path(), dir_ec);
  if (dir_ec) return ErrnoStatus(dir_ec.value(), "create", final_path.parent_path());
  const fs::path temp = TempSiblingPath(final_path);
  CacheFileSink sink(temp, want.size);
  absl::StatusOr<CachedFile> installed = [&]() -> absl::StatusOr<CachedFile> {
    if (absl::Status s = sink.Restart(); !s.ok()) return s;
    if (absl::Status s = receive(sink); !s.ok()) return s;
    auto written = sink.Finish();
    if (!written.ok()) return written.status();
    if (absl::Status s = CheckReceived(*written, want, source); !s.ok()) return s;
    return Install(temp, final_path, want);
  }();
  if (!installed.ok()) {
    std::error_code ignored;
    fs::remove(temp, ignored);
  }
  return installed;
}

absl::StatusOr<Store::VerifiedFile> OpenCachedFile(const CachePaths& paths,
                                                   const std::string& name) {
  const CacheRecord record = ReadCacheRecord(paths.record);
  const auto entry = record.files.find(name);
  if (entry == record.files.end()) return absl::NotFoundError("no record of it");
  Store::VerifiedFile out;
  out.fd = UniqueFd(::open((paths.target / name).c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  // What was opened must be the file the record vouches for: a later
  // transfer replaces it by a rename, so the open descriptor keeps one
  // whole file either way.
  if (!out.fd || ::fstat(out.fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != entry->second.size ||
      MtimeNs(st) != entry->second.mtime_ns) {
    return absl::NotFoundError("its file is not the one the record vouches for");
  }
  out.size = entry->second.size;
  return out;
}

}  // namespace stitch
