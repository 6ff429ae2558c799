// Safetensors files: a strict reader (memory-mapped) and a durable writer.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON header
// ({"<tensor>": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
//   "__metadata__": {"<key>": "<string>"}}), then the data section. Offsets are
// relative to the data section. The reader rejects, with a message naming the
// file and the reason: a header length beyond the file or above
// kMaxSafetensorsHeader, a header that is not a JSON object, an unknown dtype,
// a shape whose element count times dtype size disagrees with the byte range,
// ranges out of bounds, overlapping ranges, holes between ranges, and a file
// size that does not match the end of the last range. It also rejects a tensor
// entry that is not an object of exactly dtype/shape/data_offsets, negative
// dimensions, a tensor name given twice, and a `__metadata__` that is not an
// object of strings. Zero-size tensors (a dimension of 0, begin == end) are
// legal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stitch {

inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

enum class DType {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
  kF8E4M3,
  kF8E5M2
};

// "BOOL", "U8", ..., "BF16", "F32", "F8_E4M3", "F8_E5M2" (safetensors spelling).
std::string_view DTypeName(DType d);
[[nodiscard]] absl::StatusOr<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType d);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offset in the data section
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
  // The product of `shape` (1 for a scalar); -1 if it overflows int64 (never
  // for a tensor of a validated header).
  int64_t numel() const;
};

// A parsed, validated header. Tensors are sorted by `begin`.
struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_start = 0;  // 8 + header length
};

// Validates and parses a header. `prefix` holds at least the first
// min(file_size, 8 + header length) bytes of the file; `file_size` is the
// whole file's size. Pure: no I/O, safe on arbitrary bytes (fuzzed). Errors
// are InvalidArgument, one line, without the file name (callers add it).
[[nodiscard]] absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(
    std::span<const std::byte> prefix, uint64_t file_size);

// Reads and validates only the header of the file at `path` (no mapping).
// Errors name the file.
[[nodiscard]] absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(
    const std::filesystem::path& path);

// A read-only, memory-mapped safetensors file. Move-only. Thread-safe for
// concurrent reads.
class SafetensorsFile {
 public:
  [[nodiscard]] static absl::StatusOr<SafetensorsFile> Open(const std::filesystem::path& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }

  // nullptr when absent. O(log n).
  const TensorInfo* Find(std::string_view name) const;

  // The tensor's bytes, valid while this object lives. The pages are mapped,
  // not read: touching them faults them in. REQUIRES: `t` is one of tensors().
  std::span<const std::byte> Data(const TensorInfo& t) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  SafetensorsHeader header_;
  std::vector<uint32_t> by_name_;  // indexes into header_.tensors, sorted by name
  const std::byte* map_ = nullptr;
  size_t map_size_ = 0;
};

// Writes a safetensors file whose tensors are known up front (name, dtype,
// shape) and whose bytes are produced in order. Usage:
//   SafetensorsWriter w;
//   w.Add("a", DType::kF32, {2, 3}, 24);   // declare, in file order
//   w.SetMetadata("k", "v");
//   auto file = w.Begin(path);             // writes the header
//   file->Append(bytes) ... (exactly the declared bytes, in order)
//   file->Finish();                        // fsyncs the file
// The header lists tensors in declaration order with contiguous data_offsets
// from 0, and `__metadata__` only when metadata was set. Destroying an Output
// before Finish leaves a partial file behind: write to a temporary path.
class SafetensorsWriter {
 public:
  class Output {
   public:
    virtual ~Output() = default;
    // Appends the next bytes of the data section (buffered). InvalidArgument,
    // writing nothing, when they go beyond the declared size; after a write
    // error every later call returns that error.
    [[nodiscard]] virtual absl::Status Append(std::span<const std::byte> bytes) = 0;
    // REQUIRES: every declared byte was appended (InvalidArgument otherwise).
    // Flushes, fsyncs and closes the file; it is complete once this returns OK.
    [[nodiscard]] virtual absl::Status Finish() = 0;
  };

  // Declares the next tensor. `nbytes` must equal numel * dtype size (a U8
  // tensor of shape [nbytes] always does). Errors (InvalidArgument): a name
  // already declared or "__metadata__", a negative dimension, a size mismatch.
  [[nodiscard]] absl::Status Add(std::string name, DType dtype, std::vector<int64_t> shape,
                                 uint64_t nbytes);
  void SetMetadata(std::string key, std::string value);

  // Creates (truncates) `path` and writes the header.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<Output>> Begin(
      const std::filesystem::path& path) const;

  // The serialized header (8-byte length + JSON, padded with spaces to a
  // multiple of 8 bytes).
  std::string SerializeHeader() const;
  uint64_t data_size() const { return data_size_; }

 private:
  std::vector<TensorInfo> tensors_;
  std::set<std::string, std::less<>> names_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_size_ = 0;
};

// A tensor with its bytes in memory, for the convenience writer below.
struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};

// Writes `tensors` (in the given order) and `metadata` to `path`, fsync'ed.
[[nodiscard]] absl::Status WriteSafetensors(
    const std::filesystem::path& path, const std::vector<TensorView>& tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace stitch
