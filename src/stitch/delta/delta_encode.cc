// Over ~600 lines on purpose: the DELTA encoder and the FULL writer share
// the output protocol (a temporary directory beside the output and its
// guard, scratch files, shard names and sizes), private to this file.

#include "stitch/delta/delta_encode.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>
#include <variant>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/errors.h"
#include "stitch/core/manifest.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_version.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/format/index.h"
#include "stitch/format/tensor_checksums.h"
#include "stitch/io/fileio.h"

namespace stitch {
namespace fs = std::filesystem;

namespace {

// One tensor as the encoder reads it: in a file or in memory.
struct TensorInput {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  int fd = -1;
  uint64_t offset = 0;
  const fs::path* path = nullptr;
  std::span<const std::byte> memory;
  // A base tensor to advance: its own memory, overwritten with the target's
  // bytes as they are encoded.
  std::byte* advance = nullptr;
};

using AnySource = std::variant<FileSource, MemorySource>;

AnySource SourceFor(const TensorInput& t) {
  if (t.fd >= 0) return FileSource(t.fd, t.offset, t.path);
  return MemorySource(t.memory);
}

ChunkSource& AsSource(AnySource& s) {
  return std::visit([](auto& v) -> ChunkSource& { return v; }, s);
}

// Removes a temporary output directory unless released.
class TempDirGuard {
 public:
  explicit TempDirGuard(fs::path dir) : dir_(std::move(dir)) {}
  ~TempDirGuard() {
    if (!dir_.empty()) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }
  void Release() { dir_.clear(); }

