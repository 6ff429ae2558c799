#include "stitch/store/s3_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cerrno>
#include <map>
#include <set>
#include <span>
#include <system_error>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/format/fileio.h"
#include "stitch/format/index.h"
#include "stitch/store/pointer_cas.h"
#include "stitch/store/s3_sha256.h"
#include "stitch/store/s3_xml.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace json = boost::json;
namespace {

constexpr std::string_view kPointerKey = "latest";
constexpr std::string_view kReceiptsDir = ".receipts";
constexpr uint64_t kMinPartSize = uint64_t{5} << 20;
constexpr uint64_t kMaxParts = 10000;

std::string Quoted(std::string_view name) {
  return absl::StrCat("\"", absl::CEscape(AbslView(name)), "\"");
}

// Holds an exclusive flock until destroyed (one per open file description,
// so it excludes other threads of this process too).
absl::StatusOr<UniqueFd> LockExclusive(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return ErrnoStatus(errno, "open", path);
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoStatus(errno, "lock", path);
  }
  return fd;
}

// SHA-256 of `length` bytes of `fd` from `offset`, fed to `whole` as well.
absl::StatusOr<std::string> HashRange(int fd, const fs::path& path, uint64_t offset,
                                      uint64_t length, Sha256& whole) {
  Sha256 part;
  std::vector<char> buffer(1 << 20);
  while (length > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), length));
    ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read", path);
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("read ", path.string(), ": the file shrank while being hashed"));
    }
    std::string_view bytes(buffer.data(), static_cast<size_t>(n));
    part.Update(bytes);
    whole.Update(bytes);
    offset += static_cast<uint64_t>(n);
    length -= static_cast<uint64_t>(n);
  }
  return part.FinishHex();
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// A download into a temporary file, hashed as it arrives.
class FileSink final : public S3BodySink {
 public:
  explicit FileSink(fs::path path) : path_(std::move(path)) {}

  absl::Status Restart() override {
    fd_ = UniqueFd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd_) return ErrnoStatus(errno, "create", path_);
    hasher_ = Sha256();
    size_ = 0;
    return absl::OkStatus();
  }

  absl::Status Write(std::string_view bytes) override {
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
  UniqueFd fd_;
  Sha256 hasher_;
  uint64_t size_ = 0;
};

// The cache's record of what it downloaded for one version: per file, the
// size and SHA-256 the store recorded and the local file's mtime when it
// was written, so an unchanged file is never downloaded or hashed again.
struct CachedFile {
  uint64_t size = 0;
  std::string sha256;
  int64_t mtime_ns = 0;
};
using CacheRecord = std::map<std::string, CachedFile>;

CacheRecord ReadCacheRecord(const fs::path& path) {
  CacheRecord out;
  auto text = ReadFileToString(path);
  if (!text.ok()) return out;
  // A damaged record only costs downloads: treat it as empty.
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
    out[std::string(name)] = CachedFile{static_cast<uint64_t>(size->as_int64()),
                                        std::string(sha->as_string()), mtime->as_int64()};
  }
  return out;
}

std::string CacheRecordJson(const CacheRecord& record) {
  json::object files;
  for (const auto& [name, f] : record) {
    files[name] = json::object{
        {"size", static_cast<int64_t>(f.size)}, {"sha256", f.sha256}, {"mtime_ns", f.mtime_ns}};
  }
  return json::serialize(json::object{{"files", std::move(files)}});
}

bool ValidHostName(std::string_view host) {
  if (host.empty() || host.size() > 64 || host.front() == '.') return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

}  // namespace

struct S3Store::Upload {
  int64_t version = 0;
  std::string name;  // inside the version directory
  std::string key;
  std::optional<fs::path> path;  // the source file, or
  std::string bytes;             // the content itself (index, receipts)
  std::string content_type = "application/octet-stream";
  uint64_t size = 0;
  std::string sha256;
  // Multipart uploads only: the part size and each part's SHA-256, hashed
  // in the same pass as `sha256` so that the parts S3 accepts (it checks
  // each signed payload hash) are the bytes `sha256` describes.
  uint64_t part_size = 0;
  std::vector<std::string> part_sha256;
  bool needed = false;  // absent from the store
};

S3Store::S3Store(S3Location location, std::string run_id, fs::path cache_dir,
                 std::unique_ptr<S3Client> client, S3StoreOptions options)
    : location_(std::move(location)),
      run_id_(std::move(run_id)),
      cache_dir_(std::move(cache_dir)),
      client_(std::move(client)),
      options_(std::move(options)),
      where_(absl::StrCat("store ", location_.Display())) {}

