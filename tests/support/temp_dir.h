// A temporary directory for one test, removed with everything in it when the
// object is destroyed.
#pragma once

#include <filesystem>

namespace stitch::testing {

class TempDir {
 public:
  // Creates a fresh directory under $TEST_TMPDIR, $TMPDIR or /tmp. Aborts the
  // test binary if that fails (nothing can be tested without it).
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

}  // namespace stitch::testing
