#include "tests/support/version_dirs.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/version.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"

namespace stitch::testing {
namespace fs = std::filesystem;

std::string TestShardName(const TestVersionOptions& options, int shard) {
  return absl::StrFormat("%smodel-%05d-of-%05d.safetensors", options.file_prefix, shard + 1,
                         options.shards);
}

absl::Status WriteTestVersionAt(const fs::path& dir, int64_t version,
                                const TestVersionOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", dir.string(), ": ", ec.message()));
  CheckpointIndex index;
  if (options.record_version) index.metadata["version"] = VersionMetadataString(version);
  for (int shard = 0; shard < options.shards; ++shard) {
    std::string file = TestShardName(options, shard);
    fs::create_directories((dir / file).parent_path(), ec);
    std::vector<std::vector<float>> values;
    std::vector<TensorView> tensors;
    for (int t = 0; t < options.tensors_per_shard; ++t) {
      std::vector<float>& v = values.emplace_back(static_cast<size_t>(options.elements));
      for (size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<float>(options.seed * 100003 + shard * 1009 + t * 101) +
               static_cast<float>(i) * 0.5f;
      }
    }
    for (int t = 0; t < options.tensors_per_shard; ++t) {
      std::string name = absl::StrCat("layers.", shard, ".w", t);
      tensors.push_back(TensorView{name,
                                   DType::kF32,
                                   {options.elements},
                                   std::as_bytes(std::span(values[static_cast<size_t>(t)]))});
      index.weight_map[name] = file;
    }
    if (absl::Status s = WriteSafetensors(dir / file, tensors); !s.ok()) return s;
  }
  return WriteIndex(dir, index);
}

absl::StatusOr<fs::path> WriteTestVersion(const fs::path& parent, int64_t version,
                                          const TestVersionOptions& options) {
  fs::path dir = parent / VersionDirName(version);
  if (absl::Status s = WriteTestVersionAt(dir, version, options); !s.ok()) return s;
  return dir;
}

absl::Status VerifyVersionDir(const fs::path& dir) {
  auto index = ReadIndex(dir);
  if (!index.ok()) return index.status();
  auto manifest = index->ToManifest();
  if (!manifest.ok()) return manifest.status();
  for (const std::string& file : manifest->files) {
    auto opened = SafetensorsFile::Open(dir / file);
    if (!opened.ok()) return opened.status();
  }
  return absl::OkStatus();
}

}  // namespace stitch::testing
