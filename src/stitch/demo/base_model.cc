#include "stitch/demo/base_model.h"

#include <chrono>
#include <span>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stitch {
namespace {

constexpr auto kInitTimeout = std::chrono::seconds(120);

// The checkpoint `stitch engine init-model` wrote, as the trainer's tensors.
absl::StatusOr<BaseModel> LoadBase(const std::filesystem::path& dir) {
  auto config = ReadModelConfig(dir);
  if (!config.ok()) return config.status();
  auto file = SafetensorsFile::Open(dir / "model.safetensors");
  if (!file.ok()) return file.status();
  BaseModel base;
  base.config = *config;
  for (const TensorSpec& spec : ExpectedTensors(*config)) {
    const TensorInfo* info = file->Find(spec.name);
    if (info == nullptr) {
      return absl::DataLossError(absl::StrCat("demo: ", dir.string(), " lacks ", spec.name));
    }
    std::span<const std::byte> data = file->Data(*info);
    base.tensors.push_back(
        HostTensor{info->name, info->dtype, info->shape, {data.begin(), data.end()}});
  }
  return base;
}

}  // namespace

std::vector<std::string> InitModelArgs(const BaseModelOptions& options,
                                       const std::filesystem::path& dir) {
  return {"engine",
          "init-model",
          dir.string(),
          "--layers",
          absl::StrCat(options.layers),
          "--hidden",
          absl::StrCat(options.hidden),
          "--heads",
          "4",
          "--max-positions",
          "256",
          "--dtype",
          options.dtype,
          "--seed",
          absl::StrCat(options.seed)};
}

absl::StatusOr<BaseModel> MakeBaseModel(ProcessSupervisor& supervisor,
                                        const BaseModelOptions& options,
                                        const std::filesystem::path& dir,
                                        const std::filesystem::path& log) {
  auto init = supervisor.Start("init-model", InitModelArgs(options, dir), log);
  if (!init.ok()) return init.status();
  auto status = supervisor.WaitForExit(*init, kInitTimeout);
  if (!status.ok()) return status.status();
  if (*status != 0) {
    return absl::InternalError(absl::StrCat("demo: `stitch engine init-model` exited with ",
                                            *status, "; see ", log.string()));
  }
  return LoadBase(dir);
}

}  // namespace stitch