absl::StatusOr<std::unique_ptr<S3Store>> S3Store::Open(std::string_view uri,
                                                       const StoreOptions& options,
                                                       const S3Environment& env,
                                                       S3StoreOptions s3) {
  if (!options.run_id.empty()) {
    if (absl::Status s = ValidateRunId(options.run_id); !s.ok()) return s;
  }
  if (s3.part_size < kMinPartSize) {
    return absl::InvalidArgumentError("S3 store: part_size must be at least 5 MiB");
  }
  if (s3.parallelism < 1 || s3.list_page_size < 1 || s3.list_page_size > 1000) {
    return absl::InvalidArgumentError(
        "S3 store: parallelism must be positive and list_page_size in 1..1000");
  }
  auto location = ParseS3Uri(uri, env);
  if (!location.ok()) return location.status();
  fs::path cache_dir;
  if (!options.cache_dir.empty()) {
    std::error_code ec;
    cache_dir = fs::absolute(options.cache_dir, ec).lexically_normal();
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("cache directory ", options.cache_dir.string(),
                                                     ": cannot make it absolute: ", ec.message()));
    }
  }
  auto client = S3Client::Create(*location, env, s3.client);
  if (!client.ok()) return client.status();
  return std::unique_ptr<S3Store>(new S3Store(*std::move(location), options.run_id,
                                              std::move(cache_dir), *std::move(client),
                                              std::move(s3)));
}

std::string S3Store::VersionKey(int64_t version, std::string_view name) const {
  return location_.Key(absl::StrCat("updates/", VersionDirName(version), "/", AbslView(name)));
}

absl::Status S3Store::RequireRunId(std::string_view action) const {
  if (!run_id_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(where_, ": opened without a run id, so it cannot ",
                                                 AbslView(action), "; open it with one"));
}

absl::Status S3Store::ParallelFor(size_t n, const std::function<absl::Status(size_t)>& fn) {
  size_t workers = std::min<size_t>(n, static_cast<size_t>(options_.parallelism));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) {
      if (absl::Status s = fn(i); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first;
  auto work = [&] {
    while (!failed.load()) {
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      absl::Status s = fn(i);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = std::move(s);
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (size_t w = 0; w < workers; ++w) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  return first;
}

absl::Status S3Store::Refresh() { return absl::OkStatus(); }

absl::StatusOr<std::optional<S3ObjectInfo>> S3Store::Head(const std::string& key) {
  S3Request r;
  r.method = "HEAD";
  r.key = key;
  r.headers = {{"x-amz-checksum-mode", "ENABLED"}};
  auto response = client_->Send(r);
  if (!response.ok()) return response.status();
  if (response->status == 404) return std::nullopt;
  if (!response->ok()) return client_->ErrorFor(*response, "inspect", key);
  auto info = S3ObjectInfo::FromResponse(*response);
  if (!info.ok()) return Annotate(info.status(), location_.DisplayKey(key));
  return std::optional<S3ObjectInfo>(*std::move(info));
}

// ---- Pointer ----

absl::StatusOr<S3Store::PointerRead> S3Store::ReadPointerWithEtag() {
  const std::string key = location_.Key(kPointerKey);
  S3Request r;
  r.key = key;
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->status == 404 && response->ErrorCode() != "NoSuchBucket") return PointerRead{};
  if (!response->ok())
    return Annotate(client_->ErrorFor(*response, "read the pointer", key), where_);
  auto pointer = ParsePointerText(where_, response->body);
  if (!pointer.ok()) return pointer.status();
  return PointerRead{*std::move(pointer), response->Header("etag")};
}

absl::StatusOr<std::optional<VersionRef>> S3Store::ReadPointer() {
  auto read = ReadPointerWithEtag();
  if (!read.ok()) return read.status();
  return std::move(read->pointer);
}

absl::Status S3Store::AdvancePointer(const std::optional<VersionRef>& expected,
                                     const VersionRef& proposed) {
  auto read = ReadPointerWithEtag();
  if (!read.ok()) return read.status();
  if (absl::Status s = CheckCompareAndSwap(where_, run_id_, expected, read->pointer, proposed);
      !s.ok()) {
    return s;
  }
  const std::string key = location_.Key(kPointerKey);
  S3Request r;
  r.method = "PUT";
  r.key = key;
  r.body = proposed.ToString();
  r.headers = {{"Content-Type", "text/plain"}};
  if (read->pointer.has_value()) {
    if (read->etag.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where_, ": the service sent no ETag for ", location_.DisplayKey(key),
          ", so the pointer cannot be moved with a compare-and-swap; use an S3 service that "
          "supports conditional writes"));
    }
    r.headers.emplace_back("If-Match", read->etag);
  } else {
    r.headers.emplace_back("If-None-Match", "*");
  }
  if (before_pointer_write_) before_pointer_write_();
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->ok()) return absl::OkStatus();
  // 412: the condition failed; 409: S3's ConditionalRequestConflict for a
  // concurrent conditional write; 404: the pointer we matched against was
  // deleted. Each means someone else moved it: report what is there now.
  if (response->status == 412 || response->status == 409 ||
      (response->status == 404 && read->pointer.has_value() &&
       response->ErrorCode() != "NoSuchBucket")) {
    auto again = ReadPointerWithEtag();
    if (!again.ok()) return again.status();
    return PointerConflict(where_, expected, again->pointer, proposed);
  }
  return Annotate(client_->ErrorFor(*response, "write the pointer", key), where_);
}

