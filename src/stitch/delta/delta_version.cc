#include "stitch/delta/delta_version.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/manifest.h"

namespace stitch {
namespace fs = std::filesystem;

absl::Status ReadDeltaEntries(const CheckpointFile& f, size_t file_index,
                              const std::vector<std::string>* expected, int64_t version,
                              std::string_view where, std::vector<DeltaEntry>& out) {
  const fs::path& path = f.path;
  const std::string label = absl::StrCat(path.string(), " (version ", version, ")");
  std::map<std::string_view, const TensorInfo*> present;
  for (const TensorInfo& t : f.header.tensors) present.emplace(t.name, &t);
  auto bad = [&](std::string_view tensor, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(where), ": ", path.string(),
                                                   ": tensor \"", AbslView(tensor), "\": ", what));
  };
  std::vector<std::string> all;
  if (expected == nullptr) {
    for (const TensorInfo& t : f.header.tensors) all.push_back(t.name);
    expected = &all;
  }
  for (const std::string& tensor : *expected) {
    auto it = present.find(tensor);
    if (it == present.end()) {
      return bad(tensor, "listed in the index for this file, but the file does not hold it");
    }
    const TensorInfo& t = *it->second;
    present.erase(it);
    if (t.dtype != DType::kU8 || t.shape.size() != 1 ||
        static_cast<uint64_t>(t.shape[0]) != t.nbytes()) {
      return bad(tensor,
                 absl::StrCat("is ", AbslView(DTypeName(t.dtype)), " ", ShapeText(t.shape),
                              "; a delta entry must be U8 of shape [n] holding a zstd frame"));
    }
    auto sum = f.header.metadata.find(tensor);
    if (sum == f.header.metadata.end()) {
      return bad(tensor, "the file's __metadata__ has no xxh3-128 checksum for it");
    }
    absl::StatusOr<Checksum128> checksum = Checksum128::FromHex(sum->second);
    if (!checksum.ok()) return bad(tensor, checksum.status().message());
    DeltaEntry e{t.name,     file_index, f.header.data_start + t.begin,
                 t.nbytes(), *checksum,  std::nullopt};
    std::byte prefix[kMaxFrameHeaderBytes];
    const size_t n = static_cast<size_t>(std::min<uint64_t>(e.size, sizeof prefix));
    if (n > 0 &&
        ::pread(f.fd.get(), prefix, n, static_cast<off_t>(e.offset)) != static_cast<ssize_t>(n)) {
      return absl::DataLossError(absl::StrCat(AbslView(where),
                                              ": cannot read the frame of tensor \"", tensor,
                                              "\" in ", path.string()));
    }
    absl::StatusOr<FrameHeaderInfo> info = ParseFrameHeader(std::span(prefix, n), label);
    if (!info.ok()) {
      return absl::DataLossError(
          absl::StrCat("tensor \"", tensor, "\": ", info.status().message()));
    }
    e.content_size = info->content_size;
    out.push_back(std::move(e));
  }
  if (!present.empty()) {
    return bad(present.begin()->first, "held by the file but not listed in the index for it");
  }
  return absl::OkStatus();
}

absl::StatusOr<DeltaVersion> DeltaVersion::Open(const fs::path& dir) {
  DeltaVersion d;
  d.dir_ = dir;
  const std::string where = absl::StrCat("delta ", dir.string());
  absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
  if (!index.ok()) return Annotate(index.status(), where);
  d.index_ = *std::move(index);
  if (!d.index_.is_delta()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a DELTA version (its index has no metadata.delta_encoding)"));
  }
  absl::StatusOr<VersionManifest> manifest = d.index_.ToManifest();
  if (!manifest.ok()) return Annotate(manifest.status(), where);
  d.version_ = manifest->version;
  d.base_version_ = manifest->base_version.value_or(-1);
  if (auto it = d.index_.metadata.find(std::string(kRunIdMetadataKey));
      it != d.index_.metadata.end()) {
    d.run_id_ = it->second;
  }

  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [tensor, file] : d.index_.weight_map) by_file[file].push_back(tensor);
  for (auto& [file, expected] : by_file) {
    const fs::path path = dir / file;
    absl::StatusOr<CheckpointFile> f =
        OpenSafetensorsForReading(path, file, MaxHeaderBytesFor(expected.size()));
    if (!f.ok()) {
      if (absl::IsNotFound(f.status())) {
        return absl::NotFoundError(
            absl::StrCat(where, ": payload file \"", file, "\" listed in the index is missing"));
      }
      return Annotate(f.status(), where);
    }
    if (absl::Status s =
            ReadDeltaEntries(*f, d.files_.size(), &expected, d.version_, where, d.entries_);
        !s.ok()) {
      return s;
    }
    d.files_.push_back(*std::move(f));
  }
  std::sort(d.entries_.begin(), d.entries_.end(),
            [](const DeltaEntry& a, const DeltaEntry& b) { return a.tensor < b.tensor; });
  return d;
}

const DeltaEntry* DeltaVersion::Find(std::string_view tensor) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), tensor,
                             [](const DeltaEntry& e, std::string_view n) { return e.tensor < n; });
  return it != entries_.end() && it->tensor == tensor ? &*it : nullptr;
}

uint64_t DeltaVersion::payload_bytes() const {
  uint64_t n = 0;
  for (const CheckpointFile& f : files_) n += f.size;
  return n;
}

FrameRef DeltaVersion::Frame(const DeltaEntry& e) const {
  const CheckpointFile& f = files_[e.file];
  return FrameRef{
      f.fd.get(), e.offset, e.size, {}, absl::StrCat(f.path.string(), " (version ", version_, ")")};
}

}  // namespace stitch
