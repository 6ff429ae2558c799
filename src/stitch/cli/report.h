// Shared by the store subcommands: how a failure reaches the user.
#pragma once

#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"

namespace stitch {

// Exit code of a command that ran and failed (usage errors exit 2).
inline constexpr int kExitFailure = 1;

// Prints "stitch: <message>" as exactly one line on stderr and returns
// kExitFailure. Newlines inside the message (a path holding one, say) are
// escaped so that the failure stays one line.
inline int ReportFailure(const absl::Status& status) {
  std::cerr << "stitch: " << absl::StrReplaceAll(status.message(), {{"\n", "\\n"}, {"\r", "\\r"}})
            << "\n";
  return kExitFailure;
}

}  // namespace stitch
