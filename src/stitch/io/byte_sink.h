// Where a transfer's bytes go as they arrive (a download into the version
// cache, a file from a peer), instead of being buffered whole.
#pragma once

#include <string_view>

#include "absl/status/status.h"

namespace stitch {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  // Starts over: called before every attempt, so that a retried transfer
  // never appends to a failed one.
  [[nodiscard]] virtual absl::Status Restart() = 0;
  // The next bytes. An error ends the transfer with it.
  [[nodiscard]] virtual absl::Status Write(std::string_view bytes) = 0;
};

}  // namespace stitch
