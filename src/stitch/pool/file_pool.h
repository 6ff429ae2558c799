// FilePool: replica URLs listed in a local file, one per line, re-read when
// the file changes, so that a local fleet can grow and shrink while a gateway
// runs ("file:/run/stitch/replicas.txt").
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/pool/pool.h"

namespace stitch {

class FilePool final : public Pool {
 public:
  // Parses "file:PATH". The file is not read yet: it may appear later.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<FilePool>> Parse(
      std::string_view spec, const WakeOptions& options = {});

  FilePool(std::filesystem::path path, const WakeOptions& options);

  std::string spec() const override;

  // The URLs in the file: blank lines and lines starting with '#' are
  // skipped, surrounding whitespace and trailing slashes are dropped,
  // duplicates are kept once. The file is read at every call, so that any
  // rewrite is seen at the next discovery. Errors: NotFound when
  // the file does not exist, InvalidArgument (naming the line) for an entry
  // that is not an http(s) URL, Unavailable when it cannot be read. An empty
  // file is an empty pool, not an error.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> Discover() override;

  // Wakes the replicas the file lists now.
  int Wake() override;

 private:
  const std::filesystem::path path_;
  const WakeOptions options_;
};

}  // namespace stitch
