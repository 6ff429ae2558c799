// Hashes that every process computes alike, whatever its build: the
// gateway's affinity keys and ring points, and which peer owns a version
// file, must agree across processes and machines, which std::hash (its
// values left to the standard library) does not promise.
#pragma once

#include <cstdint>
#include <string_view>

namespace stitch {

// splitmix64's finaliser: spreads the bits of `x` over the whole word.
uint64_t StableMix(uint64_t x);

// FNV-1a of `bytes`, then StableMix (FNV-1a alone spreads short inputs
// poorly).
uint64_t StableHash(std::string_view bytes);

}  // namespace stitch