 private:
  fs::path dir_;
};

// `out_dir` may be created: it does not exist, or is an empty directory.
absl::Status CheckOutputDir(const fs::path& out_dir) {
  std::error_code ec;
  fs::file_status st = fs::symlink_status(out_dir, ec);
  if (!fs::exists(st)) {
    fs::path parent = out_dir.parent_path();
    if (!parent.empty() && !fs::is_directory(parent, ec)) {
      return absl::NotFoundError(absl::StrCat("output ", out_dir.string(), ": parent directory ",
                                              parent.string(), " does not exist"));
    }
    return absl::OkStatus();
  }
  if (!fs::is_directory(st) || !fs::is_empty(out_dir, ec)) {
    return absl::AlreadyExistsError(
        absl::StrCat("output ", out_dir.string(), " already exists; choose a new directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<fs::path> MakeTempDir(const fs::path& out_dir) {
  fs::path tmp = TempSiblingPath(out_dir);
  if (::mkdir(tmp.c_str(), 0755) != 0) return ErrnoStatus(errno, "create directory", tmp);
  return tmp;
}

// Frames of one worker, appended to a scratch file.
class ScratchFile final : public FrameSink {
 public:
  absl::Status Open(fs::path path) {
    path_ = std::move(path);
    fd_ = UniqueFd(::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd_) return ErrnoStatus(errno, "create", path_);
    return absl::OkStatus();
  }
  bool is_open() const { return static_cast<bool>(fd_); }
  uint64_t end() const { return end_; }
  // Forgets everything appended after `offset`.
  void Rewind(uint64_t offset) { end_ = offset; }
  absl::Status Append(std::span<const std::byte> bytes) override {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::pwrite(fd_.get(), bytes.data() + done, bytes.size() - done,
                           static_cast<off_t>(end_ + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return ErrnoStatus(errno, "write", path_);
      }
      done += static_cast<size_t>(n);
    }
    end_ += bytes.size();
    return absl::OkStatus();
  }
  int fd() const { return fd_.get(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  UniqueFd fd_;
  uint64_t end_ = 0;
};

struct EncodedTensor {
  bool changed = false;
  Checksum128 checksum;
  Checksum128 base_checksum;
  int worker = 0;
  uint64_t offset = 0;  // in the worker's scratch file
  uint64_t size = 0;
};

std::string ShardName(size_t i, size_t n, std::string_view prefix) {
  return absl::StrFormat("%s-%05d-of-%05d.safetensors", prefix, i + 1, n);
}

// Puts consecutive items into groups whose byte sizes sum to at most
// `max_bytes` (an item larger than that gets a group of its own).
std::vector<std::vector<size_t>> Shard(std::span<const uint64_t> sizes, uint64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  uint64_t current = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (shards.empty() || (current + sizes[i] > max_bytes && current > 0)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += sizes[i];
  }
  return shards;
}

absl::Status CopyRange(int from_fd, uint64_t offset, uint64_t size, const fs::path& from_path,
                       SafetensorsWriter::Output& out, std::vector<std::byte>& buf) {
  while (size > 0) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), size));
    ssize_t r = ::pread(from_fd, buf.data(), n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "read", from_path);
    }
    if (r == 0)
      return absl::DataLossError(absl::StrCat("read ", from_path.string(), ": ends early"));
    if (absl::Status s = out.Append(std::span(buf.data(), static_cast<size_t>(r))); !s.ok())
      return s;
    offset += static_cast<uint64_t>(r);
    size -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status CheckSameTensors(std::span<const TensorInput> base,
                              std::span<const TensorInput> target) {
  std::map<std::string_view, const TensorInput*> by_name;
  for (const TensorInput& t : base) {
    if (!by_name.emplace(t.name, &t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("base: tensor \"", t.name, "\" appears twice"));
    }
  }
  std::set<std::string_view> seen;
  for (const TensorInput& t : target) {
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("target: tensor \"", t.name, "\" appears twice"));
    }
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name,
                       "\" is in the target but not in the base; a delta "
                       "cannot add tensors (write a FULL version)"));
    }
    const TensorInput& b = *it->second;
    if (b.dtype != t.dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": dtype ", AbslView(DTypeName(b.dtype)),
                       " in the base, ", AbslView(DTypeName(t.dtype)),
                       " in the target; a delta cannot change dtypes (write a FULL version)"));
    }
    if (b.shape != t.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name, "\": shape ", ShapeText(b.shape), " in the base, ",
                       ShapeText(t.shape),
                       " in the target; a delta cannot change shapes (write a FULL version)"));
    }
    if (b.nbytes != t.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": ", b.nbytes,
                                                     " bytes in the base, ", t.nbytes,
                                                     " in the target"));
    }
  }
  for (const TensorInput& b : base) {
    if (!seen.contains(b.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", b.name,
                       "\" is in the base but not in the target; a delta "
                       "cannot remove tensors (write a FULL version)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ResolveBaseVersion(const EncodeOptions& options,
                                           std::optional<int64_t> base_dir_version) {
  if (absl::Status s = ValidateVersionNumber(options.version); !s.ok()) return s;
  if (options.version == 0) {
    return absl::InvalidArgumentError("version 0 cannot be a DELTA: it has no previous version");
  }
  // Never assumed: a delta encoded against a base of another version than
  // it says is refused by every replica, so the version must be known.
  if (!options.base_version && !base_dir_version) {
    return absl::InvalidArgumentError(
        "the base's version is unknown: the base records none, so say which version it holds "
        "(EncodeOptions.base_version)");
  }
  const int64_t base = options.base_version ? *options.base_version : *base_dir_version;
  if (options.base_version && base_dir_version && *options.base_version != *base_dir_version) {
    return absl::InvalidArgumentError(absl::StrCat("base version ", *options.base_version,
                                                   " was asked for, but the base checkpoint "
                                                   "records version ",
                                                   *base_dir_version));
  }
  if (base != options.version - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a delta to version ", options.version, " must apply to version ",
                     options.version - 1, ", not ", base, " (versions of a run are consecutive)"));
  }
  return base;
}

// The tensors' frames, encoded into per-worker scratch files.
struct EncodedTensors {
  std::vector<EncodedTensor> tensors;  // in the order encoded
  std::vector<ScratchFile> scratch;    // one per worker
};