// ---- Uploads ----

absl::Status S3Store::CompareExisting(const Upload& u, const S3ObjectInfo& info) {
  if (info.size == u.size && info.sha256 == u.sha256) return absl::OkStatus();
  std::string why = info.sha256.empty() ? "records no sha256 (it was not written by stitch)"
                    : info.size != u.size
                        ? absl::StrCat("holds ", info.size, " bytes instead of ", u.size)
                        : "holds different bytes";
  return absl::AlreadyExistsError(absl::StrCat(where_, ": version ", VersionDirName(u.version),
                                               " already exists and its ", Quoted(u.name), " ", why,
                                               "; versions are immutable"));
}

absl::Status S3Store::PutSingle(Upload& u) {
  S3Request r;
  r.method = "PUT";
  r.key = u.key;
  r.headers = {{"Content-Type", u.content_type},
               {"If-None-Match", "*"},
               {S3Response::MetaHeader(kSha256MetadataKey), u.sha256},
               {S3Response::MetaHeader(kLegacySha256MetadataKey), u.sha256},
               {"x-amz-sdk-checksum-algorithm", "SHA256"},
               {"x-amz-checksum-sha256", Sha256HexToBase64(u.sha256)}};
  if (u.path) {
    r.body_file = *u.path;
    r.body_size = u.size;
  } else {
    r.body = u.bytes;
  }
  r.payload_sha256 = u.sha256;
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->ok()) {
    if (u.path) uploaded_.fetch_add(1);
    return absl::OkStatus();
  }
  if (response->status == 412) {
    // Another publisher wrote this object first: fine if it holds our bytes.
    auto info = Head(u.key);
    if (!info.ok()) return Annotate(info.status(), where_);
    if (!*info) {
      return absl::AbortedError(absl::StrCat(where_, ": ", location_.DisplayKey(u.key),
                                             " changed concurrently while uploading; retry"));
    }
    return CompareExisting(u, **info);
  }
  return Annotate(client_->ErrorFor(*response, "upload", u.key), where_);
}

