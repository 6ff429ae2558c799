#include "stitch/delta/delta_verify.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/delta/delta_version.h"
#include "stitch/format/checkpoint_reader.h"
#include "stitch/format/index.h"

namespace stitch {
namespace fs = std::filesystem;

namespace {

absl::StatusOr<VerifyReport> VerifyCheckpoint(const fs::path& dir, const VerifyOptions& options) {
  absl::StatusOr<CheckpointReader> r = CheckpointReader::Open(dir);
  if (!r.ok()) return r.status();
  VerifyReport report;
  report.kind = VersionKind::kFull;
  report.version = r->version();
  report.files = r->files().size();
  report.tensors = r->tensors().size();
  report.bytes = r->total_bytes();
  for (const CheckpointFile& f : r->files()) report.payload_bytes += f.size;
  if (!r->records_checksums()) return report;
  std::vector<uint64_t> sizes;
  for (const CheckpointTensor& t : r->tensors()) sizes.push_back(t.nbytes);
  const std::vector<size_t> order = LargestFirst(sizes);
  ProgressMeter meter(report.bytes, options.progress);
  std::atomic<bool> cancel{false};
  absl::Status st = ParallelFor(
      order.size(), options.threads > 0 ? options.threads : DefaultThreads(),
      [&](size_t i, int) -> absl::Status {
        if (cancel.load(std::memory_order_relaxed)) return absl::CancelledError();
        const CheckpointTensor& t = r->tensors()[order[i]];
        absl::Status s = VerifyRecordedChecksum(*r, t);
        meter.Add(t.nbytes);
        return s;
      },
      &cancel);
  if (!st.ok()) return st;
  meter.Finish();
  report.checksums_verified = true;
  return report;
}

// Decodes the frame of entry `e` whole: it must be intact, decode to its
// recorded content size, and have nothing after it. Returns its size.
absl::StatusOr<uint64_t> DecodeWhole(CodecWorkspace& ws, const FrameRef& frame,
                                     const DeltaEntry& e) {
  absl::StatusOr<uint64_t> n =
      DecodedFrameSize(ws, frame, e.tensor, e.content_size.value_or(UINT64_MAX));
  if (!n.ok()) return n.status();
  if (e.content_size && *n != *e.content_size) {
    return absl::DataLossError(absl::StrCat("tensor \"", e.tensor, "\": zstd frame in ",
                                            frame.label, " decodes to ", *n,
                                            " bytes, its header says ", *e.content_size));
  }
  return *n;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> VerifyPayloadFile(const fs::path& dir,
                                                           const std::string& name,
                                                           const PayloadFileKind& kind,
                                                           const VerifyOptions& options) {
  absl::StatusOr<CheckpointFile> f = OpenSafetensorsForReading(dir / name, name);
  if (!f.ok()) return f.status();
  std::vector<std::string> names;
  for (const TensorInfo& t : f->header.tensors) names.push_back(t.name);
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  std::atomic<bool> cancel{false};
  if (kind.kind == VersionKind::kDelta) {
    std::vector<DeltaEntry> entries;
    if (absl::Status s = ReadDeltaEntries(*f, 0, nullptr, kind.version,
                                          absl::StrCat("delta ", dir.string()), entries);
        !s.ok()) {
      return s;
    }
    std::vector<CodecWorkspace> workspaces(static_cast<size_t>(threads));
    const std::string label = absl::StrCat(f->path.string(), " (version ", kind.version, ")");
    absl::Status st = ParallelFor(
        entries.size(), threads,
        [&](size_t i, int worker) -> absl::Status {
          const DeltaEntry& e = entries[i];
          const FrameRef frame{f->fd.get(), e.offset, e.size, {}, label};
          return DecodeWhole(workspaces[static_cast<size_t>(worker)], frame, e).status();
        },
        &cancel);
    if (!st.ok()) return st;
    return names;
  }
  if (!kind.records_checksums) return names;
  absl::Status st = ParallelFor(
      f->header.tensors.size(), threads,
      [&](size_t i, int) -> absl::Status {
        const TensorInfo& t = f->header.tensors[i];
        auto recorded = f->header.metadata.find(t.name);
        if (recorded == f->header.metadata.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(f->path.string(), ": tensor \"", t.name,
                           "\": the file's __metadata__ has no xxh3-128 checksum for it, but the "
                           "index records checksum_format \"",
                           AbslView(kChecksumFormat), "\""));
        }
        absl::StatusOr<Checksum128> want = Checksum128::FromHex(recorded->second);
        if (!want.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(f->path.string(), ": tensor \"", t.name,
                           "\": recorded checksum: ", want.status().message()));
        }
        CheckpointTensor ct{t.name,     t.dtype, t.shape, 0, f->header.data_start + t.begin,
                            t.nbytes(), *want};
        absl::StatusOr<Checksum128> actual = HashFileRange(*f, ct.offset, ct.nbytes);
        if (!actual.ok()) return actual.status();
        return CompareRecordedChecksum(ct, *f, *actual);
      },
      &cancel);
  if (!st.ok()) return st;
  return names;
}

// Long on purpose: the checks a publisher runs before the pointer moves,
// in order (index, files, frames, then checksums against the base when
// given), each failure naming its file and tensor.
absl::StatusOr<VerifyReport> VerifyVersion(const fs::path& dir,
                                           const std::optional<fs::path>& base_dir,
                                           const VerifyOptions& options) {
  absl::StatusOr<CheckpointIndex> index = ReadIndex(dir);
  if (!index.ok()) return index.status();
  if (!index->is_delta()) {
    if (base_dir) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir.string(),
          " is a FULL version (a complete checkpoint); it has no base to verify against"));
    }
    return VerifyCheckpoint(dir, options);
  }
  absl::StatusOr<DeltaVersion> delta = DeltaVersion::Open(dir);
  if (!delta.ok()) return delta.status();
  VerifyReport report;
  report.kind = VersionKind::kDelta;
  report.version = delta->version();
  report.base_version = delta->base_version();
  report.files = delta->files().size();
  report.tensors = delta->entries().size();
  report.payload_bytes = delta->payload_bytes();

  std::optional<CheckpointReader> base;
  if (base_dir) {
    absl::StatusOr<CheckpointReader> b = CheckpointReader::Open(*base_dir);
    if (!b.ok()) return Annotate(b.status(), absl::StrCat("base ", base_dir->string()));
    if (b->index().is_delta()) {
      return absl::InvalidArgumentError(
          absl::StrCat("base ", base_dir->string(),
                       " is a DELTA version; verify against a complete checkpoint "
                       "(materialize it with stitch delta apply)"));
    }
    if (b->version() && *b->version() != delta->base_version()) {
      return absl::InvalidArgumentError(
          absl::StrCat("delta ", dir.string(), " applies to version ", delta->base_version(),
                       ", but the base ", base_dir->string(), " is version ", *b->version()));
    }
    for (const DeltaEntry& e : delta->entries()) {
      const CheckpointTensor* t = b->Find(e.tensor);
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("delta ", dir.string(), " changes tensor \"",
                                                       e.tensor, "\", which the base ",
                                                       base_dir->string(), " does not have"));
      }
      if (absl::Status s = CheckFrameHeader(delta->Frame(e), e.tensor, t->nbytes); !s.ok())
        return s;
    }
    base = *std::move(b);
  }

  uint64_t total = 0;
  std::vector<uint64_t> sizes;
  for (const DeltaEntry& e : delta->entries()) {
    const CheckpointTensor* t = base ? base->Find(e.tensor) : nullptr;
    sizes.push_back(t != nullptr ? t->nbytes : e.content_size.value_or(e.size));
    total += sizes.back();
  }
  const std::vector<size_t> order = LargestFirst(sizes);
  const int threads = options.threads > 0 ? options.threads : DefaultThreads();
  std::vector<CodecWorkspace> workspaces(static_cast<size_t>(threads));
  std::vector<uint64_t> decoded(delta->entries().size(), 0);
  ProgressMeter meter(total, options.progress);
  std::atomic<bool> cancel{false};
  absl::Status st = ParallelFor(
      order.size(), threads,
      [&](size_t i, int worker) -> absl::Status {
        const size_t k = order[i];
        const DeltaEntry& e = delta->entries()[k];
        CodecWorkspace& ws = workspaces[static_cast<size_t>(worker)];
        const FrameRef frame = delta->Frame(e);
        if (!base) {
          absl::StatusOr<uint64_t> n = DecodeWhole(ws, frame, e);
          if (!n.ok()) return n.status();
          decoded[k] = *n;
          meter.Add(sizes[k]);
          return absl::OkStatus();
        }
        const CheckpointTensor& t = *base->Find(e.tensor);
        const CheckpointFile& f = base->files()[t.file];
        FileSource src(f.fd.get(), t.offset, &f.path);
        DiscardSink sink;
        std::span<const FrameRef> frames(&frame, 1);
        FoldSpec spec{e.tensor, t.nbytes, frames, e.checksum, UINT64_MAX, &cancel, &meter};
        decoded[k] = t.nbytes;
        return FoldFrames(ws, spec, src, sink);
      },
      &cancel);
  if (!st.ok()) return st;
  meter.Finish();
  for (uint64_t n : decoded) report.bytes += n;
  report.checksums_verified = base.has_value();
  return report;
}

}  // namespace stitch
