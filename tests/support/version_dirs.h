// Writing small but real version directories (safetensors shards plus a
// Hugging Face index) for tests, and checking that one is complete.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace stitch::testing {

struct TestVersionOptions {
  int shards = 2;             // payload files
  int tensors_per_shard = 2;  // F32 tensors in each
  int64_t elements = 64;      // elements per tensor
  // Every byte depends on the seed: the same seed writes identical files, a
  // different seed different ones.
  int seed = 1;
  // Prepended to each payload file name ("shards/" puts them in a
  // subdirectory).
  std::string file_prefix;
  // Whether the index records metadata.version.
  bool record_version = true;
};

// Writes `<parent>/weight_vNNNNNN` (the canonical name of `version`) and
// returns it.
[[nodiscard]] absl::StatusOr<std::filesystem::path> WriteTestVersion(
    const std::filesystem::path& parent, int64_t version, const TestVersionOptions& options = {});

// Writes the same files into exactly `dir` (created if missing), whatever
// its name.
[[nodiscard]] absl::Status WriteTestVersionAt(const std::filesystem::path& dir, int64_t version,
                                              const TestVersionOptions& options = {});

// The payload file names WriteTestVersion uses, in order.
std::string TestShardName(const TestVersionOptions& options, int shard);

// OK when `dir` is a complete version: its index parses and describes a
// manifest, and every payload file opens as a valid safetensors file (whose
// size matches its header). Otherwise the first problem.
[[nodiscard]] absl::Status VerifyVersionDir(const std::filesystem::path& dir);

}  // namespace stitch::testing
