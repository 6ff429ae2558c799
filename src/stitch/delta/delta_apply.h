// Applying DELTA versions: materializing a checkpoint directory at a target
// version from an anchor (a FULL version or the boot checkpoint) and the
// chain of deltas after it. The in-memory destination is checkpoint_image.h.
//
// Everything is validated before a byte is written: the anchor's files and
// headers, every delta's index, files, headers and frame headers, the
// lineage (consecutive versions of one run starting at the anchor), and that
// every changed tensor exists with the size its frames decode to. Then, for
// each changed tensor, the base is read once, every delta of the chain is
// folded into it in one streaming pass, the target checksum is verified, and
// the result is written once. Starting from an anchor that records checksums
// (a FULL version Stitch wrote, checkpoint_reader.h), every tensor the chain
// leaves unchanged is checked against its checksum as well.
//
// The destination directory `out_dir`:
//   - holds a marker file, kHeldVersionFileName, with the version identity
//     it holds ("<run>/weight_vNNNNNN", or bare without a run), and an index
//     whose metadata.version is that version;
//   - when it already holds an earlier version of the same run, at or after
//     the anchor, only the newer deltas are applied to what it holds; a
//     target older than what it holds, another run, or a held checkpoint that
//     does not match the anchor's tensors reseeds from the anchor;
//   - is replaced atomically and durably: a new generation is built in a
//     temporary sibling directory (fsync'ed), then swapped with `out_dir` in
//     one renameat2(RENAME_EXCHANGE) (a plain rename when `out_dir` does not
//     exist yet), and the old generation is removed. Readers see the old
//     complete version or the new one. Files whose tensors are all unchanged
//     are hard links to the previous generation's files, not copies; in a
//     file with some changed tensors, the unchanged ones are copied in the
//     kernel (copy_file_range), never decoded. On a filesystem without
//     RENAME_EXCHANGE, the swap is two renames, and a crash between them
//     leaves `out_dir` missing (the next apply reseeds from the anchor).
//   - On any error it is untouched.
// Other files of the anchor directory (config.json, tokenizer files: regular
// top-level files that are neither safetensors nor the index) are copied
// into the destination. A lock file beside `out_dir` (".<name>.lock")
// serializes appliers of the same destination across processes.
//
// Memory is bounded: tensor bytes stream through per-worker chunk buffers
// (pread from the base, pwrite to the new file); nothing is memory-mapped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_kernel.h"

namespace stitch {

// The marker a materialized directory holds.
inline constexpr std::string_view kHeldVersionFileName = ".stitch-version";

struct ApplyOptions {
  // The run the versions belong to. Empty: the run the anchor's or the
  // deltas' index metadata names (they must agree), if any.
  std::string run_id;
  // The version of an anchor whose index records none (a boot checkpoint).
  // Default: the version the first delta applies to.
  std::optional<int64_t> anchor_version;
  int threads = 0;                   // 0: DefaultThreads()
  ProgressMeter::Callback progress;  // may be called from any worker thread
};

struct MaterializeResult {
  VersionRef version;      // what the destination holds now
  int64_t applied_on = 0;  // the version the deltas were folded into
  bool reseeded = false;   // started from the anchor, not from the destination
  size_t deltas_applied = 0;
  size_t tensors_changed = 0;
  size_t files_written = 0;    // files with changed tensors, written anew
  size_t files_linked = 0;     // unchanged files hard-linked from the previous generation
  size_t files_copied = 0;     // unchanged files copied from the anchor
  uint64_t bytes_decoded = 0;  // bytes of changed tensors
  double write_seconds = 0;    // decoding, folding and writing
  double sync_seconds = 0;     // fsync and the swap
};

// Brings `out_dir` to the version the last of `delta_dirs` produces (the
// anchor's version when there are none). `delta_dirs` may be given in any
// order. Errors (one line, naming the file or tensor):
//   NotFound           a missing directory or file
//   InvalidArgument    a malformed index or header, a broken lineage (gap,
//                      wrong base_version, a chain that does not start at
//                      the anchor), a delta that changes an unknown tensor
//   FailedPrecondition a version of another run; `out_dir` exists and is
//                      neither empty nor a materialized checkpoint
//   DataLoss           a corrupt or truncated frame; kind kChecksumMismatch
//                      when a result, or an anchor tensor, does not match its
//                      recorded checksum
[[nodiscard]] absl::StatusOr<MaterializeResult> MaterializeCheckpoint(
    const std::filesystem::path& anchor_dir, std::span<const std::filesystem::path> delta_dirs,
    const std::filesystem::path& out_dir, const ApplyOptions& options);

// The version a materialized directory holds (its marker); nullopt when
// `dir` does not exist or is empty. FailedPrecondition when `dir` holds
// files but no marker (not a directory this codec wrote).
[[nodiscard]] absl::StatusOr<std::optional<VersionRef>> ReadHeldVersion(
    const std::filesystem::path& dir);

}  // namespace stitch
