#include "stitch/api/update_destination.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

std::string_view UpdateDestinationName(UpdateDestination d) {
  return d == UpdateDestination::kCpu ? "cpu" : "disk";
}

absl::StatusOr<UpdateDestination> ParseUpdateDestination(std::string_view name) {
  if (name == "disk") return UpdateDestination::kDisk;
  if (name == "cpu") return UpdateDestination::kCpu;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown destination \"", AbslView(name), "\"; use \"disk\" or \"cpu\""));
}

}  // namespace stitch
