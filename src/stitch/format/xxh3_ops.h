// xxh3-128 built twice, for the baseline instruction set and for AVX2 (about
// twice as fast on the L2-sized chunks the codec hashes), and picked once at
// run time by the CPU. Only checksum.cc uses this: everything else hashes
// through checksum.h.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stitch::format_internal {

// Room for an XXH3_state_t (xxh3_ops_impl.h checks that it fits).
struct alignas(64) Xxh3State {
  unsigned char bytes[640];
};

struct Xxh3Ops {
  void (*reset)(Xxh3State& state);
  void (*update)(Xxh3State& state, const void* data, size_t size);
  void (*digest)(const Xxh3State& state, uint64_t& high, uint64_t& low);
  void (*hash)(const void* data, size_t size, uint64_t& high, uint64_t& low);
};

// The baseline build.
const Xxh3Ops& Xxh3OpsDefault();
// The AVX2 build, or null when this CPU lacks AVX2 or the library was built
// for another architecture.
const Xxh3Ops* Xxh3OpsAvx2();

}  // namespace stitch::format_internal
