#include "stitch/refengine/init_model.h"

#include <system_error>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"
#include "stitch/io/fileio.h"
#include "stitch/refengine/hf_tokenizer.h"

namespace stitch {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kWeightsFileName = "model.safetensors";

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64: a tiny generator whose output is the same on every platform.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() { return Mix64(state_ += 0x9e3779b97f4a7c15ull); }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

 private:
  uint64_t state_;
};

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

bool IsNorm(std::string_view name) {
  return name.ends_with("layernorm.weight") || name == "model.norm.weight";
}

absl::Status WriteFiles(const fs::path& dir, const ModelConfig& config,
                        std::span<const TensorView> tensors) {
  const fs::path weights_path = dir / kWeightsFileName;
  const fs::path tmp = TempSiblingPath(weights_path);
  std::vector<TensorView> views(tensors.begin(), tensors.end());
  if (absl::Status s = WriteSafetensors(tmp, views, {{"format", "pt"}}); !s.ok()) {
    std::error_code ec;
    fs::remove(tmp, ec);
    return s;
  }
  if (std::error_code ec; fs::rename(tmp, weights_path, ec), ec) {
    fs::remove(tmp, ec);
    return absl::InternalError(
        absl::StrCat("rename to ", weights_path.string(), ": ", ec.message()));
  }
  if (absl::Status s = FsyncPath(dir); !s.ok()) return s;

  if (absl::Status s = WriteFileAtomically(dir / kModelConfigFileName, config.ToJson()); !s.ok()) {
    return s;
  }
  CheckpointIndex index;
  uint64_t total = 0;
  for (const TensorView& t : tensors) {
    index.weight_map[t.name] = std::string(kWeightsFileName);
    total += t.data.size();
  }
  index.other_metadata["total_size"] = absl::StrCat(total);
  if (absl::Status s = WriteHfTokenizerFiles(dir, config); !s.ok()) return s;
  return WriteIndex(dir, index);
}

}  // namespace

std::vector<HostTensor> RandomCheckpointTensors(const ModelConfig& config, uint64_t seed) {
  std::vector<HostTensor> out;
  std::vector<float> values;
  for (const TensorSpec& spec : ExpectedTensors(config)) {
    int64_t numel = 1;
    for (int64_t d : spec.shape) numel *= d;
    values.assign(static_cast<size_t>(numel), 1.0f);
    if (!IsNorm(spec.name)) {
      SplitMix64 rng(Mix64(seed) ^ Fnv1a(spec.name));
      for (float& v : values) {
        double sum = 0;
        for (int k = 0; k < 12; ++k) sum += rng.Uniform();
        v = static_cast<float>(kInitStd * (sum - 6.0));
      }
    }
    out.push_back(HostTensor::FromFloats(spec.name, spec.shape, values, config.weight_dtype));
  }
  return out;
}

absl::Status WriteCheckpoint(const fs::path& dir_in, const ModelConfig& config,
                             std::span<const TensorView> tensors, ExistingDir existing) {
  fs::path dir = dir_in.lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  const std::string where = absl::StrCat("checkpoint ", dir.string());
  if (absl::Status s = ValidateTensors(config, tensors); !s.ok()) return Annotate(s, where);

  std::error_code ec;
  const bool exists = fs::exists(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(where, ": ", ec.message()));
  if (exists && !fs::is_directory(dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat(where, ": the path exists and is not a directory; choose another path"));
  }
  const bool empty = !exists || fs::is_empty(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(where, ": ", ec.message()));
  if (!empty) {
    if (existing == ExistingDir::kRefuse) {
      return absl::AlreadyExistsError(
          absl::StrCat(where,
                       ": the directory is not empty; choose a new directory or overwrite its "
                       "checkpoint files (--force)"));
    }
    if (absl::Status s = WriteFiles(dir, config, tensors); !s.ok()) return Annotate(s, where);
    return absl::OkStatus();
  }

  if (dir.has_parent_path()) {
    fs::create_directories(dir.parent_path(), ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat(where, ": create ", dir.parent_path().string(), ": ", ec.message()));
    }
  }
  const fs::path tmp = TempSiblingPath(dir);
  fs::create_directory(tmp, ec);
  if (ec)
    return absl::InternalError(absl::StrCat(where, ": create ", tmp.string(), ": ", ec.message()));
  absl::Status s = WriteFiles(tmp, config, tensors);
  if (s.ok()) s = RenameDurably(tmp, dir);
  if (!s.ok()) {
    fs::remove_all(tmp, ec);
    return Annotate(s, where);
  }
  return absl::OkStatus();
}

}  // namespace stitch
