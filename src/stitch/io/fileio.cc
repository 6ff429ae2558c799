#include "stitch/io/fileio.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace fs = std::filesystem;

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status ErrnoStatus(int e, std::string_view operation, const fs::path& path) {
  std::string msg = absl::StrCat(AbslView(operation), " ", path.string(), ": ", std::strerror(e));
  switch (e) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::Status WriteAll(int fd, std::span<const std::byte> bytes, const fs::path& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", path);
    }
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileToString(const fs::path& path, uint64_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, "open", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return absl::OutOfRangeError(absl::StrCat(path.string(), " is ", st.st_size,
                                              " bytes, above the limit of ", max_bytes, " bytes"));
  }
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (n == 0) break;
    // A file that grew while being read is held to the limit too.
    if (out.size() + static_cast<size_t>(n) > max_bytes) {
      return absl::OutOfRangeError(
          absl::StrCat(path.string(), " is above the limit of ", max_bytes, " bytes"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

absl::StatusOr<bool> FileHolds(const fs::path& path, std::string_view contents) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return false;
    return ErrnoStatus(errno, "open", path);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "stat", path);
  if (static_cast<uint64_t>(st.st_size) != contents.size()) return false;
  char buf[1 << 16];
  size_t at = 0;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (n == 0) return at == contents.size();
    const auto got = static_cast<size_t>(n);
    if (at + got > contents.size() || contents.compare(at, got, std::string_view(buf, got)) != 0) {
      return false;
    }
    at += got;
  }
}

absl::Status FsyncPath(const fs::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, "open", path);
  if (::fsync(fd.get()) != 0) return ErrnoStatus(errno, "fsync", path);
  return absl::OkStatus();
}

fs::path TempSiblingPath(const fs::path& path) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string name =
      absl::StrFormat(".%s.tmp-%d-%016x", path.filename().string(), ::getpid(), rng());
  return path.parent_path() / name;
}

void RemoveStaleTempSiblings(const fs::path& path) {
  const std::string prefix = absl::StrCat(".", path.filename().string(), ".tmp-");
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().starts_with(prefix)) {
      std::error_code rm;
      fs::remove_all(it->path(), rm);
    }
  }
}

absl::Status WriteFileAtomically(const fs::path& path, std::string_view contents) {
  fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  fs::path tmp = TempSiblingPath(path);
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) return ErrnoStatus(errno, "create", tmp);
    absl::Status s = WriteAll(fd.get(), std::as_bytes(std::span(contents)), tmp);
    if (s.ok() && ::fsync(fd.get()) != 0) s = ErrnoStatus(errno, "fsync", tmp);
    if (!s.ok()) {
      ::unlink(tmp.c_str());
      return s;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoStatus(errno, "rename to", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncPath(dir);
}

absl::Status CopyFileDurably(const fs::path& from, const fs::path& to) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return ErrnoStatus(errno, "open", from);
  UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out) return ErrnoStatus(errno, "create", to);
  struct stat st;
  if (::fstat(in.get(), &st) != 0) return ErrnoStatus(errno, "stat", from);
  off_t offset = 0;
  // copy_file_range lets the kernel (or a reflinking filesystem) do the work.
  while (offset < st.st_size) {
    ssize_t n = ::copy_file_range(in.get(), &offset, out.get(), nullptr,
                                  static_cast<size_t>(st.st_size - offset), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == ENOSYS || errno == EINVAL) break;
      return ErrnoStatus(errno, "copy to", to);
    }
    if (n == 0) break;
  }
  if (offset < st.st_size) {
    std::vector<std::byte> buf(1 << 20);
    for (;;) {
      ssize_t n = ::pread(in.get(), buf.data(), buf.size(), offset);
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "read", from);
      }
      if (n == 0) break;
      if (absl::Status s = WriteAll(out.get(), std::span(buf.data(), static_cast<size_t>(n)), to);
          !s.ok()) {
        return s;
      }
      offset += n;
    }
  }
  if (offset != st.st_size) {
    return absl::DataLossError(
        absl::StrCat("copy ", from.string(), ": file changed size while being copied"));
  }
  if (::fsync(out.get()) != 0) return ErrnoStatus(errno, "fsync", to);
  return absl::OkStatus();
}

absl::Status FsyncTree(const fs::path& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_symlink(ec)) continue;
    if (absl::Status s = FsyncPath(it->path()); !s.ok()) return s;
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", dir.string(), ": ", ec.message()));
  return FsyncPath(dir);
}

absl::Status RenameDurably(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoStatus(errno, "rename to", to);
  auto parent = [](const fs::path& p) {
    return p.parent_path().empty() ? fs::path(".") : p.parent_path();
  };
  if (absl::Status s = FsyncPath(parent(to)); !s.ok()) return s;
  if (parent(from) != parent(to)) return FsyncPath(parent(from));
  return absl::OkStatus();
}

absl::Status ReadFully(int fd, uint64_t offset, std::span<std::byte> out,
                       const std::filesystem::path& path) {
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n =
        ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("read ", path.string(), ": file ends at byte ",
                                              offset + done, ", before the ", out.size(),
                                              " bytes its header promises at byte ", offset));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace stitch
