// The best-effort wake after the pointer moved, shared by claim and publish.
#pragma once

#include "stitch/core/version.h"
#include "stitch/pool/pool.h"

namespace stitch {

// Wakes `pool` (nothing when null) after the pointer moved to `now`, logging
// how many replicas answered. Never fails: replicas converge without wakes.
void WakeAfterMove(Pool* pool, const VersionRef& now);

}  // namespace stitch
