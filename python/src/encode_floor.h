// The encode floor of bench/delta_bench, for bench/python_encode_bench.py:
// one thread, a fused loop of XOR, zstd level 1 and xxh3-128 over each
// tensor in kChunkBytes chunks. Not part of the package's API.
#pragma once

#include <cstddef>
#include <span>

namespace stitch {

// Returns the seconds (wall clock) the floor takes over `base` and `target`,
// both split into tensors of `tensor_bytes`, and their compressed size.
// REQUIRES: base.size() == target.size(), tensor_bytes > 0.
struct FloorTiming {
  double seconds = 0;
  size_t compressed_bytes = 0;
};
FloorTiming EncodeFloor(std::span<const std::byte> base, std::span<const std::byte> target,
                        size_t tensor_bytes);

}  // namespace stitch