absl::Status S3Store::PutMultipart(Upload& u) {
  S3Request init;
  init.method = "POST";
  init.key = u.key;
  init.query = {{"uploads", ""}};
  init.headers = {{"Content-Type", u.content_type},
                  {S3Response::MetaHeader(kSha256MetadataKey), u.sha256},
                  {S3Response::MetaHeader(kLegacySha256MetadataKey), u.sha256}};
  auto started = client_->Send(init);
  if (!started.ok()) return Annotate(started.status(), where_);
  if (!started->ok())
    return Annotate(client_->ErrorFor(*started, "start uploading", u.key), where_);
  auto upload_id = ParseInitiateMultipartUpload(started->body);
  if (!upload_id.ok()) {
    return Annotate(upload_id.status(),
                    absl::StrCat(where_, ": start uploading ", location_.DisplayKey(u.key)));
  }
  auto abort_upload = [&] {
    S3Request r;
    r.method = "DELETE";
    r.key = u.key;
    r.query = {{"uploadId", *upload_id}};
    // Best effort: an abandoned upload only costs storage until the
    // bucket's lifecycle rules clean it up.
    (void)client_->Send(r);
  };

  const size_t parts = u.part_sha256.size();
  std::vector<std::string> etags(parts);
  absl::Status status = ParallelFor(parts, [&](size_t i) -> absl::Status {
    uint64_t offset = static_cast<uint64_t>(i) * u.part_size;
    S3Request r;
    r.method = "PUT";
    r.key = u.key;
    r.query = {{"partNumber", absl::StrCat(i + 1)}, {"uploadId", *upload_id}};
    r.body_file = *u.path;
    r.body_offset = offset;
    r.body_size = std::min(u.part_size, u.size - offset);
    r.payload_sha256 = u.part_sha256[i];
    auto response = client_->Send(r);
    if (!response.ok()) return response.status();
    if (!response->ok()) {
      return client_->ErrorFor(*response, absl::StrCat("upload part ", i + 1, " of"), u.key);
    }
    etags[i] = response->Header("etag");
    if (etags[i].empty()) {
      return absl::DataLossError(absl::StrCat("upload part ", i + 1, " of ",
                                              location_.DisplayKey(u.key),
                                              ": the service returned no ETag"));
    }
    return absl::OkStatus();
  });
  if (!status.ok()) {
    abort_upload();
    return Annotate(status, where_);
  }

  S3Request complete;
  complete.method = "POST";
  complete.key = u.key;
  complete.query = {{"uploadId", *upload_id}};
  complete.headers = {{"Content-Type", "application/xml"}, {"If-None-Match", "*"}};
  complete.body = CompleteMultipartUploadXml(etags);
  auto done = client_->Send(complete);
  if (!done.ok()) {
    abort_upload();
    return Annotate(done.status(), where_);
  }
  if (done->status == 412) {
    abort_upload();
    auto info = Head(u.key);
    if (!info.ok()) return Annotate(info.status(), where_);
    if (!*info) {
      return absl::AbortedError(absl::StrCat(where_, ": ", location_.DisplayKey(u.key),
                                             " changed concurrently while uploading; retry"));
    }
    return CompareExisting(u, **info);
  }
  // S3 may answer 200 and still report an error in the body.
  if (!done->ok() || !done->ErrorCode().empty()) {
    abort_upload();
    S3Response as_error = *done;
    if (as_error.ok()) as_error.status = 500;
    return Annotate(client_->ErrorFor(as_error, "finish uploading", u.key), where_);
  }
  uploaded_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status S3Store::VerifyUploaded(const std::vector<Upload>& uploads) {
  return ParallelFor(uploads.size(), [&](size_t i) -> absl::Status {
    const Upload& u = uploads[i];
    auto info = Head(u.key);
    if (!info.ok()) return Annotate(info.status(), where_);
    auto changed = [&](std::string_view why) {
      return WithKind(absl::DataLossError(absl::StrCat(
                          where_, ": ", location_.DisplayKey(u.key), " ", AbslView(why),
                          " after it was uploaded; something else writes to this prefix")),
                      ErrorKind::kChecksumMismatch);
    };
    if (!*info) return changed("disappeared");
    if ((*info)->size != u.size) {
      return changed(absl::StrCat("holds ", (*info)->size, " bytes instead of ", u.size));
    }
    if ((*info)->sha256 != u.sha256) {
      return changed(absl::StrCat("records sha256 ",
                                  (*info)->sha256.empty() ? "<none>" : (*info)->sha256,
                                  " instead of ", u.sha256));
    }
    // A full-object checksum S3 computed itself (multipart ones end in
    // "-<parts>" and describe the parts, not the object).
    const std::string& server = (*info)->checksum_sha256;
    if (!server.empty() && !absl::StrContains(server, '-') &&
        server != Sha256HexToBase64(u.sha256)) {
      return changed(
          absl::StrCat("has S3 checksum ", server, " instead of ", Sha256HexToBase64(u.sha256)));
    }
    return absl::OkStatus();
  });
}

absl::Status S3Store::UploadAll(std::vector<Upload>& uploads) {
  // Every object is looked at, so that a refusal names the first file (in
  // the caller's order) that differs, whichever HEAD answered first.
  std::vector<absl::Status> existing(uploads.size());
  absl::Status status = ParallelFor(uploads.size(), [&](size_t i) -> absl::Status {
    Upload& u = uploads[i];
    auto info = Head(u.key);
    if (!info.ok()) return Annotate(info.status(), where_);
    if (!*info) {
      u.needed = true;
    } else {
      existing[i] = CompareExisting(u, **info);
    }
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  for (const absl::Status& s : existing) {
    if (!s.ok()) return s;
  }
  std::vector<size_t> single;
  std::vector<size_t> multipart;
  for (size_t i = 0; i < uploads.size(); ++i) {
    if (!uploads[i].needed) continue;
    (uploads[i].part_sha256.empty() ? single : multipart).push_back(i);
  }
  status = ParallelFor(single.size(), [&](size_t i) { return PutSingle(uploads[single[i]]); });
  if (!status.ok()) return status;
  // Each large file's parts already use every transfer slot.
  for (size_t i : multipart) {
    if (absl::Status s = PutMultipart(uploads[i]); !s.ok()) return s;
  }
  return VerifyUploaded(uploads);
}

absl::StatusOr<std::vector<StoredFile>> S3Store::UploadVersionFiles(
    int64_t version, const fs::path& dir, const std::vector<std::string>& files) {
  if (absl::Status s = RequireRunId("publish"); !s.ok()) return s;
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  std::vector<Upload> uploads(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& name = files[i];
    if (absl::Status s = ValidatePayloadFileName(name); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
    }
    if (name == kIndexFileName ||
        absl::StartsWith(name, absl::StrCat(AbslView(kReceiptsDir), "/"))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, ": ", Quoted(name), " is not a payload file name"));
    }
    if (absl::Status s = CheckPlainFile(dir, name); !s.ok()) return Annotate(s, where_);
    uploads[i].version = version;
    uploads[i].name = name;
    uploads[i].key = VersionKey(version, name);
    uploads[i].path = dir / name;
  }
  // Hash every file (the parts of large ones in the same pass) before
  // sending anything: the metadata names the hash up front.
  absl::Status hashed = ParallelFor(uploads.size(), [&](size_t i) -> absl::Status {
    Upload& u = uploads[i];
    UniqueFd fd(::open(u.path->c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus(errno, "open", *u.path);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", *u.path);
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(u.path->string(), " is not a regular file"));
    }
    u.size = static_cast<uint64_t>(st.st_size);
    Sha256 whole;
    if (u.size >= options_.multipart_threshold && u.size > 0) {
      u.part_size = std::max(options_.part_size, (u.size + kMaxParts - 1) / kMaxParts);
      for (uint64_t offset = 0; offset < u.size; offset += u.part_size) {
        auto part =
            HashRange(fd.get(), *u.path, offset, std::min(u.part_size, u.size - offset), whole);
        if (!part.ok()) return part.status();
        u.part_sha256.push_back(*std::move(part));
      }
    } else {
      auto all = HashRange(fd.get(), *u.path, 0, u.size, whole);
      if (!all.ok()) return all.status();
    }
    u.sha256 = whole.FinishHex();
    return absl::OkStatus();
  });
  if (!hashed.ok()) return Annotate(hashed, where_);
  if (absl::Status s = UploadAll(uploads); !s.ok()) return s;
  std::vector<StoredFile> out;
  out.reserve(uploads.size());
  for (const Upload& u : uploads) out.push_back(StoredFile{u.name, u.size, u.sha256});
  return out;
}

absl::Status S3Store::PublishIndex(int64_t version, std::string_view index_json) {
  if (absl::Status s = RequireRunId("publish"); !s.ok()) return s;
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": the index of ", VersionDirName(version), " ", why));
  };
  auto index = CheckpointIndex::Parse(index_json);
  if (!index.ok()) return bad(index.status().message());
  auto manifest = index->ToManifest();
  if (!manifest.ok()) return bad(manifest.status().message());
  if (manifest->version != version) {
    return bad(absl::StrCat("records metadata.version ", manifest->version));
  }
  std::vector<Upload> uploads(1);
  Upload& u = uploads[0];
  u.version = version;
  u.name = std::string(kIndexFileName);
  u.key = VersionKey(version, kIndexFileName);
  u.bytes = std::string(index_json);
  u.content_type = "application/json";
  u.size = u.bytes.size();
  u.sha256 = Sha256Hex(u.bytes);
  return UploadAll(uploads);
}

