// The streaming core of the delta codec: the fused per-tensor loops, the byte
// sources and sinks they read and write, and the worker pool that runs them
// over many tensors at once.
//
// One tensor is processed in one pass over bounded chunks (kChunkBytes):
//   apply:  zstd-decode the next chunk of every frame of the chain, XOR them
//           into the base chunk, feed the result to xxh3, hand it to the sink;
//   encode: XOR the base and target chunks, feed the XOR to zstd and the
//           target to xxh3, hand compressed bytes to the frame sink.
// Memory per worker is a few chunks plus the zstd contexts, whatever the
// tensor or model size. delta_encode.h, delta_apply.h, checkpoint_image.h
// and delta_verify.h are the public entry points; this header is what they
// share, and what the fuzz target and tests drive directly.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/format/checksum.h"
#include "stitch/io/aligned_buffer.h"
#include "stitch/io/fileio.h"
#include "stitch/io/parallel.h"

namespace stitch {

// Bytes of a tensor processed per step: the decoded chunk and the base chunk
// stay in a core's L2 cache together.
inline constexpr size_t kChunkBytes = 128 * 1024;

// At most this many frames are decoded in lockstep; a longer chain of deltas
// for one tensor is folded in several passes over the destination, so memory
// stays bounded however long the chain is.
inline constexpr size_t kMaxFramesPerPass = 8;

// Default zstd level of encoded frames.
inline constexpr int kDefaultZstdLevel = 1;

// Levels up to this one encode with the codec's zero-run parser instead of
// zstd's match finders: every run of zero bytes in the XOR stream becomes one
// match, every other byte a literal, and zstd entropy-codes that parse. On
// sparse deltas (a few changed bytes per hundred) it is about twice as fast
// as zstd level 1 and its frames are smaller; it finds no repeats other than
// zero runs, which higher levels (zstd's match finders) do. (Built against
// zstd older than 1.5.4, which lacks the API, level 1 is zstd's own.)
inline constexpr int kZeroRunMaxLevel = 1;

// out[i] = a[i] ^ b[i] over 32-byte vectors (GCC/Clang vector extensions;
// memcpy keeps the loads and stores unaligned-safe and compiles to plain
// vector moves), built for the target of the code it is inlined into: the
// codec's own XOR adds an AVX2 clone picked at load time, the benchmarks'
// floors use the baseline build. `out` may be `a` (in place), never
// partially overlap.
[[gnu::always_inline]] inline void XorBytes(std::byte* out, const std::byte* a, const std::byte* b,
                                            size_t n) {
  using Vec = uint64_t __attribute__((vector_size(32)));
  size_t i = 0;
  for (; i + sizeof(Vec) <= n; i += sizeof(Vec)) {
    Vec x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    x ^= y;
    std::memcpy(out + i, &x, sizeof x);
  }
  for (; i < n; ++i) out[i] = a[i] ^ b[i];
}

// Reads one tensor's bytes, chunk by chunk.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // The `scratch.size()` bytes at `offset` of the tensor: either a view of
  // memory the source owns or `scratch`, filled. Valid until the next call.
  [[nodiscard]] virtual absl::StatusOr<std::span<const std::byte>> Read(
      uint64_t offset, std::span<std::byte> scratch) = 0;
};

// Receives one tensor's bytes, chunk by chunk.
class ChunkSink {
 public:
  virtual ~ChunkSink() = default;
  // Where the `scratch.size()` bytes at `offset` go: memory the sink owns, or
  // `scratch`. The caller fills the span, then calls Commit with it.
  virtual std::span<std::byte> Target(uint64_t offset, std::span<std::byte> scratch) = 0;
  [[nodiscard]] virtual absl::Status Commit(uint64_t offset, std::span<const std::byte> bytes) = 0;
  // A source that reads back what was committed, for folds that take
  // several passes; nullptr when the sink cannot be read back.
  virtual ChunkSource* ReadBack() { return nullptr; }
};

// Tensor bytes in memory.
class MemorySource final : public ChunkSource {
 public:
  explicit MemorySource(std::span<const std::byte> bytes) : bytes_(bytes) {}
  absl::StatusOr<std::span<const std::byte>> Read(uint64_t offset,
                                                  std::span<std::byte> scratch) override {
    return bytes_.subspan(offset, scratch.size());
  }

