#include "stitch/store/fs_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/url/url.hpp>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <set>
#include <system_error>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/store/pointer_cas.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kPointerFile = "latest";
constexpr std::string_view kLockFile = ".latest.lock";
constexpr std::string_view kStagingLockFile = ".staging.lock";
constexpr std::string_view kUpdatesDir = "updates";
constexpr std::string_view kAnchorsDir = "anchors";
// A staging directory's name contains this (fileio.h TempSiblingPath), its
// lock file adds kStagingLockSuffix.
constexpr absl::string_view kStagingMarker = ".tmp-";
constexpr absl::string_view kStagingLockSuffix = ".lock";

// Holds a flock (LOCK_EX or LOCK_SH) until destroyed. flock locks belong to
// the open file description, so each call excludes other threads of this
// process as well as other processes. Lock files are regular files opened
// for writing, which NFS's emulation of flock needs.
absl::StatusOr<UniqueFd> Lock(const fs::path& path, int operation) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return ErrnoStatus(errno, "open", path);
  while (::flock(fd.get(), operation) != 0) {
    if (errno != EINTR) return ErrnoStatus(errno, "lock", path);
  }
  return fd;
}

absl::StatusOr<UniqueFd> LockExclusive(const fs::path& path) { return Lock(path, LOCK_EX); }

// Every regular file under `dir` that is part of a version (names starting
// with '.' are not: version_dir.h), as relative generic paths. Anything that
// is neither a directory nor a regular file is reported as such, so that it
// can never compare equal to a published file.
absl::StatusOr<std::set<std::string>> ListFiles(const fs::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    fs::file_status st = it->symlink_status(ec);
    if (ec) break;
    if (it->path().filename().string().starts_with('.')) {
      if (fs::is_directory(st)) it.disable_recursion_pending();
      continue;
    }
    if (fs::is_directory(st)) continue;
    std::string rel = it->path().lexically_relative(dir).generic_string();
    out.insert(fs::is_regular_file(st) ? rel : absl::StrCat(rel, " (not a regular file)"));
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", dir.string(), ": ", ec.message()));
  return out;
}

// True when the two files hold the same bytes.
absl::StatusOr<bool> SameBytes(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  uintmax_t size_a = fs::file_size(a, ec);
  if (ec) return ErrnoStatus(ec.value(), "stat", a);
  uintmax_t size_b = fs::file_size(b, ec);
  if (ec) return ErrnoStatus(ec.value(), "stat", b);
  if (size_a != size_b) return false;
  UniqueFd fa(::open(a.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fa) return ErrnoStatus(errno, "open", a);
  UniqueFd fb(::open(b.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fb) return ErrnoStatus(errno, "open", b);
  constexpr size_t kChunk = 1 << 20;
  std::vector<char> ba(kChunk), bb(kChunk);
  for (uintmax_t offset = 0; offset < size_a;) {
    size_t want = static_cast<size_t>(std::min<uintmax_t>(kChunk, size_a - offset));
    ssize_t na = ::pread(fa.get(), ba.data(), want, static_cast<off_t>(offset));
    if (na < 0 && errno == EINTR) continue;
    if (na < 0) return ErrnoStatus(errno, "read", a);
    ssize_t nb = ::pread(fb.get(), bb.data(), static_cast<size_t>(na), static_cast<off_t>(offset));
    if (nb < 0 && errno == EINTR) continue;
    if (nb < 0) return ErrnoStatus(errno, "read", b);
    if (na == 0 || nb != na) return false;  // a file shrank while being compared
    if (std::memcmp(ba.data(), bb.data(), static_cast<size_t>(na)) != 0) return false;
    offset += static_cast<uintmax_t>(na);
  }
  return true;
}

}  // namespace

std::string FileUriForPath(const fs::path& absolute_path) {
  boost::urls::url u;
  u.set_scheme("file");
  u.set_host("");
  u.set_path(absolute_path.generic_string());
  return std::string(u.buffer());
}

FsStore::FsStore(fs::path root, std::string run_id, IndexBounds index_bounds)
    : root_(std::move(root)),
      run_id_(std::move(run_id)),
      uri_(FileUriForPath(root_)),
      where_(absl::StrCat("store ", uri_)),
      index_bounds_(std::move(index_bounds)) {}

absl::StatusOr<std::unique_ptr<FsStore>> FsStore::Open(const fs::path& root, std::string run_id,
                                                       IndexBounds index_bounds) {
  if (root.empty()) return absl::InvalidArgumentError("store path is empty");
  std::error_code ec;
  fs::path abs = fs::absolute(root, ec).lexically_normal();
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("store ", root.string(), ": cannot make the path absolute: ", ec.message()));
  }
  if (!abs.has_filename() && abs.has_relative_path()) abs = abs.parent_path();
  auto store = std::unique_ptr<FsStore>(new FsStore(abs, run_id, std::move(index_bounds)));
  if (!run_id.empty()) {
    if (absl::Status s = ValidateRunId(run_id); !s.ok()) return Annotate(s, store->where());
  }
  return store;
}