absl::Status S3Store::PublishFiles(int64_t version, const fs::path& dir) {
  if (absl::Status s = RequireRunId("publish"); !s.ok()) return s;
  auto contents = ReadVersionDir(dir, version);
  if (!contents.ok()) return Annotate(contents.status(), where_);
  // An existing version must hold exactly these files, as in FsStore.
  auto index_info = Head(VersionKey(version, kIndexFileName));
  if (!index_info.ok()) return Annotate(index_info.status(), where_);
  if (*index_info) {
    auto present = ListVersionFiles(version);
    if (!present.ok()) return present.status();
    const std::vector<std::string> stored = contents->StoredFiles();
    std::set<std::string> wanted(stored.begin(), stored.end());
    wanted.insert(std::string(kIndexFileName));
    std::set<std::string> have(present->begin(), present->end());
    if (have != wanted) {
      std::vector<std::string> diff;
      std::set_symmetric_difference(have.begin(), have.end(), wanted.begin(), wanted.end(),
                                    std::back_inserter(diff));
      return absl::AlreadyExistsError(absl::StrCat(
          where_, ": version ", VersionDirName(version),
          " already exists and holds a different set of files (",
          absl::StrJoin(
              diff, ", ",
              [](std::string* out, const std::string& s) { absl::StrAppend(out, Quoted(s)); }),
          "); versions are immutable"));
    }
  }
  auto stored = UploadVersionFiles(version, dir, contents->StoredFiles());
  if (!stored.ok()) return stored.status();
  return PublishIndex(version, contents->index_json);
}

