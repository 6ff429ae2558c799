// S3Store's retention operations (store.h "Retention"): listing and
// deleting versions, and the small records kept beside them.
#include <algorithm>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/manifest.h"
#include "stitch/io/sha256.h"
#include "stitch/store/s3/s3_store.h"

namespace stitch {

absl::Status S3Store::DeleteKey(const std::string& key) {
  S3Request r;
  r.method = "DELETE";
  r.key = key;
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->ok() || response->status == 404) return absl::OkStatus();
  return Annotate(client_->ErrorFor(*response, "delete", key), where_);
}

absl::Status S3Store::PutSmall(const std::string& key, std::string_view body,
                               std::string_view operation) {
  S3Request r;
  r.method = "PUT";
  r.key = key;
  r.body = std::string(body);
  std::string sha = Sha256Hex(r.body);
  r.payload_sha256 = sha;
  r.headers = {{"Content-Type", "application/json"},
               {S3Response::MetaHeader(kSha256MetadataKey), sha},
               {S3Response::MetaHeader(kLegacySha256MetadataKey), sha}};
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (!response->ok()) return Annotate(client_->ErrorFor(*response, operation, key), where_);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> S3Store::ListVersions() {
  const std::string prefix = location_.Key("updates/");
  auto keys = ListKeys(prefix);
  if (!keys.ok()) return keys.status();
  std::set<int64_t> out;
  for (const std::string& key : *keys) {
    const std::string_view rest = std::string_view(key).substr(prefix.size());
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos) continue;
    auto version = ParseVersionDirName(rest.substr(0, slash));
    if (version.ok()) out.insert(*version);
  }
  return std::vector<int64_t>(out.begin(), out.end());
}

std::unique_ptr<RemoteStore> S3Store::OpenAnchors() {
  if (parent_ != nullptr) return nullptr;
  S3Location location = location_;
  location.prefix = location.prefix.empty() ? "anchors" : absl::StrCat(location.prefix, "/anchors");
  const size_t query = location.uri.find('?');
  location.uri.insert(query == std::string::npos ? location.uri.size() : query, "/anchors");
  auto store =
      std::unique_ptr<S3Store>(new S3Store(std::move(location), run_id_, client_, options_));
  store->parent_ = this;
  return store;
}

Store* S3Store::anchors() {
  if (parent_ != nullptr) return nullptr;
  absl::MutexLock lock(&anchors_mu_);
  if (anchors_ == nullptr) anchors_ = OpenAnchors();
  return anchors_.get();
}

absl::Status S3Store::DeleteVersion(int64_t version) {
  // An anchors store obeys its parent's pointer.
  auto pointer = parent_ != nullptr ? parent_->ReadPointer() : ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (absl::Status s = CheckDeletable(where_, run_id_, *pointer, version); !s.ok()) return s;
  // The index first: without it the version is not published, and a
  // replica that reads it now fails before it trusts any byte.
  if (absl::Status s = DeleteKey(VersionKey(version, kIndexFileName)); !s.ok()) return s;
  auto keys = ListKeys(VersionKey(version, ""));
  if (!keys.ok()) return keys.status();
  for (const std::string& key : *keys) {
    if (absl::Status s = DeleteKey(key); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Store::RecordKey(std::string_view kind, std::string_view name) const {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  if (absl::Status s = ValidateRecordWord("record name", name); !s.ok()) return Annotate(s, where_);
  return location_.Key(absl::StrCat(AbslView(kind), "/", AbslView(name)));
}

absl::StatusOr<std::vector<std::string>> S3Store::ListRecords(std::string_view kind) {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  const std::string prefix = location_.Key(absl::StrCat(AbslView(kind), "/"));
  auto keys = ListKeys(prefix);
  if (!keys.ok()) return keys.status();
  std::vector<std::string> out;
  for (const std::string& key : *keys) {
    std::string name = key.substr(prefix.size());
    if (ValidateRecordWord("record name", name).ok()) out.push_back(std::move(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::optional<std::string>> S3Store::ReadRecord(std::string_view kind,
                                                               std::string_view name) {
  auto key = RecordKey(kind, name);
  if (!key.ok()) return key.status();
  auto text = GetVerified(*key, "record");
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return std::nullopt;
    return text.status();
  }
  return *std::move(text);
}

absl::Status S3Store::WriteRecord(std::string_view kind, std::string_view name,
                                  std::string_view text) {
  auto key = RecordKey(kind, name);
  if (!key.ok()) return key.status();
  auto pointer = ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (!pointer->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where_, ": no run was claimed here; records are kept in an existing store"));
  }
  return PutSmall(*key, text, "write record");
}

absl::Status S3Store::DeleteRecord(std::string_view kind, std::string_view name) {
  auto key = RecordKey(kind, name);
  if (!key.ok()) return key.status();
  return DeleteKey(*key);
}

}  // namespace stitch