absl::Status FsStore::CreateRoot() {
  const fs::path updates = root_ / kUpdatesDir;
  // The deepest directory that exists already: every directory below it is
  // new, and its entry must reach the disk before a pointer relies on it.
  std::error_code ec;
  fs::path existing = updates;
  while (existing.has_relative_path() && !fs::exists(existing, ec)) {
    existing = existing.parent_path();
  }
  fs::create_directories(updates, ec);
  if (ec || !fs::is_directory(updates, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(where_, ": cannot create ", updates.string(),
                                                      ": ", ec ? ec.message() : "not a directory",
                                                      "; check the path and permissions"));
  }
  if (existing == updates) return absl::OkStatus();
  for (fs::path dir = updates;; dir = dir.parent_path()) {
    if (absl::Status s = FsyncPath(dir); !s.ok()) return Annotate(s, where_);
    if (dir == existing || !dir.has_relative_path()) break;
  }
  return absl::OkStatus();
}

fs::path FsStore::VersionDir(int64_t version) const {
  return root_ / kUpdatesDir / VersionDirName(version);
}

absl::Status FsStore::Refresh() { return absl::OkStatus(); }

absl::StatusOr<std::optional<VersionRef>> FsStore::ReadPointer() {
  auto text = ReadFileToString(root_ / kPointerFile);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return std::nullopt;
    return Annotate(text.status(), where_);
  }
  return ParsePointerText(where_, *text);
}

absl::Status FsStore::AdvancePointer(const std::optional<VersionRef>& expected,
                                     const VersionRef& proposed) {
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) {
    // No store yet: the pointer is unset. Only a move from unset (a claim)
    // may go on, and it creates the store.
    if (absl::Status s = CheckCompareAndSwap(where_, run_id_, expected, std::nullopt, proposed);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CreateRoot(); !s.ok()) return s;
  }
  auto lock = LockExclusive(root_ / kLockFile);
  if (!lock.ok()) return Annotate(lock.status(), where_);
  auto actual = ReadPointer();
  if (!actual.ok()) return actual.status();
  if (absl::Status s = CheckCompareAndSwap(where_, run_id_, expected, *actual, proposed); !s.ok()) {
    return s;
  }
  return Annotate(WriteFileAtomically(root_ / kPointerFile, proposed.ToString()), where_);
}

absl::Status FsStore::PublishFiles(int64_t version, const fs::path& dir) {
  if (run_id_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": opened without a run id, so it cannot publish; open it with one"));
  }
  auto contents = ReadVersionDir(dir, version);
  if (!contents.ok()) return Annotate(contents.status(), where_);
  if (absl::Status s = RequireUpdatesDir(); !s.ok()) return s;
  fs::path final_dir = VersionDir(version);
  std::error_code ec;
  if (fs::equivalent(dir, final_dir, ec)) return Adopt(*contents, final_dir);
  if (fs::exists(final_dir, ec)) {
    if (absl::Status s = CompareExisting(*contents, final_dir); !s.ok()) return s;
    // A retry after a crash: make sure what is there is durable too.
    return Annotate(FsyncTree(final_dir), where_);
  }
  return CopyIn(*contents, final_dir);
}

