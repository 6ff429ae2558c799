// Durable file operations: everything Stitch writes that another process may
// rely on goes through here, so that "complete and durable" means the same
// thing everywhere. Errors name the path and the OS reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

// Reads out.size() bytes at `offset` of the open file `fd` (pread, retried
// until complete). DataLoss naming `path` when the file ends first.
[[nodiscard]] absl::Status ReadFully(int fd, uint64_t offset, std::span<std::byte> out,
                                     const std::filesystem::path& path);

// Reads a whole (small) file into one buffer of its size. A file larger
// than `max_bytes` is refused (OutOfRange, naming the path and the limit)
// before any of it is read.
[[nodiscard]] absl::StatusOr<std::string> ReadFileToString(
    const std::filesystem::path& path, uint64_t max_bytes = std::numeric_limits<uint64_t>::max());

// Whether the file at `path` holds exactly `contents`, read in pieces (never
// whole). False for a missing file; errors reading an existing one pass.
[[nodiscard]] absl::StatusOr<bool> FileHolds(const std::filesystem::path& path,
                                             std::string_view contents);

// fsync()s a file or a directory by path.
[[nodiscard]] absl::Status FsyncPath(const std::filesystem::path& path);

// Writes `contents` to `path` atomically and durably: a temporary file in the
// same directory, fsync, rename over `path`, fsync the directory. Readers see
// either the old or the new contents, never a mix, even after a crash.
[[nodiscard]] absl::Status WriteFileAtomically(const std::filesystem::path& path,
                                               std::string_view contents);

// Copies `from` to `to` (created or truncated) and fsyncs `to`.
[[nodiscard]] absl::Status CopyFileDurably(const std::filesystem::path& from,
                                           const std::filesystem::path& to);

// fsyncs every file and directory under `dir`, and `dir` itself.
[[nodiscard]] absl::Status FsyncTree(const std::filesystem::path& dir);

// Renames `from` to `to` (which must not exist, or be an empty directory) and
// fsyncs the parent directories of both.
[[nodiscard]] absl::Status RenameDurably(const std::filesystem::path& from,
                                         const std::filesystem::path& to);

// A fresh, unique sibling path for `path`: "<dir>/.<name>.tmp-<pid>-<random>".
std::filesystem::path TempSiblingPath(const std::filesystem::path& path);

// Removes every TempSiblingPath(path) left behind (files or directories) by
// a writer of `path` that crashed. Only for a caller that is the one writer
// of `path` at a time. Best effort: errors are ignored.
void RemoveStaleTempSiblings(const std::filesystem::path& path);

// The OS error `errno_value` as an absl::Status for an operation on `path`:
// "open /x/y: No such file or directory". ENOENT maps to NotFound, EACCES and
// EPERM to PermissionDenied, ENOSPC to ResourceExhausted, others to Internal.
absl::Status ErrnoStatus(int errno_value, std::string_view operation,
                         const std::filesystem::path& path);

// A file descriptor closed on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Writes all of `bytes` to `fd`, retrying short writes and EINTR.
[[nodiscard]] absl::Status WriteAll(int fd, std::span<const std::byte> bytes,
                                    const std::filesystem::path& path_for_errors);

}  // namespace stitch
