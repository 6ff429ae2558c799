#include "stitch/store/mem_store.h"

#include <map>
#include <system_error>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/store/pointer_cas.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

// File name -> bytes; the index is stored under kIndexFileName.
using VersionFiles = std::map<std::string, std::string>;

// A directory name for a store name: bytes outside [A-Za-z0-9._-] (and a
// name of only dots) are written as %XX, so distinct names never collide.
std::string EscapeName(std::string_view name) {
  bool only_dots = name.find_first_not_of('.') == std::string_view::npos;
  std::string out;
  for (char c : name) {
    bool plain = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                 (c == '.' && !only_dots);
    if (plain) {
      out.push_back(c);
    } else {
      absl::StrAppendFormat(&out, "%%%02X", static_cast<unsigned char>(c));
    }
  }
  return out;
}

// The first difference between two versions' files, or "" when identical.
std::string FirstDifference(const VersionFiles& have, const VersionFiles& incoming) {
  for (const auto& [name, bytes] : incoming) {
    auto it = have.find(name);
    if (it == have.end()) return absl::StrCat("lacks \"", absl::CEscape(name), "\"");
    if (it->second != bytes) return absl::StrCat("its \"", absl::CEscape(name), "\" differs");
  }
  for (const auto& [name, bytes] : have) {
    if (!incoming.contains(name)) return absl::StrCat("also holds \"", absl::CEscape(name), "\"");
  }
  return "";
}

// True when `dir` holds exactly `files`, byte for byte.
bool DirectoryMatches(const fs::path& dir, const VersionFiles& files) {
  std::error_code ec;
  size_t regular = 0;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory(ec)) continue;
    if (!it->is_regular_file(ec)) return false;
    ++regular;
  }
  if (ec || regular != files.size()) return false;
  for (const auto& [name, bytes] : files) {
    auto on_disk = ReadFileToString(dir / name);
    if (!on_disk.ok() || *on_disk != bytes) return false;
  }
  return true;
}

}  // namespace

struct MemStore::State {
  absl::Mutex mu;
  std::optional<std::string> pointer_text ABSL_GUARDED_BY(mu);
  std::map<int64_t, VersionFiles> versions ABSL_GUARDED_BY(mu);
  // kind -> name -> text.
  std::map<std::string, std::map<std::string, std::string, std::less<>>, std::less<>> records
      ABSL_GUARDED_BY(mu);
  // Serializes writes under cache directories, so that two threads
  // materializing the same version never interleave.
  absl::Mutex materialize_mu;
};

MemStore::State& MemStore::SharedState(const std::string& name) {
  struct Registry {
    absl::Mutex mu;
    std::map<std::string, std::unique_ptr<State>> states ABSL_GUARDED_BY(mu);
  };
  // Leaked on purpose: stores may be used until the very end of the process.
  static Registry* registry = new Registry;
  absl::MutexLock lock(&registry->mu);
  std::unique_ptr<State>& state = registry->states[name];
  if (!state) state = std::make_unique<State>();
  return *state;
}

MemStore::MemStore(std::string name, std::string run_id, fs::path cache_dir, State* state)
    : name_(std::move(name)),
      run_id_(std::move(run_id)),
      cache_dir_(std::move(cache_dir)),
      where_(absl::StrCat("store mem://", name_)),
      state_(state) {}

MemStore::~MemStore() = default;

absl::StatusOr<std::unique_ptr<MemStore>> MemStore::Open(std::string name, std::string run_id,
                                                         fs::path cache_dir) {
  if (name.empty()) {
    return absl::InvalidArgumentError("mem store name is empty; use mem://NAME");
  }
  if (!run_id.empty()) {
    if (absl::Status s = ValidateRunId(run_id); !s.ok()) {
      return Annotate(s, absl::StrCat("store mem://", name));
    }
  }
  State* state = &SharedState(name);
  return std::unique_ptr<MemStore>(
      new MemStore(std::move(name), std::move(run_id), std::move(cache_dir), state));
}

std::string MemStore::uri() const { return absl::StrCat("mem://", name_); }

