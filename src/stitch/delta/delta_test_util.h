// Test helpers for the delta codec's tests: temporary directories, synthetic
// checkpoints, and reading or rewriting what the codec wrote. Test-only.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "stitch/delta/delta_encode.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/format/index.h"
#include "stitch/format/safetensors.h"
#include "stitch/io/fileio.h"

namespace stitch::testing {

namespace fs = std::filesystem;

// A fresh directory under the test temp dir, removed with its contents. (Not
// tests/support's TempDir: format tests may not depend on tests/.)
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "stitch-delta-XXXXXX").string();
    char* made = ::mkdtemp(tmpl.data());
    if (made == nullptr) ADD_FAILURE() << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(std::string_view name) const { return path_ / name; }

 private:
  fs::path path_;
};

// One tensor of a synthetic checkpoint.
struct TestTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  std::string file = "model.safetensors";
};
using TestCheckpoint = std::map<std::string, TestTensor>;

inline uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

inline std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, n - i));
  }
  return out;
}

inline TestTensor RandomTensor(DType dtype, std::vector<int64_t> shape, uint64_t seed,
                               std::string file = "model.safetensors") {
  TestTensor t{dtype, std::move(shape), {}, std::move(file)};
  t.bytes = RandomBytes(Numel(t.shape) * DTypeSize(dtype), seed);
  return t;
}

// Changes about `fraction` of the bytes (at least one) of every tensor
// selected by `pick`, the way a training step would nudge a few values.
inline TestCheckpoint Nudge(TestCheckpoint c, double fraction, uint64_t seed,
                            const std::function<bool(const std::string&)>& pick = nullptr) {
  std::mt19937_64 rng(seed);
  for (auto& [name, t] : c) {
    if (t.bytes.empty() || (pick && !pick(name))) continue;
    const size_t changes = std::max<size_t>(1, static_cast<size_t>(fraction * t.bytes.size()));
    for (size_t i = 0; i < changes; ++i) {
      size_t at = rng() % t.bytes.size();
      t.bytes[at] ^= std::byte{static_cast<unsigned char>(1 + rng() % 255)};
    }
  }
  return c;
}

// Writes `c` as a checkpoint directory: one safetensors file per distinct
// TestTensor::file and an index with `metadata`.
inline void WriteCheckpoint(const fs::path& dir, const TestCheckpoint& c,
                            const std::map<std::string, std::string>& metadata = {}) {
  fs::create_directories(dir);
  std::map<std::string, std::vector<TensorView>> files;
  CheckpointIndex index;
  index.metadata = metadata;
  for (const auto& [name, t] : c) {
    files[t.file].push_back(TensorView{name, t.dtype, t.shape, t.bytes});
    index.weight_map[name] = t.file;
  }
  for (const auto& [file, views] : files) {
    fs::create_directories((dir / file).parent_path());
    absl::Status s = WriteSafetensors(dir / file, views);
    ASSERT_TRUE(s.ok()) << s;
  }
  absl::Status s = WriteIndex(dir, index);
  ASSERT_TRUE(s.ok()) << s;
}

// Every tensor's bytes in the checkpoint directory `dir`.
inline std::map<std::string, std::vector<std::byte>> ReadTensors(const fs::path& dir) {
  std::map<std::string, std::vector<std::byte>> out;
  absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(dir);
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return out;
  for (const CheckpointTensor& t : r->tensors()) {
    std::vector<std::byte> bytes(t.nbytes);
    const CheckpointFile& f = r->files()[t.file];
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::pread(f.fd.get(), bytes.data() + done, bytes.size() - done,
                          static_cast<off_t>(t.offset + done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    EXPECT_EQ(done, bytes.size()) << t.name;
    out[t.name] = std::move(bytes);
  }
  return out;
}

inline std::map<std::string, std::vector<std::byte>> BytesOf(const TestCheckpoint& c) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, t] : c) out[name] = t.bytes;
  return out;
}

// Every regular file under `dir` (relative path -> contents): a snapshot to
// prove a destination was left untouched.
inline std::map<std::string, std::string> SnapshotTree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    absl::StatusOr<std::string> text = ReadFileToString(it->path());
    out[fs::relative(it->path(), dir).string()] = text.ok() ? *text : "<unreadable>";
  }
  return out;
}

// One entry of a delta payload file, for tests that corrupt deltas.
struct PayloadEntry {
  std::string tensor;
  std::vector<std::byte> frame;
  std::string checksum;
};

// Rewrites every payload file of the delta in `dir`, passing each entry
// through `edit` (which may change the frame bytes or the checksum).
inline void RewritePayloads(const fs::path& dir, const std::function<void(PayloadEntry&)>& edit) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
  ASSERT_TRUE(index.ok()) << index.status();
  std::map<std::string, bool> files;
  for (const auto& [tensor, file] : index->weight_map) files[file] = true;
  for (const auto& [file, unused] : files) {
    std::vector<PayloadEntry> entries;
    {
      absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(dir / file);
      ASSERT_TRUE(f.ok()) << f.status();
      for (const TensorInfo& t : f->tensors()) {
        std::span<const std::byte> d = f->Data(t);
        entries.push_back(PayloadEntry{t.name, {d.begin(), d.end()}, f->metadata().at(t.name)});
      }
    }
    std::map<std::string, std::string> metadata;
    for (PayloadEntry& e : entries) {
      edit(e);
      metadata[e.tensor] = e.checksum;
    }
    std::vector<TensorView> views;
    for (const PayloadEntry& e : entries) {
      views.push_back(
          TensorView{e.tensor, DType::kU8, {static_cast<int64_t>(e.frame.size())}, e.frame});
    }
    absl::Status s = WriteSafetensors(dir / file, views, metadata);
    ASSERT_TRUE(s.ok()) << s;
  }
}

// Rewrites the index of the version in `dir` through `edit`.
inline void EditIndex(const fs::path& dir, const std::function<void(CheckpointIndex&)>& edit) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
  ASSERT_TRUE(index.ok()) << index.status();
  edit(*index);
  ASSERT_TRUE(WriteFileAtomically(dir / "model.safetensors.index.json", index->ToJson()).ok());
}

// Writes every one of `versions` as a checkpoint at ckpt(v) recording its
// version, and the DELTA from each to the next at delta(v), of run `run_id`.
inline void WriteVersionChain(const std::vector<TestCheckpoint>& versions,
                              const std::string& run_id,
                              const std::function<fs::path(size_t)>& ckpt,
                              const std::function<fs::path(size_t)>& delta) {
  for (size_t v = 0; v < versions.size(); ++v) {
    WriteCheckpoint(ckpt(v), versions[v],
                    {{"version", VersionMetadataString(static_cast<int64_t>(v))}});
  }
  for (size_t v = 1; v < versions.size(); ++v) {
    EncodeOptions o;
    o.version = static_cast<int64_t>(v);
    o.run_id = run_id;
    absl::StatusOr<EncodeResult> encoded = EncodeDelta(ckpt(v - 1), ckpt(v), delta(v), o);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
  }
}

}  // namespace stitch::testing