// Encodes every tensor of `order` against its base, largest first, on the
// options' threads. `*started` (when given) is set once bytes are encoded.
absl::StatusOr<EncodedTensors> EncodeTensors(
    std::span<const TensorInput* const> order,
    const std::map<std::string_view, const TensorInput*>& base_by_name, const fs::path& tmp,
    const EncodeOptions& options, uint64_t checkpoint_bytes, bool* started) {
  std::vector<uint64_t> sizes;
  for (const TensorInput* t : order) sizes.push_back(t->nbytes);
  const int threads = static_cast<int>(std::min<size_t>(
      static_cast<size_t>(options.threads > 0 ? options.threads : DefaultThreads()),
      std::max<size_t>(order.size(), 1)));
  std::vector<CodecWorkspace> workspaces(static_cast<size_t>(threads));
  EncodedTensors out;
  out.scratch.resize(static_cast<size_t>(threads));
  out.tensors.resize(order.size());
  ProgressMeter meter(checkpoint_bytes, options.progress);
  std::atomic<bool> cancel{false};
  const std::vector<size_t> schedule = LargestFirst(sizes);

  if (started != nullptr) *started = true;
  absl::Status st = ParallelFor(
      schedule.size(), threads,
      [&](size_t i, int worker) -> absl::Status {
        const size_t k = schedule[i];
        const TensorInput& t = *order[k];
        const TensorInput& b = *base_by_name.at(t.name);
        ScratchFile& sf = out.scratch[static_cast<size_t>(worker)];
        if (!sf.is_open()) {
          if (absl::Status s = sf.Open(tmp / absl::StrCat(".scratch-", worker)); !s.ok()) return s;
        }
        const uint64_t start = sf.end();
        AnySource bs = SourceFor(b), ts = SourceFor(t);
        EncodeSpec spec{t.name, t.nbytes, options.level, &cancel, &meter, b.advance};
        absl::StatusOr<EncodedFrame> f = EncodeXorFrame(workspaces[static_cast<size_t>(worker)],
                                                        spec, AsSource(bs), AsSource(ts), sf);
        if (!f.ok()) return f.status();
        if (!f->changed) sf.Rewind(start);
        out.tensors[k] = EncodedTensor{f->changed, f->target_checksum, f->base_checksum, worker,
                                       start,      f->frame_size};
        return absl::OkStatus();
      },
      &cancel);
  if (!st.ok()) return st;
  meter.Finish();
  return out;
}

// The DELTA index: the version, its base, the codec, the run, and the
// fingerprints of the base's and the target's complete weights.
CheckpointIndex DeltaIndex(std::span<const TensorInput* const> order, const EncodedTensors& encoded,
                           int64_t base_version, const EncodeOptions& options) {
  CheckpointIndex index;
  index.metadata["version"] = VersionMetadataString(options.version);
  index.metadata["base_version"] = VersionMetadataString(base_version);
  index.metadata["delta_encoding"] = "xor";
  index.metadata["compression_format"] = "zstd";
  index.metadata["checksum_format"] = std::string(kChecksumFormat);
  if (!options.run_id.empty()) index.metadata[std::string(kRunIdMetadataKey)] = options.run_id;
  TensorChecksums base_sums, target_sums;
  for (size_t k = 0; k < order.size(); ++k) {
    base_sums[order[k]->name] = encoded.tensors[k].base_checksum;
    target_sums[order[k]->name] = encoded.tensors[k].checksum;
  }
  index.metadata[std::string(kBaseFingerprintKey)] = WeightsFingerprint(base_sums).ToHex();
  index.metadata[std::string(kWeightsFingerprintKey)] = WeightsFingerprint(target_sums).ToHex();
  return index;
}

// Writes the changed tensors' frames into payload shards in `tmp` (each
// file's __metadata__ mapping its tensors to their target checksums), adds
// them to `index` and `result`.
absl::Status WriteDeltaShards(std::span<const TensorInput* const> order,
                              const EncodedTensors& encoded, const fs::path& tmp,
                              uint64_t max_shard_bytes, CheckpointIndex& index,
                              EncodeResult& result) {
  std::vector<size_t> changed;
  std::vector<uint64_t> changed_sizes;
  for (size_t k = 0; k < order.size(); ++k) {
    if (encoded.tensors[k].changed) {
      changed.push_back(k);
      changed_sizes.push_back(encoded.tensors[k].size);
    }
  }
  result.changed_tensors = changed.size();
  const std::vector<std::vector<size_t>> shards = Shard(changed_sizes, max_shard_bytes);
  std::vector<std::byte> buf(1 << 20);
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = ShardName(s, shards.size(), "delta");
    SafetensorsWriter w;
    for (size_t c : shards[s]) {
      const size_t k = changed[c];
      const EncodedTensor& e = encoded.tensors[k];
      if (absl::Status as =
              w.Add(order[k]->name, DType::kU8, {static_cast<int64_t>(e.size)}, e.size);
          !as.ok()) {
        return as;
      }
      w.SetMetadata(order[k]->name, e.checksum.ToHex());
      index.weight_map[order[k]->name] = name;
    }
    absl::StatusOr<std::unique_ptr<SafetensorsWriter::Output>> out = w.Begin(tmp / name);
    if (!out.ok()) return out.status();
    for (size_t c : shards[s]) {
      const EncodedTensor& e = encoded.tensors[changed[c]];
      const ScratchFile& sf = encoded.scratch[static_cast<size_t>(e.worker)];
      if (absl::Status cs = CopyRange(sf.fd(), e.offset, e.size, sf.path(), **out, buf); !cs.ok()) {
        return cs;
      }
    }
    if (absl::Status fin = (*out)->Finish(); !fin.ok()) return fin;
    result.files.push_back(name);
    result.payload_bytes += w.SerializeHeader().size() + w.data_size();
  }
  return absl::OkStatus();
}

