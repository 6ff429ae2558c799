// xxh3_ops.h for the baseline instruction set.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "stitch/format/xxh3_ops_impl.h"

namespace stitch::format_internal {

#if defined(STITCH_XXH3_AVX2)
const Xxh3Ops& Xxh3OpsAvx2Build();  // xxh3_avx2.cc
#endif

const Xxh3Ops& Xxh3OpsDefault() { return kOps; }

// Checked here, in code built for the baseline instruction set.
const Xxh3Ops* Xxh3OpsAvx2() {
#if defined(STITCH_XXH3_AVX2)
  if (__builtin_cpu_supports("avx2")) return &Xxh3OpsAvx2Build();
#endif
  return nullptr;
}

}  // namespace stitch::format_internal
