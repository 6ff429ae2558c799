// A DELTA version directory opened for reading (docs/design.md, "Delta format"):
// the index with its delta metadata, every payload file's header, and for
// each changed tensor where its zstd frame lies and the checksum of the
// target tensor. Opening checks everything that can be checked without the
// base checkpoint and without decoding the frames:
//   - the index is a DELTA (delta_encoding "xor", compression_format "zstd",
//     checksum_format "xxh3-128", base_version), file names are safe;
//   - every payload file exists and has a valid safetensors header;
//   - each entry is U8 of shape [n], listed in the weight_map for that file,
//     and every weight_map entry is in its file;
//   - the file's __metadata__ holds a 32-hex xxh3-128 for every entry;
//   - each frame starts with a zstd frame header.
// Errors are one line naming the version directory, file and tensor:
// NotFound for a missing file, InvalidArgument for a malformed index or
// header, DataLoss for a frame that is not a zstd frame.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/delta/delta_kernel.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/format/checksum.h"
#include "stitch/format/index.h"

namespace stitch {

// The optional index metadata key naming the run a version belongs to.
// Written by the encoder when it knows the run; checked by the lineage rules
// (a version that names another run breaks the chain).
inline constexpr std::string_view kRunIdMetadataKey = "run_id";

struct DeltaEntry {
  std::string tensor;
  size_t file = 0;                       // index into DeltaVersion::files()
  uint64_t offset = 0;                   // of the frame's first byte, from the start of the file
  uint64_t size = 0;                     // compressed bytes
  Checksum128 checksum;                  // of the complete target tensor
  std::optional<uint64_t> content_size;  // the frame header's, when recorded
};

// Checks the DELTA entries of one opened payload file `f` as
// DeltaVersion::Open checks them, and appends them to `out` with file index
// `file_index`. `expected` lists the tensors the index maps to the file
// (each must be there, and nothing else), or is null to take every tensor
// the file holds (a file checked without its index). `version` labels the
// frames; `where` prefixes the messages.
[[nodiscard]] absl::Status ReadDeltaEntries(const CheckpointFile& f, size_t file_index,
                                            const std::vector<std::string>* expected,
                                            int64_t version, std::string_view where,
                                            std::vector<DeltaEntry>& out);

// Move-only. Thread-safe for concurrent reads.
class DeltaVersion {
 public:
  [[nodiscard]] static absl::StatusOr<DeltaVersion> Open(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const CheckpointIndex& index() const { return index_; }
  int64_t version() const { return version_; }
  int64_t base_version() const { return base_version_; }
  // metadata.run_id, or "" when the index does not name a run.
  const std::string& run_id() const { return run_id_; }
  const std::vector<CheckpointFile>& files() const { return files_; }
  // Sorted by tensor name. Empty for a delta that changes nothing.
  const std::vector<DeltaEntry>& entries() const { return entries_; }
  const DeltaEntry* Find(std::string_view tensor) const;
  uint64_t payload_bytes() const;

  // Where the entry's frame is, labelled "<file path> (version N)".
  FrameRef Frame(const DeltaEntry& e) const;

 private:
  std::filesystem::path dir_;
  CheckpointIndex index_;
  int64_t version_ = 0;
  int64_t base_version_ = 0;
  std::string run_id_;
  std::vector<CheckpointFile> files_;
  std::vector<DeltaEntry> entries_;
};

}  // namespace stitch
