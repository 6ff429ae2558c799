#include "stitch/io/memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace stitch {

void ReleaseFreedMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace stitch