// `*started` (when given) is set once the tensors' bytes start to be
// encoded: input is refused before that.
absl::StatusOr<EncodeResult> EncodeImpl(std::span<const TensorInput> base,
                                        std::span<const TensorInput> target,
                                        const fs::path& out_dir, const EncodeOptions& options,
                                        std::optional<int64_t> base_dir_version,
                                        bool* started = nullptr) {
  absl::StatusOr<int64_t> base_version = ResolveBaseVersion(options, base_dir_version);
  if (!base_version.ok()) return base_version.status();
  if (!options.run_id.empty()) {
    if (absl::Status s = ValidateRunId(options.run_id); !s.ok()) return s;
  }
  if (options.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("the payload shard size must be positive");
  }
  if (absl::Status s = CheckSameTensors(base, target); !s.ok()) return s;
  if (absl::Status s = CheckOutputDir(out_dir); !s.ok()) return s;

  std::map<std::string_view, const TensorInput*> base_by_name;
  for (const TensorInput& t : base) base_by_name.emplace(t.name, &t);
  // Work on tensors sorted by name: payload order is by name.
  std::vector<const TensorInput*> order;
  for (const TensorInput& t : target) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const TensorInput* a, const TensorInput* b) { return a->name < b->name; });

  absl::StatusOr<fs::path> tmp = MakeTempDir(out_dir);
  if (!tmp.ok()) return tmp.status();
  TempDirGuard guard(*tmp);

  EncodeResult result;
  result.version = options.version;
  result.base_version = *base_version;
  result.tensors = order.size();
  for (const TensorInput* t : order) result.checkpoint_bytes += t->nbytes;

  absl::StatusOr<EncodedTensors> encoded =
      EncodeTensors(order, base_by_name, *tmp, options, result.checkpoint_bytes, started);
  if (!encoded.ok()) return encoded.status();
  CheckpointIndex index = DeltaIndex(order, *encoded, *base_version, options);
  if (absl::Status s =
          WriteDeltaShards(order, *encoded, *tmp, options.max_shard_bytes, index, result);
      !s.ok()) {
    return s;
  }
  for (ScratchFile& sf : encoded->scratch) {
    if (sf.is_open()) ::unlink(sf.path().c_str());
  }
  encoded->scratch.clear();
  if (absl::Status s = WriteIndex(*tmp, index); !s.ok()) return s;
  if (absl::Status s = FsyncPath(*tmp); !s.ok()) return s;
  if (absl::Status s = RenameDurably(*tmp, out_dir); !s.ok()) return s;
  guard.Release();
  return result;
}

std::vector<TensorInput> InputsFromReader(const CheckpointReader& r) {
  std::vector<TensorInput> out;
  for (const CheckpointTensor& t : r.tensors()) {
    const CheckpointFile& f = r.files()[t.file];
    out.push_back(
        TensorInput{t.name, t.dtype, t.shape, t.nbytes, f.fd.get(), t.offset, &f.path, {}});
  }
  return out;
}

absl::StatusOr<std::vector<TensorInput>> InputsFromViews(std::span<const TensorView> views,
                                                         std::string_view which) {
  std::vector<TensorInput> out;
  for (const TensorView& v : views) {
    uint64_t elements = 1;
    for (int64_t d : v.shape) {
      if (d < 0 || __builtin_mul_overflow(elements, static_cast<uint64_t>(d), &elements)) {
        return absl::InvalidArgumentError(absl::StrCat(AbslView(which), ": tensor \"", v.name,
                                                       "\" has an invalid shape ",
                                                       ShapeText(v.shape)));
      }
    }
    if (elements * DTypeSize(v.dtype) != v.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(AbslView(which), ": tensor \"", v.name, "\" has ", v.data.size(),
                       " bytes, but ", AbslView(DTypeName(v.dtype)), " ", ShapeText(v.shape),
                       " needs ", elements * DTypeSize(v.dtype)));
    }
    out.push_back(TensorInput{v.name, v.dtype, v.shape, v.data.size(), -1, 0, nullptr, v.data});
  }
  return out;
}

