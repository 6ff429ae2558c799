// A checkpoint directory opened for streaming: its index, an open descriptor
// and the parsed header of every payload file, and a table of its tensors
// with the checksums it records. Nothing is mapped or cached; the codec
// reads tensor bytes with pread in bounded chunks, so opening even a large
// checkpoint costs only its headers.
//
// Recorded checksums: a FULL version Stitch writes has `checksum_format:
// "xxh3-128"` in its index metadata, and each payload file's `__metadata__`
// maps every tensor of that file to the xxh3-128 of its bytes (32 hex
// digits, checksum.h). A checkpoint whose index has no checksum_format (an
// older FULL version, a boot checkpoint, a directory the codec
// materialized) records none and is read as before.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/format/checksum.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"
#include "stitch/io/fileio.h"

namespace stitch {

struct CheckpointTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  size_t file = 0;      // index into CheckpointReader::files()
  uint64_t offset = 0;  // of the first byte, from the start of the file
  uint64_t nbytes = 0;
  // The xxh3-128 the checkpoint records for the tensor's bytes; set for
  // every tensor when CheckpointReader::records_checksums(), else never.
  std::optional<Checksum128> checksum;
};

struct CheckpointFile {
  std::string name;  // as in the index's weight_map
  std::filesystem::path path;
  UniqueFd fd;
  uint64_t size = 0;
  SafetensorsHeader header;
};

// Move-only. Thread-safe for concurrent reads (pread on shared descriptors).
class CheckpointReader {
 public:
  // Reads `dir`'s index (or its single model.safetensors, see ReadIndex),
  // opens every payload file the weight_map names and validates its header.
  // Errors name the directory and file: NotFound for a missing file,
  // InvalidArgument for a bad index or header, and for a weight_map that
  // disagrees with the files (a listed tensor missing from its file, or a
  // file holding a tensor the weight_map maps elsewhere or not at all).
  // A checkpoint that records checksums (see above) must record a valid one
  // for every tensor, and name no other checksum_format: InvalidArgument
  // naming the file and tensor otherwise. The bytes are not read here
  // (VerifyRecordedChecksum does).
  [[nodiscard]] static absl::StatusOr<CheckpointReader> Open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const CheckpointIndex& index() const { return index_; }
  // metadata.version, when the index records one.
  std::optional<int64_t> version() const { return version_; }
  const std::vector<CheckpointFile>& files() const { return files_; }
  // Sorted by name.
  const std::vector<CheckpointTensor>& tensors() const { return tensors_; }
  // nullptr when absent.
  const CheckpointTensor* Find(std::string_view name) const;
  uint64_t total_bytes() const { return total_bytes_; }
  // Whether every tensor has a recorded checksum (a FULL version whose index
  // says checksum_format "xxh3-128"). Never true for a DELTA's directory:
  // its checksums are of the target tensors, not of the bytes it holds.
  bool records_checksums() const { return records_checksums_; }

 private:
  std::filesystem::path dir_;
  CheckpointIndex index_;
  std::optional<int64_t> version_;
  bool records_checksums_ = false;
  std::vector<CheckpointFile> files_;
  std::vector<CheckpointTensor> tensors_;
  uint64_t total_bytes_ = 0;
};

// The largest header a file that an index maps `tensors` tensors to may
// have: 1 KiB a tensor (a name, a dtype, a shape, offsets and a checksum
// take a few hundred bytes) plus 1 MiB for its metadata, so that checking a
// hostile header costs memory in proportion to the index, not to the file.
uint64_t MaxHeaderBytesFor(size_t tensors);

// Opens `path` read-only and parses its safetensors header; checks that the
// file's size is what the header says (it did not change in between).
// `max_header_bytes` (at most kMaxSafetensorsHeader) refuses a larger
// header by its length field, before reading or parsing it.
[[nodiscard]] absl::StatusOr<CheckpointFile> OpenSafetensorsForReading(
    const std::filesystem::path& path, std::string name,
    uint64_t max_header_bytes = kMaxSafetensorsHeader);

// OK when tensor `t` of `file` records no checksum or `actual` is it; else
// DataLoss of kind kChecksumMismatch naming the file and the tensor.
[[nodiscard]] absl::Status CompareRecordedChecksum(const CheckpointTensor& t,
                                                   const CheckpointFile& file,
                                                   const Checksum128& actual);

// The xxh3-128 of the `nbytes` bytes at `offset` of the open file `f`
// (pread, bounded chunks). DataLoss when the file ends first. Thread-safe.
[[nodiscard]] absl::StatusOr<Checksum128> HashFileRange(const CheckpointFile& f, uint64_t offset,
                                                        uint64_t nbytes);

// The xxh3-128 of tensor `t`'s bytes, read from `reader` (pread, bounded
// chunks). Thread-safe.
[[nodiscard]] absl::StatusOr<Checksum128> HashTensor(const CheckpointReader& reader,
                                                     const CheckpointTensor& t);

// Reads tensor `t` of `reader` (pread, bounded chunks) and compares its
// xxh3-128 with the recorded checksum (CompareRecordedChecksum); OK at once
// when it records none. Thread-safe.
[[nodiscard]] absl::Status VerifyRecordedChecksum(const CheckpointReader& reader,
                                                  const CheckpointTensor& t);

// The tensor's shape as text: "[2, 3]".
std::string ShapeText(const std::vector<int64_t>& shape);

}  // namespace stitch
