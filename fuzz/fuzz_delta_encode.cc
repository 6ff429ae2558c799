// Fuzzes the delta encoder, above all the zero-run parser of the default
// level: whatever XOR stream it is given, the frame must be a standard zstd
// frame that plain zstd decodes back to that stream, and folding it onto
// the base must give the target.
//
// The first input byte picks the zstd level (mostly the default) and
// whether the target is also copied over the base in the same pass
// (EncodeSpec::copy_target_to). The rest describes the XOR stream, so that
// zero runs of every length, up to ones spanning zstd's 128 KiB blocks, are
// common: a byte 0 adds 64 KiB of zeros, 1..63 that many zeros, 64..127
// (b - 64) * 257 zeros, and 128..255 the byte itself. Streams stop at 384 KiB.
#include <zstd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "stitch/delta/delta_kernel.h"
#include "stitch/format/checksum.h"

namespace {

constexpr size_t kMaxBytes = 384 << 10;

void Check(bool ok) {
  if (!ok) std::abort();
}

class VectorSink final : public stitch::FrameSink {
 public:
  absl::Status Append(std::span<const std::byte> b) override {
    bytes.insert(bytes.end(), b.begin(), b.end());
    return absl::OkStatus();
  }
  std::vector<std::byte> bytes;
};

std::vector<std::byte> XorStream(const uint8_t* data, size_t size) {
  std::vector<std::byte> x;
  for (size_t i = 0; i < size && x.size() < kMaxBytes; ++i) {
    const uint8_t b = data[i];
    const size_t zeros = b == 0 ? 65536 : b < 64 ? b : b < 128 ? (b - 64) * size_t{257} : 0;
    if (b >= 128) x.push_back(static_cast<std::byte>(b));
    x.insert(x.end(), std::min(zeros, kMaxBytes - x.size()), std::byte{0});
  }
  return x;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static constexpr int kLevels[] = {1, 1, 1, 1, 1, -1, 3, 0};
  const int level = kLevels[data[0] & 7];
  const bool copy = (data[0] & 8) != 0;
  const std::vector<std::byte> x = XorStream(data + 1, size - 1);
  const size_t n = x.size();
  std::vector<std::byte> base(n), target(n);
  uint64_t state = 0x9e3779b97f4a7c15u ^ size;
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    base[i] = static_cast<std::byte>(state >> 56);
    target[i] = base[i] ^ x[i];
  }

  static stitch::CodecWorkspace ws;
  std::vector<std::byte> advanced = base;  // advances in the pass when `copy`
  stitch::MemorySource b(copy ? std::span<const std::byte>(advanced) : base), t(target);
  VectorSink sink;
  stitch::EncodeSpec spec{"t", n, level};
  if (copy) spec.copy_target_to = advanced.data();
  absl::StatusOr<stitch::EncodedFrame> e = stitch::EncodeXorFrame(ws, spec, b, t, sink);
  Check(e.ok());
  Check(e->frame_size == sink.bytes.size());
  Check(e->target_checksum == stitch::Xxh3Checksum(target));
  Check(e->changed == (x != std::vector<std::byte>(n, std::byte{0})));
  if (copy) Check(advanced == target);

  // Plain zstd reads the frame back.
  std::vector<std::byte> decoded(n + 1);
  const size_t r =
      ZSTD_decompress(decoded.data(), decoded.size(), sink.bytes.data(), sink.bytes.size());
  Check(!ZSTD_isError(r) && r == n);
  decoded.resize(n);
  Check(decoded == x);

  // The codec folds it onto the base into the target.
  std::vector<std::byte> out = base;
  stitch::MemorySource src(out);
  stitch::MemorySink dst(out);
  std::vector<stitch::FrameRef> frames{
      stitch::FrameRef{-1, 0, sink.bytes.size(), sink.bytes, "frame"}};
  stitch::FoldSpec fold{"t", n, frames, e->target_checksum};
  Check(stitch::FoldFrames(ws, fold, src, dst).ok());
  Check(out == target);
  return 0;
}
