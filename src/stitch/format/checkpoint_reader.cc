#include "stitch/format/checkpoint_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace fs = std::filesystem;

namespace {

absl::StatusOr<std::vector<std::byte>> ReadPrefix(int fd, uint64_t n, const fs::path& path) {
  std::vector<std::byte> buf(n);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, buf.data() + done, n - done, static_cast<off_t>(done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  buf.resize(done);
  return buf;
}

}  // namespace

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

uint64_t MaxHeaderBytesFor(size_t tensors) {
  return std::min<uint64_t>(kMaxSafetensorsHeader, (uint64_t{1} << 20) + uint64_t{1024} * tensors);
}

absl::StatusOr<CheckpointFile> OpenSafetensorsForReading(const fs::path& path, std::string name,
                                                         uint64_t max_header_bytes) {
  CheckpointFile f;
  f.name = std::move(name);
  f.path = path;
  f.fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f.fd) return ErrnoStatus(errno, "open", path);
  struct stat st;
  if (::fstat(f.fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a regular file"));
  }
  f.size = static_cast<uint64_t>(st.st_size);
  // The header length field first; read the header only when the length is
  // plausible, otherwise the parser explains what is wrong from the field.
  absl::StatusOr<std::vector<std::byte>> prefix =
      ReadPrefix(f.fd.get(), std::min<uint64_t>(8, f.size), path);
  if (!prefix.ok()) return prefix.status();
  if (prefix->size() == 8) {
    uint64_t len = 0;
    for (int i = 7; i >= 0; --i)
      len = len << 8 | static_cast<uint8_t>((*prefix)[static_cast<size_t>(i)]);
    if (len <= kMaxSafetensorsHeader && len > max_header_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path.string(), ": the safetensors header is ", len, " bytes, over the ", max_header_bytes,
          " that the ", f.name.empty() ? "file" : "index's tensors for this file",
          " allow: not read"));
    }
    if (len <= kMaxSafetensorsHeader && len <= f.size - 8) {
      prefix = ReadPrefix(f.fd.get(), 8 + len, path);
      if (!prefix.ok()) return prefix.status();
    }
  }
  absl::StatusOr<SafetensorsHeader> header = ParseSafetensorsHeader(*prefix, f.size);
  if (!header.ok()) return Annotate(header.status(), path.string());
  f.header = *std::move(header);
  return f;
}

