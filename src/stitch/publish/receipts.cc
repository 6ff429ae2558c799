#include "stitch/publish/receipts.h"

#include <algorithm>
#include <boost/json.hpp>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"

namespace stitch {
namespace json = boost::json;
namespace {

std::string Quoted(std::string_view s) {
  return absl::StrCat("\"", absl::CEscape(AbslView(s)), "\"");
}

bool IsLowerSha256Hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && !(c >= 'a' && c <= 'f')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string ReceiptToJson(const UploadReceipt& receipt) {
  json::array files;
  for (const FileReceipt& f : receipt.files) {
    json::object o{{"file", f.file}, {"size", static_cast<int64_t>(f.size)}, {"sha256", f.sha256}};
    if (!f.tensors.empty()) {
      json::array tensors;
      for (const std::string& t : f.tensors) tensors.emplace_back(t);
      o["tensors"] = std::move(tensors);
    }
    files.push_back(std::move(o));
  }
  return json::serialize(json::object{
      {"version", receipt.version}, {"host", receipt.host}, {"files", std::move(files)}});
}

absl::StatusOr<UploadReceipt> ReceiptFromJson(std::string_view text) {
  auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad upload receipt: ", why));
  };
  json::error_code ec;
  json::value v = json::parse(json::string_view(text.data(), text.size()), ec);
  if (ec) return bad(absl::StrCat("not JSON: ", ec.message()));
  const json::object* o = v.if_object();
  if (o == nullptr) return bad("not a JSON object");
  UploadReceipt out;
  const json::value* version = o->if_contains("version");
  if (version == nullptr || !version->is_int64()) return bad("no integer \"version\"");
  out.version = version->as_int64();
  if (absl::Status s = ValidateVersionNumber(out.version); !s.ok()) return bad(s.message());
  const json::value* host = o->if_contains("host");
  if (host == nullptr || !host->is_string() || host->as_string().empty()) {
    return bad("no \"host\" string");
  }
  out.host = std::string(host->as_string());
  const json::value* files = o->if_contains("files");
  if (files == nullptr || !files->is_array()) return bad("no \"files\" array");
  std::set<std::string> seen;
  for (const json::value& entry : files->as_array()) {
    const json::object* e = entry.if_object();
    if (e == nullptr) return bad("a \"files\" entry is not an object");
    const json::value* file = e->if_contains("file");
    const json::value* size = e->if_contains("size");
    const json::value* sha = e->if_contains("sha256");
    if (file == nullptr || !file->is_string() || size == nullptr || !size->is_int64() ||
        size->as_int64() < 0 || sha == nullptr || !sha->is_string()) {
      return bad("a \"files\" entry lacks a string \"file\", a size or a \"sha256\" string");
    }
    FileReceipt f{std::string(file->as_string()), static_cast<uint64_t>(size->as_int64()),
                  std::string(sha->as_string())};
    if (absl::Status s = ValidatePayloadFileName(f.file); !s.ok()) {
      return bad(absl::StrCat("host ", out.host, ": ", s.message()));
    }
    if (!IsLowerSha256Hex(f.sha256)) {
      return bad(absl::StrCat("host ", out.host, ": file ", Quoted(f.file),
                              " has a sha256 that is not 64 lowercase hex digits"));
    }
    if (!seen.insert(f.file).second) {
      return bad(absl::StrCat("host ", out.host, " lists ", Quoted(f.file), " twice"));
    }
    if (const json::value* tensors = e->if_contains("tensors"); tensors != nullptr) {
      if (!tensors->is_array()) {
        return bad(absl::StrCat("host ", out.host, ": \"tensors\" of ", Quoted(f.file),
                                " is not an array"));
      }
      for (const json::value& t : tensors->as_array()) {
        if (!t.is_string()) {
          return bad(absl::StrCat("host ", out.host, ": \"tensors\" of ", Quoted(f.file),
                                  " holds a non-string"));
        }
        f.tensors.emplace_back(t.as_string());
      }
      std::sort(f.tensors.begin(), f.tensors.end());
    }
    out.files.push_back(std::move(f));
  }
  return out;
}

absl::Status CheckReceiptTensors(std::string_view where, int64_t version,
                                 const std::map<std::string, std::string>& weight_map,
                                 std::span<const FileReceipt> files) {
  const std::string prefix = absl::StrCat(AbslView(where), ": version ", VersionDirName(version));
  std::map<std::string_view, std::vector<std::string_view>> by_file;
  for (const auto& [tensor, file] : weight_map) by_file[file].push_back(tensor);
  for (const FileReceipt& f : files) {
    std::vector<std::string_view>& want = by_file[f.file];  // sorted: weight_map is
    std::vector<std::string_view> have(f.tensors.begin(), f.tensors.end());
    if (have == want) continue;
    std::vector<std::string_view> extra, missing;
    std::set_difference(have.begin(), have.end(), want.begin(), want.end(),
                        std::back_inserter(extra));
    std::set_difference(want.begin(), want.end(), have.begin(), have.end(),
                        std::back_inserter(missing));
    if (!missing.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, ": the index maps tensor ", Quoted(missing.front()), " to ", Quoted(f.file),
          ", but that file does not hold it; fix the index or the shard"));
    }
    auto mapped = weight_map.find(std::string(extra.front()));
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, ": ", Quoted(f.file), " holds tensor ", Quoted(extra.front()), ", which the index ",
        mapped == weight_map.end() ? std::string("does not list")
                                   : absl::StrCat("maps to ", Quoted(mapped->second)),
        "; fix the index or the shard"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FileReceipt>> VerifyReceipts(
    std::string_view where, int64_t version, const std::optional<VersionManifest>& manifest,
    std::span<const UploadReceipt> receipts, const StatFilesFn& stat) {
  const std::string prefix = absl::StrCat(AbslView(where), ": version ", VersionDirName(version));
  // file -> (receipt, host that sent it)
  std::map<std::string, std::pair<FileReceipt, std::string>> merged;
  for (const UploadReceipt& r : receipts) {
    if (r.version != version) {
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, ": host ", r.host, " sent a receipt for version ", r.version));
    }
    for (const FileReceipt& f : r.files) {
      auto [it, inserted] = merged.try_emplace(f.file, f, r.host);
      if (inserted || it->second.first == f) continue;
      const FileReceipt& other = it->second.first;
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, ": hosts ", it->second.second, " and ", r.host, " uploaded different ",
          Quoted(f.file), " (", other.size, " bytes, sha256 ", other.sha256, " vs ", f.size,
          " bytes, sha256 ", f.sha256, "); each file must come from one host"));
    }
  }
  if (!manifest.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix, ": the index (", AbslView(kIndexFileName),
                     ") is missing; the rank that publishes must hold it"));
  }
  std::vector<std::string> missing;
  for (const std::string& file : manifest->files) {
    if (!merged.contains(file)) missing.push_back(Quoted(file));
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix, ": no host uploaded ", absl::StrJoin(missing, ", "),
        ", named by the index's weight_map; every shard must be uploaded before publishing"));
  }
  std::set<std::string> named(manifest->files.begin(), manifest->files.end());
  for (const auto& [file, entry] : merged) {
    if (!named.contains(file)) {
      return absl::FailedPreconditionError(absl::StrCat(
          prefix, ": host ", entry.second, " uploaded ", Quoted(file),
          ", which the index's weight_map does not name; fix the file name or the index"));
    }
  }
  std::vector<std::string> files(manifest->files.begin(), manifest->files.end());
  auto stored = stat(files);
  if (!stored.ok()) return stored.status();
  if (stored->size() != files.size()) {
    return absl::InternalError(absl::StrCat(prefix, ": the store reported ", stored->size(),
                                            " files for ", files.size(), " asked"));
  }
  std::vector<FileReceipt> out;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& [want, host] = merged.at(files[i]);
    const FileReceipt& have = (*stored)[i];
    if (have.size != want.size || have.sha256 != want.sha256) {
      return WithKind(
          absl::DataLossError(absl::StrCat(prefix, ": ", Quoted(files[i]), " holds ", have.size,
                                           " bytes with sha256 ", have.sha256, " but host ", host,
                                           " uploaded ", want.size, " bytes with sha256 ",
                                           want.sha256, "; it changed after the upload")),
          ErrorKind::kChecksumMismatch);
    }
    out.push_back(want);
  }
  return out;
}

}  // namespace stitch
