// The body of xxh3_ops.h's kernels, compiled once per instruction set: only
// xxh3_default.cc and xxh3_avx2.cc include it, each right after xxhash.h
// with XXH_INLINE_ALL, so each holds its own copy of xxHash built for its
// compiler flags (internal linkage: the copies never mix).
#pragma once

#include <new>

#include "stitch/format/xxh3_ops.h"

namespace stitch::format_internal {
namespace {

static_assert(sizeof(XXH3_state_t) <= sizeof(Xxh3State) &&
              alignof(XXH3_state_t) <= alignof(Xxh3State));

XXH3_state_t* StateOf(Xxh3State& s) { return std::launder(reinterpret_cast<XXH3_state_t*>(&s)); }
const XXH3_state_t* StateOf(const Xxh3State& s) {
  return std::launder(reinterpret_cast<const XXH3_state_t*>(&s));
}

constexpr Xxh3Ops kOps{
    [](Xxh3State& s) { XXH3_128bits_reset(StateOf(s)); },
    [](Xxh3State& s, const void* data, size_t size) {
      XXH3_128bits_update(StateOf(s), data, size);
    },
    [](const Xxh3State& s, uint64_t& high, uint64_t& low) {
      const XXH128_hash_t h = XXH3_128bits_digest(StateOf(s));
      high = h.high64;
      low = h.low64;
    },
    [](const void* data, size_t size, uint64_t& high, uint64_t& low) {
      const XXH128_hash_t h = XXH3_128bits(data, size);
      high = h.high64;
      low = h.low64;
    },
};

}  // namespace
}  // namespace stitch::format_internal