// Long on purpose: the index and every file it names are checked against
// each other in one pass (each tensor mapped once, to the file that holds
// it, and nothing else in any file), with one message per mismatch.
absl::StatusOr<CheckpointReader> CheckpointReader::Open(const fs::path& dir) {
  CheckpointReader r;
  r.dir_ = dir;
  absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
  if (!index.ok()) return index.status();
  r.index_ = *std::move(index);
  absl::StatusOr<std::optional<int64_t>> version = r.index_.version();
  if (!version.ok()) return Annotate(version.status(), (dir / kIndexFileName).string());
  r.version_ = *version;
  if (!r.index_.is_delta()) {
    const std::string key = "checksum_format";
    if (r.index_.other_metadata.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          (dir / kIndexFileName).string(), ": metadata.checksum_format is not a string (",
          r.index_.other_metadata.at(key), "); expected \"", AbslView(kChecksumFormat), "\""));
    }
    if (auto it = r.index_.metadata.find(key); it != r.index_.metadata.end()) {
      if (it->second != kChecksumFormat) {
        return absl::InvalidArgumentError(
            absl::StrCat((dir / kIndexFileName).string(), ": unsupported checksum_format \"",
                         it->second, "\": Stitch reads only \"", AbslView(kChecksumFormat), "\""));
      }
      r.records_checksums_ = true;
    }
  }

  // Distinct files in name order; tensors grouped by the file the index
  // says holds them.
  std::map<std::string, std::vector<std::string>> by_file;
  for (const auto& [tensor, file] : r.index_.weight_map) by_file[file].push_back(tensor);
  for (auto& [file, expected] : by_file) {
    const fs::path path = dir / file;
    absl::StatusOr<CheckpointFile> f =
        OpenSafetensorsForReading(path, file, MaxHeaderBytesFor(expected.size()));
    if (!f.ok()) {
      if (absl::IsNotFound(f.status())) {
        return absl::NotFoundError(absl::StrCat("checkpoint ", dir.string(), ": payload file \"",
                                                file, "\" listed in the index is missing"));
      }
      return f.status();
    }
    const size_t file_index = r.files_.size();
    std::map<std::string_view, const TensorInfo*> present;
    for (const TensorInfo& t : f->header.tensors) present.emplace(t.name, &t);
    for (const std::string& tensor : expected) {
      auto it = present.find(tensor);
      if (it == present.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path.string(), ": the index maps tensor \"", tensor,
                         "\" to this file, but the file does not hold it"));
      }
      const TensorInfo& t = *it->second;
      std::optional<Checksum128> checksum;
      if (r.records_checksums_) {
        auto recorded = f->header.metadata.find(t.name);
        if (recorded == f->header.metadata.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path.string(), ": tensor \"", tensor,
                           "\": the file's __metadata__ has no xxh3-128 checksum for it, but the "
                           "index records checksum_format \"",
                           AbslView(kChecksumFormat), "\""));
        }
        absl::StatusOr<Checksum128> parsed = Checksum128::FromHex(recorded->second);
        if (!parsed.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(path.string(), ": tensor \"", tensor,
                           "\": recorded checksum: ", parsed.status().message()));
        }
        checksum = *parsed;
      }
      r.tensors_.push_back(CheckpointTensor{t.name, t.dtype, t.shape, file_index,
                                            f->header.data_start + t.begin, t.nbytes(), checksum});
      r.total_bytes_ += t.nbytes();
      present.erase(it);
    }
    if (!present.empty()) {
      const std::string& stray = std::string(present.begin()->first);
      auto mapped = r.index_.weight_map.find(stray);
      return absl::InvalidArgumentError(absl::StrCat(
          path.string(), ": holds tensor \"", stray, "\", which the index ",
          mapped == r.index_.weight_map.end() ? std::string("does not list")
                                              : absl::StrCat("maps to \"", mapped->second, "\"")));
    }
    r.files_.push_back(*std::move(f));
  }
  std::sort(r.tensors_.begin(), r.tensors_.end(),
            [](const CheckpointTensor& a, const CheckpointTensor& b) { return a.name < b.name; });
  return r;
}

absl::Status CompareRecordedChecksum(const CheckpointTensor& t, const CheckpointFile& file,
                                     const Checksum128& actual) {
  if (!t.checksum || *t.checksum == actual) return absl::OkStatus();
  return WithKind(absl::DataLossError(absl::StrCat(
                      file.path.string(), ": tensor \"", t.name, "\" hashes to ", actual.ToHex(),
                      " but the file records xxh3-128 ", t.checksum->ToHex(),
                      "; its bytes changed after the version was written: write it again")),
                  ErrorKind::kChecksumMismatch);
}

absl::StatusOr<Checksum128> HashFileRange(const CheckpointFile& f, uint64_t offset,
                                          uint64_t nbytes) {
  constexpr uint64_t kPiece = 1 << 20;
  std::vector<std::byte> buf(static_cast<size_t>(std::min(kPiece, nbytes)));
  Xxh3Hasher hasher;
  for (uint64_t done = 0; done < nbytes;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), nbytes - done));
    ssize_t n = ::pread(f.fd.get(), buf.data(), want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", f.path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("read ", f.path.string(), ": the file ends at byte ",
                                              offset + done, ", before its header says"));
    }
    hasher.Update(std::span(buf.data(), static_cast<size_t>(n)));
    done += static_cast<uint64_t>(n);
  }
  return hasher.Digest();
}

absl::StatusOr<Checksum128> HashTensor(const CheckpointReader& reader, const CheckpointTensor& t) {
  return HashFileRange(reader.files()[t.file], t.offset, t.nbytes);
}

absl::Status VerifyRecordedChecksum(const CheckpointReader& reader, const CheckpointTensor& t) {
  if (!t.checksum) return absl::OkStatus();
  absl::StatusOr<Checksum128> actual = HashTensor(reader, t);
  if (!actual.ok()) return actual.status();
  return CompareRecordedChecksum(t, reader.files()[t.file], *actual);
}

const CheckpointTensor* CheckpointReader::Find(std::string_view name) const {
  auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const CheckpointTensor& t, std::string_view n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

}  // namespace stitch
