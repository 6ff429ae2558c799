// Where a staged version updates an engine's weights: the two wire words
// that the sidecar's engine adapter sends in a stage request ("destination")
// and the reference engine reads there, and that `--update-mode` takes.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

enum class UpdateDestination {
  kDisk,  // a local checkpoint directory, loaded with /update_weights_from_disk
  kCpu,   // an in-memory image in the engine, swapped in by /update_weights_from_cpu
};

// "disk", "cpu".
std::string_view UpdateDestinationName(UpdateDestination d);
// InvalidArgument naming the word and the two accepted.
[[nodiscard]] absl::StatusOr<UpdateDestination> ParseUpdateDestination(std::string_view name);

}  // namespace stitch
