// A checkpoint directory opened for streaming: its index, an open descriptor
// and the parsed header of every payload file, and a table of its tensors.
// Nothing is mapped or cached; the codec reads tensor bytes with pread in
// bounded chunks, so opening even a large checkpoint costs only its headers.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/format/fileio.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"

namespace stitch {

struct CheckpointTensor {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  size_t file = 0;      // index into CheckpointReader::files()
  uint64_t offset = 0;  // of the first byte, from the start of the file
  uint64_t nbytes = 0;
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

 private:
  std::filesystem::path dir_;
  CheckpointIndex index_;
  std::optional<int64_t> version_;
  std::vector<CheckpointFile> files_;
  std::vector<CheckpointTensor> tensors_;
  uint64_t total_bytes_ = 0;
};

// Opens `path` read-only and parses its safetensors header; checks that the
// file's size is what the header says (it did not change in between).
[[nodiscard]] absl::StatusOr<CheckpointFile> OpenSafetensorsForReading(
    const std::filesystem::path& path, std::string name);

// The tensor's shape as text: "[2, 3]".
std::string ShapeText(const std::vector<int64_t>& shape);

}  // namespace stitch