 private:
  std::span<const std::byte> bytes_;
};

// Tensor bytes at `offset` in an open file, read with pread.
class FileSource final : public ChunkSource {
 public:
  FileSource(int fd, uint64_t offset, const std::filesystem::path* path)
      : fd_(fd), offset_(offset), path_(path) {}
  absl::StatusOr<std::span<const std::byte>> Read(uint64_t offset,
                                                  std::span<std::byte> scratch) override;

 private:
  int fd_;
  uint64_t offset_;
  const std::filesystem::path* path_;
};

// Writes into memory (possibly the very memory a MemorySource reads: folding
// in place is supported).
class MemorySink final : public ChunkSink {
 public:
  explicit MemorySink(std::span<std::byte> bytes) : bytes_(bytes), back_(bytes) {}
  std::span<std::byte> Target(uint64_t offset, std::span<std::byte> scratch) override {
    return bytes_.subspan(offset, scratch.size());
  }
  absl::Status Commit(uint64_t, std::span<const std::byte>) override { return absl::OkStatus(); }
  ChunkSource* ReadBack() override { return &back_; }

 private:
  std::span<std::byte> bytes_;
  MemorySource back_;
};

// Writes with pwrite at `offset` in a file opened for reading and writing.
class FileSink final : public ChunkSink {
 public:
  FileSink(int fd, uint64_t offset, const std::filesystem::path* path)
      : fd_(fd), offset_(offset), path_(path), back_(fd, offset, path) {}
  std::span<std::byte> Target(uint64_t, std::span<std::byte> scratch) override { return scratch; }
  absl::Status Commit(uint64_t offset, std::span<const std::byte> bytes) override;
  ChunkSource* ReadBack() override { return &back_; }

 private:
  int fd_;
  uint64_t offset_;
  const std::filesystem::path* path_;
  FileSource back_;
};

// Drops everything (verification only needs the checksum).
class DiscardSink final : public ChunkSink {
 public:
  std::span<std::byte> Target(uint64_t, std::span<std::byte> scratch) override { return scratch; }
  absl::Status Commit(uint64_t, std::span<const std::byte>) override { return absl::OkStatus(); }
};

// Where one zstd frame's compressed bytes are: `size` bytes at `offset` of
// the open file `fd`, or, when fd < 0, `memory`.
struct FrameRef {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t size = 0;
  std::span<const std::byte> memory;
  // Names the frame in messages: the payload file (and version) it is in.
  std::string label;
};

// Receives the compressed bytes of one frame, in order.
class FrameSink {
 public:
  virtual ~FrameSink() = default;
  [[nodiscard]] virtual absl::Status Append(std::span<const std::byte> bytes) = 0;
};

// Counts bytes processed and reports progress to a callback, at most once
// per `step` bytes. Thread-safe.
class ProgressMeter {
 public:
  using Callback = std::function<void(uint64_t done, uint64_t total)>;
  ProgressMeter(uint64_t total, Callback callback, uint64_t step = 16 << 20)
      : total_(total), step_(step), callback_(std::move(callback)) {}
  void Add(uint64_t n);
  // Reports `total` once (call when the work is complete).
  void Finish();

 private:
  const uint64_t total_;
  const uint64_t step_;
  std::atomic<uint64_t> done_{0};
  absl::Mutex mu_;
  Callback callback_ ABSL_GUARDED_BY(mu_);
};

