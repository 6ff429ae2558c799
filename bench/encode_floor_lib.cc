// The encode floor (encode_floor.h) behind a C ABI, for
// bench/python_encode_bench.py, which loads it with ctypes: a benchmark's
// baseline has no place in the Python package.
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <vector>

#include "encode_floor.h"
#include "stitch/delta/delta_kernel.h"

// Encodes `bytes` of `base` against `target`, one tensor of `tensor_bytes`
// at a time, as delta_bench's encode floor does; sets the seconds it took
// and the compressed bytes. Returns 0, or 1 for sizes it cannot use
// (tensor_bytes == 0). A zstd error ends that tensor's frame early; the
// floor goes on.
extern "C" int stitch_encode_floor(const void* base, const void* target, size_t bytes,
                                   size_t tensor_bytes, double* seconds, size_t* compressed_bytes) {
  if (tensor_bytes == 0) return 1;
  std::vector<std::byte> x(stitch::kChunkBytes), out(ZSTD_CStreamOutSize()), frame;
  stitch::bench::FloorEncoder floor(x, out);
  const auto* b = static_cast<const std::byte*>(base);
  const auto* t = static_cast<const std::byte*>(target);
  size_t compressed = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t at = 0; at < bytes; at += tensor_bytes) {
    (void)floor.Encode(b + at, t + at, std::min(tensor_bytes, bytes - at), frame);
    compressed += frame.size();
  }
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *compressed_bytes = compressed;
  return 0;
}
