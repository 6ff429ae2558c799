#include "stitch/delta/delta_apply.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_chain.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"

namespace stitch {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// "a/b/" and "a/./b" name the same directory as "a/b"; the sibling paths
// (temporary generations, the lock) are built from the last component.
fs::path CleanPath(const fs::path& p) {
  fs::path c = p.lexically_normal();
  if (!c.has_filename() && c.has_parent_path()) c = c.parent_path();
  return c;
}

fs::path ParentOf(const fs::path& p) {
  return p.parent_path().empty() ? fs::path(".") : p.parent_path();
}

// An exclusive flock held on "<parent>/.<name>.lock" while alive.
class DestinationLock {
 public:
  static absl::StatusOr<DestinationLock> Acquire(const fs::path& out_dir) {
    fs::path path = ParentOf(out_dir) / absl::StrCat(".", out_dir.filename().string(), ".lock");
    DestinationLock l;
    l.fd_ = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!l.fd_) return ErrnoStatus(errno, "create lock file", path);
    while (::flock(l.fd_.get(), LOCK_EX) != 0) {
      if (errno != EINTR) return ErrnoStatus(errno, "lock", path);
    }
    return l;
  }

 private:
  UniqueFd fd_;  // closing it releases the lock
};

// Removes a directory tree when it goes out of scope, unless released.
class TreeGuard {
 public:
  explicit TreeGuard(fs::path dir) : dir_(std::move(dir)) {}
  ~TreeGuard() {
    if (!dir_.empty()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }

 private:
  fs::path dir_;
};

// Copies `len` bytes at `offset` of one file to the same offset of another,
// in the kernel when it can (copy_file_range; a reflink on filesystems that
// share extents).
absl::Status CopyRange(int in, const fs::path& in_path, int out, const fs::path& out_path,
                       uint64_t offset, uint64_t len) {
  loff_t off_in = static_cast<loff_t>(offset), off_out = static_cast<loff_t>(offset);
  uint64_t left = len;
  while (left > 0) {
    ssize_t n = ::copy_file_range(in, &off_in, out, &off_out, left, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP) break;
      return ErrnoStatus(errno, "copy to", out_path);
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat("read ", in_path.string(), ": file ends at byte ",
                                              off_in, ", before its header says"));
    }
    left -= static_cast<uint64_t>(n);
  }
  if (left == 0) return absl::OkStatus();
  std::vector<std::byte> buf(std::min<uint64_t>(left, 1 << 20));
  FileSource src(in, 0, &in_path);
  FileSink dst(out, 0, &out_path);
  for (uint64_t pos = static_cast<uint64_t>(off_in); left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, buf.size()));
    absl::StatusOr<std::span<const std::byte>> b = src.Read(pos, std::span(buf).first(n));
    if (!b.ok()) return b.status();
    if (absl::Status s = dst.Commit(pos, *b); !s.ok()) return s;
    pos += n;
    left -= n;
  }
  return absl::OkStatus();
}

// Whether `held` holds the same tensors (names, dtypes, shapes) as `anchor`:
// only then can deltas of the anchor's lineage apply to it.
bool SameTensors(const CheckpointReader& anchor, const CheckpointReader& held) {
  if (anchor.tensors().size() != held.tensors().size()) return false;
  for (size_t i = 0; i < anchor.tensors().size(); ++i) {
    const CheckpointTensor& a = anchor.tensors()[i];
    const CheckpointTensor& h = held.tensors()[i];
    if (a.name != h.name || a.dtype != h.dtype || a.shape != h.shape || a.nbytes != h.nbytes) {
      return false;
    }
  }
  return true;
}

// The materialized checkpoint's index: the base's, at the target version.
CheckpointIndex MaterializedIndex(CheckpointIndex index, const VersionRef& version) {
  for (std::string_view key : std::initializer_list<std::string_view>{
           "delta_encoding", "compression_format", "checksum_format", "base_version", "run_id",
           kWeightsFingerprintKey, kBaseFingerprintKey}) {
    index.metadata.erase(std::string(key));
    index.other_metadata.erase(std::string(key));
  }
  index.metadata["version"] = VersionMetadataString(version.version);
  if (!version.run_id.empty()) index.metadata[std::string(kRunIdMetadataKey)] = version.run_id;
  return index;
}

