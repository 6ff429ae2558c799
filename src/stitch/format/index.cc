#include "stitch/format/index.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <system_error>
#include <utility>

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/format/checksum.h"
#include "stitch/format/safetensors.h"
#include "stitch/format/strict_json.h"
#include "stitch/io/fileio.h"

namespace stitch {
namespace fs = std::filesystem;
namespace json = boost::json;
namespace {

constexpr char kSingleFileName[] = "model.safetensors";

// The four DELTA keys and the one value Stitch reads for each (base_version
// is a version number instead).
struct DeltaKey {
  absl::string_view key;
  absl::string_view supported;
};
constexpr DeltaKey kDeltaKeys[] = {
    {"delta_encoding", "xor"},
    {"compression_format", "zstd"},
    {"checksum_format", "xxh3-128"},
};

absl::Status IndexError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint index: ", what));
}

// A metadata version field as the original Python Stitch reads it (int()):
// a JSON integer or whole number (3, 3.0), or a string int() reads as a
// non-negative decimal ("000007", " 7", "+7", "1_000": ParseVersionText);
// within kMaxVersion.
absl::StatusOr<int64_t> ParseVersionField(const CheckpointIndex& index, absl::string_view key) {
  auto refuse = [&](absl::string_view shown) {
    return IndexError(absl::StrCat("metadata.", key, " ", shown,
                                   " is not a version number (expected an integer or a string "
                                   "of digits like \"000007\", at most ",
                                   kMaxVersion, ")"));
  };
  auto it = index.metadata.find(std::string(key));
  if (it == index.metadata.end()) {
    auto other = index.other_metadata.find(std::string(key));
    if (other == index.other_metadata.end()) {
      return absl::NotFoundError(absl::StrCat("checkpoint index: no metadata.", key));
    }
    json::error_code ec;
    const json::value v = json::parse(other->second, ec);
    int64_t n = -1;
    if (!ec && v.is_int64()) {
      n = v.get_int64();
    } else if (!ec && v.is_double() && std::isfinite(v.get_double()) &&
               v.get_double() == std::trunc(v.get_double()) && v.get_double() >= 0 &&
               v.get_double() <= static_cast<double>(kMaxVersion)) {
      n = static_cast<int64_t>(v.get_double());
    }
    if (!ValidateVersionNumber(n).ok()) return refuse(other->second);
    return n;
  }
  const std::string& text = it->second;
  absl::StatusOr<int64_t> v = ParseVersionText(text);
  if (!v.ok()) return refuse(QuoteForMessage(text));
  return *v;
}

absl::Status ValidateWeightMap(const std::map<std::string, std::string>& weight_map) {
  for (const auto& [tensor, file] : weight_map) {
    if (absl::Status s = ValidatePayloadFileName(file); !s.ok()) {
      return IndexError(absl::StrCat("weight_map[", QuoteForMessage(tensor), "]: ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string VersionMetadataString(int64_t version) { return absl::StrFormat("%06d", version); }

absl::StatusOr<std::optional<int64_t>> CheckpointIndex::version() const {
  absl::StatusOr<int64_t> v = ParseVersionField(*this, "version");
  if (absl::IsNotFound(v.status())) return std::nullopt;
  if (!v.ok()) return v.status();
  return *v;
}

bool CheckpointIndex::is_delta() const {
  return metadata.contains("delta_encoding") || other_metadata.contains("delta_encoding");
}

namespace {

// A recorded fingerprint (kWeightsFingerprintKey, kBaseFingerprintKey) in
// its canonical lowercase form, or "" when the index records none.
absl::StatusOr<std::string> FingerprintField(const CheckpointIndex& index, std::string_view key) {
  auto it = index.metadata.find(std::string(key));
  if (it == index.metadata.end()) {
    if (index.other_metadata.contains(std::string(key))) {
      return IndexError(absl::StrCat("metadata.", AbslView(key), " is not a string"));
    }
    return std::string();
  }
  absl::StatusOr<Checksum128> parsed = Checksum128::FromHex(it->second);
  if (!parsed.ok()) {
    return IndexError(absl::StrCat("metadata.", AbslView(key), " ", QuoteForMessage(it->second),
                                   " is not 32 hex digits"));
  }
  return parsed->ToHex();
}

}  // namespace

absl::StatusOr<VersionManifest> CheckpointIndex::ToManifest() const {
  VersionManifest m;
  absl::StatusOr<std::optional<int64_t>> v = version();
  if (!v.ok()) return v.status();
  if (!v->has_value()) {
    return IndexError(
        "metadata.version is missing: a Stitch version's index must say which version it holds");
  }
  m.version = **v;
  if (is_delta()) {
    m.kind = VersionKind::kDelta;
    for (const DeltaKey& d : kDeltaKeys) {
      auto it = metadata.find(std::string(d.key));
      if (it == metadata.end()) {
        absl::string_view why =
            other_metadata.contains(std::string(d.key)) ? "is not a string" : "is missing";
        return IndexError(
            absl::StrCat("DELTA metadata.", d.key, " ", why, " (expected \"", d.supported, "\")"));
      }
      if (it->second != d.supported) {
        return IndexError(absl::StrCat("unsupported ", d.key, " ", QuoteForMessage(it->second),
                                       ": Stitch reads only \"", d.supported, "\""));
      }
    }
    absl::StatusOr<int64_t> base = ParseVersionField(*this, "base_version");
    if (absl::IsNotFound(base.status())) {
      return IndexError(
          "DELTA metadata.base_version is missing (the version the delta applies to)");
    }
    if (!base.ok()) return base.status();
    m.base_version = *base;
  }
  for (auto [key, field] : {std::pair{kWeightsFingerprintKey, &m.weights_fingerprint},
                            std::pair{kBaseFingerprintKey, &m.base_weights_fingerprint}}) {
    absl::StatusOr<std::string> fingerprint = FingerprintField(*this, key);
    if (!fingerprint.ok()) return fingerprint.status();
    *field = *std::move(fingerprint);
  }
  if (absl::Status s = ValidateWeightMap(weight_map); !s.ok()) return s;
  for (const auto& [tensor, file] : weight_map) m.files.push_back(file);
  std::sort(m.files.begin(), m.files.end());
  m.files.erase(std::unique(m.files.begin(), m.files.end()), m.files.end());
  return m;
}

IndexBounds IndexBoundsFor(const CheckpointIndex& base) {
  constexpr uint64_t kMetadataAllowance = uint64_t{1} << 20;
  // Quotes, a colon, a comma and a payload file name (at most 255 bytes).
  constexpr uint64_t kEntryAllowance = 6 + 255;
  constexpr uint64_t kEscapedCharBytes = 6;  // \u00XX
  size_t longest = 0;
  for (const auto& [tensor, file] : base.weight_map) longest = std::max(longest, tensor.size());
  IndexBounds bounds;
  bounds.max_tensors = std::min(kMaxIndexTensors, 2 * base.weight_map.size() + 16);
  bounds.max_bytes = std::min(
      kMaxIndexBytes,
      kMetadataAllowance + bounds.max_tensors * (kEscapedCharBytes * longest + kEntryAllowance));
  bounds.why = absl::StrCat("what a version of the base checkpoint can hold, whose index lists ",
                            base.weight_map.size(), " tensors");
  return bounds;
}

absl::StatusOr<CheckpointIndex> CheckpointIndex::Parse(std::string_view text,
                                                       const IndexBounds& bounds) {
  if (text.size() > bounds.max_bytes) {
    return IndexError(absl::StrCat("is ", text.size(), " bytes, above the limit of ",
                                   bounds.max_bytes, " bytes (", bounds.why, ")"));
  }
  json::monotonic_resource arena;
  absl::StatusOr<json::value> doc = ParseJsonStrict(text, &arena);
  if (!doc.ok()) return IndexError(absl::StrCat("not valid JSON: ", doc.status().message()));
  const json::object* root = doc->if_object();
  if (root == nullptr) {
    return IndexError(absl::StrCat("is a JSON ", JsonKindName(*doc), ", expected an object"));
  }
  CheckpointIndex index;
  if (const json::value* md = root->if_contains("metadata"); md != nullptr) {
    const json::object* o = md->if_object();
    if (o == nullptr) {
      return IndexError(absl::StrCat("metadata is a ", JsonKindName(*md), ", expected an object"));
    }
    for (const auto& [key, value] : *o) {
      if (value.is_string()) {
        index.metadata.emplace(std::string(key), std::string(value.get_string()));
      } else {
        index.other_metadata.emplace(std::string(key), json::serialize(value));
      }
    }
  }
  const json::value* wm = root->if_contains("weight_map");
  if (wm == nullptr) return IndexError("has no weight_map");
  const json::object* wmo = wm->if_object();
  if (wmo == nullptr) {
    return IndexError(absl::StrCat("weight_map is a ", JsonKindName(*wm), ", expected an object"));
  }
  if (wmo->size() > bounds.max_tensors) {
    return IndexError(absl::StrCat("weight_map lists ", wmo->size(),
                                   " tensors, above the limit of ", bounds.max_tensors, " (",
                                   bounds.why, "); the index is not a real checkpoint's"));
  }
  for (const auto& [tensor, file] : *wmo) {
    if (!file.is_string()) {
      return IndexError(absl::StrCat("weight_map[", QuoteForMessage(tensor), "] is a ",
                                     JsonKindName(file), ", expected a file name"));
    }
    index.weight_map.emplace(std::string(tensor), std::string(file.get_string()));
  }
  if (absl::Status s = ValidateWeightMap(index.weight_map); !s.ok()) return s;
  return index;
}

std::string CheckpointIndex::ToJson() const {
  json::monotonic_resource arena;
  // Both metadata maps are written as one object in key order.
  std::map<std::string_view, json::value> md;
  for (const auto& [k, v] : metadata) md.emplace(k, json::value(v, &arena));
  for (const auto& [k, text] : other_metadata) {
    json::error_code ec;
    json::value v = json::parse(text, ec, &arena);
    // Text that is not JSON (set by hand, never read from a file) is kept as
    // a string rather than dropped. A key set in `metadata` too was set
    // there after parsing (a new version number over a source's integer
    // one), so that value is the one written.
    md.emplace(k, ec ? json::value(text, &arena) : std::move(v));
  }
  json::object root(&arena);
  json::object& m = root.emplace("metadata", json::object(&arena)).first->value().as_object();
  m.reserve(md.size());
  for (auto& [k, v] : md) m.emplace(k, std::move(v));
  json::object& w = root.emplace("weight_map", json::object(&arena)).first->value().as_object();
  w.reserve(weight_map.size());
  for (const auto& [tensor, file] : weight_map) w.emplace(tensor, file);
  return json::serialize(root);
}

absl::StatusOr<CheckpointIndex> ReadIndex(const fs::path& dir) {
  const fs::path index_path = dir / kIndexFileName;
  std::error_code size_ec;
  if (const uintmax_t size = fs::file_size(index_path, size_ec);
      !size_ec && size > kMaxIndexBytes) {
    return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": checkpoint index: is ",
                                                   size, " bytes, above the limit of ",
                                                   kMaxIndexBytes, " bytes"));
  }
  absl::StatusOr<std::string> text = ReadFileToString(index_path);
  if (text.ok()) {
    absl::StatusOr<CheckpointIndex> index = CheckpointIndex::Parse(*text);
    if (!index.ok()) return Annotate(index.status(), index_path.string());
    return index;
  }
  if (!absl::IsNotFound(text.status())) return text.status();

  const fs::path single = dir / kSingleFileName;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir.string(),
                                            " does not exist or is not a directory"));
  }
  if (!fs::exists(single, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir.string(), " has neither ",
                                            AbslView(kIndexFileName), " nor ", kSingleFileName));
  }
  absl::StatusOr<SafetensorsHeader> header = ReadSafetensorsHeader(single);
  if (!header.ok()) return header.status();
  CheckpointIndex index;
  for (const TensorInfo& t : header->tensors) index.weight_map.emplace(t.name, kSingleFileName);
  return index;
}

absl::Status WriteIndex(const fs::path& dir, const CheckpointIndex& index) {
  if (absl::Status s = ValidateWeightMap(index.weight_map); !s.ok()) {
    return Annotate(s, absl::StrCat("write ", dir.string()));
  }
  return WriteFileAtomically(dir / kIndexFileName, index.ToJson());
}

}  // namespace stitch