absl::StatusOr<std::vector<StoredFile>> S3Store::StatVersionFiles(
    int64_t version, const std::vector<std::string>& files) {
  std::vector<StoredFile> out(files.size());
  absl::Status status = ParallelFor(files.size(), [&](size_t i) -> absl::Status {
    const std::string key = VersionKey(version, files[i]);
    auto info = Head(key);
    if (!info.ok()) return Annotate(info.status(), where_);
    if (!*info) {
      return absl::NotFoundError(absl::StrCat(where_, ": version ", VersionDirName(version),
                                              " has no ", Quoted(files[i]), " (",
                                              location_.DisplayKey(key), " does not exist)"));
    }
    if ((*info)->sha256.empty() || !IsSha256Hex((*info)->sha256)) {
      return absl::DataLossError(absl::StrCat(where_, ": ", location_.DisplayKey(key),
                                              " records no valid sha256; it was not written by "
                                              "stitch: republish the version"));
    }
    out[i] = StoredFile{files[i], (*info)->size, (*info)->sha256};
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<std::string>> S3Store::ListVersionFiles(int64_t version) {
  const std::string prefix = VersionKey(version, "");
  std::vector<std::string> out;
  std::string token;
  while (true) {
    S3Request r;
    r.key = "";
    r.query = {{"list-type", "2"},
               {"prefix", prefix},
               {"max-keys", absl::StrCat(options_.list_page_size)}};
    if (!token.empty()) r.query.emplace_back("continuation-token", token);
    auto response = client_->Send(r);
    if (!response.ok()) return Annotate(response.status(), where_);
    if (!response->ok()) {
      return Annotate(client_->ErrorFor(*response, "list", prefix), where_);
    }
    auto page = ParseListObjectsV2(response->body);
    if (!page.ok()) return Annotate(page.status(), absl::StrCat(where_, ": list ", prefix));
    for (const S3ObjectSummary& object : page->objects) {
      if (!absl::StartsWith(object.key, prefix)) continue;
      std::string name = object.key.substr(prefix.size());
      // Receipts, and anything else under a name starting with '.', are not
      // part of the version (version_dir.h).
      if (name.empty() || IsHiddenVersionPath(name)) continue;
      out.push_back(std::move(name));
    }
    if (!page->truncated) break;
    token = page->next_continuation_token;
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status S3Store::PutReceipt(int64_t version, std::string_view host, std::string_view json) {
  if (absl::Status s = RequireRunId("publish"); !s.ok()) return s;
  if (!ValidHostName(host)) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": receipt host name ", Quoted(host),
                                                   " must be 1-64 characters of [A-Za-z0-9._-]"));
  }
  S3Request r;
  r.method = "PUT";
  r.key = VersionKey(version, absl::StrCat(AbslView(kReceiptsDir), "/", AbslView(host), ".json"));
  r.body = std::string(json);
  std::string sha = Sha256Hex(r.body);
  r.payload_sha256 = sha;
  r.headers = {{"Content-Type", "application/json"},
               {S3Response::MetaHeader(kSha256MetadataKey), sha},
               {S3Response::MetaHeader(kLegacySha256MetadataKey), sha}};
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (!response->ok())
    return Annotate(client_->ErrorFor(*response, "write receipt", r.key), where_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Store::GetReceipt(int64_t version, std::string_view host) {
  if (!ValidHostName(host)) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": receipt host name ", Quoted(host),
                                                   " must be 1-64 characters of [A-Za-z0-9._-]"));
  }
  return GetVerified(
      VersionKey(version, absl::StrCat(AbslView(kReceiptsDir), "/", AbslView(host), ".json")),
      "receipt");
}

// ---- Reads ----

absl::StatusOr<std::string> S3Store::GetVerified(const std::string& key, std::string_view what) {
  S3Request r;
  r.key = key;
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->status == 404 && response->ErrorCode() != "NoSuchBucket") {
    return absl::NotFoundError(absl::StrCat(where_, ": ", AbslView(what), " ",
                                            location_.DisplayKey(key), " does not exist"));
  }
  if (!response->ok()) {
    return Annotate(client_->ErrorFor(*response, absl::StrCat("read ", AbslView(what)), key),
                    where_);
  }
  auto recorded_or = RecordedSha256(*response);
  if (!recorded_or.ok()) {
    return Annotate(recorded_or.status(), absl::StrCat(where_, ": ", location_.DisplayKey(key)));
  }
  const std::string& recorded = *recorded_or;
  if (!IsSha256Hex(recorded)) {
    return absl::DataLossError(absl::StrCat(where_, ": ", location_.DisplayKey(key),
                                            " records no valid sha256; it was not written by "
                                            "stitch: republish the version"));
  }
  std::string actual = Sha256Hex(response->body);
  if (actual != recorded) {
    return WithKind(
        absl::DataLossError(absl::StrCat(where_, ": ", location_.DisplayKey(key), " hashes to ",
                                         actual, " but records sha256 ", recorded,
                                         "; the object changed after it was published")),
        ErrorKind::kChecksumMismatch);
  }
  return std::move(response->body);
}

