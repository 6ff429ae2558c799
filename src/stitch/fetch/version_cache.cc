#include "stitch/store/s3_version_cache.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <span>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"
#include "stitch/store/curl_handles.h"
#include "stitch/store/s3_sha256.h"
#include "stitch/store/store.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace json = boost::json;
namespace {

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// A download into a temporary file, hashed as it arrives, that never grows
// past `limit` bytes (the size the store records): whoever sends more, the
// cache holds at most the file's size.
class FileSink final : public S3BodySink {
 public:
  FileSink(fs::path path, uint64_t limit) : path_(std::move(path)), limit_(limit) {}

  absl::Status Restart() override {
    fd_ = UniqueFd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd_) return ErrnoStatus(errno, "create", path_);
    hasher_ = Sha256();
    size_ = 0;
    return absl::OkStatus();
  }

  absl::Status Write(std::string_view bytes) override {
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

  // fsyncs and closes the file; returns what was written.
  absl::StatusOr<FileDigest> Finish() {
    if (::fsync(fd_.get()) != 0) return ErrnoStatus(errno, "fsync", path_);
    fd_ = UniqueFd();
    return FileDigest{size_, hasher_.FinishHex()};
  }

 private:
  const fs::path path_;
  const uint64_t limit_;
  UniqueFd fd_;
  Sha256 hasher_;
  uint64_t size_ = 0;
};

// OK when the bytes received are `want`'s, else DataLoss naming `source`
// and saying `why`.
absl::Status CheckReceived(const FileDigest& got, const StoredFile& want, std::string_view source,
                           std::string_view why) {
  if (got.sha256 == want.sha256 && got.size == want.size) return absl::OkStatus();
  return WithKind(absl::DataLossError(
                      absl::StrCat(AbslView(source), ": received ", got.size, " bytes hashing to ",
                                   got.sha256, " but the store records ", want.size,
                                   " bytes with sha256 ", want.sha256, "; ", AbslView(why))),
                  ErrorKind::kChecksumMismatch);
}

// Receives `key` into `temp` and checks what arrived; the caller removes
// `temp` on failure.
absl::Status ReceiveVerified(S3Client& client, const S3Location& location, const std::string& key,
                             const StoredFile& want, const fs::path& temp) {
  FileSink sink(temp, want.size);
  S3Request r;
  r.key = key;
  r.sink = &sink;
  auto response = client.Send(r);
  if (!response.ok() && absl::IsDataLoss(response.status())) {
    return Annotate(response.status(), location.DisplayKey(key));
  }
  if (!response.ok()) return response.status();
  if (!response->ok()) return client.ErrorFor(*response, "download", key);
  auto written = sink.Finish();
  if (!written.ok()) return written.status();
  auto recorded = RecordedSha256(*response);
  if (!recorded.ok()) return Annotate(recorded.status(), location.DisplayKey(key));
  StoredFile object = want;
  object.sha256 = *recorded;
  if (absl::Status s = CheckReceived(*written, object, location.DisplayKey(key),
                                     "the object changed after it was published");
      !s.ok()) {
    return s;
  }
  return CheckReceived(*written, want, location.DisplayKey(key),
                       "the object changed after it was published");
}

// Renames the verified `temp` to `final_path` and makes it durable: the
// file's record entry.
absl::StatusOr<S3CachedFile> Install(const fs::path& temp, const fs::path& final_path,
                                     const StoredFile& want) {
  if (::rename(temp.c_str(), final_path.c_str()) != 0)
    return ErrnoStatus(errno, "rename", final_path);
  if (absl::Status s = FsyncPath(final_path.parent_path()); !s.ok()) return s;
  struct stat st;
  if (::stat(final_path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", final_path);
  return S3CachedFile{want.size, want.sha256, MtimeNs(st)};
}

// Runs `receive` into a temporary sibling of `final_path`, then Install;
// the temporary file never outlives a failure.
absl::StatusOr<S3CachedFile> ReceiveIntoCache(
    const fs::path& final_path, const StoredFile& want,
    const std::function<absl::Status(const fs::path& temp)>& receive) {
  std::error_code dir_ec;
  fs::create_directories(final_path.parent_path(), dir_ec);
  if (dir_ec) return ErrnoStatus(dir_ec.value(), "create", final_path.parent_path());
  const fs::path temp = TempSiblingPath(final_path);
  const absl::Status received = receive(temp);
  absl::StatusOr<S3CachedFile> installed =
      received.ok() ? Install(temp, final_path, want) : absl::StatusOr<S3CachedFile>(received);
  if (!installed.ok()) {
    std::error_code ignored;
    fs::remove(temp, ignored);
  }
  return installed;
}

// One response from a peer as it arrives: a successful one's declared
// length is checked against the size the store records before any of its
// body is written, and its body goes to `sink`, which stops at that size.
struct PeerResponse {
  CURL* curl = nullptr;
  FileSink* sink = nullptr;
  uint64_t want_size = 0;
  absl::Status status;  // why the transfer was cut, when it was
};

size_t OnPeerHeader(char* data, size_t size, size_t count, void* user) {
  auto* response = static_cast<PeerResponse*>(user);
  const size_t n = size * count;
  // At the blank line that ends a response's header, curl has parsed its
  // status and Content-Length (-1: none, as for the chunked body a sidecar
  // streams).
  if (!absl::StripAsciiWhitespace(absl::string_view(data, n)).empty()) return n;
  long code = 0;
  curl_off_t declared = -1;
  curl_easy_getinfo(response->curl, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_getinfo(response->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &declared);
  if (code < 200 || code >= 300 || declared < 0 ||
      static_cast<uint64_t>(declared) == response->want_size) {
    return n;
  }
  response->status = WithKind(
      absl::DataLossError(absl::StrCat("declared a body of ", declared,
                                       " bytes but the store records ", response->want_size)),
      ErrorKind::kChecksumMismatch);
  return 0;
}

size_t OnPeerBody(char* data, size_t size, size_t count, void* user) {
  auto* response = static_cast<PeerResponse*>(user);
  response->status = response->sink->Write(std::string_view(data, size * count));
  return response->status.ok() ? size * count : 0;
}

}  // namespace

S3VersionCachePaths S3VersionCachePaths::For(const fs::path& cache_dir, const S3Location& location,
                                             int64_t version) {
  S3VersionCachePaths paths;
  paths.parent = cache_dir / "s3" / location.bucket;
  for (absl::string_view seg : absl::StrSplit(location.prefix, '/', absl::SkipEmpty())) {
    paths.parent /= std::string(seg);
  }
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

absl::StatusOr<UniqueFd> LockCacheVersion(const S3VersionCachePaths& paths) {
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

S3CacheRecord ReadS3CacheRecord(const fs::path& path) {
  S3CacheRecord out;
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
    out.files[std::string(name)] = S3CachedFile{static_cast<uint64_t>(size->as_int64()),
                                                std::string(sha->as_string()), mtime->as_int64()};
  }
  return out;
}

absl::Status WriteS3CacheRecord(const fs::path& path, const S3CacheRecord& record) {
  json::object files;
  for (const auto& [name, f] : record.files) {
    files[name] = json::object{
        {"size", static_cast<int64_t>(f.size)}, {"sha256", f.sha256}, {"mtime_ns", f.mtime_ns}};
  }
  return WriteFileAtomically(path, json::serialize(json::object{{"files", std::move(files)}}));
}

std::vector<size_t> StaleCacheFiles(const fs::path& target, const std::vector<StoredFile>& stored,
                                    const S3CacheRecord& record) {
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

absl::StatusOr<S3CachedFile> DownloadToCache(S3Client& client, const S3Location& location,
                                             const std::string& key, const StoredFile& want,
                                             const fs::path& final_path) {
  return ReceiveIntoCache(final_path, want, [&](const fs::path& temp) {
    return ReceiveVerified(client, location, key, want, temp);
  });
}

std::chrono::milliseconds PeerTransferDeadline(const StorePeers& peers, uint64_t size,
                                               int64_t wait_ms) {
  // Capped at a year, far beyond any transfer, so that nothing overflows
  // (nor curl's long).
  constexpr double kCapMs = 365.0 * 24 * 3600 * 1000;
  const double at_rate_ms = std::ceil(1000.0 * static_cast<double>(size) /
                                      static_cast<double>(std::max<uint64_t>(1, peers.min_rate)));
  const double total_ms = at_rate_ms + static_cast<double>(std::max<int64_t>(0, wait_ms)) +
                          static_cast<double>(std::max<int64_t>(0, peers.connect_timeout.count())) +
                          static_cast<double>(std::max<int64_t>(0, peers.allowance.count()));
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(total_ms, kCapMs)));
}

absl::StatusOr<S3CachedFile> FetchFromPeerToCache(const StorePeers& peers,
                                                  const std::string& peer_url, int64_t version,
                                                  const StoredFile& want,
                                                  const fs::path& final_path, int64_t wait_ms) {
  CurlEasy curl = NewCurlEasy();
  if (!curl) return absl::ResourceExhaustedError("cannot create a curl handle");
  CURL* c = curl.get();
  char* escaped = curl_easy_escape(c, want.name.c_str(), static_cast<int>(want.name.size()));
  const std::string url =
      absl::StrCat(peer_url, AbslView(kPeerFileRoute), "?version=", version,
                   "&name=", escaped != nullptr ? escaped : "", wait_ms > 0 ? "&wait_ms=" : "",
                   wait_ms > 0 ? absl::StrCat(wait_ms) : std::string());
  curl_free(escaped);
  const std::string source = absl::StrCat("peer ", url);
  const std::chrono::milliseconds deadline = PeerTransferDeadline(peers, want.size, wait_ms);
  return ReceiveIntoCache(final_path, want, [&](const fs::path& temp) -> absl::Status {
    FileSink sink(temp, want.size);
    if (absl::Status s = sink.Restart(); !s.ok()) return s;
    PeerResponse out{c, &sink, want.size, absl::OkStatus()};
    CurlSlist headers;
    if (!peers.token.empty()) {
      const std::string auth = absl::StrCat("Authorization: Bearer ", peers.token);
      headers.reset(curl_slist_append(headers.release(), auth.c_str()));
    }
    if (!peers.self_id.empty()) {
      const std::string self = absl::StrCat(AbslView(kPeerIdHeader), ": ", peers.self_id);
      headers.reset(curl_slist_append(headers.release(), self.c_str()));
    }
    char error[CURL_ERROR_SIZE] = {};
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::max<int64_t>(1, peers.connect_timeout.count())));
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(
        c, CURLOPT_LOW_SPEED_TIME,
        static_cast<long>(std::max<int64_t>(
            1, std::chrono::duration_cast<std::chrono::seconds>(peers.stall_timeout).count() +
                   wait_ms / 1000)));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(deadline.count()));
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnPeerHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &out);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnPeerBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &out);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    const CURLcode code = curl_easy_perform(c);
    if (!out.status.ok()) return Annotate(out.status, source);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    if (code == CURLE_HTTP_RETURNED_ERROR && status == 404) {
      return absl::NotFoundError(absl::StrCat(source, ": the peer does not hold it"));
    }
    if (code == CURLE_HTTP_RETURNED_ERROR && status == 409) {
      return absl::FailedPreconditionError(absl::StrCat(source, ": that is this replica"));
    }
    if (code == CURLE_OPERATION_TIMEDOUT) {
      return absl::UnavailableError(
          absl::StrCat(source, ": ", error[0] != '\0' ? error : curl_easy_strerror(code),
                       "; a peer has ", deadline.count(), " ms for this ", want.size,
                       "-byte file (--peer-min-rate, --peer-allowance) and must not stall"));
    }
    if (code != CURLE_OK) {
      return absl::UnavailableError(
          absl::StrCat(source, ": ", error[0] != '\0' ? error : curl_easy_strerror(code)));
    }
    auto written = sink.Finish();
    if (!written.ok()) return written.status();
    return CheckReceived(*written, want, source, "the peer's copy is not the published file");
  });
}

}  // namespace stitch