// Index metadata of a FULL version made from `source`, whose tensors have
// the checksums `sums`.
CheckpointIndex FullIndex(CheckpointIndex source, const TensorChecksums& sums,
                          const FullVersionOptions& options) {
  for (std::string_view key : std::initializer_list<std::string_view>{
           "delta_encoding", "compression_format", "checksum_format", "base_version",
           kWeightsFingerprintKey, kBaseFingerprintKey}) {
    source.metadata.erase(std::string(key));
    source.other_metadata.erase(std::string(key));
  }
  source.metadata["version"] = VersionMetadataString(options.version);
  source.metadata["checksum_format"] = std::string(kChecksumFormat);
  source.metadata[std::string(kWeightsFingerprintKey)] = WeightsFingerprint(sums).ToHex();
  if (!options.run_id.empty()) source.metadata[std::string(kRunIdMetadataKey)] = options.run_id;
  return source;
}

absl::Status CheckFullOptions(const FullVersionOptions& options) {
  if (absl::Status s = ValidateVersionNumber(options.version); !s.ok()) return s;
  if (!options.run_id.empty()) return ValidateRunId(options.run_id);
  return absl::OkStatus();
}

// Marks the errors of EncodeDeltaAdvancingBase raised after the base
// started to advance.
constexpr char kBaseAdvancedPayload[] = "stitch/base-advanced";

// A base that advances while it is encoded must be memory of its own: no
// base tensor may share a byte with another base tensor or with any target
// tensor (one would be overwritten while it is still being read).
absl::Status CheckBaseIsSeparate(std::span<const TensorInput> base,
                                 std::span<const TensorInput> target) {
  struct Range {
    uintptr_t begin, end;
    bool is_base;
    std::string_view name;
  };
  std::vector<Range> ranges;
  for (const auto& [inputs, is_base] : {std::pair{base, true}, std::pair{target, false}}) {
    for (const TensorInput& t : inputs) {
      const auto begin = reinterpret_cast<uintptr_t>(t.memory.data());
      if (!t.memory.empty()) ranges.push_back({begin, begin + t.memory.size(), is_base, t.name});
    }
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& x, const Range& y) { return x.begin < y.begin; });
  // The range reaching furthest so far, among all, and among base ranges.
  const Range* furthest = nullptr;
  const Range* furthest_base = nullptr;
  for (const Range& r : ranges) {
    // Target ranges may share memory with each other (tied weights); any
    // other pair may not.
    const Range* other = r.is_base ? furthest : furthest_base;
    if (other != nullptr && other->end > r.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the base that advances must be memory of its own, but ",
          other->is_base ? "base" : "target", " tensor \"", AbslView(other->name), "\" and ",
          r.is_base ? "base" : "target", " tensor \"", AbslView(r.name), "\" share bytes"));
    }
    if (furthest == nullptr || r.end > furthest->end) furthest = &r;
    if (r.is_base && (furthest_base == nullptr || r.end > furthest_base->end)) furthest_base = &r;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<EncodeResult> EncodeDelta(const fs::path& base_dir, const fs::path& target_dir,
                                         const fs::path& out_dir, const EncodeOptions& options) {
  absl::StatusOr<CheckpointReader> base = CheckpointReader::Open(base_dir);
  if (!base.ok()) return Annotate(base.status(), absl::StrCat("base ", base_dir.string()));
  absl::StatusOr<CheckpointReader> target = CheckpointReader::Open(target_dir);
  if (!target.ok()) return Annotate(target.status(), absl::StrCat("target ", target_dir.string()));
  if (base->index().is_delta() || target->index().is_delta()) {
    return absl::InvalidArgumentError(
        absl::StrCat("encode needs complete checkpoints, but ",
                     (base->index().is_delta() ? base_dir : target_dir).string(),
                     " is a DELTA version; materialize it first (stitch delta apply)"));
  }
  if (!options.base_version && !base->version()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the base checkpoint ", base_dir.string(),
        " records no version (its index has no metadata.version); ",
        "say which version it holds (--base-version): a delta never assumes its base"));
  }
  std::vector<TensorInput> b = InputsFromReader(*base), t = InputsFromReader(*target);
  return EncodeImpl(b, t, out_dir, options, base->version());
}