absl::Status FsStore::RequireUpdatesDir() {
  std::error_code ec;
  if (parent_ != nullptr && fs::is_directory(parent_->root(), ec)) {
    // An anchors store: made inside the store it belongs to, durably.
    if (::mkdir(root_.c_str(), 0755) == 0) {
      if (absl::Status s = FsyncPath(parent_->root()); !s.ok()) return Annotate(s, where_);
    } else if (errno != EEXIST) {
      return Annotate(ErrnoStatus(errno, "create", root_), where_);
    }
  }
  if (!fs::is_directory(root_, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(where_, ": the store does not exist (", root_.string(),
                     " is not a directory); check the path, or create the store by claiming a run "
                     "(`stitch claim`)"));
  }
  const fs::path updates = root_ / kUpdatesDir;
  if (fs::is_directory(updates, ec)) return absl::OkStatus();
  // A store claimed before `updates/` was made at claim time, or one whose
  // `updates/` was removed: only that directory is missing.
  if (::mkdir(updates.c_str(), 0755) != 0 && errno != EEXIST) {
    return Annotate(ErrnoStatus(errno, "create", updates), where_);
  }
  return Annotate(FsyncPath(root_), where_);
}

absl::Status FsStore::Adopt(const VersionDirContents& contents, const fs::path& final_dir) {
  fs::path index = final_dir / kIndexFileName;
  auto on_disk = ReadFileToString(index);
  if (!on_disk.ok() || *on_disk != contents.index_json) {
    if (absl::Status s = WriteFileAtomically(index, contents.index_json); !s.ok()) {
      return Annotate(s, where_);
    }
  }
  if (absl::Status s = FsyncTree(final_dir); !s.ok()) return Annotate(s, where_);
  return Annotate(FsyncPath(final_dir.parent_path()), where_);
}

