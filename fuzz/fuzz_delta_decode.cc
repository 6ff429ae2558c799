// Fuzzes the delta decoder: the frame header checks and the fused fold
// (zstd decode + XOR + xxh3) must be safe on arbitrary bytes, and what they
// accept must be consistent.
//
// The first input byte picks the shape of the rest:
//   even: a delta payload file (safetensors header + frames, checksums in
//         __metadata__), each U8 entry folded onto a synthetic base of the
//         size its frame header records;
//   odd:  one raw frame, folded onto a base whose size the next two bytes
//         give.
// Invariants checked (abort on violation): a frame that folds without error
// decodes to exactly the base's size, and folding it twice restores the
// base (XOR is its own inverse); a fold with a checksum succeeds only when
// the result hashes to it.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <vector>

#include "stitch/delta/delta_kernel.h"
#include "stitch/format/checksum.h"
#include "stitch/format/safetensors.h"

namespace {

using stitch::Checksum128;
using stitch::FrameRef;

// Keeps each run small and fast: bases up to 1 MiB, windows up to 8 MiB.
constexpr uint64_t kMaxBase = 1 << 20;
constexpr uint64_t kMaxWindow = 8 << 20;

void Check(bool ok) {
  if (!ok) std::abort();
}

std::vector<std::byte> Base(uint64_t n) {
  std::vector<std::byte> b(n);
  for (uint64_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 2654435761u) >> 13);
  return b;
}

void FoldOne(stitch::CodecWorkspace& ws, std::span<const std::byte> frame_bytes, uint64_t nbytes,
             std::optional<Checksum128> expected) {
  FrameRef frame{-1, 0, frame_bytes.size(), frame_bytes, "fuzz.safetensors"};
  absl::StatusOr<stitch::FrameHeaderInfo> info =
      stitch::ParseFrameHeader(frame_bytes.first(std::min<size_t>(frame_bytes.size(), 18)), "fuzz");
  if (info.ok() && info->window_size > kMaxWindow) return;
  (void)stitch::CheckFrameHeader(frame, "t", nbytes);

  const std::vector<std::byte> base = Base(nbytes);
  std::vector<std::byte> mem = base;
  stitch::MemorySource src(mem);
  stitch::MemorySink sink(mem);
  std::span<const FrameRef> frames(&frame, 1);
  stitch::FoldSpec spec{"t", nbytes, frames, expected};
  absl::Status s = stitch::FoldFrames(ws, spec, src, sink);
  if (!s.ok()) return;
  if (expected) Check(stitch::Xxh3Checksum(mem) == *expected);
  absl::StatusOr<uint64_t> size = stitch::DecodedFrameSize(ws, frame, "t", kMaxBase);
  Check(size.ok() && *size == nbytes);
  spec.expected.reset();
  Check(stitch::FoldFrames(ws, spec, src, sink).ok());
  Check(mem == base);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static stitch::CodecWorkspace ws;
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  if ((data[0] & 1) == 1) {
    if (bytes.size() < 2) return 0;
    const uint64_t n = static_cast<uint64_t>(data[1]) | static_cast<uint64_t>(data[2]) << 8;
    FoldOne(ws, bytes.subspan(2), n, std::nullopt);
    return 0;
  }
  absl::StatusOr<stitch::SafetensorsHeader> h = stitch::ParseSafetensorsHeader(bytes, bytes.size());
  if (!h.ok()) return 0;
  int folded = 0;
  for (const stitch::TensorInfo& t : h->tensors) {
    if (t.dtype != stitch::DType::kU8 || folded++ == 8) continue;
    std::span<const std::byte> frame = bytes.subspan(h->data_start + t.begin, t.nbytes());
    absl::StatusOr<stitch::FrameHeaderInfo> info =
        stitch::ParseFrameHeader(frame.first(std::min<size_t>(frame.size(), 18)), "fuzz");
    if (!info.ok() || !info->content_size || *info->content_size > kMaxBase) continue;
    std::optional<Checksum128> expected;
    if (auto it = h->metadata.find(t.name); it != h->metadata.end()) {
      absl::StatusOr<Checksum128> c = Checksum128::FromHex(it->second);
      if (c.ok()) expected = *c;
    }
    FoldOne(ws, frame, *info->content_size, expected);
  }
  return 0;
}