absl::StatusOr<EncodeResult> EncodeDelta(std::span<const TensorView> base,
                                         std::span<const TensorView> target,
                                         const fs::path& out_dir, const EncodeOptions& options) {
  absl::StatusOr<std::vector<TensorInput>> b = InputsFromViews(base, "base");
  if (!b.ok()) return b.status();
  absl::StatusOr<std::vector<TensorInput>> t = InputsFromViews(target, "target");
  if (!t.ok()) return t.status();
  return EncodeImpl(*b, *t, out_dir, options, std::nullopt);
}

absl::StatusOr<EncodeResult> EncodeDeltaAdvancingBase(std::span<const TensorView> base,
                                                      std::span<const TensorView> target,
                                                      const fs::path& out_dir,
                                                      const EncodeOptions& options) {
  absl::StatusOr<std::vector<TensorInput>> b = InputsFromViews(base, "base");
  if (!b.ok()) return b.status();
  absl::StatusOr<std::vector<TensorInput>> t = InputsFromViews(target, "target");
  if (!t.ok()) return t.status();
  if (absl::Status s = CheckBaseIsSeparate(*b, *t); !s.ok()) return s;
  // The caller owns the base's memory and lets it be written (the contract
  // of this entry point); TensorView only carries it as const.
  for (TensorInput& in : *b) in.advance = const_cast<std::byte*>(in.memory.data());
  bool started = false;
  absl::StatusOr<EncodeResult> r = EncodeImpl(*b, *t, out_dir, options, std::nullopt, &started);
  if (!r.ok() && started) {
    absl::Status s(r.status().code(),
                   absl::StrCat(r.status().message(),
                                " (the base was partly advanced: it is no version any more)"));
    r.status().ForEachPayload(
        [&](absl::string_view url, const absl::Cord& payload) { s.SetPayload(url, payload); });
    s.SetPayload(kBaseAdvancedPayload, absl::Cord("1"));
    return s;
  }
  return r;
}

bool BaseWasAdvanced(const absl::Status& status) {
  return status.GetPayload(kBaseAdvancedPayload).has_value();
}

absl::StatusOr<FullVersionResult> WriteFullVersion(const fs::path& checkpoint_dir,
                                                   const fs::path& out_dir,
                                                   const FullVersionOptions& options) {
  if (absl::Status s = CheckFullOptions(options); !s.ok()) return s;
  absl::StatusOr<CheckpointReader> src = CheckpointReader::Open(checkpoint_dir);
  if (!src.ok()) return src.status();
  if (src->index().is_delta()) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint_dir.string(),
                                                   " is a DELTA version, not a checkpoint; "
                                                   "materialize it first (stitch delta apply)"));
  }
  if (absl::Status s = CheckOutputDir(out_dir); !s.ok()) return s;
  absl::StatusOr<fs::path> tmp = MakeTempDir(out_dir);
  if (!tmp.ok()) return tmp.status();
  TempDirGuard guard(*tmp);
  FullVersionResult result;
  result.version = options.version;
  result.tensors = src->tensors().size();
  result.checkpoint_bytes = src->total_bytes();
  // Every tensor's checksum goes into its file's header, so the bytes are
  // hashed before any file is written; a source that records checksums
  // already is checked against them on the way.
  const std::vector<CheckpointTensor>& tensors = src->tensors();
  std::vector<Checksum128> sums(tensors.size());
  std::vector<uint64_t> sizes;
  for (const CheckpointTensor& t : tensors) sizes.push_back(t.nbytes);
  const std::vector<size_t> order = LargestFirst(sizes);
  std::atomic<bool> cancel{false};
  absl::Status hashed = ParallelFor(
      order.size(), DefaultThreads(),
      [&](size_t i, int) -> absl::Status {
        if (cancel.load(std::memory_order_relaxed)) return absl::CancelledError();
        const CheckpointTensor& t = tensors[order[i]];
        absl::StatusOr<Checksum128> sum = HashTensor(*src, t);
        if (!sum.ok()) return sum.status();
        sums[order[i]] = *sum;
        return CompareRecordedChecksum(t, src->files()[t.file], *sum);
      },
      &cancel);
  if (!hashed.ok()) return hashed;
  std::vector<std::byte> buf(1 << 20);
  for (const CheckpointFile& f : src->files()) {
    const fs::path dst = *tmp / f.name;
    std::error_code ec;
    fs::create_directories(dst.parent_path(), ec);
    if (ec)
      return absl::InternalError(
          absl::StrCat("create ", dst.parent_path().string(), ": ", ec.message()));
    // The same tensors in the same order, so the data section is copied as
    // it is; only the header gains the checksums.
    SafetensorsWriter w;
    for (const auto& [key, value] : f.header.metadata) w.SetMetadata(key, value);
    for (const TensorInfo& t : f.header.tensors) {
      if (absl::Status s = w.Add(t.name, t.dtype, t.shape, t.nbytes()); !s.ok()) {
        return Annotate(s, f.path.string());
      }
      const CheckpointTensor* read = src->Find(t.name);
      w.SetMetadata(t.name, sums[static_cast<size_t>(read - tensors.data())].ToHex());
    }
    absl::StatusOr<std::unique_ptr<SafetensorsWriter::Output>> out = w.Begin(dst);
    if (!out.ok()) return out.status();
    if (absl::Status s = CopyRange(f.fd.get(), f.header.data_start, f.size - f.header.data_start,
                                   f.path, **out, buf);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = (*out)->Finish(); !s.ok()) return s;
    result.files.push_back(f.name);
  }
  TensorChecksums by_name;
  for (size_t i = 0; i < tensors.size(); ++i) by_name[tensors[i].name] = sums[i];
  if (absl::Status s = WriteIndex(*tmp, FullIndex(src->index(), by_name, options)); !s.ok()) {
    return s;
  }
  if (absl::Status s = FsyncTree(*tmp); !s.ok()) return s;
  if (absl::Status s = RenameDurably(*tmp, out_dir); !s.ok()) return s;
  guard.Release();
  return result;
}