namespace {}  // namespace

absl::StatusOr<VersionManifest> S3Store::ReadManifest(int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  auto text = GetVerified(VersionKey(version, kIndexFileName), "index");
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(
          absl::StrCat(where_, ": version ", VersionDirName(version), " is not published"));
    }
    return text.status();
  }
  return ManifestFromIndex(where_, version, *text);
}

absl::StatusOr<fs::path> S3Store::Materialize(int64_t version) {
  if (cache_dir_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where_,
        ": no cache directory to materialize into; pass --cache-dir (StoreOptions.cache_dir)"));
  }
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  auto index_text = GetVerified(VersionKey(version, kIndexFileName), "index");
  if (!index_text.ok()) {
    if (absl::IsNotFound(index_text.status())) {
      return absl::NotFoundError(
          absl::StrCat(where_, ": version ", VersionDirName(version), " is not published"));
    }
    return index_text.status();
  }
  auto manifest = ManifestFromIndex(where_, version, *index_text);
  if (!manifest.ok()) return manifest.status();
  // The payload, and the version's other files (config, tokenizer), which
  // an engine loading the directory needs too.
  auto listed = ListVersionFiles(version);
  if (!listed.ok()) return listed.status();
  std::vector<std::string> files = manifest->files;
  {
    const std::set<std::string> payload(files.begin(), files.end());
    for (const std::string& name : *listed) {
      if (name != kIndexFileName && !payload.contains(name)) files.push_back(name);
    }
  }

  fs::path parent = cache_dir_ / "s3" / location_.bucket;
  for (absl::string_view seg : absl::StrSplit(location_.prefix, '/', absl::SkipEmpty())) {
    parent /= std::string(seg);
  }
  const std::string dir_name = VersionDirName(version);
  const fs::path target = parent / dir_name;
  // Every name must stay inside the version directory, whatever the index
  // (already validated when parsed) says.
  for (const std::string& name : files) {
    fs::path rel = (target / name).lexically_normal().lexically_relative(target);
    if (absl::Status s = ValidatePayloadFileName(name);
        !s.ok() || rel.empty() || *rel.begin() == "..") {
      return absl::DataLossError(absl::StrCat(where_, ": version ", dir_name, " names file ",
                                              Quoted(name),
                                              ", which would escape the cache directory"));
    }
  }
  std::error_code ec;
  fs::create_directories(target, ec);
  if (ec) return Annotate(ErrnoStatus(ec.value(), "create", target), where_);
  auto lock = LockExclusive(parent / absl::StrCat(".", dir_name, ".lock"));
  if (!lock.ok()) return Annotate(lock.status(), where_);

  auto stored = StatVersionFiles(version, files);
  if (!stored.ok()) {
    if (absl::IsNotFound(stored.status())) {
      return absl::DataLossError(
          absl::StrCat(stored.status().message(), "; the published version is incomplete"));
    }
    return stored.status();
  }
  const fs::path record_path = parent / absl::StrCat(".", dir_name, ".files.json");
  CacheRecord record = ReadCacheRecord(record_path);
  std::vector<size_t> missing;
  for (size_t i = 0; i < stored->size(); ++i) {
    const StoredFile& want = (*stored)[i];
    auto it = record.find(want.name);
    struct stat st;
    bool fresh =
        it != record.end() && it->second.size == want.size && it->second.sha256 == want.sha256 &&
        ::stat((target / want.name).c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        static_cast<uint64_t>(st.st_size) == want.size && MtimeNs(st) == it->second.mtime_ns;
    if (!fresh) missing.push_back(i);
  }

  absl::Mutex record_mu;
  absl::Status status = ParallelFor(missing.size(), [&](size_t m) -> absl::Status {
    const StoredFile& want = (*stored)[missing[m]];
    const std::string key = VersionKey(version, want.name);
    fs::path final_path = target / want.name;
    std::error_code dir_ec;
    fs::create_directories(final_path.parent_path(), dir_ec);
    if (dir_ec) return ErrnoStatus(dir_ec.value(), "create", final_path.parent_path());
    fs::path temp = TempSiblingPath(final_path);
    FileSink sink(temp);
    S3Request r;
    r.key = key;
    r.sink = &sink;
    auto response = client_->Send(r);
    auto cleanup = [&] {
      std::error_code ignored;
      fs::remove(temp, ignored);
    };
    if (!response.ok()) {
      cleanup();
      return response.status();
    }
    if (!response->ok()) {
      cleanup();
      return client_->ErrorFor(*response, "download", key);
    }
    auto written = sink.Finish();
    if (!written.ok()) {
      cleanup();
      return written.status();
    }
    auto recorded = RecordedSha256(*response);
    if (!recorded.ok()) {
      cleanup();
      return Annotate(recorded.status(), location_.DisplayKey(key));
    }
    if (written->sha256 != *recorded || written->sha256 != want.sha256 ||
        written->size != want.size) {
      cleanup();
      return WithKind(
          absl::DataLossError(absl::StrCat(
              location_.DisplayKey(key), ": downloaded ", written->size, " bytes hashing to ",
              written->sha256, " but the object records ", want.size, " bytes with sha256 ",
              want.sha256, "; the object changed after it was published")),
          ErrorKind::kChecksumMismatch);
    }
    if (::rename(temp.c_str(), final_path.c_str()) != 0) {
      int e = errno;
      cleanup();
      return ErrnoStatus(e, "rename", final_path);
    }
    if (absl::Status s = FsyncPath(final_path.parent_path()); !s.ok()) return s;
    struct stat st;
    if (::stat(final_path.c_str(), &st) != 0) return ErrnoStatus(errno, "stat", final_path);
    downloaded_.fetch_add(1);
    absl::MutexLock guard(&record_mu);
    record[want.name] = CachedFile{want.size, want.sha256, MtimeNs(st)};
    return absl::OkStatus();
  });
  if (!status.ok()) {
    // Keep what did arrive: the next attempt downloads only the rest.
    (void)WriteFileAtomically(record_path, CacheRecordJson(record));
    return Annotate(status, where_);
  }
  const fs::path index_path = target / kIndexFileName;
  auto on_disk = ReadFileToString(index_path);
  if (!on_disk.ok() || *on_disk != *index_text) {
    if (absl::Status s = WriteFileAtomically(index_path, *index_text); !s.ok()) {
      return Annotate(s, where_);
    }
  }
  if (!missing.empty()) {
    if (absl::Status s = WriteFileAtomically(record_path, CacheRecordJson(record)); !s.ok()) {
      return Annotate(s, where_);
    }
    for (const fs::path& dir : {target, parent}) {
      if (absl::Status s = FsyncPath(dir); !s.ok()) return Annotate(s, where_);
    }
  }
  return target;
}

}  // namespace stitch