// Staging directories (see the header): a publisher creates
// `updates/.weight_vN.tmp-<pid>-<random>` and, beside it, the lock file of
// the same name plus ".lock", which it flocks for as long as the directory
// exists. Both are created under a shared flock on `<root>/.staging.lock`,
// and a cleaner scans under an exclusive one, so a cleaner never sees a
// staging directory whose writer has not locked it yet. A lock the cleaner
// can take belongs to a dead writer: the directory is abandoned. A staging
// directory without a lock file comes from a publisher that did not lock
// (an older stitch) and is abandoned too.
absl::StatusOr<FsStore::StagingDir> FsStore::CreateStagingDir(const fs::path& final_dir) {
  auto guard = Lock(root_ / kStagingLockFile, LOCK_SH);
  if (!guard.ok()) return Annotate(guard.status(), where_);
  StagingDir out;
  out.path = TempSiblingPath(final_dir);
  out.lock_path = fs::path(absl::StrCat(out.path.string(), kStagingLockSuffix));
  out.lock = UniqueFd(::open(out.lock_path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out.lock) return Annotate(ErrnoStatus(errno, "create", out.lock_path), where_);
  // A lock nobody else can hold yet: it cannot block.
  while (::flock(out.lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) {
      absl::Status s = ErrnoStatus(errno, "lock", out.lock_path);
      ::unlink(out.lock_path.c_str());
      return Annotate(s, where_);
    }
  }
  if (::mkdir(out.path.c_str(), 0755) != 0) {
    absl::Status s = ErrnoStatus(errno, "create", out.path);
    ::unlink(out.lock_path.c_str());
    return Annotate(s, where_);
  }
  return out;
}

FsStore::StagingDir::~StagingDir() {
  if (lock_path.empty()) return;
  std::error_code ec;
  fs::remove_all(path, ec);
  // The lock file goes last: while it exists and is locked, no cleaner
  // touches the directory.
  ::unlink(lock_path.c_str());
}

absl::StatusOr<int> FsStore::RemoveAbandonedStaging() {
  const fs::path updates = root_ / kUpdatesDir;
  std::error_code ec;
  if (!fs::is_directory(updates, ec)) return 0;
  struct Abandoned {
    fs::path dir;
    fs::path lock_path;  // empty when it had none
    UniqueFd lock;
  };
  std::vector<Abandoned> abandoned;
  {
    auto guard = Lock(root_ / kStagingLockFile, LOCK_EX);
    if (!guard.ok()) return Annotate(guard.status(), where_);
    std::set<std::string> names;
    for (fs::directory_iterator it(updates, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (absl::StartsWith(name, ".") && absl::StrContains(name, kStagingMarker)) {
        names.insert(name);
      }
    }
    if (ec)
      return absl::InternalError(
          absl::StrCat(where_, ": list ", updates.string(), ": ", ec.message()));
    for (const std::string& name : names) {
      if (absl::EndsWith(name, kStagingLockSuffix)) {
        const fs::path lock_path = updates / name;
        UniqueFd fd(::open(lock_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
        if (!fd) continue;
        if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // its writer is alive
        const std::string dir(absl::StripSuffix(name, kStagingLockSuffix));
        abandoned.push_back(Abandoned{updates / dir, lock_path, std::move(fd)});
      } else if (!names.contains(absl::StrCat(name, kStagingLockSuffix))) {
        abandoned.push_back(Abandoned{updates / name, {}, UniqueFd()});
      }
    }
  }
  // Each abandoned lock is held from here on, so that a concurrent cleaner
  // leaves these alone; names are never reused, so no writer wants them.
  int removed = 0;
  for (Abandoned& a : abandoned) {
    std::error_code rm;
    if (fs::remove_all(a.dir, rm) > 0) ++removed;
    if (rm) {
      return absl::InternalError(
          absl::StrCat(where_, ": remove ", a.dir.string(), ": ", rm.message()));
    }
    if (!a.lock_path.empty()) ::unlink(a.lock_path.c_str());
  }
  return removed;
}

absl::Status FsStore::CopyIn(const VersionDirContents& contents, const fs::path& final_dir) {
  // Publishers killed mid-copy leave their staging directories behind; the
  // next publish clears them, so that they never accumulate.
  if (auto cleaned = RemoveAbandonedStaging(); !cleaned.ok()) return cleaned.status();
  auto created = CreateStagingDir(final_dir);
  if (!created.ok()) return created.status();
  const StagingDir& staged = *created;
  const fs::path& staging = staged.path;
  std::error_code ec;
  auto stage = [&]() -> absl::Status {
    if (absl::Status s = WriteFileAtomically(staging / kIndexFileName, contents.index_json);
        !s.ok()) {
      return s;
    }
    for (const std::string& name : contents.StoredFiles()) {
      fs::path to = staging / name;
      fs::create_directories(to.parent_path(), ec);
      if (ec) return ErrnoStatus(ec.value(), "create", to.parent_path());
      if (absl::Status s = CopyFileDurably(contents.dir / name, to); !s.ok()) return s;
    }
    return FsyncTree(staging);
  };
  absl::Status status = stage();
  if (status.ok()) {
    if (before_rename_) before_rename_();
    status = RenameDurably(staging, final_dir);
    // Another publisher renamed the same version into place first: that is a
    // retry if its bytes are ours, and a refusal otherwise.
    if (absl::IsAlreadyExists(status)) status = CompareExisting(contents, final_dir);
  }
  return Annotate(status, where_);
}

absl::Status FsStore::CompareExisting(const VersionDirContents& contents,
                                      const fs::path& final_dir) {
  auto differs = [&](absl::string_view what) {
    return absl::AlreadyExistsError(
        absl::StrCat(where_, ": version ", final_dir.filename().string(), " already exists and ",
                     what, "; versions are immutable"));
  };
  auto present = ListFiles(final_dir);
  if (!present.ok()) return Annotate(present.status(), where_);
  const std::vector<std::string> stored = contents.StoredFiles();
  std::set<std::string> wanted(stored.begin(), stored.end());
  wanted.insert(std::string(kIndexFileName));
  if (*present != wanted) {
    std::vector<std::string> diff;
    std::set_symmetric_difference(present->begin(), present->end(), wanted.begin(), wanted.end(),
                                  std::back_inserter(diff));
    return differs(absl::StrCat("holds a different set of files (",
                                absl::StrJoin(diff, ", ",
                                              [](std::string* out, const auto& s) {
                                                absl::StrAppend(out, "\"", absl::CEscape(s), "\"");
                                              }),
                                ")"));
  }
  auto index = ReadFileToString(final_dir / kIndexFileName);
  if (!index.ok()) return Annotate(index.status(), where_);
  if (*index != contents.index_json) return differs("its index differs");
  for (const std::string& name : stored) {
    auto same = SameBytes(contents.dir / name, final_dir / name);
    if (!same.ok()) return Annotate(same.status(), where_);
    if (!*same) return differs(absl::StrCat("its \"", absl::CEscape(name), "\" differs"));
  }
  return absl::OkStatus();
}

absl::Status FsStore::CheckNoLinks(int64_t version, LinkCheck scope) const {
  // A store is written by `publish`, which refuses links: a link found here
  // was put there by hand or by someone with write access to the store, and
  // could point anywhere on this host. Neither `updates`, the version
  // directory nor anything in it may be one, nor anything but a directory
  // or a regular file.
  const fs::path dir = VersionDir(version);
  auto refuse = [&](const fs::path& path, std::string_view what) {
    return absl::DataLossError(absl::StrCat(
        where_, ": version ", VersionDirName(version), ": ",
        absl::CEscape(path.lexically_relative(root_).generic_string()), " is ", AbslView(what),
        "; a published version holds only directories and regular files: republish it"));
  };
  auto check = [&](const fs::path& path, const fs::file_status& st) -> absl::Status {
    if (fs::is_symlink(st)) return refuse(path, "a symbolic link");
    if (!fs::is_directory(st) && !fs::is_regular_file(st)) {
      return refuse(path, "neither a directory nor a regular file");
    }
    return absl::OkStatus();
  };
  std::error_code ec;
  for (const fs::path& path : {root_ / kUpdatesDir, dir, dir / kIndexFileName}) {
    const fs::file_status st = fs::symlink_status(path, ec);
    if (ec || st.type() == fs::file_type::not_found) continue;  // NotFound is the reader's to say
    if (absl::Status s = check(path, st); !s.ok()) return s;
  }
  if (scope == LinkCheck::kIndex) return absl::OkStatus();
  fs::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    if (absl::Status s = check(it->path(), it->symlink_status(ec)); !s.ok()) return s;
  }
  if (ec) return ErrnoStatus(ec.value(), "list", dir);
  return absl::OkStatus();
}

absl::StatusOr<VersionManifest> FsStore::ReadManifest(int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  fs::path dir = VersionDir(version);
  if (absl::Status s = CheckNoLinks(version, LinkCheck::kIndex); !s.ok()) return s;
  // A larger index than the bounds allow is refused before it is read.
  auto text = ReadFileToString(dir / kIndexFileName, index_bounds_.max_bytes);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(
          absl::StrCat(where_, ": version ", VersionDirName(version), " is not published"));
    }
    if (absl::IsOutOfRange(text.status())) {
      return IndexTooLarge(where_, version, text.status().message(), index_bounds_);
    }
    return Annotate(text.status(), where_);
  }
  return ManifestFromIndex(where_, version, *text, index_bounds_);
}

absl::StatusOr<fs::path> FsStore::Materialize(int64_t version) {
  auto manifest = ReadManifest(version);
  if (!manifest.ok()) return manifest.status();
  fs::path dir = VersionDir(version);
  if (absl::Status s = CheckNoLinks(version, LinkCheck::kWholeVersion); !s.ok()) return s;
  std::error_code ec;
  for (const std::string& name : manifest->files) {
    if (!fs::is_regular_file(dir / name, ec)) {
      return absl::DataLossError(absl::StrCat(where_, ": version ", VersionDirName(version),
                                              " is missing its payload file \"",
                                              absl::CEscape(name), "\""));
    }
  }
  return dir;
}

absl::StatusOr<std::vector<int64_t>> FsStore::ListVersions() {
  const fs::path updates = root_ / kUpdatesDir;
  std::vector<int64_t> out;
  std::error_code ec;
  if (!fs::is_directory(updates, ec)) return out;
  for (fs::directory_iterator it(updates, ec), end; !ec && it != end; it.increment(ec)) {
    auto version = ParseVersionDirName(it->path().filename().string());
    if (version.ok()) out.push_back(*version);  // not staging directories, lock files
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat(where_, ": list ", updates.string(), ": ", ec.message()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Store* FsStore::anchors() {
  if (parent_ != nullptr) return nullptr;
  absl::MutexLock lock(&anchors_mu_);
  if (anchors_ == nullptr) {
    anchors_.reset(new FsStore(root_ / kAnchorsDir, run_id_, index_bounds_));
    anchors_->parent_ = this;
  }
  return anchors_.get();
}

absl::Status FsStore::DeleteVersion(int64_t version) {
  // An anchors store obeys its parent's pointer.
  auto pointer = parent_ != nullptr ? parent_->ReadPointer() : ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (absl::Status s = CheckDeletable(where_, run_id_, *pointer, version); !s.ok()) return s;
  const fs::path dir = VersionDir(version);
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  auto trash = CreateStagingDir(dir);
  if (!trash.ok()) return trash.status();
  // rename(2) replaces the empty staging directory in one step: readers see
  // the version whole or not at all.
  if (::rename(dir.c_str(), trash->path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();  // another gc took it
    return Annotate(ErrnoStatus(errno, "rename", dir), where_);
  }
  if (absl::Status s = FsyncPath(root_ / kUpdatesDir); !s.ok()) return Annotate(s, where_);
  fs::remove_all(trash->path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(where_, ": remove ", trash->path.string(), ": ",
                                            ec.message(), " (the next publish removes it)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<fs::path> FsStore::RecordPath(std::string_view kind, std::string_view name) const {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  if (absl::Status s = ValidateRecordWord("record name", name); !s.ok()) return Annotate(s, where_);
  return root_ / fs::path(kind) / fs::path(name);
}

absl::StatusOr<std::vector<std::string>> FsStore::ListRecords(std::string_view kind) {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  const fs::path dir = root_ / fs::path(kind);
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    // WriteFileAtomically's temporary files start with '.'.
    if (ValidateRecordWord("record name", name).ok() && it->is_regular_file()) {
      out.push_back(std::move(name));
    }
  }
  if (ec) {
    return absl::InternalError(absl::StrCat(where_, ": list ", dir.string(), ": ", ec.message()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<std::optional<std::string>> FsStore::ReadRecord(std::string_view kind,
                                                               std::string_view name) {
  auto path = RecordPath(kind, name);
  if (!path.ok()) return path.status();
  auto text = ReadFileToString(*path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return std::nullopt;
    return Annotate(text.status(), where_);
  }
  return *std::move(text);
}

absl::Status FsStore::WriteRecord(std::string_view kind, std::string_view name,
                                  std::string_view text) {
  auto path = RecordPath(kind, name);
  if (!path.ok()) return path.status();
  std::error_code ec;
  if (!fs::is_regular_file(root_ / kPointerFile, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(where_, ": no run was claimed here; records are kept in an existing store"));
  }
  if (!fs::is_directory(path->parent_path(), ec)) {
    if (::mkdir(path->parent_path().c_str(), 0755) != 0 && errno != EEXIST) {
      return Annotate(ErrnoStatus(errno, "create", path->parent_path()), where_);
    }
    if (absl::Status s = FsyncPath(root_); !s.ok()) return Annotate(s, where_);
  }
  return Annotate(WriteFileAtomically(*path, text), where_);
}

absl::Status FsStore::DeleteRecord(std::string_view kind, std::string_view name) {
  auto path = RecordPath(kind, name);
  if (!path.ok()) return path.status();
  if (::unlink(path->c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return Annotate(ErrnoStatus(errno, "remove", *path), where_);
  }
  return Annotate(FsyncPath(path->parent_path()), where_);
}

}  // namespace stitch
