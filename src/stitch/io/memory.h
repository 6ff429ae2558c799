// The process's memory, as the operating system sees it.
#pragma once

namespace stitch {

// Hands back to the system the memory this process has freed but the
// allocator keeps for reuse (glibc keeps freed heap pages). Called after a
// large structure that lived briefly (a big index parsed and dropped), so
// that the process does not keep its peak for the rest of its life. Costs a
// walk of the heap's free lists: not for hot paths.
void ReleaseFreedMemory();

}  // namespace stitch