// Copies the anchor's small companion files (config, tokenizer).
absl::Status CopyCompanionFiles(const fs::path& anchor_dir, const fs::path& gen) {
  std::error_code ec;
  for (fs::directory_iterator it(anchor_dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!it->is_regular_file(ec) || name.empty() || name[0] == '.' || name == kIndexFileName ||
        absl::EndsWith(name, ".safetensors")) {
      continue;
    }
    if (fs::exists(gen / name)) continue;  // a payload file of the same name
    if (absl::Status s = CopyFileDurably(it->path(), gen / name); !s.ok()) return s;
  }
  if (ec)
    return absl::InternalError(absl::StrCat("list ", anchor_dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// Makes `gen` (complete and fsync'ed) visible at `out_dir`. Afterwards `gen`
// holds the previous generation, if there was one.
absl::Status Swap(const fs::path& gen, const fs::path& out_dir, bool out_exists) {
  const fs::path parent = ParentOf(out_dir);
  if (!out_exists) return RenameDurably(gen, out_dir);
  if (::renameat2(AT_FDCWD, gen.c_str(), AT_FDCWD, out_dir.c_str(), RENAME_EXCHANGE) == 0) {
    return FsyncPath(parent);
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    return ErrnoStatus(errno, "swap into place", out_dir);
  }
  // No RENAME_EXCHANGE here: move the old generation aside, then the new
  // one in, and put the old one back where `gen` was.
  const fs::path old = TempSiblingPath(out_dir);
  if (::rename(out_dir.c_str(), old.c_str()) != 0) return ErrnoStatus(errno, "move aside", out_dir);
  if (::rename(gen.c_str(), out_dir.c_str()) != 0) {
    absl::Status s = ErrnoStatus(errno, "rename to", out_dir);
    ::rename(old.c_str(), out_dir.c_str());
    return s;
  }
  if (::rename(old.c_str(), gen.c_str()) != 0) {
    std::error_code ec;
    fs::remove_all(old, ec);
  }
  return FsyncPath(parent);
}

struct Task {
  enum class Kind { kFold, kCopyRange, kCopyFile, kVerify };
  Kind kind = Kind::kFold;
  uint64_t size = 0;
  const CheckpointTensor* tensor = nullptr;  // kFold, kCopyRange, kVerify
  const TensorChange* change = nullptr;      // kFold
  size_t out_file = 0;                       // kFold, kCopyRange
  fs::path from, to;                         // kCopyFile
};

struct OutFile {
  fs::path path;
  UniqueFd fd;
};

// A lineage checked whole before anything is written: the anchor, the
// deltas after it, the run they belong to, and the version they reach.
struct Lineage {
  CheckpointReader anchor;
  DeltaChain chain;
  int64_t anchor_version = 0;
  VersionRef target;
};

// The run the anchor records ("" when none), checked against `run` (the
// caller's, or the anchor's when the caller gave none).
absl::StatusOr<std::string> AnchorRun(const CheckpointReader& anchor, const fs::path& anchor_dir,
                                      const std::string& asked) {
  std::string anchor_run;
  if (auto it = anchor.index().metadata.find(std::string(kRunIdMetadataKey));
      it != anchor.index().metadata.end()) {
    anchor_run = it->second;
  }
  const std::string run = asked.empty() ? anchor_run : asked;
  if (!anchor_run.empty() && anchor_run != run) {
    return absl::FailedPreconditionError(absl::StrCat(
        "anchor ", anchor_dir.string(), " belongs to run \"", anchor_run, "\", not \"", run, "\""));
  }
  return anchor_run;
}

// The anchor's version (recorded, else given, else the chain's base), and
// that the first delta applies to it.
absl::StatusOr<int64_t> AnchorVersion(const CheckpointReader& anchor, const fs::path& anchor_dir,
                                      const DeltaChain& chain, const ApplyOptions& options) {
  if (anchor.version() && options.anchor_version && *anchor.version() != *options.anchor_version) {
    return absl::InvalidArgumentError(absl::StrCat("anchor ", anchor_dir.string(),
                                                   " records version ", *anchor.version(), ", not ",
                                                   *options.anchor_version));
  }
  std::optional<int64_t> version = anchor.version() ? anchor.version() : options.anchor_version;
  if (!version) {
    if (chain.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "anchor ", anchor_dir.string(), " records no version; say which version it holds"));
    }
    version = chain.base_version();
  }
  if (!chain.empty() && chain.base_version() != *version) {
    const DeltaVersion& first = chain.deltas.front();
    return absl::InvalidArgumentError(
        chain.base_version() > *version
            ? absl::StrCat("the lineage has a gap: the anchor ", anchor_dir.string(),
                           " is version ", *version, ", the first delta ", first.dir().string(),
                           " applies to version ", first.base_version(),
                           "; the deltas for versions ", *version + 1, "..", first.base_version(),
                           " are missing")
            : absl::StrCat("delta ", first.dir().string(), " (version ", first.version(),
                           ") is not after the anchor ", anchor_dir.string(), " (version ",
                           *version, "); give only the deltas after the anchor"));
  }
  return *version;
}

absl::StatusOr<Lineage> OpenLineage(const fs::path& anchor_dir,
                                    std::span<const fs::path> delta_dirs,
                                    const ApplyOptions& options) {
  if (!options.run_id.empty()) {
    if (absl::Status s = ValidateRunId(options.run_id); !s.ok()) return s;
  }
  absl::StatusOr<CheckpointReader> anchor = CheckpointReader::Open(anchor_dir);
  if (!anchor.ok()) return Annotate(anchor.status(), absl::StrCat("anchor ", anchor_dir.string()));
  if (anchor->index().is_delta()) {
    return absl::InvalidArgumentError(
        absl::StrCat("anchor ", anchor_dir.string(),
                     " is a DELTA version; an anchor is a FULL version or the boot checkpoint"));
  }
  absl::StatusOr<std::string> anchor_run = AnchorRun(*anchor, anchor_dir, options.run_id);
  if (!anchor_run.ok()) return anchor_run.status();
  absl::StatusOr<DeltaChain> chain =
      OpenDeltaChain(delta_dirs, options.run_id.empty() ? *anchor_run : options.run_id);
  if (!chain.ok()) return chain.status();
  if (!anchor_run->empty() && !chain->run_id.empty() && chain->run_id != *anchor_run) {
    return absl::FailedPreconditionError(absl::StrCat("the deltas belong to run \"", chain->run_id,
                                                      "\", the anchor ", anchor_dir.string(),
                                                      " to run \"", *anchor_run, "\""));
  }
  absl::StatusOr<int64_t> anchor_version = AnchorVersion(*anchor, anchor_dir, *chain, options);
  if (!anchor_version.ok()) return anchor_version.status();
  const CheckpointReader& a = *anchor;
  if (absl::Status s = CheckChainAgainst(*chain,
                                         [&](std::string_view name) -> std::optional<uint64_t> {
                                           const CheckpointTensor* t = a.Find(name);
                                           if (t == nullptr) return std::nullopt;
                                           return t->nbytes;
                                         });
      !s.ok()) {
    return s;
  }
  const VersionRef target{chain->run_id,
                          chain->empty() ? *anchor_version : chain->target_version()};
  return Lineage{*std::move(anchor), *std::move(chain), *anchor_version, target};
}

// The new generation's work: files taken whole (linked from what the
// destination held, or copied) and, in the files the deltas change, each
// tensor folded or copied; from a FULL anchor that records checksums, every
// unchanged tensor verified too.
struct GenerationPlan {
  std::vector<Task> tasks;
  std::vector<OutFile> out_files;
  uint64_t total = 0;
};

absl::StatusOr<GenerationPlan> PlanGeneration(
    const CheckpointReader& base, const std::map<std::string, TensorChange, std::less<>>& plan,
    bool from_held, const fs::path& gen, MaterializeResult& result) {
  GenerationPlan out;
  std::error_code ec;
  std::vector<bool> file_changed(base.files().size(), false);
  for (const CheckpointTensor& t : base.tensors()) {
    if (plan.contains(t.name)) file_changed[t.file] = true;
  }
  std::vector<size_t> out_file_of(base.files().size(), SIZE_MAX);
  for (size_t i = 0; i < base.files().size(); ++i) {
    const CheckpointFile& f = base.files()[i];
    const fs::path dst = gen / f.name;
    fs::create_directories(dst.parent_path(), ec);
    if (ec) return ErrnoStatus(ec.value(), "create directory", dst.parent_path());
    if (!file_changed[i]) {
      if (from_held && ::link(f.path.c_str(), dst.c_str()) == 0) {
        ++result.files_linked;
        continue;
      }
      out.tasks.push_back(Task{Task::Kind::kCopyFile, f.size, nullptr, nullptr, 0, f.path, dst});
      ++result.files_copied;
      continue;
    }
    OutFile of{dst, UniqueFd(::open(dst.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644))};
    if (!of.fd) return ErrnoStatus(errno, "create", dst);
    if (::ftruncate(of.fd.get(), static_cast<off_t>(f.size)) != 0) {
      return ErrnoStatus(errno, "resize", dst);
    }
    // The header is the base file's, byte for byte: deltas change no dtype,
    // shape or offset.
    if (absl::Status s = CopyRange(f.fd.get(), f.path, of.fd.get(), dst, 0, f.header.data_start);
        !s.ok()) {
      return s;
    }
    out_file_of[i] = out.out_files.size();
    out.out_files.push_back(std::move(of));
    ++result.files_written;
  }
  for (const CheckpointTensor& t : base.tensors()) {
    if (!file_changed[t.file]) continue;
    auto it = plan.find(t.name);
    if (it != plan.end()) {
      out.tasks.push_back(
          Task{Task::Kind::kFold, t.nbytes, &t, &it->second, out_file_of[t.file], {}, {}});
      result.bytes_decoded += t.nbytes;
    } else {
      out.tasks.push_back(
          Task{Task::Kind::kCopyRange, t.nbytes, &t, nullptr, out_file_of[t.file], {}, {}});
    }
  }
  // A changed tensor is covered by its target checksum. What the
  // destination already held was written and checked by this codec.
  if (!from_held && base.records_checksums()) {
    for (const CheckpointTensor& t : base.tensors()) {
      if (!plan.contains(t.name)) {
        out.tasks.push_back(Task{Task::Kind::kVerify, t.nbytes, &t, nullptr, 0, {}, {}});
      }
    }
  }
  for (const Task& t : out.tasks) out.total += t.size;
  return out;
}

// Runs every task of `g`, largest first, on `threads` workers.
absl::Status RunGeneration(const CheckpointReader& base, GenerationPlan& g, int threads,
                           ProgressMeter& meter) {
  std::vector<uint64_t> sizes;
  for (const Task& t : g.tasks) sizes.push_back(t.size);
  const std::vector<size_t> order = LargestFirst(sizes);
  std::vector<CodecWorkspace> workspaces(static_cast<size_t>(threads));
  std::atomic<bool> cancel{false};
  return ParallelFor(
      order.size(), threads,
      [&](size_t i, int worker) -> absl::Status {
        const Task& task = g.tasks[order[i]];
        absl::Status s;
        if (task.kind == Task::Kind::kVerify) {
          s = VerifyRecordedChecksum(base, *task.tensor);
        } else if (task.kind == Task::Kind::kCopyFile) {
          s = CopyFileDurably(task.from, task.to);
        } else {
          const CheckpointTensor& t = *task.tensor;
          const CheckpointFile& in = base.files()[t.file];
          OutFile& out = g.out_files[task.out_file];
          if (task.kind == Task::Kind::kCopyRange) {
            s = CopyRange(in.fd.get(), in.path, out.fd.get(), out.path, t.offset, t.nbytes);
          } else {
            FileSource src(in.fd.get(), t.offset, &in.path);
            FileSink sink(out.fd.get(), t.offset, &out.path);
            FoldSpec spec{t.name,  t.nbytes, task.change->frames, task.change->expected, UINT64_MAX,
                          &cancel, &meter};
            return FoldFrames(workspaces[static_cast<size_t>(worker)], spec, src, sink);
          }
        }
        meter.Add(task.size);
        return s;
      },
      &cancel);
}

// Makes the written generation durable and complete (companion files, the
// index, the held-version marker), then swaps it into `out_dir`.
absl::Status FinishGeneration(GenerationPlan& g, int threads, const fs::path& anchor_dir,
                              const CheckpointReader& base, const VersionRef& target,
                              const fs::path& gen, const fs::path& out_dir, bool out_exists) {
  absl::Status st = ParallelFor(g.out_files.size(), threads, [&](size_t i, int) -> absl::Status {
    if (::fsync(g.out_files[i].fd.get()) != 0) {
      return ErrnoStatus(errno, "fsync", g.out_files[i].path);
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  g.out_files.clear();
  if (absl::Status s = CopyCompanionFiles(anchor_dir, gen); !s.ok()) return s;
  if (absl::Status s = WriteIndex(gen, MaterializedIndex(base.index(), target)); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomically(gen / kHeldVersionFileName, target.ToString() + "\n");
      !s.ok()) {
    return s;
  }
  // Every file is synced already (a no-op for them); this reaches the
  // directories, including those of nested payload names.
  if (absl::Status s = FsyncTree(gen); !s.ok()) return s;
  return Swap(gen, out_dir, out_exists);
}

}  // namespace

absl::StatusOr<std::optional<VersionRef>> ReadHeldVersion(const fs::path& dir) {
  std::error_code ec;
  fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) return std::optional<VersionRef>();
  if (!fs::is_directory(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination ", dir.string(), " exists and is not a directory"));
  }
  absl::StatusOr<std::string> text = ReadFileToString(dir / kHeldVersionFileName);
  if (!text.ok()) {
    if (!absl::IsNotFound(text.status())) return text.status();
    if (fs::is_empty(dir, ec)) return std::optional<VersionRef>();
    return absl::FailedPreconditionError(absl::StrCat(
        "destination ", dir.string(), " holds files but no ", AbslView(kHeldVersionFileName),
        " marker: it is not a checkpoint Stitch materialized; choose a new or empty directory"));
  }
  absl::StatusOr<VersionRef> v = VersionRef::Parse(*text);
  if (!v.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("destination ", dir.string(), ": marker ", AbslView(kHeldVersionFileName),
                     " is unreadable (", v.status().message(), "); remove the directory"));
  }
  return std::optional<VersionRef>(*v);
}

absl::StatusOr<MaterializeResult> MaterializeCheckpoint(const fs::path& anchor_dir,
                                                        std::span<const fs::path> delta_dirs,
                                                        const fs::path& out_arg,
                                                        const ApplyOptions& options) {
  const fs::path out_dir = CleanPath(out_arg);
  // Validate the whole lineage before touching anything.
  absl::StatusOr<Lineage> lineage = OpenLineage(anchor_dir, delta_dirs, options);
  if (!lineage.ok()) return lineage.status();
  const CheckpointReader& anchor = lineage->anchor;
  const DeltaChain& chain = lineage->chain;
  const VersionRef& target = lineage->target;

  // The destination: what it holds decides where we start.
  std::error_code ec;
  if (!out_dir.parent_path().empty()) fs::create_directories(out_dir.parent_path(), ec);
  absl::StatusOr<DestinationLock> lock = DestinationLock::Acquire(out_dir);
  if (!lock.ok()) return lock.status();
  // Generations left behind by a crashed apply (the lock is held: none is
  // in use).
  RemoveStaleTempSiblings(out_dir);
  absl::StatusOr<std::optional<VersionRef>> held = ReadHeldVersion(out_dir);
  if (!held.ok()) return held.status();
  const bool out_exists = fs::exists(fs::symlink_status(out_dir, ec));

  MaterializeResult result;
  result.version = target;
  std::optional<CheckpointReader> held_reader;
  if (*held && (*held)->run_id == target.run_id && (*held)->version >= lineage->anchor_version &&
      (*held)->version <= target.version) {
    absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(out_dir);
    if (r.ok() && SameTensors(anchor, *r)) held_reader = *std::move(r);
  }
  if (held_reader && (*held)->version == target.version) {
    result.applied_on = target.version;
    return result;
  }
  const CheckpointReader& base = held_reader ? *held_reader : anchor;
  const size_t first =
      held_reader ? static_cast<size_t>((*held)->version - lineage->anchor_version) : 0;
  result.applied_on = held_reader ? (*held)->version : lineage->anchor_version;
  result.reseeded = !held_reader;
  result.deltas_applied = chain.deltas.size() - first;
  const std::map<std::string, TensorChange, std::less<>> plan = PlanChanges(chain, first);
  result.tensors_changed = plan.size();

  // Build the new generation.
  const auto write_start = Clock::now();
  const fs::path gen = TempSiblingPath(out_dir);
  if (::mkdir(gen.c_str(), 0755) != 0) return ErrnoStatus(errno, "create directory", gen);
  TreeGuard guard(gen);
  absl::StatusOr<GenerationPlan> g =
      PlanGeneration(base, plan, held_reader.has_value(), gen, result);
  if (!g.ok()) return g.status();
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  ProgressMeter meter(g->total, options.progress);
  if (absl::Status s = RunGeneration(base, *g, threads, meter); !s.ok()) return s;
  result.write_seconds = SecondsSince(write_start);

  const auto sync_start = Clock::now();
  if (absl::Status s =
          FinishGeneration(*g, threads, anchor_dir, base, target, gen, out_dir, out_exists);
      !s.ok()) {
    return s;
  }
  meter.Finish();
  result.sync_seconds = SecondsSince(sync_start);
  return result;
}

}  // namespace stitch
