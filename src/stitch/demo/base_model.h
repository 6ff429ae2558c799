// The demo's base checkpoint (version 0): written by `stitch engine
// init-model` in a child process, then read back as the trainer's tensors.
// Four attention heads, so that the head dimension is hidden / 4 (a real
// vLLM on CPU needs at least 32: hidden 128 or more); bfloat16 storage for
// real engines, which then load exactly the bytes the trainer publishes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/demo/supervisor.h"
#include "stitch/format/safetensors.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/weights.h"

namespace stitch {

struct BaseModelOptions {
  int hidden = 128;
  int layers = 2;
  uint64_t seed = 0;
  std::string dtype = "float32";  // or "bfloat16"
};

// The arguments after `stitch` that write the checkpoint into `dir`.
std::vector<std::string> InitModelArgs(const BaseModelOptions& options,
                                       const std::filesystem::path& dir);

struct BaseModel {
  ModelConfig config;
  std::vector<HostTensor> tensors;  // ExpectedTensors(config) order, as stored
};

// Runs `stitch engine init-model` through `supervisor` (its output in
// `log`) and loads what it wrote. Internal error naming the log when it
// fails.
[[nodiscard]] absl::StatusOr<BaseModel> MakeBaseModel(ProcessSupervisor& supervisor,
                                                      const BaseModelOptions& options,
                                                      const std::filesystem::path& dir,
                                                      const std::filesystem::path& log);

}  // namespace stitch
