// Expectations about what a `stitch` command printed and how it ended, for
// tests that run the binary (RunStitch, subprocess.h).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string_view>

#include "tests/support/subprocess.h"

namespace stitch::testing {

// The command succeeded; otherwise says `what` failed and shows its output.
inline void ExpectOk(const ProcessResult& r, std::string_view what) {
  EXPECT_EQ(r.exit_code, 0) << what << "\nstdout: " << r.out << "\nstderr: " << r.err;
}

// Exactly one line: "stitch: ...\n".
MATCHER(IsOneFailureLine, "") {
  return arg.starts_with("stitch: ") && arg.ends_with("\n") &&
         std::count(arg.begin(), arg.end(), '\n') == 1;
}

}  // namespace stitch::testing