absl::Status MemStore::Refresh() { return absl::OkStatus(); }

absl::StatusOr<std::optional<VersionRef>> MemStore::ReadPointer() {
  std::string text;
  {
    absl::MutexLock lock(&state_->mu);
    text = state_->pointer_text.value_or("");
  }
  return ParsePointerText(where_, text);
}

absl::Status MemStore::AdvancePointer(const std::optional<VersionRef>& expected,
                                      const VersionRef& proposed) {
  absl::MutexLock lock(&state_->mu);
  auto actual = ParsePointerText(where_, state_->pointer_text.value_or(""));
  if (!actual.ok()) return actual.status();
  if (absl::Status s = CheckCompareAndSwap(where_, run_id_, expected, *actual, proposed); !s.ok()) {
    return s;
  }
  state_->pointer_text = proposed.ToString();
  return absl::OkStatus();
}

absl::Status MemStore::PublishFiles(int64_t version, const fs::path& dir) {
  if (run_id_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where_, ": opened without a run id, so it cannot publish; open it with one"));
  }
  auto contents = ReadVersionDir(dir, version);
  if (!contents.ok()) return Annotate(contents.status(), where_);
  VersionFiles files;
  files[std::string(kIndexFileName)] = contents->index_json;
  for (const std::string& name : contents->StoredFiles()) {
    auto bytes = ReadFileToString(dir / name);
    if (!bytes.ok()) return Annotate(bytes.status(), where_);
    files[name] = *std::move(bytes);
  }
  absl::MutexLock lock(&state_->mu);
  auto [it, inserted] = state_->versions.try_emplace(version, std::move(files));
  if (inserted) return absl::OkStatus();
  std::string difference = FirstDifference(it->second, files);
  if (difference.empty()) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(where_, ": version ", VersionDirName(version),
                                               " already exists and ", difference,
                                               "; versions are immutable"));
}

absl::StatusOr<VersionManifest> MemStore::ReadManifest(int64_t version) {
  std::string index_json;
  {
    absl::MutexLock lock(&state_->mu);
    auto it = state_->versions.find(version);
    if (it == state_->versions.end()) {
      return absl::NotFoundError(
          absl::StrCat(where_, ": version ", VersionDirName(version), " is not published"));
    }
    auto index = it->second.find(std::string(kIndexFileName));
    if (index != it->second.end()) index_json = index->second;
  }
  if (index_json.empty()) {
    return absl::DataLossError(absl::StrCat(where_, ": version ", VersionDirName(version),
                                            " has a bad index: it is missing"));
  }
  return ManifestFromIndex(where_, version, index_json);
}

absl::StatusOr<fs::path> MemStore::Materialize(int64_t version) {
  if (cache_dir_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where_, ": no cache directory to materialize into; open it with StoreOptions.cache_dir"));
  }
  auto manifest = ReadManifest(version);
  if (!manifest.ok()) return manifest.status();
  VersionFiles files;
  {
    absl::MutexLock lock(&state_->mu);
    files = state_->versions.at(version);
  }
  for (const std::string& name : manifest->files) {
    if (!files.contains(name)) {
      return absl::DataLossError(absl::StrCat(where_, ": version ", VersionDirName(version),
                                              " is missing its payload file \"",
                                              absl::CEscape(name), "\""));
    }
  }
  fs::path target = cache_dir_ / "mem" / EscapeName(name_) / VersionDirName(version);
  absl::MutexLock lock(&state_->materialize_mu);
  std::error_code ec;
  if (fs::exists(target, ec) && DirectoryMatches(target, files)) return target;
  fs::create_directories(target.parent_path(), ec);
  if (ec) return Annotate(ErrnoStatus(ec.value(), "create", target.parent_path()), where_);
  fs::path staging = TempSiblingPath(target);
  auto stage = [&]() -> absl::Status {
    for (const auto& [name, bytes] : files) {
      fs::path to = staging / name;
      fs::create_directories(to.parent_path(), ec);
      if (ec) return ErrnoStatus(ec.value(), "create", to.parent_path());
      if (absl::Status s = WriteFileAtomically(to, bytes); !s.ok()) return s;
    }
    // Whatever sits at the target does not match (a stale or foreign copy).
    fs::remove_all(target, ec);
    if (ec) return ErrnoStatus(ec.value(), "remove", target);
    return RenameDurably(staging, target);
  };
  absl::Status status = stage();
  fs::remove_all(staging, ec);
  if (!status.ok()) return Annotate(status, where_);
  return target;
}