absl::StatusOr<FullVersionResult> WriteFullVersion(std::span<const TensorView> tensors,
                                                   const fs::path& out_dir,
                                                   const FullVersionOptions& options) {
  if (absl::Status s = CheckFullOptions(options); !s.ok()) return s;
  if (options.max_shard_bytes == 0)
    return absl::InvalidArgumentError("the shard size must be positive");
  absl::StatusOr<std::vector<TensorInput>> inputs = InputsFromViews(tensors, "checkpoint");
  if (!inputs.ok()) return inputs.status();
  std::set<std::string_view> names;
  for (const TensorView& t : tensors) {
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" appears twice"));
    }
  }
  if (absl::Status s = CheckOutputDir(out_dir); !s.ok()) return s;
  absl::StatusOr<fs::path> tmp = MakeTempDir(out_dir);
  if (!tmp.ok()) return tmp.status();
  TempDirGuard guard(*tmp);

  FullVersionResult result;
  result.version = options.version;
  result.tensors = tensors.size();
  std::vector<uint64_t> sizes;
  for (const TensorView& t : tensors) {
    sizes.push_back(t.data.size());
    result.checkpoint_bytes += t.data.size();
  }
  std::vector<Checksum128> sums(tensors.size());
  absl::Status hashed = ParallelFor(tensors.size(), DefaultThreads(), [&](size_t i, int) {
    sums[i] = Xxh3Checksum(tensors[i].data);
    return absl::OkStatus();
  });
  if (!hashed.ok()) return hashed;
  CheckpointIndex index;
  const std::vector<std::vector<size_t>> shards = Shard(sizes, options.max_shard_bytes);
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string name = ShardName(s, shards.size(), "model");
    std::vector<TensorView> part;
    std::map<std::string, std::string> checksums;
    for (size_t i : shards[s]) {
      part.push_back(tensors[i]);
      index.weight_map[tensors[i].name] = name;
      checksums[tensors[i].name] = sums[i].ToHex();
    }
    if (absl::Status ws = WriteSafetensors(*tmp / name, part, checksums); !ws.ok()) return ws;
    result.files.push_back(name);
  }
  TensorChecksums by_name;
  for (size_t i = 0; i < tensors.size(); ++i) by_name[tensors[i].name] = sums[i];
  if (absl::Status s = WriteIndex(*tmp, FullIndex(std::move(index), by_name, options)); !s.ok()) {
    return s;
  }
  if (absl::Status s = FsyncPath(*tmp); !s.ok()) return s;
  if (absl::Status s = RenameDurably(*tmp, out_dir); !s.ok()) return s;
  guard.Release();
  return result;
}

}  // namespace stitch
