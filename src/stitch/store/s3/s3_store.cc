#include "stitch/store/s3/s3_store.h"

#include <algorithm>
#include <functional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/io/parallel.h"
#include "stitch/io/sha256.h"
#include "stitch/store/pointer_cas.h"
#include "stitch/store/s3/s3_xml.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kPointerKey = "latest";
constexpr uint64_t kMinPartSize = uint64_t{5} << 20;

std::string Quoted(std::string_view name) {
  return absl::StrCat("\"", absl::CEscape(AbslView(name)), "\"");
}

bool ValidHostName(std::string_view host) {
  if (host.empty() || host.size() > 64 || host.front() == '.') return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

}  // namespace

S3Store::S3Store(S3Location location, std::string run_id, std::shared_ptr<S3Client> client,
                 S3StoreOptions options)
    : location_(std::move(location)),
      run_id_(std::move(run_id)),
      client_(std::move(client)),
      options_(std::move(options)),
      where_(absl::StrCat("store ", location_.Display())) {}

absl::StatusOr<std::unique_ptr<S3Store>> S3Store::Open(std::string_view uri, std::string run_id,
                                                       const S3Environment& env,
                                                       S3StoreOptions s3) {
  if (!run_id.empty()) {
    if (absl::Status s = ValidateRunId(run_id); !s.ok()) return s;
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
  auto client = S3Client::Create(*location, env, s3.client);
  if (!client.ok()) return client.status();
  return std::unique_ptr<S3Store>(
      new S3Store(*std::move(location), std::move(run_id), *std::move(client), std::move(s3)));
}

std::string S3Store::VersionKey(int64_t version, std::string_view name) const {
  return location_.Key(absl::StrCat("updates/", VersionDirName(version), "/", AbslView(name)));
}

absl::Status S3Store::RequireRunId(std::string_view action) const {
  if (!run_id_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(where_, ": opened without a run id, so it cannot ",
                                                 AbslView(action), "; open it with one"));
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

absl::StatusOr<std::vector<StoredFile>> S3Store::StatVersionFiles(
    int64_t version, const std::vector<std::string>& files) {
  std::vector<StoredFile> out(files.size());
  absl::Status status =
      ParallelFor(files.size(), options_.parallelism, [&](size_t i) -> absl::Status {
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

absl::StatusOr<std::vector<std::string>> S3Store::ListKeys(const std::string& prefix) {
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
    for (S3ObjectSummary& object : page->objects) {
      if (absl::StartsWith(object.key, prefix)) out.push_back(std::move(object.key));
    }
    if (!page->truncated) return out;
    token = page->next_continuation_token;
  }
}

absl::StatusOr<std::vector<std::string>> S3Store::ListVersionFiles(int64_t version) {
  const std::string prefix = VersionKey(version, "");
  auto keys = ListKeys(prefix);
  if (!keys.ok()) return keys.status();
  std::vector<std::string> out;
  for (const std::string& key : *keys) {
    std::string name = key.substr(prefix.size());
    // Receipts, and anything else under a name starting with '.', are not
    // part of the version (version_dir.h).
    if (name.empty() || IsHiddenVersionPath(name)) continue;
    out.push_back(std::move(name));
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
  return PutSmall(
      VersionKey(version, absl::StrCat(AbslView(kReceiptsDir), "/", AbslView(host), ".json")), json,
      "write receipt");
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

absl::StatusOr<std::string> S3Store::GetVerified(const std::string& key, std::string_view what,
                                                 uint64_t max_bytes) {
  S3Request r;
  r.key = key;
  r.max_buffered_body = max_bytes;
  auto response = client_->Send(r);
  // "It is N bytes, above the limit": the caller names the object.
  if (absl::IsOutOfRange(response.status())) return response.status();
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

absl::StatusOr<std::string> S3Store::ReadIndexText(int64_t version) {
  // A larger index than the bounds allow is refused before it is held.
  auto text =
      GetVerified(VersionKey(version, kIndexFileName), "index", options_.index_bounds.max_bytes);
  if (!text.ok() && absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat(where_, ": version ", VersionDirName(version), " is not published"));
  }
  if (!text.ok() && absl::IsOutOfRange(text.status())) {
    return IndexTooLarge(where_, version, text.status().message(), options_.index_bounds);
  }
  return text;
}

absl::StatusOr<VersionManifest> S3Store::ReadManifest(int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  auto text = ReadIndexText(version);
  if (!text.ok()) return text.status();
  return ManifestFromIndex(where_, version, *text, options_.index_bounds);
}

// ---- What the version cache reads (store/remote_store.h) ----

absl::StatusOr<RemoteVersion> S3Store::DescribeVersion(int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  RemoteVersion out;
  auto index_text = ReadIndexText(version);
  if (!index_text.ok()) return index_text.status();
  out.index_text = *std::move(index_text);
  auto manifest = ManifestFromIndex(where_, version, out.index_text, options_.index_bounds);
  if (!manifest.ok()) return manifest.status();
  out.manifest = *std::move(manifest);
  // The payload, and the version's other files (config, tokenizer), which
  // an engine loading the directory needs too.
  auto listed = ListVersionFiles(version);
  if (!listed.ok()) return listed.status();
  std::vector<std::string> names = out.manifest.files;
  const std::set<std::string> payload(names.begin(), names.end());
  for (const std::string& name : *listed) {
    if (name != kIndexFileName && !payload.contains(name)) names.push_back(name);
  }
  auto stored = StatVersionFiles(version, names);
  if (!stored.ok()) {
    if (absl::IsNotFound(stored.status())) {
      return absl::DataLossError(
          absl::StrCat(stored.status().message(), "; the published version is incomplete"));
    }
    return stored.status();
  }
  out.files = *std::move(stored);
  return out;
}

absl::Status S3Store::ReadFile(int64_t version, const StoredFile& want, ByteSink& sink) {
  const std::string key = VersionKey(version, want.name);
  S3Request r;
  r.key = key;
  r.sink = &sink;
  auto response = client_->Send(r);
  if (!response.ok() && absl::IsDataLoss(response.status())) {
    return Annotate(response.status(), location_.DisplayKey(key));
  }
  if (!response.ok()) return response.status();
  if (!response->ok()) return client_->ErrorFor(*response, "download", key);
  auto recorded = RecordedSha256(*response);
  if (!recorded.ok()) return Annotate(recorded.status(), location_.DisplayKey(key));
  if (*recorded != want.sha256) {
    return WithKind(
        absl::DataLossError(absl::StrCat(
            location_.DisplayKey(key), ": records sha256 ", *recorded, " but recorded ",
            want.sha256, " when it was listed; the object changed after it was published")),
        ErrorKind::kChecksumMismatch);
  }
  return absl::OkStatus();
}

std::filesystem::path S3Store::CacheSubdir() const {
  fs::path subdir = fs::path("s3") / location_.bucket;
  for (absl::string_view seg : absl::StrSplit(location_.prefix, '/', absl::SkipEmpty())) {
    subdir /= std::string(seg);
  }
  return subdir;
}

}  // namespace stitch
