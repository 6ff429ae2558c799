// The upload side of the S3 store (s3_store.h): PublishFiles and the
// multi-host pieces that write a version's objects, each checked for
// immutability before and verified after.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/io/parallel.h"
#include "stitch/io/sha256.h"
#include "stitch/store/s3/s3_store.h"
#include "stitch/store/s3/s3_xml.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

// Parts per multipart upload, at most (S3's limit).
constexpr uint64_t kMaxParts = 10000;

std::string Quoted(std::string_view name) {
  return absl::StrCat("\"", absl::CEscape(AbslView(name)), "\"");
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
  // Another publisher wrote this object first: fine if it holds our bytes.
  if (response->status == 412) return CompareAfterLostRace(u);
  return Annotate(client_->ErrorFor(*response, "upload", u.key), where_);
}

void S3Store::AbortMultipart(const Upload& u, const std::string& upload_id) {
  S3Request r;
  r.method = "DELETE";
  r.key = u.key;
  r.query = {{"uploadId", upload_id}};
  // Best effort: an abandoned upload only costs storage until the bucket's
  // lifecycle rules clean it up.
  (void)client_->Send(r);
}

absl::Status S3Store::CompareAfterLostRace(const Upload& u) {
  auto info = Head(u.key);
  if (!info.ok()) return Annotate(info.status(), where_);
  if (!*info) {
    return absl::AbortedError(absl::StrCat(where_, ": ", location_.DisplayKey(u.key),
                                           " changed concurrently while uploading; retry"));
  }
  return CompareExisting(u, **info);
}

absl::StatusOr<std::vector<std::string>> S3Store::UploadParts(const Upload& u,
                                                              const std::string& upload_id) {
  const size_t parts = u.part_sha256.size();
  std::vector<std::string> etags(parts);
  absl::Status status = ParallelFor(parts, options_.parallelism, [&](size_t i) -> absl::Status {
    uint64_t offset = static_cast<uint64_t>(i) * u.part_size;
    S3Request r;
    r.method = "PUT";
    r.key = u.key;
    r.query = {{"partNumber", absl::StrCat(i + 1)}, {"uploadId", upload_id}};
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
  if (!status.ok()) return status;
  return etags;
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
  auto etags = UploadParts(u, *upload_id);
  if (!etags.ok()) {
    AbortMultipart(u, *upload_id);
    return Annotate(etags.status(), where_);
  }

  S3Request complete;
  complete.method = "POST";
  complete.key = u.key;
  complete.query = {{"uploadId", *upload_id}};
  complete.headers = {{"Content-Type", "application/xml"}, {"If-None-Match", "*"}};
  complete.body = CompleteMultipartUploadXml(*etags);
  auto done = client_->Send(complete);
  if (!done.ok()) {
    AbortMultipart(u, *upload_id);
    return Annotate(done.status(), where_);
  }
  if (done->status == 412) {
    AbortMultipart(u, *upload_id);
    return CompareAfterLostRace(u);
  }
  // S3 may answer 200 and still report an error in the body.
  if (!done->ok() || !done->ErrorCode().empty()) {
    AbortMultipart(u, *upload_id);
    S3Response as_error = *done;
    if (as_error.ok()) as_error.status = 500;
    return Annotate(client_->ErrorFor(as_error, "finish uploading", u.key), where_);
  }
  uploaded_.fetch_add(1);
  return absl::OkStatus();
}

absl::Status S3Store::VerifyUploaded(const std::vector<Upload>& uploads) {
  return ParallelFor(uploads.size(), options_.parallelism, [&](size_t i) -> absl::Status {
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
  absl::Status status =
      ParallelFor(uploads.size(), options_.parallelism, [&](size_t i) -> absl::Status {
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
  status = ParallelFor(single.size(), options_.parallelism,
                       [&](size_t i) { return PutSingle(uploads[single[i]]); });
  if (!status.ok()) return status;
  // Each large file's parts already use every transfer slot.
  for (size_t i : multipart) {
    if (absl::Status s = PutMultipart(uploads[i]); !s.ok()) return s;
  }
  return VerifyUploaded(uploads);
}

absl::Status S3Store::HashUpload(Upload& u) const {
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
  absl::Status hashed = ParallelFor(uploads.size(), options_.parallelism,
                                    [&](size_t i) { return HashUpload(uploads[i]); });
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

}  // namespace stitch
