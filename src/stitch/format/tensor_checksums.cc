#include "stitch/format/tensor_checksums.h"

#include "absl/strings/str_cat.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/format/index.h"

namespace stitch {

absl::StatusOr<std::optional<TensorChecksums>> ReadRecordedChecksums(
    const std::filesystem::path& dir) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
  if (!index.ok()) return index.status();
  if (index->is_delta()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir.string(),
                     " is a DELTA version: it records checksums only of the tensors it changes; "
                     "read them from the checkpoint it produces (stitch delta apply)"));
  }
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return reader.status();
  if (!reader->records_checksums()) return std::optional<TensorChecksums>();
  TensorChecksums out;
  for (const CheckpointTensor& t : reader->tensors()) out.emplace(t.name, *t.checksum);
  return std::optional<TensorChecksums>(std::move(out));
}

}  // namespace stitch