void MemStore::SetPointerTextForTesting(std::optional<std::string> text) {
  absl::MutexLock lock(&state_->mu);
  state_->pointer_text = std::move(text);
}

void MemStore::DropFileForTesting(int64_t version, const std::string& file) {
  absl::MutexLock lock(&state_->mu);
  auto it = state_->versions.find(version);
  if (it != state_->versions.end()) it->second.erase(file);
}

absl::StatusOr<std::vector<int64_t>> MemStore::ListVersions() {
  absl::MutexLock lock(&state_->mu);
  std::vector<int64_t> out;
  for (const auto& [version, files] : state_->versions) out.push_back(version);
  return out;
}

Store* MemStore::anchors() {
  if (parent_ != nullptr) return nullptr;
  absl::MutexLock lock(&anchors_mu_);
  if (anchors_ == nullptr) {
    std::string name = absl::StrCat(name_, "/anchors");
    State* state = &SharedState(name);
    anchors_.reset(new MemStore(std::move(name), run_id_, cache_dir_, state));
    anchors_->parent_ = this;
  }
  return anchors_.get();
}

absl::Status MemStore::DeleteVersion(int64_t version) {
  // An anchors store obeys its parent's pointer.
  auto pointer = parent_ != nullptr ? parent_->ReadPointer() : ReadPointer();
  if (!pointer.ok()) return pointer.status();
  absl::MutexLock lock(&state_->mu);
  if (absl::Status s = CheckDeletable(where_, run_id_, *pointer, version); !s.ok()) return s;
  state_->versions.erase(version);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> MemStore::ListRecords(std::string_view kind) {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  absl::MutexLock lock(&state_->mu);
  std::vector<std::string> out;
  auto it = state_->records.find(kind);
  if (it == state_->records.end()) return out;
  for (const auto& [name, text] : it->second) out.push_back(name);
  return out;
}

absl::StatusOr<std::optional<std::string>> MemStore::ReadRecord(std::string_view kind,
                                                                std::string_view name) {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  if (absl::Status s = ValidateRecordWord("record name", name); !s.ok()) return Annotate(s, where_);
  absl::MutexLock lock(&state_->mu);
  auto it = state_->records.find(kind);
  if (it == state_->records.end()) return std::nullopt;
  auto record = it->second.find(name);
  if (record == it->second.end()) return std::nullopt;
  return record->second;
}

absl::Status MemStore::WriteRecord(std::string_view kind, std::string_view name,
                                   std::string_view text) {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  if (absl::Status s = ValidateRecordWord("record name", name); !s.ok()) return Annotate(s, where_);
  absl::MutexLock lock(&state_->mu);
  if (!state_->pointer_text.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(where_, ": no run was claimed here; records are kept in an existing store"));
  }
  auto [it, inserted] = state_->records.try_emplace(std::string(kind));
  it->second.insert_or_assign(std::string(name), std::string(text));
  return absl::OkStatus();
}

absl::Status MemStore::DeleteRecord(std::string_view kind, std::string_view name) {
  if (absl::Status s = ValidateRecordWord("record kind", kind); !s.ok()) return Annotate(s, where_);
  if (absl::Status s = ValidateRecordWord("record name", name); !s.ok()) return Annotate(s, where_);
  absl::MutexLock lock(&state_->mu);
  auto it = state_->records.find(kind);
  if (it != state_->records.end()) {
    auto record = it->second.find(name);
    if (record != it->second.end()) it->second.erase(record);
  }
  return absl::OkStatus();
}

}  // namespace stitch
