// xxh3_ops.h for AVX2: this file alone is compiled with -mavx2 (see
// CMakeLists.txt); xxh3_default.cc hands it out only on CPUs with AVX2.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "stitch/format/xxh3_ops_impl.h"

namespace stitch::format_internal {

const Xxh3Ops& Xxh3OpsAvx2Build() { return kOps; }

}  // namespace stitch::format_internal