// One worker's reusable zstd contexts and chunk buffers. Create one per
// worker and reuse it for every tensor that worker processes. Not
// thread-safe.
class CodecWorkspace {
 public:
  CodecWorkspace();
  ~CodecWorkspace();
  CodecWorkspace(const CodecWorkspace&) = delete;
  CodecWorkspace& operator=(const CodecWorkspace&) = delete;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// Folds a chain of XOR frames into one tensor: out = base ^ frame_1 ^ ... ^
// frame_k, each frame decoding to exactly `nbytes` bytes.
struct FoldSpec {
  std::string_view tensor;  // for messages
  uint64_t nbytes = 0;
  std::span<const FrameRef> frames;  // in chain order; at least one
  // When set, the result's xxh3-128 must equal it: otherwise DataLoss of kind
  // kChecksumMismatch. Requires limit == nbytes.
  std::optional<Checksum128> expected;
  // Fold only the bytes [0, limit) (limit <= nbytes); frames are still
  // checked to decode those bytes. Used to undo a partial fold: XOR is its
  // own inverse.
  uint64_t limit = UINT64_MAX;
  const std::atomic<bool>* cancel = nullptr;  // stop early (Cancelled)
  ProgressMeter* progress = nullptr;
};

// How far a fold got, for undoing it: frames [0, frames_done) were applied
// to all bytes, and the next min(kMaxFramesPerPass, remaining) frames to the
// bytes [0, prefix_done).
struct FoldProgress {
  size_t frames_done = 0;
  uint64_t prefix_done = 0;
};

// Runs the fold. Errors name the tensor and the frame's label: DataLoss for
// a corrupt or truncated frame, a frame that decodes to more or fewer than
// `nbytes`, trailing bytes after the frame, or (kind kChecksumMismatch) a
// checksum mismatch; errors of the source or sink pass through. `progress`,
// when given, always tells what was committed to `out` even on failure.
// REQUIRES: when frames.size() > kMaxFramesPerPass, out.ReadBack() != nullptr.
[[nodiscard]] absl::Status FoldFrames(CodecWorkspace& ws, const FoldSpec& spec, ChunkSource& base,
                                      ChunkSink& out, FoldProgress* progress = nullptr);

// Encodes one tensor: the zstd frame (content size recorded, no zstd
// checksum, so it matches Python's `zstandard` defaults) of base ^ target.
struct EncodeSpec {
  std::string_view tensor;  // for messages
  uint64_t nbytes = 0;
  int level = kDefaultZstdLevel;
  const std::atomic<bool>* cancel = nullptr;
  ProgressMeter* progress = nullptr;
  // When set, the target's bytes are also stored here (nbytes), chunk by
  // chunk right after they are read. It may be the very memory the base
  // source reads (each chunk of the base is read before it is overwritten):
  // the base then advances to the target in the encoding pass.
  std::byte* copy_target_to = nullptr;
};
struct EncodedFrame {
  bool changed = false;  // some byte of target differs from base
  Checksum128 target_checksum;
  Checksum128 base_checksum;  // of the base tensor, for the base's fingerprint
  uint64_t frame_size = 0;    // bytes appended to the frame sink
};
[[nodiscard]] absl::StatusOr<EncodedFrame> EncodeXorFrame(CodecWorkspace& ws,
                                                          const EncodeSpec& spec, ChunkSource& base,
                                                          ChunkSource& target, FrameSink& out);

// What a zstd frame's header says, read from its first bytes.
struct FrameHeaderInfo {
  std::optional<uint64_t> content_size;  // absent when the frame does not record it
  uint64_t window_size = 0;
};
// Parses the header at the start of `prefix` (pass at least
// kMaxFrameHeaderBytes bytes when the frame is that long). InvalidArgument
// naming `label` when it is not a zstd frame or is cut short.
inline constexpr size_t kMaxFrameHeaderBytes = 18;
[[nodiscard]] absl::StatusOr<FrameHeaderInfo> ParseFrameHeader(std::span<const std::byte> prefix,
                                                               std::string_view label);

// Reads the header of the frame `frame` refers to and checks that it is a
// zstd frame whose recorded content size, if any, is `nbytes`. DataLoss
// naming the tensor and the frame's label otherwise.
[[nodiscard]] absl::Status CheckFrameHeader(const FrameRef& frame, std::string_view tensor,
                                            std::optional<uint64_t> nbytes);

// Decodes a whole frame and discards the bytes; returns how many it decodes
// to. DataLoss when the frame is corrupt, truncated, decodes to more than
// `max_bytes`, or is followed by trailing bytes.
[[nodiscard]] absl::StatusOr<uint64_t> DecodedFrameSize(CodecWorkspace& ws, const FrameRef& frame,
                                                        std::string_view tensor,
                                                        uint64_t max_bytes);

// The order in which to run tasks of these sizes so that workers finish
// together: largest first.
std::vector<size_t> LargestFirst(std::span<const uint64_t> sizes);

}  // namespace stitch
