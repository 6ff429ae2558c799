// Deterministic random checkpoints for the reference engine, and the writer
// that puts a checkpoint on disk in Hugging Face's layout:
//   <dir>/config.json
//   <dir>/model.safetensors               (metadata {"format": "pt"})
//   <dir>/model.safetensors.index.json    (weight_map -> model.safetensors,
//                                          metadata {"total_size": N}, no version)
//   <dir>/tokenizer.json, tokenizer_config.json, special_tokens_map.json,
//   generation_config.json                (hf_tokenizer.h: so that real
//                                          engines load the checkpoint too)
// The same configuration and seed give byte-identical files on every machine:
// the random numbers come from our own generator and plain float arithmetic.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch {

// The standard deviation of the random projection and embedding weights.
inline constexpr double kInitStd = 0.02;

// Every tensor of ExpectedTensors(config), in that order, stored as
// config.weight_dtype: norms are 1, everything else is drawn from an
// approximately normal distribution (the sum of 12 uniforms, recentred) with
// standard deviation kInitStd. Each tensor draws from its own stream, seeded
// by `seed` and its name, so a tensor's values do not depend on the others.
// REQUIRES: config.Validate() is OK.
std::vector<HostTensor> RandomCheckpointTensors(const ModelConfig& config, uint64_t seed);

enum class ExistingDir {
  kRefuse,     // `dir` must be absent or empty
  kOverwrite,  // replace the checkpoint files in `dir`; leave its other files
};

// Writes a checkpoint of `config` holding `tensors` (checked by
// ValidateTensors) into `dir`, creating missing parent directories. A new or
// empty `dir` is built complete beside it and renamed into place, so a crash
// never leaves a partial checkpoint there; with kOverwrite each file is
// replaced atomically, one after the other. Everything is fsync'ed.
// AlreadyExists when `dir` is not empty and `existing` is kRefuse.
[[nodiscard]] absl::Status WriteCheckpoint(const std::filesystem::path& dir,
                                           const ModelConfig& config,
                                           std::span<const TensorView> tensors,
                                           ExistingDir existing);

}  // namespace stitch
