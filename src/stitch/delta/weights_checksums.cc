#include "stitch/delta/weights_checksums.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_version.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/io/fileio.h"

namespace stitch {

absl::StatusOr<TensorChecksums> HashCheckpointTensors(const std::filesystem::path& dir) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return reader.status();
  constexpr uint64_t kChunk = uint64_t{4} << 20;
  std::vector<std::byte> buffer;
  TensorChecksums out;
  for (const CheckpointTensor& t : reader->tensors()) {
    const CheckpointFile& file = reader->files()[t.file];
    buffer.resize(static_cast<size_t>(std::min(kChunk, std::max<uint64_t>(t.nbytes, 1))));
    Xxh3Hasher hasher;
    for (uint64_t done = 0; done < t.nbytes;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer.size(), t.nbytes - done));
      const ssize_t r =
          ::pread(file.fd.get(), buffer.data(), n, static_cast<off_t>(t.offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        return r < 0 ? ErrnoStatus(errno, "reading", file.path)
                     : absl::DataLossError(absl::StrCat(file.path.string(), ": tensor \"", t.name,
                                                        "\" ends past the end of the file"));
      }
      hasher.Update(std::span(buffer.data(), static_cast<size_t>(r)));
      done += static_cast<uint64_t>(r);
    }
    out.emplace(t.name, hasher.Digest());
  }
  return out;
}

absl::StatusOr<TensorChecksums> AnchorChecksums(const std::filesystem::path& dir) {
  absl::StatusOr<std::optional<TensorChecksums>> recorded = ReadRecordedChecksums(dir);
  if (!recorded.ok()) return recorded.status();
  if (recorded->has_value()) return **std::move(recorded);
  return HashCheckpointTensors(dir);
}

absl::Status FoldDeltaChecksums(const std::filesystem::path& dir, TensorChecksums& checksums) {
  absl::StatusOr<DeltaVersion> delta = DeltaVersion::Open(dir);
  if (!delta.ok()) return delta.status();
  for (const DeltaEntry& e : delta->entries()) {
    if (!checksums.contains(e.tensor)) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir.string(), ": the delta changes tensor \"", e.tensor,
                       "\", which the version it applies to does not have"));
    }
  }
  for (const DeltaEntry& e : delta->entries()) checksums[e.tensor] = e.checksum;
  return absl::OkStatus();
}

}  // namespace stitch
